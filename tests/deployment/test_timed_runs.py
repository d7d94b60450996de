"""Timed deployments end to end: one clock (the server's), the idle wait over the clients a run
follows, dropouts that cost the time until they are known, busy clients not sampled, personal
state written when an update arrives, FedAsync's mixing, the staleness functions, a time budget,
serial equal to Ray and checkpoints that resume with clients in flight or still working."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.fedasync import mix
from raysim import checkpoint
from raysim.capabilities.asynchronous import Staleness
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import tiny_config, without_times

LOGNORMAL = {"deployment.devices": "lognormal:1"}


def durations(rows: list[dict]) -> list[float]:
    clock = [0.0] + [r["sim_time_s"] for r in rows]
    return [b - a for a, b in zip(clock, clock[1:], strict=False)]


def test_an_async_step_with_c_equal_to_k_is_not_a_synchronous_round(tmp_path):
    """C = K: every freed place starts another client at once, so a step comes at the K-th arrival
    of a stream of clients, not when the slowest of a cohort returns."""
    setup = {"rounds": 8, "clients": 12, "participation": 1 / 3, "eval.every": 1, **LOGNORMAL}
    sync = run_experiment(tiny_config(tmp_path / "sync", **setup))
    fresh = {"deployment.mode": "async", "deployment.concurrency": 4, "deployment.buffer": 4}
    buff = run_experiment(tiny_config(tmp_path / "async", algo="fedbuff", **setup, **fresh))
    per_round, per_step = np.mean(durations(sync.rows)), np.mean(durations(buff.rows))
    assert per_step < 0.6 * per_round, (per_step, per_round)
    assert max(r["staleness"] for r in buff.rows) > 0  # the fast clients' places cycled while slow ones flew


def test_a_trace_round_waits_only_for_the_trace_clients_the_run_follows(tmp_path):
    """16 trace clients; the run's 8 follow the first 8, offline until 50 s; the other 8 always online."""
    f = tmp_path / "avail.csv"
    f.write_text(
        "client,start_s,end_s\n"
        + "".join(f"{c},50,100000\n" for c in range(8))
        + "".join(f"{c},0,100000\n" for c in range(8, 16))
    )
    cfg = tiny_config(
        tmp_path / "run",
        rounds=3,
        **{
            "deployment.availability": "trace",
            "deployment.availability_file": str(f),
            "deployment.devices": "fixed",
        },
    )
    run = run_experiment(cfg)
    assert (
        run.rows[0]["samples_trained"] == 0 and run.rows[0]["sim_time_s"] == 50.0
    )  # idle until they come online
    assert run.rows[-1]["samples_trained"] > 0


def test_an_update_is_lost_when_its_client_goes_offline_before_uploading(tmp_path):
    """Every client online for 0.05 s at 0 and 10 s of each 20: less than a download's latency, so
    every update is lost, at the moment its client goes offline."""
    f = tmp_path / "avail.csv"
    rows = "".join(f"{c},0,0.05\n{c},10,10.05\n" for c in range(8))
    f.write_text("client,start_s,end_s\n" + rows + "8,0,20\n")  # trace client 8, followed by none, spans 20 s
    cfg = tiny_config(
        tmp_path / "run",
        rounds=3,
        **{"deployment.availability": "trace", "deployment.availability_file": str(f), "deployment.devices": "fixed"},
    )
    run = run_experiment(cfg)
    # round 1 loses its 4 sampled updates as they go offline at 0.05 s; round 2 finds no one online
    # and lasts until they come back at 10 s; round 3 loses its 4 at 10.05 s
    assert [r["updates_lost"] for r in run.rows] == [4, 4, 8]  # so far
    assert [r["sim_time_s"] for r in run.rows] == pytest.approx([0.05, 10.0, 10.05])
    assert [r["samples_trained"] > 0 for r in run.rows] == [True, True, True]  # they trained, and lost it


def test_a_dropout_costs_the_time_until_the_loss_is_known(tmp_path):
    """The same rounds with and without 30% dropout: a lost client is known at its nominal time, so
    no round is shorter for its losses (they had made a run 16% faster)."""
    setup = {"rounds": 10, **LOGNORMAL, "train.drop_last": False}
    none = run_experiment(tiny_config(tmp_path / "none", **setup))
    lost = run_experiment(tiny_config(tmp_path / "lost", **setup, **{"deployment.dropout": 0.3}))
    assert lost.rows[-1]["updates_lost"] > 0
    assert all(a >= b - 1e-4 for a, b in zip(durations(lost.rows), durations(none.rows), strict=True))


def test_a_client_still_working_on_a_late_update_is_not_sampled(tmp_path):
    cfg = tiny_config(
        tmp_path, rounds=8, clients=10, participation=0.5, **LOGNORMAL, **{"deployment.policy": "deadline"}
    )
    ex = SerialExecutor(cfg, prepare(cfg))
    ever_busy = False
    for rnd in range(1, 9):
        busy = ex.server.clock.busy_at(ex.server.clock_s)
        ex.train_round(rnd)
        assert not busy & set(ex.server._sampled)
        ever_busy |= bool(busy)
    assert ever_busy


def test_one_clock_the_servers_is_the_runs(tmp_path):
    """Async mode under Bernoulli availability: the summary's clock is the server's buffer clock."""
    cfg = tiny_config(
        tmp_path,
        algo="fedbuff",
        rounds=6,
        **LOGNORMAL,
        **{
            "deployment.mode": "async",
            "deployment.availability": "bernoulli:0.3",
            "output.checkpoint_every": 6,
        },
    )
    run = run_experiment(cfg)
    buffer = checkpoint.load(tmp_path).snapshot.server_state.buffer
    assert run.totals.sim_time_s == pytest.approx(buffer.clock_s, abs=1e-9) and buffer.clock_s > 0


def test_a_clients_personal_state_changes_when_its_update_arrives(tmp_path):
    cfg = tiny_config(
        tmp_path,
        algo="fedper",
        rounds=6,
        **LOGNORMAL,
        **{"deployment.mode": "async", "deployment.concurrency": 6, "deployment.buffer": 2},
    )
    ex = SerialExecutor(cfg, prepare(cfg))
    in_flight_seen = arrived_seen = 0
    flying: dict[int, object] = {}
    for rnd in range(1, 7):
        ex.train_round(rnd)
        for f in ex.server.buffer.pool:  # started, not arrived: its state on the worker is the old one
            assert ex.runtime.memory.get(f.client) is not f.result.final.memory
            in_flight_seen += 1
        for c, memory in list(flying.items()):
            if c not in {f.client for f in ex.server.buffer.pool}:  # arrived this round: written now
                assert ex.runtime.memory[c] is memory or any(f.client == c for f in ex.server.buffer.received)
                arrived_seen += 1
                del flying[c]
        flying.update({f.client: f.result.final.memory for f in ex.server.buffer.pool})
    assert in_flight_seen and arrived_seen


def test_fedasync_mixes_each_update_by_its_staleness():
    current = ModelWeights(head=np.array([1.0, 2.0], dtype=np.float32))
    upload = ModelWeights(head=np.array([3.0, 0.0], dtype=np.float32))
    np.testing.assert_allclose(mix(current, upload, 0.25).head, [1.5, 1.5])
    from algorithms.fedasync import FedAsync
    from algorithms.fedavg import GlobalState
    from raysim.config import replace as replace_cfg

    cfg = replace_cfg(
        tiny_config(),
        algo="fedasync",
        **{"deployment.mode": "async", "deployment.buffer": 1, "deployment.staleness": "hinge:10:4"},
    )
    algo = FedAsync(cfg, FedAsync.Config(alpha=0.5))
    jr = JobResult(Job((0,), None), (ClientResult(0, 10, 0.0, weights=upload),), staleness=6)
    # alpha_t = 0.5 * 1 / (10 (6 - 4) + 1) = 0.5 / 21
    got = algo.aggregate(GlobalState(current), 1, [jr]).weights.head
    np.testing.assert_allclose(got, (1 - 0.5 / 21) * current.head + 0.5 / 21 * upload.head, rtol=1e-6)
    fresh = JobResult(jr.job, jr.results, staleness=4)  # within the hinge: alpha itself
    np.testing.assert_allclose(algo.aggregate(GlobalState(current), 1, [fresh]).weights.head, [2.0, 1.0])


def test_the_staleness_functions_are_xie_et_als():
    assert Staleness.parse("constant")(7) == 1.0
    assert Staleness.parse("polynomial")(3) == 0.5  # FedBuff's 1/sqrt(1 + tau)
    assert Staleness.parse("polynomial:1")(3) == 0.25
    assert Staleness.parse("hinge")(4) == 1.0 and Staleness.parse("hinge")(5) == pytest.approx(1 / 11)
    assert Staleness.parse("hinge:2:1")(3) == pytest.approx(1 / 5)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"deployment.staleness": "polinomial"}, "deployment.staleness takes constant, polynomial[:A]"),
        ({"deployment.staleness": "polynomial:-1"}, "not 'polynomial:-1'"),
        ({"deployment.staleness": "hinge:10"}, "takes both A and B"),
        ({"deployment.staleness": "hinge:a:b"}, "has a part that is not a number"),
        ({"deployment.staleness": "constant:2"}, "not 'constant:2'"),
        ({"deployment.max_staleness": -1}, "deployment.max_staleness must be at least 0"),
        ({"deployment.max_staleness": "two"}, "deployment.max_staleness must be an integer"),
        (
            {"deployment.mode": "sync", "deployment.max_staleness": 2},
            "deployment.max_staleness is read only in async mode",
        ),
        ({"algo": "fedasync", "deployment.buffer": 2}, "it needs deployment.buffer=1, not 2"),
        (
            {"algo": "fedasync", "deployment.mode": "sync", "deployment.buffer": None},
            "fedasync mixes each update in",
        ),
        ({"algo": "fedasync", "algo.alpha": 0}, "alpha must be above 0"),
        ({"algo": "fedasync", "algo.alpha": 1.5}, "alpha must be at most 1"),
        ({"algo": "fedasync", "algo.rho": -0.1}, "rho must be at least 0"),
    ],
)
def test_async_settings_that_cannot_be_are_refused(settings, needle):
    from raysim.api import checked_experiment

    base = {
        "data.dataset": "synthetic",
        "model": "mlp_fcd",
        "clients": 8,
        "participation": 0.5,
        "ray.executor": "serial",
        "deployment.mode": "async",
        "deployment.devices": "fixed",
    }
    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={**base, **settings})
    assert needle in str(e.value) and str(e.value).count(". ") == 0


def test_fedasyncs_paper_setup_turns_async_on_with_a_buffer_of_one(tmp_path):
    from raysim.api import checked_experiment

    base = {
        "data.dataset": "synthetic",
        "model": "mlp_fcd",
        "clients": 8,
        "ray.executor": "serial",
        "algo": "fedasync",
    }
    d = checked_experiment(None, set=base).cfg.deployment
    assert (d.mode, d.buffer) == ("async", 1)
    run = run_experiment(
        tiny_config(
            tmp_path,
            algo="fedasync",
            rounds=6,
            **LOGNORMAL,
            **{"deployment.mode": "async", "deployment.buffer": 1, "deployment.concurrency": 3},
        )
    )
    assert len(run.rows) == 6 and run.rows[-1]["gm_gtest"] is not None


def test_a_time_budget_stops_the_run_at_the_round_that_reaches_it(tmp_path):
    cfg = tiny_config(tmp_path / "full", rounds=12, **{"deployment.devices": "fixed", "eval.every": 5})
    full = run_experiment(cfg)
    budget = full.rows[-1]["sim_time_s"] * 0.4
    # the rounds every 5, and the last: a row for the round that crosses the budget too
    short = run_experiment(
        tiny_config(
            tmp_path / "short",
            rounds=12,
            **{"deployment.devices": "fixed", "eval.every": 5, "deployment.time_budget_s": budget},
        )
    )
    assert short.last_round < 12 and short.rows[-1]["round"] == short.last_round
    assert short.rows[-1]["sim_time_s"] >= budget
    assert short.totals.sim_time_s - durations(full.rows)[0] < budget  # the round before had not reached it


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"deployment.time_budget_s": 10, "deployment.devices": "ideal"}, "the simulated clock never moves"),
        ({"deployment.time_budget_s": -1}, "deployment.time_budget_s must be above 0"),
        ({"deployment.time_budget_s": "ten"}, "deployment.time_budget_s must be a number"),
        ({"deployment.time_budget_s": 0}, "deployment.time_budget_s must be above 0"),
        (
            {"deployment.time_budget_s": 10, "algo": "fedbabu"},
            "cannot run the fine-tuning after the last round",
        ),
        ({"deployment.time_budget_s": 10, "eval.features": 10}, "cannot run eval.features"),
        (
            {"deployment.time_budget_s": 10, "algo": "spherefed"},
            "spherefed's pass over every client after the last round",
        ),
    ],
)
def test_a_time_budget_that_cannot_be_is_refused(settings, needle):
    from raysim.api import checked_experiment

    base = {
        "data.dataset": "synthetic",
        "model": "mlp_fcd",
        "clients": 8,
        "ray.executor": "serial",
        "deployment.devices": "fixed",
    }
    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={**base, **settings})
    assert needle in str(e.value)


def test_a_sync_checkpoint_resumes_with_clients_still_working(tmp_path):
    from tests.engine.test_checkpoint import CtrlCAfter

    setup = {"rounds": 5, **LOGNORMAL, "deployment.policy": "deadline", "clients": 10, "participation": 0.5}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    assert run_experiment(cfg, [CtrlCAfter(2)]).stopped
    ckpt = checkpoint.load(tmp_path / "stopped")
    assert ckpt.snapshot.server_state.clock.clock_s > 0
    resumed = run_experiment(cfg, resume=ckpt)
    assert without_times(resumed.rows) == without_times(full.rows)


RAY_CASES = {
    "fedasync-hinge": {
        "algo": "fedasync",
        **LOGNORMAL,
        "deployment.mode": "async",
        "deployment.buffer": 1,
        "deployment.concurrency": 4,
        "deployment.staleness": "hinge:2:1",
        "deployment.max_staleness": 3,
    },
    "stragglers-diurnal-zones": {
        "rounds": 4,
        **LOGNORMAL,
        "deployment.completeness": "stragglers:0.5:0.2",
        "deployment.availability": "diurnal",
        "deployment.diurnal_period_h": 0.001,
        "deployment.time_zones": 2,
        "deployment.zone_shares": (0.75, 0.25),
        "deployment.dropout": 0.2,
        "deployment.time_budget_s": 2.0,
    },
}


@pytest.mark.ray
@pytest.mark.parametrize("case", sorted(RAY_CASES))
def test_serial_equals_ray_under_the_timed_settings(case, tmp_path, ray_local):
    setup = {"rounds": 5, **RAY_CASES[case]}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["sim_time_s"] > 0


@pytest.mark.ray
def test_serial_equals_ray_with_clients_going_offline_in_flight(tmp_path, ray_local):
    """FedBuff on an availability trace whose clients go offline mid-work now and then: losses known
    as they go offline, places refilled then, the clock and the in-flight clients the same on both."""
    f = tmp_path / "avail.csv"
    f.write_text(
        "client,start_s,end_s\n"
        + "".join(f"{c},{0.1 * c},{0.1 * c + 0.25}\n{c},{0.1 * c + 0.3},40\n" for c in range(8))
    )
    setup = {
        "algo": "fedbuff",
        "rounds": 5,
        **LOGNORMAL,
        "deployment.mode": "async",
        "deployment.concurrency": 4,
        "deployment.buffer": 2,
        "deployment.availability": "trace",
        "deployment.availability_file": str(f),
    }
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["updates_lost"] > 0 and serial.rows[-1]["sim_time_s"] > 0
