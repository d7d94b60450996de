"""FedCP (Zhang, Hua, Wang, Song, Xue, Ma and Guan, "FedCP: Separating Feature Information for
Personalized Federated Learning via Conditional Policy", KDD 2023; arXiv:2307.01217v2, its method
section and its figure of the CPN): a Conditional Policy Network (CPN) splits each sample's feature
vector into a global and a personal part; the global part goes through a frozen global head, the
personal part through the client's personal head, and the prediction is their sum. The paper's
equations are given below by what they compute (its numbering is not quoted), in the form the
authors' code computes them.

The model in raysim's parts: h = filter(extractor(x)) in R^d (d the heads' input); the global
head W^hg is ``head``, the personal head W^hp is ``phead``. The CPN is FedCP's own module, carried
beside the weights as one flat array (as GPFL's modules are, ``algorithms/gpfl.py``).

- The conditional input (client i's, fixed during a local update): v_i = the sum of the rows of
  its personal head's weight (one row per class), L2-normalised; read from the personal head as
  the update starts (its kept one, or the initial one before it first trains).
- The policy: the CPN, Linear(d, 2d) -> LayerNorm(2d) -> ReLU, reads h ⊙ v_i; its 2d outputs are
  d pairs (the first d: personal, the next d: global), and a Gumbel-Softmax over each pair with
  temperature ``tau`` gives r_i (personal) and s_i (global), r + s = 1 entry by entry.
- The output: W^hp(h ⊙ r) + W^hg(h ⊙ s).
- Client i's loss on a batch: cross-entropy of that output, plus lambda times the maximum mean
  discrepancy (MMD) between h and the features the received (frozen) extractor and filter give the
  same batch (an RBF kernel, summed over the bandwidths 10, 15, 20 and 50:
  k(a, b) = sum_sigma exp(-||a - b||^2 / (2 sigma)), MMD = mean(K_hh + K_gg - 2 K_hg)).
- The local update: the client loads the received extractor, filter, global head and CPN and its
  own personal head, and trains the extractor, filter, personal head and CPN for E epochs with
  the run's SGD; the global head is frozen. It keeps its personal head (on its home worker) and
  uploads the extractor, filter, CPN and, as its head, ``head_mix`` W^hp + (1 - head_mix) W^hg
  (its trained personal head mixed with the global head it received).
- The server averages every upload (extractor, filter, head and CPN) by training-set size, and
  sends the averages to the next round's clients.
- LM of client i = the output above with its own personal head and v_i, the current shared parts,
  and the noise-free policy (below). FedCP defines no global model (``gm_*`` null): the global head
  reads the CPN's share of the features, never the whole feature vector.
- A newcomer (``eval.new_clients``) takes the shared parts and the CPN as the federation shares
  them with the initial personal head (v_i read from it), and trains its personal head on the
  output's cross-entropy with the training policy (Gumbel noise from its own stream) for
  ``eval.new_client_epochs`` epochs; the MMD term reads only the shared body, which stays as
  received, as a shared-and-personal algorithm's newcomer trains only its personal parts.

Where the paper is silent this follows the authors' code, read in TsingZ0/PFLlib
``system/flcore/clients/clientcp.py`` and ``system/flcore/servers/servercp.py`` (commit d832e76)
and their FedCP repository's ``system/run_me.sh`` (TsingZ0/FedCP, commit 7110e97): the CPN's
layers, tau = 1 (soft, not hard, Gumbel-Softmax), the MMD's kernel and bandwidths, lambda = 5
(their run; PFLlib's ``main.py`` defaults it to 1), the uploaded head mixed half and half (``generate_upload_head``), v_i from the
personal head's weight and the personal head starting as a copy of the initial global head
(:meth:`FedCP.adapt_model`: the initial model's ``phead`` is its ``head``, as each of their
clients copies one model). Readings of this implementation:

- The Gumbel noise of training is drawn from (seed, round, client), one draw a step, so serial
  and Ray runs agree to the bit. The authors' code draws fresh noise at test time too (its
  ``gumbel_softmax`` is called in eval mode); here a personal model predicts with the noise-free
  policy softmax(logits / tau), so its score depends on no draw.
- v_i in a client's first update is its initial personal head's; the authors' clients start
  from a uniformly random v and read it from the personal head only after their first round.
- Every sampled client receives the current CPN and global head; the authors' server gives the
  new ones only to the clients that just trained (the same when every client takes part each
  round, their setting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from algorithms.base import Algorithm, Evaluation, lambda_setting, register
from raysim import rng
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching
from raysim.config import setting
from raysim.toolkit.aggregate import upload_coefficients, weighted_mean
from raysim.weights import BODY, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext

SHARED = (*BODY, "head")  # W^fe (extractor and filter) and W^hg, with the CPN beside them
PERSONAL = ("phead",)  # W^hp
TRAINED = (*BODY, "phead")  # W^hg is frozen during the local update
#: the RBF kernel's bandwidths in the MMD term (the authors' ``MMD(..., 'rbf')``)
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


@dataclass(frozen=True)
class FedCPConfig:
    lam: float = lambda_setting(5.0, at_least=0)  # lambda: the MMD term's weight (``algo.lambda``)
    tau: float = setting(1.0, above=0)  # the Gumbel-Softmax's temperature
    #: the personal head's share in the uploaded head (the rest: the received global head)
    head_mix: float = setting(0.5, at_least=0, at_most=1)


@dataclass(frozen=True)
class FedCPPayload:
    weights: ModelWeights  # extractor, filter and the global head
    cpn: np.ndarray  # the CPN's parameters, flattened (float32)
    lr: float


@dataclass(frozen=True)
class FedCPState:
    weights: ModelWeights
    cpn: np.ndarray


def build_cpn(dim: int, seed: int) -> Any:
    """The CPN for features of ``dim``, initialised from ``seed``: its ``forward`` gives the
    policy's logits, shaped (batch, 2, dim) (index 0 personal, 1 global)."""
    from torch import nn

    from raysim.models import seeded_global_rng

    class ConditionalPolicy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Sequential(nn.Linear(dim, 2 * dim), nn.LayerNorm([2 * dim]), nn.ReLU())

        def forward(self, gate_in: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.fc(gate_in).view(gate_in.shape[0], 2, dim)
            return out

    with seeded_global_rng(seed):
        return ConditionalPolicy()


def flatten_cpn(cpn: Any) -> np.ndarray:
    from torch.nn.utils import parameters_to_vector

    out: np.ndarray = parameters_to_vector(cpn.parameters()).detach().cpu().numpy().astype(np.float32)
    return out


def load_cpn(cpn: Any, flat: np.ndarray) -> None:
    """Copy ``flat`` into the CPN's parameters (copied: the array may be the server's own, or a
    read-only object-store buffer)."""
    import torch

    offset = 0
    with torch.no_grad():
        for q in cpn.parameters():
            n = q.numel()
            q.copy_(torch.from_numpy(np.asarray(flat[offset : offset + n])).view_as(q))
            offset += n
    if offset != flat.size:
        raise ValueError(f"FedCP's CPN has {offset} parameters, the payload {flat.size}")


def conditional_input(phead_weight: torch.Tensor) -> torch.Tensor:
    """v_i: the rows of the personal head's weight (classes x d) summed, L2-normalised, detached."""
    import torch.nn.functional as F

    return F.normalize(phead_weight.detach().sum(dim=0), dim=0)


def policy(
    cpn: Any, h: torch.Tensor, v: torch.Tensor, tau: float, noise: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, s): the personal and global policy of each of ``h``'s rows, a softmax over each pair of
    the CPN's logits on h ⊙ v at temperature ``tau``, with Gumbel noise drawn from ``noise`` (a CPU
    generator: the Gumbel-Softmax of training), or without (the noise-free policy)."""
    import torch

    logits = cpn(h * v)
    if noise is not None:  # g = -log(E), E ~ Exp(1): a standard Gumbel draw per logit
        draws = torch.empty(logits.shape, dtype=logits.dtype).exponential_(generator=noise)
        logits = logits - draws.log().to(logits.device)
    p = torch.softmax(logits / tau, dim=1)
    return p[:, 0, :], p[:, 1, :]


def fedcp_output(
    model: SplitModel,
    cpn: Any,
    v: torch.Tensor,
    x: torch.Tensor,
    tau: float,
    noise: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W^hp(h ⊙ r) + W^hg(h ⊙ s), h) for h = filter(extractor(x))."""
    h = model.filter(model.extractor(x))
    r, s = policy(cpn, h, v, tau, noise)
    out: torch.Tensor = model.phead(h * r) + model.head(h * s)
    return out, h


def mmd(a: torch.Tensor, b: torch.Tensor, bandwidths: Sequence[float] = BANDWIDTHS) -> torch.Tensor:
    """The empirical MMD of the rows of ``a`` and ``b`` (the same count) under the sum of RBF
    kernels exp(-||u - w||^2 / (2 sigma)), one per bandwidth sigma: mean(K_aa + K_bb - 2 K_ab)."""
    import torch

    def sq_dist(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (u * u).sum(1)[:, None] + (w * w).sum(1)[None, :] - 2 * u @ w.T

    d_aa, d_bb, d_ab = sq_dist(a, a), sq_dist(b, b), sq_dist(a, b)
    total = torch.zeros_like(d_ab)
    for sigma in bandwidths:
        total = (
            total
            + torch.exp(-0.5 * d_aa / sigma)
            + torch.exp(-0.5 * d_bb / sigma)
            - 2 * torch.exp(-0.5 * d_ab / sigma)
        )
    return total.mean()


def upload_head(phead: np.ndarray, head: np.ndarray, mix: float) -> np.ndarray:
    """The head a client uploads: ``mix`` of its personal head plus the rest of the received
    global head (the two laid out alike: a linear layer's weight, then its bias)."""
    out: np.ndarray = (mix * phead + (1 - mix) * head).astype(np.float32)
    return out


def averaged(arrays: Sequence[np.ndarray], sizes: Sequence[float]) -> np.ndarray:
    """sum_k n_k a_k / sum_k n_k, summed in float64 in order (as :func:`weighted_mean`), in float32."""
    total = np.zeros(arrays[0].shape, dtype=np.float64)
    for a, c in zip(arrays, upload_coefficients(sizes), strict=True):
        total += c * np.asarray(a, dtype=np.float64)
    return total.astype(np.float32)


@register("fedcp")
class FedCP(Algorithm[FedCPState]):
    family = "split"
    Config = FedCPConfig
    has_global_model = False
    has_personal_model = True
    example_privacy: ClassVar[str | None] = (
        "its MMD term compares the batch's features with one another, so its loss is not a mean of per-example terms"
    )
    batching = Batching(
        why_not="its loss draws Gumbel noise for the policy at every step and trains the CPN beside "
        "the model's parts, which batched training does not carry."
    )
    asynchronous = Asynchronous(
        why_not="its upload carries the CPN beside the model's parts and a head mixed with the "
        "client's personal one, which a stale upload's rebasing onto the current weights does not cover."
    )
    #: the conditional input v_i of the client whose personal model was loaded last (evaluation)
    _v: torch.Tensor

    @staticmethod
    def adapt_model(model: SplitModel) -> SplitModel:
        """The personal head starts as a copy of the global head (the authors' clients copy one
        model into both), so every client's first v_i and the initial LM are the global head's."""
        model.phead.load_state_dict(model.head.state_dict())
        return model

    # ---------------------------------------------------------------------------------- server
    def init(self, ctx: ServerContext) -> FedCPState:
        cpn = build_cpn(ctx.build_model().filter_dim, rng.int_seed(self.cfg.seed, "fedcp/cpn"))
        return FedCPState(ctx.init_weights.select(SHARED), flatten_cpn(cpn))

    def plan(self, state: FedCPState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = FedCPPayload(state.weights, state.cpn, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: FedCPState, rnd: int, results: Sequence[JobResult]) -> FedCPState:
        finals = [jr.final for jr in results]
        sizes = [r.num_samples for r in finals]
        weights = weighted_mean([r.weights for r in finals if r.weights is not None], sizes)
        return FedCPState(weights, averaged([r.extra for r in finals], sizes))

    def evaluation(self, state: FedCPState) -> Evaluation:
        return FedCPEvaluation(state)

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer trains a personal head under the shared parts (:meth:`FedCPEvaluation.newcomer_model`)."""
        return cfg.eval.new_clients > 0

    # ---------------------------------------------------------------------------------- client
    def worker_cpn(self, ctx: ClientContext, flat: np.ndarray) -> Any:
        """This worker's CPN (built once), loaded with ``flat``."""
        if getattr(self, "_cpn", None) is None:
            self._cpn = build_cpn(ctx.model.filter_dim, 0).to(ctx.device)
        load_cpn(self._cpn, flat)
        return self._cpn

    def objective(self, ctx: ClientContext, payload: FedCPPayload, cpn: Any, noise: torch.Generator) -> Any:
        """The loss of a batch, made with the received weights and the client's personal head
        loaded: cross-entropy of the policy-split output plus lambda MMD(h, h of the received body)."""
        import torch
        import torch.nn.functional as F

        v = conditional_input(ctx.model.phead.weight)
        tau, lam = self.params.tau, self.params.lam
        received = ctx.teacher(payload.weights.select(BODY)) if lam > 0 else None

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out, h = fedcp_output(model, cpn, v, x, tau, noise)
            value = F.cross_entropy(out, y)
            if received is not None:
                with torch.no_grad():
                    h_global = received.filter(received.extractor(x))
                value = value + lam * mmd(h, h_global)
            return value

        return loss

    def local_update(self, ctx: ClientContext, payload: FedCPPayload) -> ClientResult:
        import torch

        ctx.load(payload.weights.merged(ctx.kept(PERSONAL)))
        cpn = self.worker_cpn(ctx, payload.cpn)
        cpn.train()
        noise = torch.Generator().manual_seed(rng.int_seed(self.cfg.seed, "fedcp/gumbel", ctx.rnd, ctx.cid))
        loss = self.objective(ctx, payload, cpn, noise)
        stats = ctx.train(TRAINED, payload.lr, loss_fn=loss, extra=list(cpn.parameters()))
        trained = ctx.weights((*BODY, *PERSONAL))
        ctx.keep(trained.select(PERSONAL))
        head = upload_head(trained.part("phead"), payload.weights.part("head"), self.params.head_mix)
        upload = ModelWeights(extractor=trained.extractor, filter=trained.filter, head=head)
        return ctx.result(stats, weights=upload, extra=flatten_cpn(cpn))


class FedCPEvaluation(Evaluation):
    """The server's :class:`FedCPState`; a client's personal model is the shared parts with its
    own personal head, predicting through this worker's CPN with the client's v_i and the
    noise-free policy."""

    payload: FedCPState

    def personal_model(self, algo: FedCP, ctx: ClientContext) -> SplitModel:
        """Loads the shared parts, the client's personal head and this worker's CPN, and sets the
        client's v_i, which :meth:`forward` (called next, for the same client) predicts with."""
        ctx.load(self.payload.weights.merged(ctx.kept(PERSONAL)))
        algo.worker_cpn(ctx, self.payload.cpn)
        algo._v = conditional_input(ctx.model.phead.weight)
        return ctx.model

    def newcomer_model(self, algo: FedCP, ctx: ClientContext) -> SplitModel:
        """A client held out of training: the shared parts and this worker's CPN as shared, the
        initial personal head and its v_i; the personal head trained on the output's
        cross-entropy under the training policy, its Gumbel noise from (seed, "fedcp/gumbel/newcomer",
        round, client), for ``eval.new_client_epochs`` (:func:`adapt_newcomer`)."""
        import torch
        import torch.nn.functional as F

        from raysim.engine.evaluation import adapt_newcomer

        self.personal_model(algo, ctx)  # never trained: the shared parts, the CPN and v_i of the initial phead
        cpn, v, tau = algo._cpn, algo._v, algo.params.tau
        noise = torch.Generator().manual_seed(rng.int_seed(algo.cfg.seed, "fedcp/gumbel/newcomer", ctx.rnd, ctx.cid))

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():  # the shared body and the CPN as received: only the personal head trains
                h = model.filter(model.extractor(x))
                r, s = policy(cpn, h, v, tau, noise)
                shared = model.head(h * s)
            return F.cross_entropy(model.phead(h * r) + shared, y)

        return adapt_newcomer(algo, ctx, PERSONAL, loss)

    def newcomer_forward(self, algo: FedCP, model: SplitModel) -> Any:
        return self.forward(algo, model)

    def forward(self, algo: FedCP, model: SplitModel) -> Any:
        cpn, v, tau = algo._cpn, algo._v, algo.params.tau
        cpn.eval()

        def forward(x: torch.Tensor) -> torch.Tensor:
            out, _ = fedcp_output(model, cpn, v, x, tau)
            return out

        return forward


__all__ = [
    "FedCP",
    "FedCPConfig",
    "FedCPEvaluation",
    "FedCPPayload",
    "FedCPState",
    "build_cpn",
    "conditional_input",
    "fedcp_output",
    "mmd",
    "policy",
    "upload_head",
]
