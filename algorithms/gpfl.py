"""GPFL ("GPFL: Simultaneously Learning Global and Personalized Feature Information for Personalized
Federated Learning", Zhang et al., ICCV 2023, Sec. 4): a shared feature extractor, a Conditional
Valve (CoV) that turns its features into a global and a personalised version, a Global Category
Embedding layer (GCE) that guides the global features, and a personal head.

The model (raysim's parts): phi = extractor + filter (shared), f = phi(x) in R^d (d the filter's
output), the head (personal). GPFL's own modules, shared and carried beside the weights:

- GCE: an embedding e_c in R^d per class.
- CoV: gamma(v) and beta(v), each Linear(d, d) -> ReLU -> LayerNorm(d), applied to a conditional
  input v: CoV(f, v) = ReLU(f * (gamma(v) + 1) + beta(v)) (Eq. 3-4's feature-wise affine map).
- The conditional inputs, from the received GCE (fixed during the local update): the global
  g = (1/C) sum_c e_c and client i's personalised p_i = sum_c alpha_ic e_c, alpha_i its label
  distribution (Sec. 4.2).

Client i's loss on a batch (Eq. 8): cross-entropy of head(CoV(f, p_i)) (the personalised path);
plus the angle-level guidance, cross-entropy over the cosines between f_G = CoV(f, g) and every
e_c (Eq. 6); plus lambda ||f_G - e_y|| with e_y from the received GCE, frozen (the magnitude-level
guidance, Eq. 7; the norm over the batch as PFLlib computes it); plus mu/2 times the squared norm
of GCE's and CoV's parameters (weight decay mu on those two modules only, as the authors'
optimizers apply it: PFLlib's ``clientgpfl`` gives ``weight_decay=mu`` to its GCE and CoV optimizers
and none to the model's). Everything (phi, the head, GCE, CoV) trains together for E epochs; phi,
GCE and CoV are uploaded and averaged by training-set size, the head stays on the client's home
worker. (Before commit f29cda5 the mu term covered phi and the head too: a decay of 0.1 % a step on
the whole network. FedFCD's Table 1 rows ended at 88.23 (Pat) and 86.14 (Dir(0.1)) with it, and at
94.71 and 92.80 without it: docs/results/gpfl_fix.)

LM (personalised model) = head(CoV(phi(x), p_i)). GPFL defines no global model (``gm_*`` null).
A newcomer (``eval.new_clients``) takes phi, GCE and CoV as the federation shares them with the
initial head, and trains its head (the only personal part) on head(CoV(phi(x), p_i)) with
cross-entropy, for ``eval.new_client_epochs`` epochs (the guidance and the regulariser read only
the shared parts, which stay as received, as a shared-and-personal algorithm's newcomer does).

Where the paper is silent we follow the authors' ``clientgpfl``/``servergpfl`` (TsingZ0/PFLlib): the
magnitude-level term's norm, weight decay as the regulariser, and lambda = 0.01, mu = 0.1 (its
example settings). One difference: PFLlib computes the conditional inputs from the client's GCE
before it loads the received one; we use the received GCE, as Sec. 4.2 defines them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, Evaluation, lambda_setting, register
from raysim import rng
from raysim.config import setting
from raysim.toolkit.aggregate import weighted_mean
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext

SHARED = ("extractor", "filter")
PERSONAL = ("head",)


@dataclass(frozen=True)
class GPFLConfig:
    lam: float = lambda_setting(0.01, at_least=0)  # lambda: the magnitude-level guidance (``algo.lambda``)
    mu: float = setting(0.1, at_least=0)  # the regulariser: weight decay on GCE's and CoV's parameters


@dataclass(frozen=True)
class GPFLPayload:
    weights: ModelWeights  # phi (extractor and filter)
    modules: np.ndarray  # GCE and CoV, flattened (float32)
    lr: float


@dataclass(frozen=True)
class GPFLState:
    weights: ModelWeights
    modules: np.ndarray


def build_modules(dim: int, num_classes: int, seed: int) -> Any:
    """GCE and CoV as one torch module, initialised from ``seed``."""
    import torch
    from torch import nn

    class GPFLModules(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(num_classes, dim)
            self.gamma = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm([dim]))
            self.beta = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm([dim]))

        def valve(self, f: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            """CoV(f, v) = ReLU(f * (gamma(v) + 1) + beta(v))."""
            out: torch.Tensor = torch.relu(f * (self.gamma(v) + 1) + self.beta(v))
            return out

    from raysim.models import seeded_global_rng

    with seeded_global_rng(seed):
        return GPFLModules()


def flatten_modules(modules: Any) -> np.ndarray:
    from torch.nn.utils import parameters_to_vector

    out: np.ndarray = parameters_to_vector(modules.parameters()).detach().cpu().numpy().astype(np.float32)
    return out


def load_modules(modules: Any, flat: np.ndarray) -> None:
    """Copy ``flat`` into the modules' parameters (copied: the array may be the server's own, or
    a read-only object-store buffer)."""
    import torch

    offset = 0
    with torch.no_grad():
        for q in modules.parameters():
            n = q.numel()
            q.copy_(torch.from_numpy(np.asarray(flat[offset : offset + n])).view_as(q))
            offset += n
    if offset != flat.size:
        raise ValueError(f"GPFL's modules have {offset} parameters, the payload {flat.size}")


def conditional_inputs(
    embeddings: torch.Tensor, label_counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """g = the mean class embedding, p = the embeddings weighted by the label distribution."""
    alpha = label_counts.to(embeddings.dtype) / label_counts.sum()
    return embeddings.mean(dim=0), alpha @ embeddings


@register("gpfl")
class GPFL(Algorithm[GPFLState]):
    family = "split"
    Config = GPFLConfig
    has_global_model = False
    has_personal_model = True
    #: the client's p_i, set by :meth:`GPFLEvaluation.personal_model` for its forward pass
    _p: torch.Tensor

    def init(self, ctx: ServerContext) -> GPFLState:
        model = ctx.build_model()
        modules = build_modules(
            model.filter_dim, ctx.clients.num_classes, rng.int_seed(self.cfg.seed, "gpfl")
        )
        return GPFLState(ctx.init_weights.select(SHARED), flatten_modules(modules))

    def plan(self, state: GPFLState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = GPFLPayload(state.weights, state.modules, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: GPFLState, rnd: int, results: Sequence[JobResult]) -> GPFLState:
        finals = [jr.final for jr in results]
        sizes = [r.num_samples for r in finals]
        weights = weighted_mean([r.weights for r in finals if r.weights is not None], sizes)
        modules = np.zeros_like(state.modules, dtype=np.float64)
        for r, n in zip(finals, sizes, strict=True):  # in order, in float64: as weighted_mean
            modules += (n / sum(sizes)) * np.asarray(r.extra, dtype=np.float64)
        return GPFLState(weights, modules.astype(np.float32))

    def evaluation(self, state: GPFLState) -> Evaluation:
        return GPFLEvaluation(state)

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer trains a head under the shared parts (:meth:`GPFLEvaluation.newcomer_model`)."""
        return cfg.eval.new_clients > 0

    # ---------------------------------------------------------------------------------- client
    def worker_modules(self, ctx: ClientContext, flat: np.ndarray) -> Any:
        """This worker's GCE and CoV (built once), loaded with ``flat``."""
        if getattr(self, "_built", None) is None:
            self._built = build_modules(ctx.model.filter_dim, ctx.model.num_classes, 0).to(ctx.device)
        load_modules(self._built, flat)
        return self._built

    def _label_counts(self, ctx: ClientContext) -> torch.Tensor:
        import torch

        _, y = ctx.train_tensors()
        return torch.bincount(y, minlength=ctx.model.num_classes)

    def local_update(self, ctx: ClientContext, payload: GPFLPayload) -> ClientResult:
        import torch
        import torch.nn.functional as F

        ctx.load(payload.weights.merged(ctx.kept(PERSONAL)))
        mods = self.worker_modules(ctx, payload.modules)
        with torch.no_grad():
            frozen = mods.embedding.weight.detach().clone()  # the received GCE
            g, p = conditional_inputs(frozen, self._label_counts(ctx))
        lam, mu = self.params.lam, self.params.mu
        decayed = list(mods.parameters())  # GCE and CoV: the authors decay nothing else

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            f = model.filter(model.extractor(x))
            out = F.cross_entropy(model.head(mods.valve(f, p)), y)
            f_g = mods.valve(f, g)
            cosine = F.linear(F.normalize(f_g), F.normalize(mods.embedding.weight))
            out = out + F.cross_entropy(cosine, y)  # angle-level guidance
            out = out + lam * torch.linalg.vector_norm(f_g - frozen[y])  # magnitude-level guidance
            if mu > 0:
                out = out + (mu / 2) * sum(torch.sum(q * q) for q in decayed)
            return out

        stats = ctx.train((*SHARED, *PERSONAL), payload.lr, loss_fn=loss, extra=list(mods.parameters()))
        ctx.keep(ctx.weights(PERSONAL))
        return ctx.result(stats, weights=ctx.weights(SHARED), extra=flatten_modules(mods))


class GPFLEvaluation(Evaluation):
    """The server's :class:`GPFLState`; a client's personal model is phi with its own head, and
    predicts through this worker's CoV with the client's p_i."""

    payload: GPFLState

    def personal_model(self, algo: GPFL, ctx: ClientContext) -> SplitModel:
        """Loads phi, the client's head, and this worker's GCE/CoV with the client's p_i, which
        :meth:`forward` (called next, for the same client) predicts with."""
        import torch

        ctx.load(self.payload.weights.merged(ctx.kept(PERSONAL)))
        mods = algo.worker_modules(ctx, self.payload.modules)
        with torch.no_grad():
            _, algo._p = conditional_inputs(mods.embedding.weight, algo._label_counts(ctx))
        return ctx.model

    def newcomer_model(self, algo: GPFL, ctx: ClientContext) -> SplitModel:
        """A client held out of training: phi and this worker's GCE/CoV as shared, the initial head,
        its p_i from its label distribution; the head trained with cross-entropy on
        head(CoV(phi(x), p_i)) for ``eval.new_client_epochs`` (:func:`adapt_newcomer`). Its
        :meth:`forward` then predicts with that p_i."""
        import torch
        import torch.nn.functional as F

        from raysim.engine.evaluation import adapt_newcomer

        self.personal_model(algo, ctx)  # never trained: phi, GCE/CoV and p_i with the initial head
        mods, p = algo._built, algo._p

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():  # the shared parts as received: only the head trains
                z = mods.valve(model.filter(model.extractor(x)), p)
            return F.cross_entropy(model.head(z), y)

        return adapt_newcomer(algo, ctx, PERSONAL, loss)

    def newcomer_forward(self, algo: GPFL, model: SplitModel) -> Any:
        return self.forward(algo, model)

    def forward(self, algo: GPFL, model: SplitModel) -> Any:
        mods, p = algo._built, algo._p
        mods.eval()

        def forward(x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = model.head(mods.valve(model.filter(model.extractor(x)), p))
            return out

        return forward


__all__ = ["GPFL", "GPFLConfig", "build_modules", "conditional_inputs"]
