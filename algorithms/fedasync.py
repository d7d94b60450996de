"""FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019, Algorithm 1): the
server mixes each update into the global model the moment it arrives.

Worker (Algorithm 1, its "Option II"): from the model x_tau it downloaded, SGD on the regularised
local objective g(x) = f(x) + rho/2 ||x - x_tau||^2 (FedProx's proximal term with mu = rho,
``algo.rho``), for E epochs. Server (Algorithm 1, Eq. for x_t): on receiving x_new, trained from
the model of step tau, with the staleness t - tau,

    alpha_t = alpha * s(t - tau),    x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new

with the mixing hyperparameter alpha (``algo.alpha``) and the staleness function s
(``deployment.staleness``: constant; polynomial:A, s = (t - tau + 1)^-A; hinge:A:B, s = 1 while
t - tau <= B, else 1 / (A (t - tau - B) + 1); Sec. 5.2). Unlike FedBuff's, the mixing uses the
upload itself, not its difference from the model it started from, so FedAsync declares
``Asynchronous(rebase=False)``: the server hands it the uploads as trained, each with its staleness.

raysim runs FedAsync in async mode with a buffer of one (``deployment.buffer=1``, set by its paper
setup with ``deployment.mode=async``): every arrival is a server step. The paper's scheduler
triggers workers at random; raysim keeps ``deployment.concurrency`` clients in flight, as FedBuff's
simulation does, each freed place refilled at the arrival's time (raysim.engine.buffered). The
defaults alpha = 0.6 and rho = 0.01 are ours, inside the ranges the paper's experiments use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from algorithms.base import register
from algorithms.fedavg import GlobalState
from algorithms.fedprox import FedProx
from raysim.capabilities.asynchronous import Asynchronous, Staleness
from raysim.config import ExperimentConfig, setting
from raysim.errors import ConfigError
from raysim.registry import DatasetInfo
from raysim.setups import Source, Stated
from raysim.weights import ModelWeights, map_parts
from raysim.wire import JobResult


@dataclass(frozen=True)
class FedAsyncConfig:
    alpha: float = setting(0.6, above=0, at_most=1)  # the mixing hyperparameter
    rho: float = setting(0.01, at_least=0)  # the proximal term's weight in the local objective

    @property
    def mu(self) -> float:
        """FedProx's name for rho: the local objective is FedProx's."""
        return self.rho


def mix(current: ModelWeights, upload: ModelWeights, alpha_t: float) -> ModelWeights:
    """(1 - alpha_t) current + alpha_t upload, part by part, in float64, as float32."""
    return map_parts(
        lambda w, x: ((1.0 - alpha_t) * w.astype(np.float64) + alpha_t * x.astype(np.float64)).astype(
            np.float32
        ),
        current,
        upload,
    )


@register("fedasync")
class FedAsync(FedProx):
    family = "global"
    Config = FedAsyncConfig  # type: ignore[assignment]
    asynchronous = Asynchronous(rebase=False)

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        return {"deployment.mode": "async", "deployment.buffer": 1}

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        return {
            "deployment.mode": Stated("Algorithm 1: asynchronous updates"),
            "deployment.buffer": Stated("Algorithm 1: every arriving model updates the global one"),
        }

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: FedAsyncConfig) -> None:
        d = cfg.deployment
        if d.mode != "async":
            raise ConfigError(
                "fedasync mixes each update in as it arrives: it needs deployment.mode=async and deployment.buffer=1 "
                "(its paper setup sets both)."
            )
        if d.buffer != 1:
            raise ConfigError(
                f"fedasync mixes each update in as it arrives, so it needs deployment.buffer=1, not {d.buffer} "
                "(fedbuff aggregates a buffer of K)."
            )

    def __init__(self, cfg: ExperimentConfig, params: FedAsyncConfig) -> None:
        super().__init__(cfg, params)
        self.staleness = Staleness.parse(cfg.deployment.staleness)

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> GlobalState:
        weights = state.weights
        for jr in results:  # one a step (a buffer of one)
            upload = jr.final.weights
            if upload is not None:
                weights = mix(weights, upload, self.params.alpha * self.staleness(jr.staleness))
        return GlobalState(weights)


__all__ = ["FedAsync", "FedAsyncConfig", "mix"]
