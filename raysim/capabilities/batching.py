"""Which of a round's jobs train together (``train.batch_clients``), the same for every executor.

A batch is a set of jobs that carry the same payload and are all pinned to their clients' home
workers or all not, taken in the order the server planned them and cut into pieces of at most K
jobs: their chains' first clients train together, then their second ones, and so on. Jobs of one
payload need not be neighbours in the plan (Fed3+2p's phase 2 plans its clients in sampled order,
each with its Type-B group's payload): a round's jobs are independent of one another, and every
result goes back to its job's place in the plan, so the aggregation sees them in plan order. (The
Ray executor runs a pinned batch on its first client's home worker and moves the other clients'
memories there and back.)
The batches depend on the plan alone, never on the workers, so serial and Ray runs train the same
clients together and give the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raysim.capabilities.declared import Capability
from raysim.wire import ClientResult, Job

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class Batching(Capability):
    """An algorithm's capability for ``train.batch_clients``, declared on its class
    (``batching = Batching(pinned=True)``), or why it has none (``Batching(why_not="...")``, one
    sentence). With it, the algorithm's ``batch_update`` trains a unit's clients together, and
    ``pinned`` says whether jobs pinned to home workers are batched too (their clients' memories
    then move to the batch's worker and back); else those train one by one on their homes."""

    pinned: bool = False
    why_not: str = ""

    @property
    def possible(self) -> bool:
        return not self.why_not

    @classmethod
    def absent(cls) -> Batching:
        """An algorithm that declares no ``Batching``: :data:`NO_BATCHING`."""
        return NO_BATCHING


#: what an algorithm that says nothing has
NO_BATCHING = Batching(
    why_not="its local update is not one pass of supervised training from the received model with a "
    "loss the same for every client.",
    declared=False,
)


def _same(a: object, b: object) -> bool:
    """The same payload: one object, or one object in Ray's object store (equal ObjectRefs)."""
    if a is b:
        return True
    return type(a).__name__ == "ObjectRef" and type(b) is type(a) and bool(a == b)


def batch_units(jobs: Sequence[Job], k: int, pinned: bool = False) -> list[list[int]]:
    """The round's jobs as units: lists of job indices, a batch (more than one job, trained
    together) or a single job run as usual; ordered by their first job. Pinned jobs are batched
    only with ``pinned`` (the algorithm's ``Batching.pinned``)."""
    if k <= 1:
        return [[j] for j in range(len(jobs))]
    groups: list[list[int]] = []  # jobs of one payload and pinning, in plan order
    for j, job in enumerate(jobs):
        if job.pinned and not pinned:
            groups.append([j])
            continue
        for g in groups:
            head = jobs[g[0]]
            if (pinned or not head.pinned) and head.pinned == job.pinned and _same(head.payload, job.payload):
                g.append(j)
                break
        else:
            groups.append([j])
    units = [g[i : i + k] for g in groups for i in range(0, len(g), k)]
    return sorted(units, key=lambda u: u[0])


def train_received(
    algo: Any,
    ctxs: Sequence[ClientContext],
    payloads: Sequence[Any],
    parts: tuple[str, ...],
    objective: Callable[[ClientContext, Any], LossFn],
) -> list[ClientResult]:
    """The common ``batch_update`` (FedAvg's family, the frozen-head family): every client loads
    ``payloads``' one ``WeightsPayload``, trains ``parts`` with ``objective(ctx, payload)`` (made
    once, with the received weights loaded; the run's regularisers added, for an algorithm with
    them) and uploads them; payloads that are not one object run one by one (``algo.local_update``)."""
    from raysim.toolkit.context import ClientContext

    payload = payloads[0]
    if any(p is not payload for p in payloads):
        return [algo.local_update(c, p) for c, p in zip(ctxs, payloads, strict=True)]
    first = ctxs[0]
    first.load(payload.weights)
    loss = objective(first, payload)
    from raysim.capabilities.regularizers import Regularizable

    loss = Regularizable.of(algo).wrap(algo.cfg, first, payload.weights, parts, loss)
    trained = ClientContext.train_together(ctxs, parts, payload.lr, loss_fn=loss)
    return [ctx.result(stats, weights=w) for ctx, (stats, w) in zip(ctxs, trained, strict=True)]


__all__ = ["NO_BATCHING", "Batching", "batch_units", "train_received"]
