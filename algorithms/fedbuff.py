"""FedBuff (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek and Huba, "Federated Learning with Buffered
Asynchronous Aggregation", AISTATS 2022, Algorithm 1).

Clients train as FedAvg's (E epochs of SGD from the model they downloaded) and upload their update
Delta_k = w_start - w_k. Up to C clients train at once; the server keeps a buffer of arriving updates,
each scaled by a staleness weight s(tau_k) with tau_k the server steps since client k started (the
paper's polynomial choice 1/sqrt(1 + tau)), and after K of them it steps

    w <- w - eta_g (1/K) sum_k s(tau_k) Delta_k

and clears the buffer. raysim runs the concurrency, the buffer and the staleness (``deployment.mode=
async``, ``deployment.concurrency``, ``deployment.buffer``, ``deployment.staleness``; see
:mod:`raysim.engine.buffered`) for any algorithm whose aggregate is a weighted average, driven by
events as the paper's Algorithm 1 and the authors' simulator (FLSim) are: a client's place is
refilled the moment its update arrives, and the step fires at the K-th arrival; what is
FedBuff's own is the server step above, with the uniform 1/K mean over the buffer (not FedAvg's
weighting by data size) and the server learning rate eta_g (``algo.server_lr``). Each uploaded
update arrives rebased onto the current model, w'_k = w + s(tau_k) (w_k - w_start), so the step is
``w + eta_g mean_k (w'_k - w)``.

Defaults. The paper's hyperparameter tables could not be read here; the authors' own simulator
(FLSim, its Sent140 FedBuff example) uses a buffer of 10 with a server learning rate of 0.7 and server
momentum 0.9. We take the formula above as written (no momentum) with eta_g = 1, so that FedBuff with
every update fresh (K = C, tau = 0) is FedAvg with uniform weights; ``algo.server_lr`` and
``algo.server_momentum`` (heavy-ball momentum on the server step, m <- beta m + mean, w <- w + eta_g
m, FLSim's) set the authors' values. ``algo.server_opt=adam|yogi|adagrad`` (with ``beta1``, ``beta2``
and ``tau``) steps from the buffer's mean instead with FedOpt's adaptive optimisers (Reddi et al.,
ICLR 2021, Algorithm 2; :mod:`raysim.capabilities.server_opt`): FedBuff with Adam is this setting.
Any step beyond the mean's (another rate, momentum, an adaptive optimiser) moves parameters only: a
BatchNorm layer's running statistics take the buffer's mean. Its paper setup turns async mode on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from algorithms.base import register
from algorithms.fedavg import FedAvg, GlobalState
from raysim.capabilities.server_opt import OptSettings, keep_statistics, statistics_masks
from raysim.capabilities.server_opt import server_step as optimiser_step
from raysim.config import ExperimentConfig, setting
from raysim.errors import ConfigError
from raysim.registry import DatasetInfo
from raysim.setups import Source, Stated
from raysim.weights import ModelWeights, map_parts
from raysim.wire import JobResult, ServerContext


@dataclass(frozen=True)
class FedBuffConfig:
    server_lr: float = setting(1.0, above=0)  # eta_g
    server_momentum: float = setting(0.0, at_least=0, below=1)  # beta (0: the paper's plain step)
    #: sgd: the step above (with server_momentum); adam, yogi, adagrad: FedOpt's from the buffer's mean
    server_opt: Literal["sgd", "adam", "yogi", "adagrad"] = "sgd"
    beta1: float = setting(0.9, at_least=0, below=1)
    beta2: float = setting(0.99, at_least=0, below=1)
    tau: float = setting(1e-3, above=0)


@dataclass(frozen=True)
class BuffState(GlobalState):
    momentum: ModelWeights | None = None  # the server's momentum buffer (server_momentum > 0)


def server_step(
    current: ModelWeights, uploads: Sequence[ModelWeights], lr: float, beta: float, momentum: ModelWeights | None
) -> tuple[ModelWeights, ModelWeights | None]:
    """(w', m'): the mean of the (rebased) uploads' differences from ``current``, through the
    momentum if ``beta`` > 0, times ``lr``, added to ``current``."""
    return apply_update(current, mean_update(current, uploads), lr, beta, momentum)


def mean_update(current: ModelWeights, uploads: Sequence[ModelWeights]) -> ModelWeights:
    """The mean of the uploads' differences from ``current`` (summed in float64)."""

    def mean(w: np.ndarray, *ups: np.ndarray) -> np.ndarray:
        acc = np.zeros(w.shape, dtype=np.float64)
        for u in ups:
            acc += u.astype(np.float64) - w
        out: np.ndarray = (acc / len(ups)).astype(np.float32)
        return out

    return map_parts(mean, current, *uploads)


def apply_update(
    current: ModelWeights, update: ModelWeights, lr: float, beta: float, momentum: ModelWeights | None
) -> tuple[ModelWeights, ModelWeights | None]:
    """(w', m'): ``update`` through the momentum if ``beta`` > 0, times ``lr``, added to ``current``."""
    if beta > 0:
        update = update if momentum is None else map_parts(lambda m, u: (beta * m + u).astype(np.float32), momentum, update)
    step = map_parts(lambda w, u: (w.astype(np.float64) + lr * u.astype(np.float64)).astype(np.float32), current, update)
    return step, update if beta > 0 else None


@register("fedbuff")
class FedBuff(FedAvg):
    family = "global"
    Config = FedBuffConfig

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        return {"deployment.mode": "async"}

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        return {"deployment.mode": Stated("Algorithm 1: buffered asynchronous aggregation")}

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: FedBuffConfig) -> None:
        if cfg.deployment.mode != "async":
            raise ConfigError(
                "fedbuff aggregates asynchronously: it needs deployment.mode=async (its paper setup sets it; "
                "fedavg is the synchronous run)."
            )
        defaults = FedBuffConfig()
        if params.server_opt == "sgd":
            given = [k for k in ("beta1", "beta2", "tau") if getattr(params, k) != getattr(defaults, k)]
            if given:
                raise ConfigError(
                    f"fedbuff's algo.{given[0]} is an adaptive optimiser's: set algo.server_opt=adam, yogi or adagrad."
                )
        elif params.server_momentum != defaults.server_momentum:
            raise ConfigError(
                f"fedbuff's algo.server_momentum is the sgd step's; algo.server_opt={params.server_opt} keeps its own "
                "first moment (algo.beta1)."
            )

    def init(self, ctx: ServerContext) -> BuffState:
        p = self.params
        if p.server_opt != "sgd" or p.server_lr != 1.0 or p.server_momentum > 0:  # a step beyond the mean's
            self.statistics = statistics_masks(ctx, self.shared_parts)
        return BuffState(ctx.init_weights.select(self.shared_parts))

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> BuffState:
        assert isinstance(state, BuffState)
        uploads = [jr.final.weights for jr in results if jr.final.weights is not None]
        p = self.params
        update = mean_update(state.weights, uploads)
        if p.server_opt != "sgd":  # FedOpt's step from the buffer's uniform mean
            mean, _ = apply_update(state.weights, update, 1.0, 0.0, None)
            opt = OptSettings(p.server_opt, p.server_lr, 0.0, p.beta1, p.beta2, p.tau)
            weights, state_opt = optimiser_step(state.weights, mean, state.opt, opt, self.statistics)
            return BuffState(weights, state_opt)
        weights, momentum = apply_update(state.weights, update, p.server_lr, p.server_momentum, state.momentum)
        if self.statistics:  # BatchNorm running statistics: the buffer's mean itself, not stepped
            weights = keep_statistics(weights, apply_update(state.weights, update, 1.0, 0.0, None)[0], self.statistics)
        return BuffState(weights, momentum=momentum)


__all__ = ["BuffState", "FedBuff", "FedBuffConfig", "apply_update", "mean_update", "server_step"]
