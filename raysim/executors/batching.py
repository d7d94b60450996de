"""Which of a round's jobs train together (``train.batch_clients``), the same for every executor.

A batch is a run of consecutive jobs, in the order the server planned them, that carry the same
payload and are all pinned to their clients' home workers or all not, cut into pieces of at most K
jobs: their chains' first clients train together, then their second ones, and so on. (The Ray
executor runs a pinned batch on its first client's home worker and moves the other clients'
memories there and back.)
The batches depend on the plan alone, never on the workers, so serial and Ray runs train the same
clients together and give the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from raysim.wire import Job


def _same(a: object, b: object) -> bool:
    """The same payload: one object, or one object in Ray's object store (equal ObjectRefs)."""
    if a is b:
        return True
    return type(a).__name__ == "ObjectRef" and type(b) is type(a) and bool(a == b)


def batch_units(jobs: Sequence[Job], k: int, pinned: bool = False) -> list[list[int]]:
    """The round's jobs as units: lists of job indices, a batch (more than one job, trained
    together) or a single job run as usual; in plan order. Pinned jobs are batched only with
    ``pinned`` (the algorithm's ``batches_pinned``)."""
    units: list[list[int]] = []
    run: list[int] = []

    def flush() -> None:
        for i in range(0, len(run), k):
            units.append(run[i : i + k])
        run.clear()

    for j, job in enumerate(jobs):
        fits = k > 1 and (pinned or not job.pinned)
        prev = jobs[run[-1]] if run else None
        if fits and prev is not None and prev.pinned == job.pinned and _same(prev.payload, job.payload):
            run.append(j)
            continue
        flush()
        if fits:
            run.append(j)
        else:
            units.append([j])
    flush()
    return units


__all__ = ["batch_units"]
