"""The server's side of asynchronous aggregation (``deployment.mode=async``: FedBuff, FedAsync; the
rebasing of a stale update is :mod:`raysim.capabilities.asynchronous`'s), driven by events on one
simulated clock, the server's, as FLSim's event queue and FedScale's ``_new_task(event_time)`` drive
theirs.

Up to ``deployment.concurrency`` (C) clients are in flight. One raysim round is one server step:

1. Events are taken in time order (at one time: arrivals and losses in start order, then starts).
   - An update **arrives**: it joins the buffer, unless it is staler than
     ``deployment.max_staleness`` (then it is dropped, counted late). Its place is freed at once.
   - A **loss is known** (the client dropped out: at its nominal time, :meth:`~raysim.deployment.
     model.Deployment.nominal_s`; or it went offline before its upload, :meth:`~raysim.deployment.
     model.Deployment.offline_at`): its place is freed then.
   - A freed place **starts** a client at that time, from the current model: drawn from those
     available then who are not busy. Places freed at one time are filled by one draw, the round's
     first as a synchronous round draws. A place with no one to start waits for the next event (or,
     under an availability trace, for the next followed client to come online).
2. The step fires when K = ``deployment.buffer`` updates are in the buffer: they are aggregated (in
   start order), divided by K as K is what arrived, and the clock is the K-th arrival's time. The
   place that arrival freed starts a client from the new model, in the next round.

**Busy** means busy: a client is not started while its update is in flight or waits in the buffer
(our choice for the latter: it would download the very model it trained from), and a client starts
at most once a round, so each update's random streams, keyed by (round, client), are its own.

**Training** runs where it always does, on the workers, but a client's arrival is known only once
it has trained. A round is therefore simulated in waves (:func:`simulate`): every start whose
client has not trained this round is trained in one wave, its arrival treated as later than any
event until then; the round is simulated again with those arrivals, and so on until every start it
makes has trained. Each pass makes the same choices up to the first arrival it did not know, so the
last pass is the event order itself, whatever waves led to it: the numbers do not depend on the
executor. A client trained in a wave that the last pass does not start is not used (its work is
the simulator's, not the deployment's: it is not counted).

**Personal state** (the clients' memories) changes when an update arrives: a job's memory comes back
in its result (:attr:`raysim.wire.ClientResult.memory`) and the executor writes it to the client's
worker after the step (:attr:`Step.commits`); an evaluation never sees an update in flight.

Everything the server keeps between rounds (:class:`Buffer`: the updates in flight with their
arrival, the buffered ones, the free places, the models stale updates started from, the clock) is
immutable and part of its checkpoint, so a resumed run goes on with the same clients in flight.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from raysim.capabilities.asynchronous import Staleness, rebased
from raysim.weights import ModelWeights
from raysim.wire import JobResult

ARRIVE, START = 0, 1  # event kinds, in their order at one time


@dataclass(frozen=True)
class InFlight:
    """A started client: when it started, its start order, the server step and round it started
    in, and when its update arrives (or, if ``lost``, when its loss is known). ``result`` is its
    trained update (None for a client that dropped out before it trained)."""

    client: int
    start_s: float
    seq: int
    version: int
    rnd: int
    event_s: float
    lost: bool = False
    result: JobResult | None = None


@dataclass(frozen=True)
class Buffer:
    """The async server's state beside the algorithm's."""

    pool: tuple[InFlight, ...] = ()  # started, neither arrived nor known lost
    received: tuple[
        InFlight, ...
    ] = ()  # arrived, waiting for the step (only after a round that did not step)
    free: tuple[float, ...] = ()  # places freed and not yet filled: the time each was freed
    starts: tuple[
        tuple[int, ModelWeights], ...
    ] = ()  # the models of the steps that updates in flight started from
    version: int = 0  # server steps so far
    clock_s: float = 0.0
    started: int = 0  # clients started so far (the next start's order)

    @classmethod
    def initial(cls, concurrency: int) -> Buffer:
        return cls(free=(0.0,) * concurrency)

    @property
    def busy(self) -> set[int]:
        return {f.client for f in self.pool} | {f.client for f in self.received}


class Environment(Protocol):
    """What the deployment says to a simulation (:class:`raysim.deployment.model.Deployment` and the
    server's knowledge of the clients, :class:`raysim.engine.server.AsyncEnvironment`)."""

    def available(self, rnd: int, now_s: float) -> list[int]: ...

    def draw(self, rnd: int, batch: int, pool: Sequence[int], k: int) -> list[int]: ...

    def lost(self, rnd: int, client: int) -> bool: ...

    def nominal_s(self, client: int) -> float: ...

    def duration_s(self, result: JobResult) -> float: ...

    def offline_at(self, client: int, start_s: float, end_s: float) -> float | None: ...

    def next_online_s(self, now_s: float, excluded: set[int]) -> float: ...


@dataclass
class Simulation:
    """One pass over a round's events: the clients it started that have not trained (``need``),
    or, when ``need`` is empty, the step."""

    need: list[int] = field(default_factory=list)
    fired: bool = False  # K updates arrived: a server step
    taken: list[InFlight] = field(default_factory=list)  # the buffer when the pass ended, in arrival order
    arrived: list[InFlight] = field(default_factory=list)  # every update that arrived (taken or too stale)
    stale: int = 0  # dropped as staler than max_staleness
    lost: int = 0  # losses known
    started: list[InFlight] = field(default_factory=list)  # this round's starts, in start order
    buffer: Buffer | None = None  # the buffer after the step (its starts' models not yet updated)


def simulate(
    buf: Buffer,
    rnd: int,
    size: int,
    trained: Mapping[int, JobResult],
    env: Environment,
    *,
    max_staleness: int | None = None,
) -> Simulation:
    """Round ``rnd``'s events from ``buf`` (see the module docstring), with ``trained`` the updates
    trained so far this round by client: a start of a client not in it adds the client to
    ``need`` and never arrives in this pass."""
    heap: list[tuple[float, int, int, InFlight | None]] = []
    order = itertools.count()  # start events' order at one time: their push order
    for flying in buf.pool:
        heapq.heappush(heap, (flying.event_s, ARRIVE, flying.seq, flying))
    for t in buf.free:
        heapq.heappush(heap, (t, START, next(order), None))
    sim = Simulation(taken=list(buf.received))
    busy = buf.busy
    started_now: set[int] = set()
    pool = {f.seq: f for f in buf.pool}
    seq, batch, waiting = buf.started, 0, 0
    now = buf.clock_s
    while heap:
        t, kind, _, item = heapq.heappop(heap)
        now = t
        if kind == ARRIVE:
            assert item is not None
            del pool[item.seq]
            if item.lost:
                sim.lost += 1
                busy.discard(item.client)
            else:
                sim.arrived.append(item)
                if max_staleness is not None and buf.version - item.version > max_staleness:
                    sim.stale += 1
                else:
                    sim.taken.append(item)
            places = 1 + waiting  # the freed place, and any waiting for someone to start
            waiting = 0
            if len(sim.taken) == size:  # the step: the freed places start from the new model
                sim.fired = True
                for _ in range(places):
                    heapq.heappush(heap, (t, START, next(order), None))
                break
            for _ in range(places):
                heapq.heappush(heap, (t, START, next(order), None))
            continue
        places = 1  # every start at this time, filled by one draw
        while heap and heap[0][0] == t and heap[0][1] == START:
            heapq.heappop(heap)
            places += 1
        candidates = [c for c in env.available(rnd, t) if c not in busy and c not in started_now]
        chosen = env.draw(rnd, batch, candidates, min(places, len(candidates))) if candidates else []
        batch += 1 if chosen else 0
        for c in chosen:
            started_now.add(c)
            busy.add(c)
            if env.lost(rnd, c):
                f = InFlight(c, t, seq, buf.version, rnd, t + env.nominal_s(c), True)
            elif c in trained:
                jr = trained[c]
                end = t + env.duration_s(jr)
                off = env.offline_at(c, t, end)
                f = InFlight(c, t, seq, buf.version, rnd, end if off is None else off, off is not None, jr)
            else:
                sim.need.append(c)
                f = InFlight(
                    c, t, seq, buf.version, rnd, math.inf
                )  # not trained yet: arrives after everything here
            seq += 1
            sim.started.append(f)
            if f.event_s < math.inf:
                heapq.heappush(heap, (f.event_s, ARRIVE, f.seq, f))
            pool[f.seq] = f
        if len(chosen) < places:  # no one (else) to start: wait for someone
            wait = env.next_online_s(t, busy | started_now)
            if 0 < wait < math.inf and t + wait > t:
                for _ in range(places - len(chosen)):
                    heapq.heappush(heap, (t + wait, START, next(order), None))
            else:
                waiting += places - len(chosen)
    if sim.need:
        return sim
    free = [t for t, kind, _, _ in heap if kind == START] + [now] * waiting
    in_flight = tuple(sorted(pool.values(), key=lambda f: f.seq))
    if sim.fired:
        sim.buffer = Buffer(in_flight, (), tuple(sorted(free)), buf.starts, buf.version + 1, now, seq)
    else:  # the events ran out before K arrived: the buffer waits on, the clock at the last event
        sim.buffer = Buffer(
            in_flight, tuple(sim.taken), tuple(sorted(free)), buf.starts, buf.version, now, seq
        )
    return sim


@dataclass(frozen=True)
class Step:
    """A server step's outcome: the updates to aggregate (in start order; rebased, or each with its
    staleness), the buffer after it, how long it lasted, the mean staleness of what it aggregates,
    and the personal states its arrivals commit."""

    results: list[JobResult]
    buffer: Buffer
    duration_s: float
    staleness: float
    commits: dict[int, object]
    started: list[InFlight]
    arrived: list[InFlight]
    lost: int
    stale: int


def finish(
    buf: Buffer,
    sim: Simulation,
    model: ModelWeights,
    staleness: Staleness,
    *,
    rebase: bool = True,
) -> Step:
    """The step of a complete pass (``sim.need`` empty): the buffered updates, rebased onto
    ``model`` (the current one) with their staleness weights, or as they came with their
    staleness; the models that updates still in flight started from kept."""
    assert sim.buffer is not None and not sim.need
    after = sim.buffer
    starts = dict(buf.starts)
    if any(f.version == buf.version for f in sim.started):
        starts[buf.version] = model
    out: list[JobResult] = []
    taken = sorted(sim.taken, key=lambda f: f.seq) if sim.fired else []
    for f in taken:
        assert f.result is not None
        tau = buf.version - f.version
        weight = staleness(tau)
        r = f.result.final
        if not rebase:
            out.append(replace(f.result, staleness=tau))
        elif (tau == 0 and weight == 1.0) or r.weights is None:  # fresh (as it came), or nothing uploaded
            out.append(f.result)
        else:
            moved = replace(r, weights=rebased(r.weights, starts[f.version], model, weight))
            out.append(JobResult(f.result.job, (*f.result.results[:-1], moved)))
    kept = {f.version for f in after.pool} | {f.version for f in after.received}
    after = replace(after, starts=tuple((v, w) for v, w in sorted(starts.items()) if v in kept))
    commits = {
        f.client: f.result.final.memory
        for f in sim.arrived
        if f.result is not None and f.result.final.memory is not None
    }
    mean_tau = sum(buf.version - f.version for f in taken) / len(taken) if taken else 0.0
    return Step(
        out,
        after,
        after.clock_s - buf.clock_s,
        mean_tau,
        commits,
        [f for f in sim.started if f.result is not None],
        sim.arrived,
        sim.lost,
        sim.stale,
    )


@dataclass(frozen=True)
class SyncClock:
    """A synchronous deployment's state beside the algorithm's: the clock, and the clients still
    working (their late update arrives at the time given), who are not sampled until then."""

    clock_s: float = 0.0
    busy: tuple[tuple[int, float], ...] = ()

    def busy_at(self, now_s: float) -> set[int]:
        return {c for c, until in self.busy if until > now_s}


@dataclass(frozen=True)
class Saved:
    """What a checkpoint keeps of a server in a timed deployment or under client-level DP: the
    algorithm's state, and the async buffer or the synchronous clock, and the privacy state."""

    state: object
    buffer: Buffer | None = None
    clock: SyncClock | None = None
    #: client-level DP's state (its clip, which adaptive clipping moves): raysim.privacy.client_level
    privacy: object = None


__all__ = [
    "Buffer",
    "Environment",
    "InFlight",
    "Saved",
    "Simulation",
    "Step",
    "SyncClock",
    "finish",
    "simulate",
]
