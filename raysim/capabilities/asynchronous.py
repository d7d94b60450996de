"""Buffered asynchronous aggregation (``deployment.mode=async``; FedBuff, Nguyen et al., AISTATS 2022):
which algorithms can run asynchronously, and how a stale update joins the current model.

In async mode, up to ``deployment.concurrency`` clients train at once on the simulated clock, each
from the model current when it started; the server aggregates every ``deployment.buffer`` updates
to arrive, a server step (one raysim round). An algorithm can run so when its clients all start
from one global model and its aggregate is a weighted average of their uploads (of that model's
parts): then an update that started ``tau`` server steps ago is *rebased* onto the current model,
``w' = w_now + s(tau) (w - w_start)`` part by part, and the algorithm's own aggregate runs on the
rebased uploads as it would on fresh ones. FedAvg's weighted mean of them is the current model plus
the weighted mean of the scaled updates ``s(tau) Delta``; FedBuff's server step
(``algorithms/fedbuff.py``) is the paper's ``w <- w - eta_g (1/K) sum s(tau_k) Delta_k``. An update
with ``tau = 0`` and weight 1 is used as it came, so an async run whose every update is fresh gives
its synchronous numbers to the bit.

The hook the capability calls: ``started_from(state) -> ModelWeights``, the weights a client
starting now downloads (the parts its upload may hold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raysim.capabilities.declared import Capability
from raysim.deployment.staleness import Staleness
from raysim.weights import ModelWeights


@dataclass(frozen=True)
class Asynchronous(Capability):
    """Declared on an algorithm class that can aggregate asynchronously (``asynchronous =
    Asynchronous()``), or why it cannot (``Asynchronous(why_not="...")``, one sentence)."""

    why_not: str = ""
    #: the server rebases each stale upload onto the current model (``w + s(tau) (w_k - w_start)``)
    #: before the algorithm's aggregate; False: the uploads come as they were trained, each
    #: ``JobResult.staleness`` set, and the algorithm weighs them itself (FedAsync's mixing)
    rebase: bool = True

    @property
    def possible(self) -> bool:
        return not self.why_not

    @classmethod
    def absent(cls) -> Asynchronous:
        """An algorithm that declares no ``Asynchronous``: :data:`NO_ASYNC`."""
        return NO_ASYNC

    @staticmethod
    def started_from(algorithm: Any, state: Any) -> ModelWeights:
        weights: ModelWeights = algorithm.started_from(state)
        return weights


#: what an algorithm that says nothing has
NO_ASYNC = Asynchronous(
    why_not="its aggregate is not a weighted average of uploads that all started from one global model.",
    declared=False,
)


def rebased(upload: ModelWeights, start: ModelWeights, now: ModelWeights, weight: float) -> ModelWeights:
    """``now + weight (upload - start)`` for each part ``upload`` holds, in float64, as float32."""
    import numpy as np

    def part(name: str) -> np.ndarray:
        delta = upload.part(name).astype(np.float64) - start.part(name)
        out: np.ndarray = (now.part(name) + weight * delta).astype(np.float32)
        return out

    return ModelWeights(**{name: part(name) for name in upload.part_names})


__all__ = ["NO_ASYNC", "Asynchronous", "Staleness", "rebased"]
