"""FedAvg, FedProx and Local: what is shared, what is weighted, what stays personal."""

from __future__ import annotations

import numpy as np

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import tiny_config, without_times


def _executor(cfg):
    return SerialExecutor(cfg, prepare(cfg))


def test_fedavg_aggregate_is_the_sample_weighted_mean(tmp_path):
    ex = _executor(tiny_config(tmp_path))
    algo, state = ex.server.algo, ex.server.state
    shapes = {n: a.shape for n, a in state.weights.items()}
    w1 = ModelWeights(**{n: np.full(s, 1.0, np.float32) for n, s in shapes.items()})
    w2 = ModelWeights(**{n: np.full(s, 4.0, np.float32) for n, s in shapes.items()})
    results = [
        JobResult(Job((0,), None), (ClientResult(0, 10, 0.0, w1),)),
        JobResult(Job((1,), None), (ClientResult(1, 30, 0.0, w2),)),
    ]
    new = algo.aggregate(state, 1, results)
    for _, arr in new.weights.items():
        np.testing.assert_allclose(arr, (10 * 1 + 30 * 4) / 40)


def test_fedavg_sends_the_global_parts_and_every_client_starts_from_them(tmp_path):
    ex = _executor(tiny_config(tmp_path))
    jobs = ex.server.plan(1, [0, 3])
    assert all(job.payload is jobs[0].payload for job in jobs)  # one payload, shared
    assert jobs[0].payload.weights.part_names == ("extractor", "filter", "head")
    res = ex.runtime.run_chain(1, (0,), jobs[0].payload, None)[0]
    assert res.weights.part_names == ("extractor", "filter", "head")  # no personal head uploaded
    assert res.bytes_down == jobs[0].payload.weights.nbytes and res.bytes_up == res.weights.nbytes


def _upload_distance(cfg, client=2):
    ex = _executor(cfg)
    job = ex.server.plan(1, [client])[0]
    res = ex.runtime.run_chain(1, job.clients, job.payload, None)[0]
    return sum(float(np.sum((getattr(res.weights, n) - a) ** 2)) for n, a in job.payload.weights.items())


def test_fedprox_mu_zero_is_fedavg_and_mu_pulls_to_the_global_model(tmp_path):
    base = run_experiment(tiny_config(tmp_path / "a"))
    prox0 = run_experiment(tiny_config(tmp_path / "b", algo="fedprox", **{"algo.mu": 0.0}))
    assert without_times(base.rows) == without_times(prox0.rows)
    far = _upload_distance(tiny_config(tmp_path, algo="fedprox", **{"algo.mu": 0.0, "train.local_epochs": 3}))
    near = _upload_distance(
        tiny_config(tmp_path, algo="fedprox", **{"algo.mu": 5.0, "train.local_epochs": 3})
    )
    assert near < 0.5 * far


def test_local_communicates_nothing_and_keeps_each_model_on_its_client(tmp_path):
    cfg = tiny_config(tmp_path, algo="local", participation=1.0, rounds=3)
    result = run_experiment(cfg)
    assert all(r["bytes_up"] == 0 and r["bytes_down"] == 0 for r in result.rows)
    assert result.final["gm_gtest"] is None and result.final["gm_ptest"] is None
    assert result.rows[-1]["lm_ptest"] > result.rows[0]["lm_ptest"]

    ex = _executor(tiny_config(tmp_path, algo="local"))
    job = ex.server.plan(1, [1])[0]
    ex.runtime.run_chain(1, (1,), job.payload, None)
    after1 = ex.runtime.kept(1)
    assert 0 not in ex.runtime.memory  # only the trained client has a model
    ex.runtime.run_chain(2, (1,), ex.server.plan(2, [1])[0].payload, None)
    after2 = ex.runtime.kept(1)
    assert not after1.equals(after2)  # round 2 continued from round 1's model, not from the init
    assert not after1.equals(ex.runtime.initial_weights.select(after1.part_names))



def test_fedprox_anchors_at_the_received_model_whatever_the_worker_ran_before(tmp_path):
    """w^t in mu/2 ||w - w^t||^2 is the received global model: a client's update is the same on a
    fresh worker and on one whose model last held another client's update."""
    cfg = tiny_config(tmp_path, algo="fedprox", **{"algo.mu": 1.0})
    fresh = _executor(cfg)
    payload = fresh.server.plan(1, [3])[0].payload
    alone = fresh.runtime.run_chain(1, (3,), payload, None)[0]
    busy = _executor(cfg)
    busy.runtime.run_chain(1, (2,), payload, None)  # the worker's model now holds client 2's update
    after = busy.runtime.run_chain(1, (3,), payload, None)[0]
    assert after.weights.equals(alone.weights)
