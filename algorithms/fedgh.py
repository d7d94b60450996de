"""FedGH ("FedGH: Heterogeneous Federated Learning with Generalized Global Header", Yi et al., ACM MM
2023), a baseline of the FedFCD paper (seed 003), as the reference implementation that paper's
comparisons come from (PFLlib) runs it.

- Each client keeps its body (``extractor``, ``filter``) on its home worker. Every round it replaces
  its head with the received global head, trains body and head for E epochs with cross-entropy, and
  uploads the class means of z under its trained body (the local averaged representations) with counts.
- Server: SGD with cross-entropy on the global head over the round's (class mean, label) pairs
  (``server_lr``, ``server_epochs`` passes in mini-batches of B), as FedFCD's server does.
- LM = the client's body with the current global head. No global extractor (``gm_*`` null).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, ClientResult, Job, JobResult, ServerContext, register, server_model
from algorithms.fedfcd import train_global_head
from algorithms.fedproto import ProtoUpload, upload_class_means
from raysim.errors import ConfigError
from raysim.weights import BODY, ModelWeights

if TYPE_CHECKING:
    from raysim.client import ClientContext
    from raysim.models import SplitModel


@dataclass(frozen=True)
class FedGHConfig:
    server_lr: float = 0.01
    server_epochs: int = 1  # passes over the round's uploaded pairs


@dataclass(frozen=True)
class HeadPayload:
    head: ModelWeights  # the global head
    lr: float


@dataclass(frozen=True)
class GHState:
    rnd: int
    head: ModelWeights


@dataclass(frozen=True)
class OwnBody:
    weights: ModelWeights  # extractor, filter


@register("fedgh")
class FedGH(Algorithm[GHState]):
    Config = FedGHConfig
    has_global_model = False
    has_personal_model = True

    @classmethod
    def check(cls, cfg: Any, params: FedGHConfig) -> None:
        if params.server_epochs < 0 or params.server_lr <= 0:
            raise ConfigError("FedGH's server_epochs must be >= 0 and server_lr > 0.")

    def init(self, ctx: ServerContext) -> GHState:
        self._model = server_model(ctx)
        return GHState(0, ctx.init_weights.select(("head",)))

    def plan(self, state: GHState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = HeadPayload(state.head, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: GHState, rnd: int, results: Sequence[JobResult]) -> GHState:
        ups: list[ProtoUpload] = [r.extra for jr in results for r in jr.results]
        means, counts = np.stack([u.means for u in ups]), np.stack([u.counts for u in ups])
        head = train_global_head(self, self._model, state.head, means, counts, "fedgh/server", rnd)
        return GHState(rnd, head)

    def eval_payload(self, state: GHState) -> ModelWeights:
        return state.head

    def _body(self, ctx: ClientContext) -> ModelWeights:
        state: OwnBody | None = ctx.state
        return state.weights if state is not None else ctx.initial_weights.select(BODY)

    def local_update(self, ctx: ClientContext, payload: HeadPayload) -> ClientResult:
        ctx.load(self._body(ctx).merged(payload.head))  # the local head replaced by the global one
        stats = ctx.train((*BODY, "head"), payload.lr)
        ctx.set_state(OwnBody(ctx.weights(BODY)))
        means, counts = upload_class_means(ctx)
        return ctx.result(stats, extra=ProtoUpload(means, counts))

    def personal_model(self, ctx: ClientContext, eval_payload: ModelWeights) -> SplitModel:
        ctx.load(self._body(ctx).merged(eval_payload))
        return ctx.model


__all__ = ["FedGH", "FedGHConfig"]
