"""A client worker's job slots (raysim.engine.executors.slots): jobs trained at once, on several runtimes
that share the clients' memories, give the numbers of one runtime training them one by one."""

from __future__ import annotations

import pickle

import pytest

from raysim.engine.executors.evaluation import eval_targets
from raysim.engine.executors.slots import JobSlots, predecessors
from raysim.engine.runner import prepare
from raysim.engine.server import ServerHost
from raysim.wire import ClientStats
from tests.conftest import tiny_config


def test_default_jobs_per_worker_fill_a_cpu_worker_with_one_thread_jobs():
    assert tiny_config(**{"ray.cpus_per_worker": 2}).worker_jobs == 2
    assert tiny_config(**{"ray.cpus_per_worker": 2}).train_threads == 1
    assert tiny_config(**{"ray.cpus_per_worker": 4, "train.threads": 2}).worker_jobs == 2
    assert tiny_config(**{"ray.cpus_per_worker": 0.5}).worker_jobs == 1
    assert tiny_config(**{"ray.cpus_per_worker": 2, "ray.jobs_per_worker": 1}).worker_jobs == 1
    gpu = tiny_config(**{"ray.cpus_per_worker": 2, "ray.gpus_per_worker": 0.5})
    assert (gpu.worker_jobs, gpu.train_threads) == (1, 2)


def test_jobs_wait_only_for_earlier_jobs_with_a_client_of_theirs():
    chains = [(0, 1), (2,), (1, 3), (2,), (4, 4), (3, 2)]
    assert predecessors(chains) == [set(), set(), {0}, {1}, set(), {2, 3}]


def _setup(algo: str, **changes):
    cfg = tiny_config(algo=algo, **{"ray.cpus_per_worker": 2, **changes})
    data = prepare(cfg)
    one, two = JobSlots(cfg, data, 1), JobSlots(cfg, data, 2)
    stats = ClientStats.from_label_counts(data.train_label_counts(), data.train.input_shape)
    server = ServerHost(cfg, stats, one.main.initial_weights)
    return cfg, data, one, two, server


@pytest.mark.parametrize(
    ("algo", "changes"),
    [
        ("fedavg", {"model": "cnn3p2_fmnist", "data.synthetic.shape": (1, 16, 16)}),
        ("local", {}),  # pinned: each client's model lives in the shared memory
        ("fedrep", {}),  # pinned personal heads, a shared body
    ],
)
def test_two_slots_train_as_one_runtime_does(algo, changes):
    cfg, data, one, two, server = _setup(algo, **changes)
    try:
        for rnd in (1, 2):
            jobs = [(job.clients, job.payload) for job in server.plan(rnd, list(range(cfg.clients)))]
            # clients 0 and 1 trained a second time in the round: after their first job, in both
            jobs += [((0,), jobs[0][1]), ((1,), jobs[1][1])]
            expected = [one.main.run_chain(rnd, clients, payload, None) for clients, payload in jobs]
            got = two.run_jobs(rnd, jobs)
            assert pickle.dumps(got) == pickle.dumps(expected), f"round {rnd}"
            assert pickle.dumps(dict(sorted(two.main.memory.items()))) == pickle.dumps(
                dict(sorted(one.main.memory.items()))
            )
            assert two.runtimes[1].memory is two.main.memory
    finally:
        two.close()


@pytest.mark.parametrize("algo", ["fedavg", "local"])
def test_two_slots_evaluate_as_one_runtime_does(algo):
    cfg, data, one, two, server = _setup(algo, **{"eval.analyses": algo == "fedavg"})
    try:
        jobs = [(job.clients, job.payload) for job in server.plan(1, list(range(cfg.clients)))]
        for slots in (one, two):
            slots.run_jobs(1, jobs)
        targets = eval_targets(data) if algo == "fedavg" else []
        clients = list(range(cfg.clients)) if algo == "local" else []
        evaluation = server.evaluation()
        expected = one.evaluate(1, evaluation, targets, clients)
        got = two.evaluate(1, evaluation, targets, clients)
        assert pickle.dumps(got) == pickle.dumps(expected)
        if algo == "fedavg":
            assert len(got.global_correct[0]) == len(targets[0].indices) and len(got.global_align) == 1
        else:
            assert [c for c, _ in got.personal_correct] == clients
    finally:
        two.close()


def test_a_failing_job_fails_the_call_after_the_others_end():
    """No thread may still be training when the call returns: the next call reuses the runtimes."""
    import time

    cfg, data, one, two, server = _setup("fedavg")
    jobs = [(job.clients, job.payload) for job in server.plan(1, list(range(cfg.clients)))][:2]
    ended: list[int] = []

    def slow_or_failing(rnd, clients, payload, prev):
        if clients == jobs[0][0]:
            raise RuntimeError("boom")
        time.sleep(0.3)
        ended.append(clients[0])
        return []

    for runtime in two.runtimes:
        runtime.run_chain = slow_or_failing  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="boom"):
            two.run_jobs(1, jobs)
        assert ended == [jobs[1][0][0]]
    finally:
        two.close()
