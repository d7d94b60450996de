"""FedProto ("FedProto: Federated Prototype Learning across Heterogeneous Clients", Tan et al.,
AAAI 2022), a baseline of the FedFCD paper (seed 003), as the reference implementation that paper's
comparisons come from (PFLlib) runs it: only class prototypes travel; every model stays personal.

- Each client keeps its whole model (body and ``head``) on its home worker and trains it for E epochs
  on CE + lambda * (1/d) ||z - C_bar^(y)||^2 (classes without a global prototype add nothing).
- It uploads its class prototypes C_i^(j) (class means of z under its trained body) and counts.
- Server: C_bar^(j) = the unweighted mean of the round's C_i^(j) over the clients holding class j.
- LM: with ``predict="proto"`` (default) a sample goes to the nearest global prototype,
  argmin_j ||z - C_bar^(j)||; ``predict="head"`` uses the client's own head. No global model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, ClientResult, Job, JobResult, ServerContext, register
from raysim.errors import ConfigError
from raysim.prototypes import plain_means
from raysim.weights import BODY, ModelWeights

if TYPE_CHECKING:
    import torch

    from raysim.client import ClientContext
    from raysim.models import SplitModel

OWN_PARTS = (*BODY, "head")


@dataclass(frozen=True)
class FedProtoConfig:
    lam: float = 1.0  # lambda of the prototype term (``algo.lambda``)
    predict: str = "proto"  # proto: nearest global prototype | head: the client's own head


@dataclass(frozen=True)
class ProtoPayload:
    protos: np.ndarray  # (C, d) global prototypes (d = 0 before the first round)
    mask: np.ndarray  # (C,) classes that have one
    lr: float


@dataclass(frozen=True)
class ProtoUpload:
    means: np.ndarray  # (C, d)
    counts: np.ndarray  # (C,)


@dataclass(frozen=True)
class ProtoState:
    rnd: int
    protos: np.ndarray
    mask: np.ndarray


@dataclass(frozen=True)
class OwnModel:
    weights: ModelWeights  # the client's whole model: extractor, filter, head


def own_model(ctx: ClientContext) -> ModelWeights:
    """The client's personal model, or the seeded initial one before its first round."""
    state: OwnModel | None = ctx.state
    return state.weights if state is not None else ctx.initial_weights.select(OWN_PARTS)


def upload_class_means(ctx: ClientContext) -> tuple[np.ndarray, np.ndarray]:
    """The class means of z under the model now loaded, over the client's training set, and counts."""
    from raysim.features import class_means, extract_features

    x, y = ctx.train_tensors()
    cm = class_means(extract_features(ctx.model, x), y, ctx.model.num_classes)
    return cm.means, cm.counts


@register("fedproto")
class FedProto(Algorithm[ProtoState]):
    Config = FedProtoConfig
    has_global_model = False
    has_personal_model = True
    aliases = {"lambda": "lam"}

    @classmethod
    def check(cls, cfg: Any, params: FedProtoConfig) -> None:
        if params.lam < 0:
            raise ConfigError(f"FedProto's lambda must be >= 0, not {params.lam}.")
        if params.predict not in ("proto", "head"):
            raise ConfigError(f"FedProto's predict is 'proto' or 'head', not {params.predict!r}.")

    def init(self, ctx: ServerContext) -> ProtoState:
        c = ctx.clients.num_classes
        return ProtoState(0, np.zeros((c, 0), np.float32), np.zeros(c, bool))

    def plan(self, state: ProtoState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = ProtoPayload(state.protos, state.mask, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: ProtoState, rnd: int, results: Sequence[JobResult]) -> ProtoState:
        ups: list[ProtoUpload] = [r.extra for jr in results for r in jr.results]
        protos, mask = plain_means(np.stack([u.means for u in ups]), np.stack([u.counts for u in ups]))
        return ProtoState(rnd, protos, mask)

    def eval_payload(self, state: ProtoState) -> ProtoPayload:
        return ProtoPayload(state.protos, state.mask, 0.0)

    def local_update(self, ctx: ClientContext, payload: ProtoPayload) -> ClientResult:
        import torch
        import torch.nn.functional as F

        from raysim.features import alignment_loss, representation

        ctx.load(own_model(ctx))
        use = self.params.lam > 0 and payload.protos.shape[1] > 0
        protos = torch.from_numpy(payload.protos).to(ctx.device) if use else None
        mask = torch.from_numpy(payload.mask).to(ctx.device) if use else None

        def loss_fn(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = representation(model, x)
            loss = F.cross_entropy(model.head(z), y)
            if protos is not None and mask is not None:
                loss = loss + self.params.lam * alignment_loss(z, y, protos, mask)
            return loss

        stats = ctx.train(OWN_PARTS, payload.lr, loss_fn=loss_fn)
        ctx.set_state(OwnModel(ctx.weights(OWN_PARTS)))
        means, counts = upload_class_means(ctx)
        return ctx.result(stats, extra=ProtoUpload(means, counts))

    def personal_model(self, ctx: ClientContext, eval_payload: ProtoPayload) -> SplitModel:
        ctx.load(own_model(ctx))
        return ctx.model

    def personal_forward(self, model: SplitModel, eval_payload: Any = None) -> Any:
        if self.params.predict == "head" or eval_payload is None or eval_payload.protos.shape[1] == 0:
            return model
        import torch

        from raysim.features import representation

        def nearest_prototype(x: torch.Tensor) -> torch.Tensor:
            z = representation(model, x)
            protos = torch.from_numpy(eval_payload.protos).to(z.device)
            mask = torch.from_numpy(eval_payload.mask).to(z.device)
            score = -(torch.cdist(z, protos) ** 2)  # the nearest prototype scores highest
            return score.masked_fill(~mask, float("-inf"))

        return nearest_prototype


__all__ = ["FedProto", "FedProtoConfig", "own_model", "upload_class_means"]
