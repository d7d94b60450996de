"""The round's schedule as a pure plan (raysim.engine.executors.schedule), tested without Ray: every segment
goes out once, in a call on the worker placement gives it; a worker's first segments of single jobs
share one call; and the rule that keeps the waves deadlock-free: a call only depends on calls
submitted before it, so the earliest unfinished call can always run."""

from __future__ import annotations

import random

import pytest

from raysim.engine.executors.schedule import (
    BatchCall,
    BatchesCall,
    ChainCall,
    JobsCall,
    Member,
    dependencies,
    next_wave,
    plan_round,
)
from raysim.wire import Job


def assert_deadlock_free(calls) -> None:
    """Every call's dependencies were submitted in an earlier call, and each worker's calls (run in
    the order submitted) follow chain positions: simulating the workers' queues, all finish."""
    submitted: set[tuple[int, int]] = set()
    for call in calls:
        for dep in dependencies(call):
            assert dep in submitted, (call, dep)
        submitted |= {m.key for m in call.members}
    queues = {w: [c for c in calls if c.worker == w] for w in {c.worker for c in calls}}
    finished: set[tuple[int, int]] = set()
    while any(queues.values()):
        ran = False
        for queue in queues.values():
            if queue and all(d in finished for d in dependencies(queue[0])):
                finished |= {m.key for m in queue.pop(0).members}
                ran = True
        assert ran, "every worker waits on a call queued behind another: deadlock"


def test_single_jobs_go_to_each_worker_in_one_call():
    payload = object()
    jobs = [Job((c,), payload) for c in range(6)]
    plan = plan_round(jobs, 1, False, home=[0, 1] * 3, sizes=[10, 20, 30, 40, 50, 60], workers=2)
    calls = next_wave(plan)
    assert all(isinstance(c, JobsCall) for c in calls) and sorted(c.worker for c in calls) == [0, 1]
    members = [m for c in calls for m in c.members]
    assert sorted(m.clients for m in members) == [(c,) for c in range(6)]  # each once
    # unpinned jobs balance by size, longest first: 60+30+20 against 50+40+10
    load = {c.worker: sum(sum(10 * (k + 1) for k in m.clients) for m in c.members) for c in calls}
    assert sorted(load.values()) == [100, 110]
    assert next_wave(plan, {m.key for m in members}) == []


def test_a_chain_across_workers_runs_as_segments_each_after_the_one_before():
    payload = object()
    # pinned chains: each client on its home worker; (0, 1) on worker 0, then 2 and 3 on worker 1, 4 on 0
    jobs = [Job((0, 1, 2, 3, 4), payload, pinned=True), Job((5, 6), payload, pinned=True)]
    home = [0, 0, 1, 1, 0, 1, 0]
    plan = plan_round(jobs, 1, False, home, sizes=[1] * 7, workers=2)
    assert plan.placement[0] == ((0, 0, 2), (1, 2, 4), (0, 4, 5))
    calls = next_wave(plan)
    assert_deadlock_free(calls)
    assert calls[0] == JobsCall(0, (Member(0, 0, 0, (0, 1)),))  # closed before the later segment
    chain = [c for c in calls if isinstance(c, ChainCall)]
    assert [c.member.clients for c in chain] == [(6,), (2, 3), (4,)]  # by chain position
    # after a failure, only what is not done goes again, in the same order
    again = next_wave(plan, {(0, 0), (1, 0)})
    assert [m.key for c in again for m in c.members] == [(1, 1), (0, 1), (0, 2)]
    assert_deadlock_free_after(again, {(0, 0), (1, 0)})


def test_a_workers_batches_go_in_one_call_and_a_pinned_one_runs_on_its_first_clients_home():
    a, b = object(), object()
    jobs = [Job((0,), a), Job((1,), a), Job((2,), a), Job((3,), b, pinned=True), Job((4,), b, pinned=True)]
    home = [0, 1, 0, 1, 0]
    plan = plan_round(jobs, 3, True, home, sizes=[5] * 5, workers=2)
    assert plan.units == ((0, 1, 2), (3, 4))
    calls = next_wave(plan)
    gathered = [c for c in calls if isinstance(c, BatchesCall)]
    assert [c.chains for c in gathered] == [(((0,), (1,), (2,)),)]
    pinned = [c for c in calls if isinstance(c, BatchCall)]
    assert [c.chains for c in pinned] == [((3,), (4,))]
    assert pinned[0].worker == home[3]  # the pinned batch on its first client's home
    # each planned job gets its own result back from the batch's list
    results = [[["r0", "r1", "r2"]], [["r3", "r4"]]]
    assert plan.per_planned_job(results) == [["r0"], ["r1"], ["r2"], ["r3"], ["r4"]]
    # unless the algorithm batches pinned jobs (Batching(pinned=True)), they are not batched
    assert plan_round(jobs, 3, False, home, [5] * 5, 2).units == ((0, 1, 2), (3,), (4,))
    # unpinned batches of one payload or several: a worker's all in one call, in plan order
    many = [Job((c,), a if c < 6 else b) for c in range(10)]
    plan = plan_round(many, 2, False, [0] * 10, [5] * 10, 2)
    calls = next_wave(plan)
    assert all(isinstance(c, BatchesCall) for c in calls) and sorted(c.worker for c in calls) == [0, 1]
    assert sorted(ch for c in calls for chains in c.chains for ch in chains) == [(c,) for c in range(10)]
    for c in calls:
        firsts = [chains[0][0] for chains in c.chains]
        assert firsts == sorted(firsts)
    assert_deadlock_free(calls)


@pytest.mark.parametrize("seed", range(40))
def test_random_rounds_schedule_every_segment_once_without_deadlock(seed):
    rng = random.Random(seed)
    workers = rng.randint(1, 4)
    clients = rng.randint(1, 30)
    home = [rng.randrange(workers) for _ in range(clients)]
    payloads = [object() for _ in range(3)]
    order = list(range(clients))
    rng.shuffle(order)
    jobs, k = [], 0
    while k < clients:
        n = rng.randint(1, 4)
        jobs.append(Job(tuple(order[k : k + n]), rng.choice(payloads), pinned=rng.random() < 0.5))
        k += n
    plan = plan_round(jobs, rng.choice([1, 2, 3]), rng.random() < 0.5, home, [rng.randint(1, 9)] * clients, workers)
    calls = next_wave(plan)
    assert_deadlock_free(calls)
    keys = [m.key for c in calls for m in c.members]
    assert sorted(keys) == sorted(m.key for m in plan.segments)  # every segment once
    for c in calls:
        for m in c.members:
            w, start, stop = plan.placement[m.unit][m.segment]
            assert c.worker == w == m.worker and m.clients == plan.jobs[m.unit].clients[start:stop]
    # a failure leaves some segments done: the next wave is the rest, still deadlock-free
    done = set(rng.sample(keys, rng.randint(0, len(keys))))
    rest = next_wave(plan, done)
    assert sorted(m.key for c in rest for m in c.members) == sorted(set(keys) - done)
    assert_deadlock_free_after(rest, done)


def assert_deadlock_free_after(calls, done) -> None:
    submitted = set(done)
    for call in calls:
        assert all(d in submitted for d in dependencies(call)), call
        submitted |= {m.key for m in call.members}
