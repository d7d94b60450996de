"""pFedHN (Shamsian, Navon, Fetaya and Chechik, "Personalized Federated Learning using
Hypernetworks", ICML 2021, Sec. 3 and Algorithm 1): a hypernetwork h(v_i; phi) on the server, with a
learned embedding v_i per client, generates each client's model theta_i = h(v_i; phi); the client
trains theta_i for K steps and returns Delta theta_i; the server moves phi and v_i by the chain rule
(Eq. 4: grad_phi L_i = (grad_phi theta_i)^T grad_theta_i L_i, with grad_theta_i L_i approximated by
Delta theta_i).

- The hypernetwork (the authors' ``CNNHyper``, built here for any registered model): the embedding
  table v (N x d, one row per client, d = ``embed_dim``, by default the authors' 1 + N/4), an MLP
  of ``n_hidden`` + 1 linear layers of width ``hidden_dim`` with ReLUs between them (the authors'
  ``mlp``), and one linear head per parameter tensor of the model's global path (``extractor``,
  ``filter``, ``head``: the authors' ``c1_weights``, ``l1_bias``, ...), whose output is that
  tensor, flat. Every layer starts as PyTorch's ``nn.Linear`` does (weight and bias uniform in
  +-1/sqrt(fan_in)) and v as ``nn.Embedding`` does (standard normal), drawn from the seeded stream
  (seed, "pfedhn/init"), so every process builds the same one. A model's buffers are not generated
  (models with BatchNorm are refused); the hypernetwork and its optimiser's momentum are the server
  state, checkpointed with it.
- Client (Algorithm 1, inner loop): it loads theta_i, trains the global path for ``inner_steps``
  SGD steps (K; the run's ``train.lr``, ``train.momentum`` and ``train.weight_decay``, where the
  authors' runs take inner rate 5e-3, momentum 0.9, weight decay 5e-5 and batches of 64; each step's
  gradient clipped to norm ``inner_grad_clip`` as the authors' ``clip_grad_norm_(net.parameters(),
  50)``) and uploads Delta theta_i = theta_i - theta_tilde_i. The paper writes Delta theta_i =
  theta_tilde_i - theta_i and steps against it; the authors' code (followed here) uploads the
  difference the other way round and hands it to the optimiser as the gradient, the same step. The
  steps are the client's shuffled mini-batches, epoch after epoch (raysim's loop; the authors draw
  each step's batch as the first of a fresh shuffle).
- Server (Algorithm 1, the phi and v_i updates): each uploaded Delta theta_i is pulled back through
  the hypernetwork, g_i = (d theta_i / d(phi, v))^T Delta theta_i, at the phi that generated the
  round's theta_i. Algorithm 1 samples one client a step, so a round of n clients is n steps
  (``round_steps: each``, the default): one step for each upload's g_i, in the order of the
  clients' indices (the uploads' order does not matter, serial and Ray agree), each g_i taken at the
  round's phi, which generated the weights its client trained. With one client a round either way
  is Algorithm 1 exactly. ``round_steps: mean`` takes one step on the mean of the round's g_i
  instead: n times fewer hypernetwork steps, each embedding row moved by 1/n of its gradient.
  Each step's gradient has its norm clipped to ``grad_clip``, then one SGD step is taken, as the
  authors' ``torch.optim.SGD``: weight decay ``server_weight_decay`` added to the gradient, momentum
  ``server_momentum`` (the buffer starts as the first step's gradient), rate ``server_lr`` for the
  MLP and heads and ``embed_lr`` (default ``server_lr``) for the embedding table; weight decay and
  momentum act on the whole table, as the authors' optimiser's do, so a row moves only from its
  client's gradients when both are zero.
- LM: each client's model is h(v_i; phi) from the current server state, evaluated as generated (the
  authors evaluate the generated weights, without local training). No global model (``gm_*`` null).
- Newcomers (``eval.new_clients``), as the paper's novel clients (its experiment on generalisation
  to novel clients): the hypernetwork frozen, the newcomer's embedding alone learned on its data
  (:meth:`PFedHNEvaluation.newcomer_model`; its optimiser, plain SGD at the embeddings' rate, and
  its start, the client's own row of the table, are our choices).

Defaults from the authors' code (AvivSham/pFedHN, ``experiments/pfedhn/trainer.py`` and
``experiments/pfedhn/models.py``, commit 1bc0549): inner steps 50, hidden width 100, 3 hidden layers,
rate 1e-2, momentum 0.9, weight decay 1e-3, clipping at 50 (both), embedding 1 + N/4. The handling
of a round with several clients was checked against FL-bench's ``src/server/pfedhn.py`` (commit
06e658b), which trains them one after another with one hypernetwork step each, so that a later
client trains weights generated after the earlier ones' steps; here they train in parallel from one
phi, and the steps follow, one a client, as FL-bench's count of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from algorithms.base import Algorithm, Evaluation, register
from raysim import rng
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching
from raysim.config import ExperimentConfig, setting
from raysim.errors import ConfigError
from raysim.registry import MODELS
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext

#: the most weights the hypernetwork's heads may hold (hidden_dim x the model's parameters): beyond
#: it, generating the model is impractical (the hypernetwork and its momentum, 800 MB at this cap,
#: live on the server, and the hypernetwork travels to every evaluation)
MAX_HEAD_WEIGHTS = 100_000_000


@dataclass(frozen=True)
class PFedHNConfig:
    inner_steps: int = setting(50, at_least=1)  # K: the client's SGD steps on theta_i
    hidden_dim: int = setting(100, at_least=1)  # the hypernetwork's MLP width
    n_hidden: int = setting(3, at_least=0)  # hidden layers after the MLP's first
    embed_dim: int = setting(0, at_least=0)  # d; 0: the authors' 1 + N/4
    server_lr: float = setting(0.01, above=0)  # the hypernetwork's rate (MLP and heads)
    embed_lr: float | None = setting(None, above=0)  # the embeddings' rate; None: server_lr
    server_momentum: float = setting(0.9, at_least=0, below=1)
    server_weight_decay: float = setting(1e-3, at_least=0)
    grad_clip: float = setting(50.0, above=0)  # the norm the hypernetwork's gradient is clipped to
    inner_grad_clip: float = setting(50.0, above=0)  # the norm each client step's gradient is clipped to
    #: each: one hypernetwork step per upload (Algorithm 1's one client a step); mean: one step a round
    #: on the mean of the uploads' gradients
    round_steps: Literal["each", "mean"] = "each"


@dataclass(frozen=True)
class Target:
    """One generated parameter tensor: its part, where it lies in the part's flat array, and its
    name among the model's parameters (``functional_call``'s key)."""

    part: str
    start: int
    shape: tuple[int, ...]
    name: str

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def targets_of(model: SplitModel) -> tuple[Target, ...]:
    """The parameter tensors of ``model``'s global path, in flat order (buffers are laid out in the
    flat arrays too, and are not generated)."""
    import torch

    from raysim.models import float_tensors

    names = {id(q): name for name, q in model.named_parameters()}
    out = []
    for part in GLOBAL_PARTS:
        offset = 0
        for t in float_tensors(model.part(part)):
            if isinstance(t, torch.nn.Parameter):
                out.append(Target(part, offset, tuple(t.shape), names[id(t)]))
            offset += t.numel()
    return tuple(out)


@dataclass(frozen=True)
class HyperNet:
    """phi and v as arrays, in order: the embedding table (N x d); the MLP's ``n_hidden`` + 1
    (weight, bias) pairs; one (weight, bias) head per target tensor (weight: size x hidden_dim)."""

    tensors: tuple[np.ndarray, ...]
    n_hidden: int

    @property
    def embeddings(self) -> np.ndarray:
        return self.tensors[0]


@dataclass(frozen=True)
class HNState:
    hnet: HyperNet
    momentum: tuple[np.ndarray, ...] | None = None  # SGD's buffers, one per tensor (None: no step yet)


def init_hypernet(
    seed: int, num_clients: int, embed_dim: int, hidden_dim: int, n_hidden: int, targets: Sequence[Target]
) -> HyperNet:
    """The hypernetwork as ``nn.Embedding`` and ``nn.Linear`` start theirs, from (seed, "pfedhn/init")."""
    g = rng.generator(seed, "pfedhn/init")

    def linear(n_out: int, n_in: int) -> list[np.ndarray]:
        bound = 1.0 / np.sqrt(n_in)
        w = g.uniform(-bound, bound, (n_out, n_in)).astype(np.float32)
        return [w, g.uniform(-bound, bound, n_out).astype(np.float32)]

    tensors = [g.standard_normal((num_clients, embed_dim)).astype(np.float32)]
    tensors += linear(hidden_dim, embed_dim)
    for _ in range(n_hidden):
        tensors += linear(hidden_dim, hidden_dim)
    for t in targets:
        tensors += linear(t.size, hidden_dim)
    return HyperNet(tuple(tensors), n_hidden)


def generate(phi: Sequence[torch.Tensor], n_hidden: int, client: int) -> list[torch.Tensor]:
    """theta_i = h(v_i; phi): the flat target tensors generated for ``client``, differentiable in ``phi``."""
    return generate_from(phi, n_hidden, phi[0][client])


def generate_from(phi: Sequence[torch.Tensor], n_hidden: int, v: torch.Tensor) -> list[torch.Tensor]:
    """h(v; phi) for an embedding ``v`` (a newcomer's, learned with phi frozen), differentiable in
    ``v`` and ``phi`` (``phi[0]``, the table, is not read)."""
    import torch

    f = phi[1] @ v + phi[2]
    for k in range(n_hidden):
        f = phi[3 + 2 * k] @ torch.relu(f) + phi[4 + 2 * k]
    heads = phi[3 + 2 * n_hidden :]
    return [heads[j] @ f + heads[j + 1] for j in range(0, len(heads), 2)]


def as_tensors(hnet: HyperNet, grad: bool = False) -> list[torch.Tensor]:
    import torch

    return [torch.tensor(a, requires_grad=grad) if grad else torch.from_numpy(a) for a in hnet.tensors]


def generated_weights(
    hnet: HyperNet, client: int, targets: Sequence[Target], base: ModelWeights, embedding: np.ndarray | None = None
) -> ModelWeights:
    """Client ``client``'s global path as generated: ``base``'s flat parts (their buffers kept) with
    every target tensor h(v_i; phi)'s (h(embedding; phi)'s where ``embedding`` is given)."""
    import torch

    with torch.no_grad():
        phi = as_tensors(hnet)
        if embedding is None:
            outputs = generate(phi, hnet.n_hidden, client)
        else:
            outputs = generate_from(phi, hnet.n_hidden, torch.from_numpy(np.asarray(embedding, np.float32)))
    out = {part: base.part(part).copy() for part in GLOBAL_PARTS}
    for t, o in zip(targets, outputs, strict=True):
        out[t.part][t.start : t.start + t.size] = o.numpy()
    return ModelWeights(**out)


def client_gradient(hnet: HyperNet, client: int, delta: ModelWeights, targets: Sequence[Target]) -> list[np.ndarray]:
    """One upload's gradient of phi and v: (d theta_i / d(phi, v))^T Delta theta_i (Eq. 4 with
    Delta theta_i for grad_theta_i L_i), at ``hnet``."""
    import torch

    phi = as_tensors(hnet, grad=True)
    outputs = generate(phi, hnet.n_hidden, client)
    deltas = [
        torch.from_numpy(np.ascontiguousarray(delta.part(t.part)[t.start : t.start + t.size])) for t in targets
    ]
    # copies: a bias's gradient is the grad_output itself, a view of the upload
    return [g.numpy().copy() for g in torch.autograd.grad(outputs, phi, grad_outputs=deltas)]


def hypernet_gradient(
    hnet: HyperNet, uploads: Sequence[tuple[int, ModelWeights]], targets: Sequence[Target]
) -> list[np.ndarray]:
    """The mean over the uploads (client i, Delta theta_i) of their gradients (``client_gradient``)."""
    total = client_gradient(hnet, *uploads[0], targets)
    for client, delta in uploads[1:]:
        for acc, g in zip(total, client_gradient(hnet, client, delta, targets), strict=True):
            acc += g
    return [acc / np.float32(len(uploads)) for acc in total]


def hypernet_step(state: HNState, grads: Sequence[np.ndarray], params: PFedHNConfig) -> HNState:
    """One step of the authors' optimiser on ``grads``: clipped to norm ``grad_clip`` (as
    ``clip_grad_norm_``), then ``torch.optim.SGD`` with weight decay, momentum (its buffer starting
    as the first step's direction, no dampening) and the embeddings' own rate."""
    norm = float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads)))
    scale = min(1.0, params.grad_clip / (norm + 1e-6))  # as clip_grad_norm_ scales
    embed_lr = params.server_lr if params.embed_lr is None else params.embed_lr
    tensors, buffers = [], []
    for k, (p, g) in enumerate(zip(state.hnet.tensors, grads, strict=True)):
        d = (g * np.float32(scale) if scale < 1.0 else g) + np.float32(params.server_weight_decay) * p
        if params.server_momentum > 0:
            d = d if state.momentum is None else np.float32(params.server_momentum) * state.momentum[k] + d
            buffers.append(d)
        lr = embed_lr if k == 0 else params.server_lr
        tensors.append((p - np.float32(lr) * d).astype(np.float32))
    return HNState(HyperNet(tuple(tensors), state.hnet.n_hidden), tuple(buffers) if buffers else None)


def refusal(model: str) -> str:
    return (
        f"pfedhn's hypernetwork generates a model's parameters, not its BatchNorm statistics, and the "
        f"model {model} has BatchNorm layers: choose one without them (e.g. mlp_fcd or cnn_pac)."
    )


@register("pfedhn")
class PFedHN(Algorithm[HNState]):
    """The hypernetwork on the server; the clients train what it generates and upload the change."""
    family = "personal"

    Config = PFedHNConfig
    has_global_model = False
    has_personal_model = True
    batching = Batching(
        why_not="each client trains weights of its own, generated for it by the server, not a shared payload."
    )
    asynchronous = Asynchronous(
        why_not="its server pulls each client's change back through the hypernetwork at the phi that "
        "generated the client's weights, which a stale upload's rebasing onto newer weights would not keep."
    )

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: Any) -> None:
        if MODELS.get(cfg.model).batch_norm:
            raise ConfigError(refusal(cfg.model))

    @classmethod
    def evaluates_newcomers(cls, cfg: ExperimentConfig) -> bool:
        """A newcomer learns its embedding with the hypernetwork frozen."""
        return cfg.eval.new_clients > 0

    # ---- server side
    def embed_dim(self) -> int:
        return self.params.embed_dim or int(1 + self.cfg.clients / 4)

    def init(self, ctx: ServerContext) -> HNState:
        self._targets = targets_of(ctx.build_model())
        self._base = ctx.init_weights.select(GLOBAL_PARTS)
        p = self.params
        count = sum(t.size for t in self._targets)
        if count * p.hidden_dim > MAX_HEAD_WEIGHTS:
            raise ConfigError(
                f"pfedhn's hypernetwork would hold {count * p.hidden_dim:,} head weights to generate the "
                f"{count:,} parameters of the model {self.cfg.model} (algo.hidden_dim {p.hidden_dim}), "
                f"more than the {MAX_HEAD_WEIGHTS:,} it allows: choose a smaller model (e.g. mlp_fcd) or "
                "a smaller algo.hidden_dim."
            )
        hnet = init_hypernet(
            self.cfg.seed, self.cfg.clients, self.embed_dim(), p.hidden_dim, p.n_hidden, self._targets
        )
        return HNState(hnet)

    def plan(self, state: HNState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        lr = self.lr(rnd)
        return [
            Job((c,), WeightsPayload(generated_weights(state.hnet, c, self._targets, self._base), lr))
            for c in sampled
        ]

    def aggregate(self, state: HNState, rnd: int, results: Sequence[JobResult]) -> HNState:
        uploads = sorted(
            ((r.client, r.weights) for jr in results for r in jr.results if r.weights is not None),
            key=lambda upload: upload[0],
        )
        if not uploads:
            return state
        if self.params.round_steps == "mean":
            return hypernet_step(state, hypernet_gradient(state.hnet, uploads, self._targets), self.params)
        generator = state.hnet  # the round's phi: every upload's weights came from it
        for client, delta in uploads:
            state = hypernet_step(state, client_gradient(generator, client, delta, self._targets), self.params)
        return state

    def evaluation(self, state: HNState) -> Evaluation:
        return PFedHNEvaluation(state.hnet)

    # ---- client side
    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        import torch

        from raysim.models import parameters_of

        ctx.load(payload.weights)
        params = parameters_of(ctx.model, GLOBAL_PARTS)
        clip = self.params.inner_grad_clip

        def clipped() -> None:
            torch.nn.utils.clip_grad_norm_(params, clip)

        stats = ctx.train(GLOBAL_PARTS, payload.lr, steps=self.params.inner_steps, after_backward=clipped)
        trained = ctx.weights(GLOBAL_PARTS)
        delta = ModelWeights(**{p: payload.weights.part(p) - trained.part(p) for p in GLOBAL_PARTS})
        return ctx.result(stats, weights=delta)


class PFedHNEvaluation(Evaluation):
    """The hypernetwork; a client's personal model is h(v_i; phi), generated on the worker."""

    def personal_model(self, algo: PFedHN, ctx: ClientContext) -> SplitModel:
        base = ctx.initial_weights.select(GLOBAL_PARTS)
        ctx.load(generated_weights(self.payload, ctx.cid, targets_of(ctx.model), base))
        return ctx.model

    def newcomer_model(self, algo: PFedHN, ctx: ClientContext) -> SplitModel:
        """A client held out of training, as the paper's novel clients (its experiment on
        generalisation to novel clients): phi frozen, only its embedding learned, from its row of
        the table (drawn as every row is, and moved only by the whole table's weight decay and
        momentum), by plain SGD at the embeddings' rate (``embed_lr``, else ``server_lr``) on the
        cross-entropy of the model h(v; phi) generates, over its mini-batches for
        ``eval.new_client_epochs`` epochs on its own stream ("newcomer"); its model is then
        h(v; phi). Nothing is kept."""
        import torch
        import torch.nn.functional as F
        from torch.func import functional_call

        from raysim.engine.evaluation import newcomer_epochs

        hnet = self.payload
        model = ctx.model
        targets = targets_of(model)
        base = ctx.initial_weights.select(GLOBAL_PARTS)
        ctx.load(base)  # the buffers, which the hypernetwork does not generate
        phi = as_tensors(hnet)
        v = torch.tensor(hnet.embeddings[ctx.cid], requires_grad=True)
        lr = algo.params.server_lr if algo.params.embed_lr is None else algo.params.embed_lr
        model.train()
        for epoch in range(newcomer_epochs(algo.cfg)):
            for x, y in ctx.batches(epoch, stream="newcomer"):
                theta = generate_from(phi, hnet.n_hidden, v)
                weights = {t.name: o.view(t.shape) for o, t in zip(theta, targets, strict=True)}
                loss = F.cross_entropy(functional_call(model, weights, (x,)), y)
                (grad,) = torch.autograd.grad(loss, v)
                with torch.no_grad():
                    v -= lr * grad
        ctx.load(generated_weights(hnet, ctx.cid, targets, base, v.detach().numpy()))
        return model


__all__ = [
    "HNState",
    "HyperNet",
    "PFedHN",
    "PFedHNConfig",
    "PFedHNEvaluation",
    "Target",
    "generate",
    "generate_from",
    "generated_weights",
    "hypernet_gradient",
    "hypernet_step",
    "init_hypernet",
    "targets_of",
]
