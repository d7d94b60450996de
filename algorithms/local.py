"""Local training: every client trains its own model on its own data and nothing is communicated.
The lower bound of personalisation baselines (e.g. Fed3+2p and FedPAC's "Local"). Only ``lm_ptest``
applies. All clients start from the same seeded initial model, built on each worker from the seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from algorithms.base import Algorithm, ClientResult, Job, JobResult, ServerContext, register
from raysim.weights import GLOBAL_PARTS, ModelWeights

if TYPE_CHECKING:
    from raysim.client import ClientContext
    from raysim.models import SplitModel


@dataclass(frozen=True)
class LocalPayload:
    lr: float


@register("local")
class Local(Algorithm[None]):
    has_global_model = False
    has_personal_model = True

    def init(self, ctx: ServerContext) -> None:
        return None

    def plan(self, state: None, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = LocalPayload(self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def _own_weights(self, ctx: ClientContext) -> ModelWeights:
        own: ModelWeights | None = ctx.state
        return own if own is not None else ctx.initial_weights.select(GLOBAL_PARTS)

    def local_update(self, ctx: ClientContext, payload: LocalPayload) -> ClientResult:
        ctx.load(self._own_weights(ctx))
        stats = ctx.train(GLOBAL_PARTS, payload.lr)
        ctx.set_state(ctx.weights(GLOBAL_PARTS))
        return ctx.result(stats)

    def aggregate(self, state: None, rnd: int, results: Sequence[JobResult]) -> None:
        return None

    def personal_model(self, ctx: ClientContext, eval_payload: None) -> SplitModel:
        ctx.load(self._own_weights(ctx))
        return ctx.model
