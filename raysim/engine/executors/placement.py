"""Where clients live and where a round's jobs run (the Ray executor's placement).

A client has a home worker (clients are spread over workers by training-set size, longest first).
Pinned jobs (``Job.pinned``: their clients keep personal state) run on the clients' home workers, so
that state never moves; a chain whose clients live on several workers runs as segments, each
segment's result passed to the next worker. Unpinned jobs go to the least-loaded worker of the round
(longest job first), since where a job runs does not change its numbers: every random draw is keyed
by (seed, round, client, purpose) and every job trains with the configured number of threads.
"""

from __future__ import annotations

from collections.abc import Sequence

from raysim.wire import Job

#: a job's segment: (worker, first client's position in the chain, one past the last's)
Segment = tuple[int, int, int]


def lpt_assign(costs: Sequence[float], bins: int, loads: list[float] | None = None) -> list[int]:
    """Longest processing time first: each item, largest first, to the least-loaded bin (ties to the
    lower index), starting from ``loads`` (updated in place) if given. Deterministic; returns the
    bin of each item."""
    loads = [0.0] * bins if loads is None else loads
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        b = min(range(bins), key=lambda k: (loads[k], k))
        out[i] = b
        loads[b] += costs[i]
    return out


def place_jobs(jobs: Sequence[Job], home: Sequence[int], sizes: Sequence[int], workers: int) -> list[list[Segment]]:
    """For each job, its segments: a pinned job in runs of clients that share a home worker; an
    unpinned one whole, on the worker the round's longest-first balancing gives it (pinned work
    counts towards the loads)."""
    placed: list[list[Segment]] = []
    loads = [0.0] * workers
    for job in jobs:
        segs: list[Segment] = []
        if job.pinned:
            for k, c in enumerate(job.clients):
                w = home[c]
                loads[w] += sizes[c]
                if segs and segs[-1][0] == w:
                    segs[-1] = (w, segs[-1][1], k + 1)
                else:
                    segs.append((w, k, k + 1))
        placed.append(segs)
    free = [j for j, job in enumerate(jobs) if not job.pinned]
    costs = [float(sum(sizes[c] for c in jobs[j].clients)) for j in free]
    for j, w in zip(free, lpt_assign(costs, workers, loads), strict=True):
        placed[j] = [(w, 0, len(jobs[j].clients))]
    return placed


def place_blocks(jobs: Sequence[Job], sizes: Sequence[int], workers: int, block: int) -> list[list[Segment]]:
    """Unpinned jobs in blocks of ``block`` consecutive jobs, each block whole on the worker the
    round's longest-first balancing gives it (a block's jobs are then summed on that worker)."""
    costs = [float(sum(sizes[c] for job in jobs[b : b + block] for c in job.clients)) for b in range(0, len(jobs), block)]
    where = lpt_assign(costs, workers)
    return [[(where[j // block], 0, len(job.clients))] for j, job in enumerate(jobs)]


__all__ = ["Segment", "lpt_assign", "place_blocks", "place_jobs"]
