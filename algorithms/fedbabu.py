"""FedBABU ("FedBABU: Toward Enhanced Representation for Federated Image Classification", Oh, Kim
and Yun, ICLR 2022), a baseline of FedDr+ (seed 004): the head is randomly initialised (seeded, the
same everywhere) and frozen during federated training; only the body (``extractor``, ``filter``) is
trained with cross-entropy and averaged by training-set size. FedBABU-FT: after the last round
each client fine-tunes the whole global model (body and head) on its own data for ``ft_epochs``
(default E) at ``ft_lr`` (default the initial rate); ``lm_ptest`` at the last round reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from algorithms.base import Algorithm, ClientResult, Job, JobResult, ServerContext, WeightsPayload, register
from algorithms.feddrplus import GlobalEval, fine_tune
from raysim.aggregate import weighted_mean
from raysim.errors import ConfigError
from raysim.weights import BODY, set_weights

if TYPE_CHECKING:
    from raysim.client import ClientContext
    from raysim.models import SplitModel


@dataclass(frozen=True)
class FedBABUConfig:
    ft_epochs: int | None = None  # None: the local epochs E
    ft_lr: float | None = None  # None: the initial learning rate


@register("fedbabu")
class FedBABU(Algorithm[GlobalEval]):
    Config = FedBABUConfig
    has_global_model = True
    has_personal_model = True

    @classmethod
    def check(cls, cfg: Any, params: FedBABUConfig) -> None:
        if params.ft_epochs is not None and params.ft_epochs < 0:
            raise ConfigError(f"FedBABU's ft_epochs must be >= 0, not {params.ft_epochs}.")

    def init(self, ctx: ServerContext) -> GlobalEval:
        return GlobalEval(ctx.init_weights.select((*BODY, "head")), self.cfg.rounds == 0)

    def plan(self, state: GlobalEval, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = WeightsPayload(state.weights, self.lr(rnd))
        return [Job((c,), payload) for c in sampled]

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        ctx.load(payload.weights)
        stats = ctx.train(BODY, payload.lr)  # cross-entropy, the head frozen
        return ctx.result(stats, weights=ctx.weights(BODY))

    def aggregate(self, state: GlobalEval, rnd: int, results: Sequence[JobResult]) -> GlobalEval:
        finals = [jr.final for jr in results]
        body = weighted_mean(
            [r.weights for r in finals if r.weights is not None], [r.num_samples for r in finals]
        )
        return GlobalEval(body.merged(state.weights.select(("head",))), rnd >= self.cfg.rounds)

    def eval_payload(self, state: GlobalEval) -> GlobalEval:
        return state

    def global_model(self, model: SplitModel, eval_payload: GlobalEval) -> SplitModel:
        set_weights(model, eval_payload.weights)
        return model

    def personal_model(self, ctx: ClientContext, eval_payload: GlobalEval) -> SplitModel | None:
        from raysim.train import cross_entropy

        if not eval_payload.final:
            return None
        p = self.params
        epochs = self.cfg.train.local_epochs if p.ft_epochs is None else p.ft_epochs
        lr = self.cfg.train.lr if p.ft_lr is None else p.ft_lr
        return fine_tune(ctx, eval_payload.weights, (*BODY, "head"), epochs, lr, cross_entropy)


__all__ = ["FedBABU", "FedBABUConfig"]
