"""Every algorithm under a harsh deployment; Fed3+2p's chains without a lost client; personal state
that survives a dropout; serial equal to Ray under every round policy."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.deployment.model import Deployment
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from tests.conftest import tiny_config, without_times
from tests.golden import case_config, one_case_per_algorithm

#: lost updates, partial work, slow devices and a deadline, all at once
HARSH = {
    "deployment.dropout": 0.3,
    "deployment.completeness": "uniform:0.3",
    "deployment.devices": "lognormal:1",
    "deployment.policy": "deadline",
}


@pytest.mark.parametrize("case", one_case_per_algorithm())
def test_every_algorithm_runs_under_a_harsh_deployment(case, tmp_path):
    cfg = case_config(case, tmp_path)
    from raysim.config import replace

    harsh = dict(HARSH)
    if cfg.deployment.mode == "async":  # FedBuff, FedAsync: no round to close at a deadline
        harsh.update({"deployment.mode": "async", "deployment.policy": "all"})
    run = run_experiment(replace(cfg, rounds=2, clients=10, **{"eval.every": 0}, **harsh))
    assert [r["round"] for r in run.rows] == [2]  # evaluated after the last round only
    assert run.rows[-1]["sim_time_s"] > 0
    assert any(run.rows[-1][m] is not None and not np.isnan(run.rows[-1][m]) for m in ("gm_gtest", "lm_ptest"))


FED3P2 = {
    "algo": "fed3p2",
    "clients": 12,
    "participation": 1.0,
    "algo.num_type_a": 3,
    "algo.num_type_b": 3,
    "algo.phase1_rounds": 2,
    "rounds": 3,
    "model": "cnn3p2_fmnist",
    "data.synthetic.shape": (1, 16, 16),
    "deployment.dropout": 0.3,
}


def test_fed3p2_chains_skip_a_lost_client_and_go_on_from_the_last_update_that_arrived(tmp_path):
    cfg = tiny_config(tmp_path, **FED3P2)
    ex = SerialExecutor(cfg, prepare(cfg))
    d = Deployment(cfg)
    planned = ex.runtime.algo.plan(ex.server.state, 1, list(range(12)))  # the algorithm's own chains
    lost = {c for c in range(12) if d.lost(1, c)}
    assert lost and any(len(set(j.clients) - lost) >= 2 and set(j.clients) & lost for j in planned)
    received = []
    inner = ex.server.aggregate
    ex.server.aggregate = lambda r, res: (received.extend(res), inner(r, res))[1]
    stats = ex.train_round(1, list(range(12)))
    want = [tuple(c for c in j.clients if c not in lost) for j in planned]
    assert [jr.job.clients for jr in received] == [w for w in want if w] and stats.lost == len(lost)
    chain = next(jr for jr in received if len(jr.results) >= 2)
    # the link after a lost one starts from the last update that arrived: the same as a chain without it
    again = ex.runtime.run_chain(1, chain.job.clients, chain.job.payload, None)
    assert all(a.weights.equals(b.weights) for a, b in zip(again, chain.results, strict=True))


def test_a_client_that_drops_out_keeps_its_personal_state(tmp_path):
    cfg = tiny_config(tmp_path, **{**FED3P2, "rounds": 4})
    ex = SerialExecutor(cfg, prepare(cfg))
    d = Deployment(cfg)
    for rnd in (1, 2, 3):
        ex.train_round(rnd, list(range(12)))
    before = dict(ex.runtime.memory)
    ex.train_round(4, list(range(12)))  # phase 2's second round: P-heads on their workers
    lost = [c for c in range(12) if d.lost(4, c)]
    kept = [c for c in range(12) if not d.lost(4, c)]
    assert lost and kept
    assert any(c in before for c in lost)  # a lost client with a P-head of its own
    for c in lost:  # neither lost nor changed: it never started the round's work
        assert ex.runtime.memory.get(c) is before.get(c)
    for c in kept:  # trained: a new P-head
        mine = ex.runtime.memory[c].weights
        assert c not in before or not mine.equals(before[c].weights)


POLICIES = {  # (the all policy: test_a_round_with_no_client_online_runs_on_ray_as_serially)
    "deadline": {
        "deployment.devices": "lognormal:1",
        "deployment.policy": "deadline",
        "deployment.completeness": "uniform:0.5",
    },
    "overselect": {"deployment.devices": "lognormal:1", "deployment.policy": "overselect", "deployment.dropout": 0.2},
}


@pytest.mark.ray
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_serial_equals_ray_under_every_round_policy(policy, tmp_path, ray_local):
    setup = {**FED3P2, "deployment.dropout": 0.0, **POLICIES[policy]}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["sim_time_s"] > 0


@pytest.mark.ray
def test_serial_equals_ray_asynchronously(tmp_path, ray_local):
    """Stale updates rebased on the server actor, clients in flight across rounds, and FedPer's
    personal heads on their home workers (FedBuff's own step is the server's, the same code on both)."""
    setup = {
        "algo": "fedper",
        "rounds": 4,
        "deployment.mode": "async",
        "deployment.devices": "lognormal:1",
        "deployment.concurrency": 6,
        "deployment.buffer": 2,
        "deployment.dropout": 0.2,
    }
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert max(r["staleness"] for r in serial.rows) > 0


@pytest.mark.ray
def test_a_round_with_no_client_online_runs_on_ray_as_serially(tmp_path, ray_local):
    """The all policy with an availability trace, lost updates and partial work."""
    f = tmp_path / "avail.csv"
    f.write_text("client,start_s,end_s\n" + "".join(f"{c},5,1005\n" for c in range(4)))
    setup = {
        "rounds": 3,
        "deployment.availability": "trace",
        "deployment.availability_file": str(f),
        "deployment.devices": "fixed",
        "deployment.dropout": 0.3,
        "deployment.completeness": "uniform:0.5",
    }
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[0]["samples_trained"] == 0 and serial.rows[-1]["updates_lost"] > 0
