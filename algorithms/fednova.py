"""FedNova ("Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization",
Wang, Liu, Liang, Joshi and Poor, NeurIPS 2020, Sec. 4, Eq. 6-7): normalised averaging, for clients
that take different numbers of local steps.

FedAvg weighs each client's change by its data share p_i whatever the number of local steps tau_i it
took, so a client that took more steps (more data at a fixed E, or a faster device) pulls the
global model towards its own objective: the global model then minimises an inconsistent, tau-weighted
objective (Theorem 1). FedNova divides each client's change by its step count's weight a_i,

    d_i = (x - y_i) / a_i,    x <- x - tau_eff sum_i p_i d_i,    tau_eff = sum_i p_i a_i,

with p_i = n_i / sum_j n_j over the round's clients (Eq. 6-7 with the paper's default tau_eff). With
plain SGD a_i = tau_i, the steps the client took (``ClientResult.extra``); with heavy-ball momentum
rho (``train.momentum``, PyTorch's form: buf <- rho buf + g) a_i = [tau_i - rho (1 - rho^tau_i) /
(1 - rho)] / (1 - rho), the sum over its steps of each gradient's total weight in the change (the
paper's App. C.3). Weight decay is left out of a_i (the paper's analysis has none). With every
client taking the same number of steps it is FedAvg, to rounding; under a deployment's partial work
(``deployment.completeness=uniform:F``: each client completes a random share of its steps) the
clients' tau_i differ and the normalisation matters, which is the case it was written for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from algorithms.base import register
from algorithms.fedavg import FedAvg, GlobalState
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, JobResult, WeightsPayload

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class NovaSteps:
    """What a FedNova client reports beside its weights: its local steps tau_i and their weight a_i."""

    steps: int
    a: float


def step_weight(steps: int, momentum: float) -> float:
    """a_i for ``steps`` local steps of SGD with heavy-ball ``momentum`` rho (rho = 0: the steps)."""
    if momentum == 0 or steps == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


@register("fednova")
class FedNova(FedAvg):
    """FedAvg's clients, each reporting its steps; the server's normalised average."""
    family = "global"

    batching = Batching(
        why_not="each client reports the local steps it took, which its own training loop counts."
    )
    asynchronous = Asynchronous(
        why_not="its server normalises each round's changes against one another's step counts."
    )

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        ctx.load(payload.weights)
        loss = self.regularizers.wrap(self.cfg, ctx, payload.weights, GLOBAL_PARTS, self.loss_fn(ctx, payload))
        stats = ctx.train(GLOBAL_PARTS, payload.lr, loss_fn=loss)
        a = step_weight(stats.steps, self.cfg.train.momentum)
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS), extra=NovaSteps(stats.steps, a))

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> GlobalState:
        finals = [jr.final for jr in results if jr.final.weights is not None and jr.final.extra.a > 0]
        if not finals:  # no client took a step
            return state
        total = float(sum(r.num_samples for r in finals))
        p = [r.num_samples / total for r in finals]
        tau_eff = sum(pi * r.extra.a for pi, r in zip(p, finals, strict=True))
        new = {}
        for n in state.weights.part_names:
            x = state.weights.part(n).astype(np.float64)
            d = np.zeros_like(x)
            for pi, r in zip(p, finals, strict=True):
                assert r.weights is not None
                d += pi * (x - r.weights.part(n).astype(np.float64)) / r.extra.a
            new[n] = (x - tau_eff * d).astype(np.float32)
        return GlobalState(ModelWeights(**new))


__all__ = ["FedNova", "NovaSteps", "step_weight"]
