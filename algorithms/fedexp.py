"""FedExP ("FedExP: Speeding Up Federated Averaging via Extrapolation", Jhunjhunwala, Wang and Joshi,
ICLR 2023, Algorithm 1), a baseline of FedDr+ (Tables 1-2).

Clients train as FedAvg's. The server extrapolates along the round's mean update with a step size
from the clients' updates themselves (Eq. 9, the POCS view of Sec. 4):

    Delta_i = w^t - w_i,  Delta = sum_i p_i Delta_i,
    eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + epsilon))),
    w^{t+1} = w^t - eta_g Delta,

with p_i the training-set share of client i among the round's clients (the paper writes 1/M for M
equal clients; the authors' code weighs by data size, as FedAvg here does), so eta_g = 1 is FedAvg's
step and eta_g >= 1 always. ``epsilon`` (default 0.001, FedDr+'s Tables 6-7 and the authors' CIFAR
setting) keeps the step bounded when the clients' updates cancel. The iterates oscillate, so the
global model evaluated after round t >= 2 is the mean of the last two iterates,
(w^t + w^{t-1}) / 2 (Sec. 5, as the authors' code evaluates), while w^t is what the clients receive.
The norms and the extrapolation run over the model's parameters; a BatchNorm layer's running
statistics (estimates, not parameters: extrapolated, a running variance could turn negative) take
the round's mean of the uploads, as FedAvg's. The authors' models use GroupNorm, whose entries are
all parameters.

Where the authors' code differs from the paper's formula: it adds M * epsilon (not epsilon) to
||Delta||^2 and decays epsilon by the square of the learning-rate decay each round; we follow the
paper. Per round, ``fedexp_eta_g`` is logged (metrics table and TensorBoard).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from algorithms.base import Evaluation, register
from algorithms.fedavg import FedAvg, GlobalState
from raysim.capabilities.round_log import RoundLog
from raysim.capabilities.server_opt import keep_statistics, statistics_masks
from raysim.config import setting
from raysim.toolkit.aggregate import apply_updates, subtract, weighted_mean
from raysim.weights import ModelWeights, map_parts
from raysim.wire import JobResult, ServerContext


@dataclass(frozen=True)
class FedExPConfig:
    epsilon: float = setting(0.001, at_least=0)


@dataclass(frozen=True)
class ExPState(GlobalState):
    previous: ModelWeights | None = None  # w^{t-1}, for the evaluated mean of the last two iterates
    eta_g: float = 1.0  # the last round's server step size


def squared_norm(w: ModelWeights, statistics: Mapping[str, np.ndarray] | None = None) -> float:
    """||w||^2 over every entry but those ``statistics`` marks (running statistics)."""
    total = 0.0
    for name, a in w.items():
        a = a.astype(np.float64)
        if statistics is not None and name in statistics:
            a = a[~statistics[name]]
        total += float(np.dot(a, a))
    return total


def extrapolation_step(
    current: ModelWeights,
    uploads: Sequence[ModelWeights],
    sizes: Sequence[float],
    epsilon: float,
    statistics: Mapping[str, np.ndarray] | None = None,
) -> tuple[ModelWeights, float]:
    """(w^{t+1}, eta_g) from w^t and the round's uploads w_i with their training-set sizes; the
    entries ``statistics`` marks (BatchNorm running statistics) count in no norm and take the mean
    of the uploads, unextrapolated."""
    p = np.asarray(sizes, dtype=np.float64) / float(np.sum(sizes))
    mean = weighted_mean(uploads, list(p))
    spread = sum(pi * squared_norm(subtract(current, w), statistics) for pi, w in zip(p, uploads, strict=True))
    delta = subtract(current, mean)
    eta_g = max(1.0, spread / (2.0 * (squared_norm(delta, statistics) + epsilon)))
    return keep_statistics(apply_updates(current, [delta], [eta_g]), mean, statistics), eta_g


@register("fedexp")
class FedExP(FedAvg):
    """FedAvg's clients; the server's extrapolated step (its state is an :class:`ExPState`)."""
    family = "global"

    Config = FedExPConfig
    round_log = RoundLog()

    def init(self, ctx: ServerContext) -> ExPState:
        self.statistics = statistics_masks(ctx, self.shared_parts)
        return ExPState(ctx.init_weights.select(self.shared_parts))

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> ExPState:
        finals = [jr.final for jr in results]
        uploads = [r.weights for r in finals if r.weights is not None]
        if len(uploads) != len(finals):
            raise ValueError("every FedExP client uploads its weights")
        new, eta_g = extrapolation_step(
            state.weights, uploads, [r.num_samples for r in finals], self.params.epsilon, self.statistics
        )
        return ExPState(new, previous=state.weights if rnd > 1 else None, eta_g=eta_g)

    def evaluation(self, state: GlobalState) -> Evaluation:
        assert isinstance(state, ExPState)
        if state.previous is None:
            return Evaluation(state.weights)
        return Evaluation(
            map_parts(
                lambda a, b: ((a.astype(np.float64) + b) / 2).astype(np.float32), state.weights, state.previous
            )
        )

    def round_scalars(self, state: GlobalState, rnd: int) -> dict[str, float]:
        assert isinstance(state, ExPState)
        return {"fedexp_eta_g": state.eta_g}


__all__ = ["FedExP", "FedExPConfig", "extrapolation_step"]
