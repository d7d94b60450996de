"""A round's schedule on the client workers, as a pure plan: which calls go to which worker, in
which order, without Ray (the Ray executor submits the calls, collects them and recovers).

A round's planned jobs become *units* (:func:`~raysim.capabilities.batching.batch_units`: a job, or a
batch of jobs trained together), each placed as *segments* (:func:`~raysim.engine.executors.placement.
place_jobs`: a chain whose clients live on several workers runs a segment on each). The segments
go to the workers as three kinds of call:

- :class:`JobsCall`: a worker's first segments of single jobs, each from its payload, in one call
  that trains them on the worker's job slots;
- :class:`BatchesCall`: a worker's batches of unpinned jobs (each batch's jobs trained together),
  in one call that trains them one batch after another;
- :class:`BatchCall`: a pinned batch, trained together on its first client's home worker, the
  others' memories brought there first and sent home after;
- :class:`ChainCall`: a later segment of a chain, which starts from the segment before it.

:func:`next_wave` gives the calls for the segments not done yet, in submission order. The order is
by chain position, so a call only ever depends on calls submitted before it; since a worker runs its
calls in the order they were submitted, the earliest unfinished call always has what it needs and
no worker's queue can block on a call queued behind it (no deadlock). A failed call's segments are
simply not done: the next wave submits them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raysim.capabilities.batching import batch_units
from raysim.engine.executors.placement import place_blocks, place_jobs
from raysim.wire import Job


@dataclass(frozen=True)
class Member:
    """One segment of a unit: which unit, its position among the unit's segments, the worker that
    runs it and its clients."""

    unit: int
    segment: int
    worker: int
    clients: tuple[int, ...]

    @property
    def key(self) -> tuple[int, int]:
        return self.unit, self.segment


@dataclass(frozen=True)
class JobsCall:
    """Worker ``worker`` trains first segments of single jobs, each from its job's payload."""

    worker: int
    members: tuple[Member, ...]


@dataclass(frozen=True)
class OneSegmentCall:
    """A call that runs one segment on its worker."""

    member: Member

    @property
    def worker(self) -> int:
        return self.member.worker

    @property
    def members(self) -> tuple[Member, ...]:
        return (self.member,)


@dataclass(frozen=True)
class BatchCall(OneSegmentCall):
    """A batch of pinned planned jobs (``chains``, their clients) trained together: its clients'
    memories live on their home workers (brought here first, sent home after). Unpinned batches go
    in a :class:`BatchesCall`."""

    chains: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class BatchesCall:
    """Worker ``worker`` trains batches of unpinned jobs, one after another: ``members[i]`` is a
    batch (a unit's one segment) and ``chains[i]`` its planned jobs' clients. One call for a
    worker's share of a round, not one per batch (a round of hundreds of one-step clients in
    batches of K would otherwise be hundreds over K calls)."""

    worker: int
    members: tuple[Member, ...]
    chains: tuple[tuple[tuple[int, ...], ...], ...]


@dataclass(frozen=True)
class ChainCall(OneSegmentCall):
    """A later segment of a chain, starting from the result of the segment before it."""


Call = JobsCall | BatchesCall | BatchCall | ChainCall


@dataclass(frozen=True)
class RoundPlan:
    """A round's units and their placement."""

    planned: tuple[Job, ...]  # the server's jobs
    units: tuple[tuple[int, ...], ...]  # indices into ``planned``, each unit run as one job
    jobs: tuple[Job, ...]  # each unit as a job: a planned job, or a batch's clients with its payload
    placement: tuple[tuple[tuple[int, int, int], ...], ...]  # per unit: (worker, start, stop) segments
    pinned_batch: tuple[bool, ...]  # per unit: a batch of pinned jobs

    @property
    def segments(self) -> list[Member]:
        """Every segment of the round, in chain-position order (the submission order)."""
        order = sorted((segs[s][1], j, s) for j, segs in enumerate(self.placement) for s in range(len(segs)))
        return [self.member(j, s) for _, j, s in order]

    def member(self, unit: int, segment: int) -> Member:
        w, start, stop = self.placement[unit][segment]
        return Member(unit, segment, w, tuple(self.jobs[unit].clients[start:stop]))

    def per_planned_job(self, results: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Each planned job's results, segment by segment, from each unit's (``results[u][s]``;
        a batch's one segment holds its jobs' results in order)."""
        out: list[list[Any]] = [[] for _ in self.planned]
        for u, unit in enumerate(self.units):
            if len(unit) > 1:
                for i, j in enumerate(unit):
                    out[j] = [results[u][0][i]]
            else:
                out[unit[0]] = list(results[u])
        return out


def plan_round(
    planned: Sequence[Job],
    batch_clients: int,
    batch_pinned: bool,
    home: Sequence[int],
    sizes: Sequence[int],
    workers: int,
    block: int | None = None,
) -> RoundPlan:
    """The round's units (``batch_clients`` jobs at most trained together; pinned ones only where
    the algorithm's ``Batching.pinned``) and where each runs: an unpinned batch where the round's load
    is lightest, a pinned one whole on its first client's home worker. With ``block``, a round of
    unpinned jobs is placed in blocks of that many consecutive jobs, each whole on one worker (to
    be summed there: :mod:`~raysim.capabilities.presum`)."""
    units = batch_units(planned, batch_clients, batch_pinned)
    jobs = [
        planned[u[0]] if len(u) == 1 else Job(tuple(c for j in u for c in planned[j].clients), planned[u[0]].payload)
        for u in units
    ]
    if block is not None and all(len(u) == 1 and not planned[u[0]].pinned for u in units):
        placement = place_blocks(jobs, sizes, workers, block)
    else:
        placement = place_jobs(jobs, home, sizes, workers)
    pinned_batch = [len(u) > 1 and planned[u[0]].pinned for u in units]
    for u, pinned in enumerate(pinned_batch):
        if pinned:
            placement[u] = [(home[jobs[u].clients[0]], 0, len(jobs[u].clients))]
    return RoundPlan(
        tuple(planned),
        tuple(tuple(u) for u in units),
        tuple(jobs),
        tuple(tuple(segs) for segs in placement),
        tuple(pinned_batch),
    )


def next_wave(plan: RoundPlan, done: set[tuple[int, int]] | frozenset[tuple[int, int]] = frozenset()) -> list[Call]:
    """The calls for the segments not ``done`` (keys ``(unit, segment)``), in submission order: by
    chain position; a worker's first segments of single jobs gathered into one call, which is
    submitted before that worker's next call and before any later segment (whose predecessor it
    may hold). Empty when every segment is done."""
    calls: list[Call] = []
    gathering: dict[int, list[Member]] = {}  # per worker: first segments of single jobs, not yet a call
    batching: dict[int, list[Member]] = {}  # per worker: unpinned batches, not yet a call

    def chains_of(m: Member) -> tuple[tuple[int, ...], ...]:
        return tuple(plan.planned[i].clients for i in plan.units[m.unit])

    def close(w: int) -> None:
        if w in gathering:
            calls.append(JobsCall(w, tuple(gathering.pop(w))))
        if w in batching:
            members = tuple(batching.pop(w))
            calls.append(BatchesCall(w, members, tuple(chains_of(m) for m in members)))

    for m in (m for m in plan.segments if m.key not in done):
        single = len(plan.units[m.unit]) == 1
        if single and m.segment == 0:
            gathering.setdefault(m.worker, []).append(m)
            continue
        if not single and not plan.pinned_batch[m.unit]:
            batching.setdefault(m.worker, []).append(m)
            continue
        for w in [m.worker] if m.segment == 0 else list(dict.fromkeys([*gathering, *batching])):
            close(w)
        if single:
            calls.append(ChainCall(m))
        else:
            calls.append(BatchCall(m, chains_of(m)))
    for w in list(dict.fromkeys([*gathering, *batching])):
        close(w)
    return calls


def dependencies(call: Call) -> list[tuple[int, int]]:
    """The segments a call needs done first: a later segment's predecessor."""
    return [(m.unit, m.segment - 1) for m in call.members if m.segment > 0]


__all__ = [
    "BatchCall",
    "BatchesCall",
    "Call",
    "ChainCall",
    "JobsCall",
    "Member",
    "RoundPlan",
    "dependencies",
    "next_wave",
    "plan_round",
]
