"""A toy chain algorithm for the engine tests: the sampled clients form one chain (in the sampled
order, or reversed) trained one after another on one model. Its clients are pinned to their home
workers, so under Ray a chain crosses workers and its weights pass worker to worker as ObjectRefs.
The server checks on the weights that each client started from the one before it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from algorithms.fedavg import FedAvg, GlobalState
from raysim.capabilities.round_log import RoundLog
from raysim.toolkit.context import ClientContext
from raysim.weights import GLOBAL_PARTS
from raysim.wire import ClientResult, Job, JobResult, WeightsPayload


@dataclass(frozen=True)
class ChainToyConfig:
    reverse: bool = False


@dataclass(frozen=True)
class StartedFrom:
    weights: object  # the ModelWeights the client loaded


class ChainToy(FedAvg):
    Config = ChainToyConfig
    round_log = RoundLog()

    def __init__(self, cfg, params):
        super().__init__(cfg, params)
        self.links_checked = 0

    def plan(self, state: GlobalState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        order = tuple(reversed(sampled)) if self.params.reverse else tuple(sampled)
        return [Job(order, WeightsPayload(state.weights, self.lr(rnd)), pinned=True)]

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        ctx.load(payload.weights)
        start = ctx.weights(GLOBAL_PARTS)
        stats = ctx.train(GLOBAL_PARTS, payload.lr)
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS), extra=StartedFrom(start))

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> GlobalState:
        (job,) = results
        assert [r.client for r in job.results] == list(job.job.clients)
        assert job.results[0].extra.weights.equals(state.weights)
        for before, after in zip(job.results, job.results[1:], strict=False):
            assert after.extra.weights.equals(before.weights), "a link did not start from the previous one"
            assert not np.array_equal(after.weights.head, before.weights.head)
            self.links_checked += 1
        return GlobalState(job.final.weights)

    def round_scalars(self, state: GlobalState, rnd: int) -> dict[str, float]:
        return {"links_checked": float(self.links_checked)}
