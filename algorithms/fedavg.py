"""FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized
Data", Algorithm 1): sampled clients train the whole model from the global weights for E epochs; the
server averages the uploads weighted by training-set size, w <- sum_k n_k/n * w_k.

The server may step from that average with an optimiser (``algo.server_opt``,
:mod:`raysim.capabilities.server_opt`): FedAvgM (Hsu, Qi and Brown 2019) and FedAdam, FedYogi and
FedAdagrad (Reddi et al., ICLR 2021) are registered here with their defaults; every algorithm built
on :class:`AveragedWeights` takes the setting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from algorithms.base import Algorithm, Evaluation, register
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching, train_received
from raysim.capabilities.finetune import FineTune
from raysim.capabilities.presum import Presum
from raysim.capabilities.regularizers import Regularizable
from raysim.capabilities.server_opt import DEFAULTS, OptState, ServerOptimizer, server_step, statistics_masks
from raysim.toolkit.aggregate import average_uploads
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext, WeightsPayload

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class GlobalState:
    weights: ModelWeights  # the shared parts (FedAvg: extractor, filter, head)
    opt: OptState | None = None  # the server optimiser's state (algo.server_opt other than FedAvg's)


def train_global_parts(
    ctx: ClientContext, payload: WeightsPayload, objective: Callable[[], LossFn] | None = None
) -> ClientResult:
    """FedAvg's client step: start from the received extractor, filter and head, train them for E
    epochs, upload them. The loss is ``objective()`` (cross-entropy on the global path by default),
    asked for once the received weights are loaded, so that it may read them (FedProx's w^t)."""
    from raysim.toolkit.train import cross_entropy

    ctx.load(payload.weights)
    stats = ctx.train(GLOBAL_PARTS, payload.lr, loss_fn=objective() if objective else cross_entropy)
    return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))


class AveragedWeights(Algorithm[GlobalState]):
    """FedAvg's server side, shared by the algorithms built on it (FedProx, Ditto and the
    shared/personal family): the weights of ``shared_parts`` start from the seeded model, go to
    every sampled client in a job of its own (on the client's home worker when ``pinned``, where
    its personal state lives) and come back averaged by training-set size. With no shared parts
    nothing is sent or averaged (Local)."""

    example_privacy: ClassVar[str | None] = None  # raysim.privacy.dp_sgd

    shared_parts: tuple[str, ...] = GLOBAL_PARTS
    pinned = False
    #: deployment.mode=async: every client starts from the shared weights, averaged back
    asynchronous = Asynchronous()
    #: the aggregate is the size-weighted mean of every upload: the Ray executor may sum a round's
    #: uploads on the workers (in the cross-device regime: raysim.capabilities.presum)
    presum = Presum()
    #: algo.server_opt: the server steps from the average with an optimiser (FedAvg's own by default)
    server_opt = ServerOptimizer()

    #: each shared part's BatchNorm running-statistics entries, which a server optimiser leaves at
    #: the average (:func:`raysim.capabilities.server_opt.statistics_masks`; None without BatchNorm
    #: or with FedAvg's own step)
    statistics: Mapping[str, np.ndarray] | None = None

    def init(self, ctx: ServerContext) -> GlobalState:
        self.note_statistics(ctx)
        return GlobalState(ctx.init_weights.select(self.shared_parts))

    def note_statistics(self, ctx: ServerContext) -> None:
        """Where a server optimiser steps the average (``algo.server_opt`` other than FedAvg's own),
        which of the shared entries are a BatchNorm layer's running statistics (:attr:`statistics`)."""
        if ServerOptimizer.applies(self) and not ServerOptimizer.of(self).settings(self.cfg, self).plain:
            self.statistics = statistics_masks(ctx, self.shared_parts)

    def started_from(self, state: GlobalState) -> ModelWeights:
        """The shared weights a client starting now downloads (an async update is rebased from them)."""
        return state.weights

    def plan(self, state: GlobalState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = WeightsPayload(state.weights, self.lr(rnd))
        return [Job((c,), payload, pinned=self.pinned) for c in sampled]

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> GlobalState:
        if not self.shared_parts:
            return state
        average = average_uploads(results)
        opt = ServerOptimizer.of(self).settings(self.cfg, self)
        if opt.plain:  # FedAvg's step: the average itself
            return GlobalState(average)
        return GlobalState(*server_step(state.weights, average, state.opt, opt, self.statistics))

    def evaluation(self, state: GlobalState) -> Evaluation:
        return Evaluation(state.weights)


@register("fedavg")
class FedAvg(AveragedWeights):
    family = "global"
    finetune = FineTune()  # FedAvg-FT with algo.ft_epochs (and FedProx, FedNTD, FedExP)
    regularizers = Regularizable()  # e.g. FedAvg+FD with algo.regularizers=[fd]
    batching = Batching()  # (and FedProx, FedNTD, FedExP): every client's loss is the payload's

    def loss_fn(self, ctx: ClientContext, payload: WeightsPayload) -> LossFn:
        """The local objective, made with the received weights loaded in ``ctx.model`` (FedProx
        adds its proximal term to them here)."""
        from raysim.toolkit.train import cross_entropy

        return cross_entropy

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        return train_global_parts(
            ctx, payload, lambda: self.regularizers.wrap(self.cfg, ctx, payload.weights, GLOBAL_PARTS, self.loss_fn(ctx, payload))
        )

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[WeightsPayload]) -> list[ClientResult]:
        """:meth:`local_update` for each of ``ctxs``, trained together: the loss depends only on
        the received weights, so one loss serves every client of one payload."""
        return train_received(self, ctxs, payloads, GLOBAL_PARTS, self.loss_fn)


@register("fedavgm")
class FedAvgM(FedAvg):
    """FedAvgM (Hsu, Qi and Brown 2019, Sec. 3): FedAvg with server momentum beta = 0.9 at rate 1."""
    family = "global"

    server_opt = DEFAULTS["sgdm"]


@register("fedadam")
class FedAdam(FedAvg):
    """FedAdam (Reddi et al., ICLR 2021, Algorithm 2): eta 10^-2.5, beta1 0.9, beta2 0.99, tau 1e-4."""
    family = "global"

    server_opt = DEFAULTS["adam"]


@register("fedyogi")
class FedYogi(FedAvg):
    """FedYogi (Reddi et al., ICLR 2021, Algorithm 2): eta 10^-2.5, beta1 0.9, beta2 0.99, tau 1e-4."""
    family = "global"

    server_opt = DEFAULTS["yogi"]


@register("fedadagrad")
class FedAdagrad(FedAvg):
    """FedAdagrad (Reddi et al., ICLR 2021, Algorithm 2): eta 0.1, beta1 0.9, tau 1e-2."""
    family = "global"

    server_opt = DEFAULTS["adagrad"]


__all__ = [
    "AveragedWeights",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedYogi",
    "GlobalState",
    "train_global_parts",
]
