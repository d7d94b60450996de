"""Buffered asynchronous aggregation (deployment.mode=async, FedBuff): a server step on hand-made
updates, fresh steps equal to synchronous rounds, FedBuff against FedAvg, stale updates, clients in
flight never started twice, a checkpoint that keeps what is in flight, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.fedbuff import server_step
from raysim import checkpoint
from raysim.capabilities.asynchronous import Staleness, rebased
from raysim.config import replace
from raysim.engine.buffered import Buffer, finish, simulate
from raysim.engine.runner import run_experiment
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import tiny_config, without_times

ASYNC = {"deployment.mode": "async", "deployment.devices": "lognormal:1"}


def w(*values: float) -> ModelWeights:
    return ModelWeights(head=np.array(values, dtype=np.float32))


def upload(client: int, *values: float) -> JobResult:
    return JobResult(Job((client,), None), (ClientResult(client, 10, 0.0, weights=w(*values)),))


def test_staleness_weights_are_the_papers():
    assert Staleness.parse("polynomial")(0) == 1.0 and Staleness.parse("polynomial")(3) == 0.5
    assert Staleness.parse("constant")(3) == 1.0


def test_a_stale_update_is_rebased_onto_the_current_model():
    # started from (1, 1), trained to (3, 0); the model moved on to (2, 2): w' = now + s (w - start)
    got = rebased(w(3.0, 0.0), w(1.0, 1.0), w(2.0, 2.0), 0.5)
    np.testing.assert_array_equal(got.head, [3.0, 1.5])


class Hand:
    """A hand-made deployment for the event simulation: known times per client, everyone
    available, the lowest ids drawn first, nothing lost unless listed."""

    def __init__(
        self,
        times: dict[int, float],
        lost: dict[int, float] | None = None,
        offline: dict[int, float] | None = None,
    ):
        self.times, self.lost_at, self.offline = times, lost or {}, offline or {}

    def available(self, rnd, now_s):
        return sorted(self.times)

    def draw(self, rnd, batch, pool, k):
        return sorted(pool)[:k]

    def lost(self, rnd, client):
        return client in self.lost_at

    def nominal_s(self, client):
        return self.lost_at[client]

    def duration_s(self, result):
        return self.times[result.final.client]

    def offline_at(self, client, start_s, end_s):
        off = self.offline.get(client)
        return off if off is not None and start_s <= off < end_s else None

    def next_online_s(self, now_s, excluded):
        return 0.0


def run_rounds(env, buf, rounds, size, **kw):
    """Each round simulated in waves, as the server does: train what a pass needs, pass again."""
    steps = []
    for rnd in range(1, rounds + 1):
        trained: dict[int, JobResult] = {}
        while (sim := simulate(buf, rnd, size, trained, env, **kw)).need:
            trained.update({c: upload(c, float(c)) for c in sim.need})
        step = finish(buf, sim, w(0.0), Staleness.parse("constant"))
        steps.append((sim, step))
        buf = step.buffer
    return steps, buf


def test_the_event_driven_hand_case_four_clients_c_2_k_2():
    """Clients 0-3 take 1, 3, 1.5 and 0.5 s; C = 2 in flight, a step every K = 2 arrivals."""
    steps, buf = run_rounds(Hand({0: 1.0, 1: 3.0, 2: 1.5, 3: 0.5}), Buffer.initial(2), 4, 2)
    starts = [[(f.client, f.start_s) for f in sim.started] for sim, _ in steps]
    # round 1: 0 and 1 start at 0; 0 arrives at 1 and its place starts 2 (0 waits in the buffer, 1 is in
    # flight); 2 arrives at 2.5: the step. Round 2: 2.5 starts 0 (1 still in flight); 1 arrives at 3
    # (one step stale) and its place starts 2; 0 arrives at 3.5: the step. Round 3: 3.5 starts 0;
    # 2 and 0 both arrive at 4.5 (2 started first, so it arrives first): the step. Round 4: two
    # places at 4.5, one draw: 0 and 1; 0 arrives at 5.5 and starts 2, who arrives at 7.
    assert starts == [
        [(0, 0.0), (1, 0.0), (2, 1.0)],
        [(0, 2.5), (2, 3.0)],
        [(0, 3.5)],
        [(0, 4.5), (1, 4.5), (2, 5.5)],
    ]
    taken = [
        [(f.client, buf_version - f.version) for f in sim.taken]
        for (sim, _), buf_version in zip(steps, range(4), strict=True)
    ]
    assert taken == [[(0, 0), (2, 0)], [(1, 1), (0, 0)], [(2, 1), (0, 0)], [(0, 0), (2, 0)]]
    assert [step.buffer.clock_s for _, step in steps] == [2.5, 3.5, 4.5, 7.0]
    assert [step.duration_s for _, step in steps] == [2.5, 1.0, 1.0, 2.5]
    assert [step.staleness for _, step in steps] == [0.0, 0.5, 0.5, 0.0]
    # aggregated in start order; the K-th arrival's place starts from the new model, next round
    assert [[jr.final.client for jr in step.results] for _, step in steps] == [[0, 2], [1, 0], [2, 0], [0, 2]]
    assert [step.buffer.free for _, step in steps] == [(2.5,), (3.5,), (4.5, 4.5), (7.0,)]
    assert [(f.client, f.event_s) for f in buf.pool] == [(1, 7.5)] and buf.version == 4


def test_a_step_fires_at_k_arrivals_while_a_slow_client_is_in_flight():
    """C = K = 2 with one client ten times slower: the freed places are refilled at each arrival,
    so the step comes from the fast clients, not at the slow one's arrival as a synchronous round would."""
    steps, buf = run_rounds(Hand({0: 10.0, 1: 1.0, 2: 1.0, 3: 1.0}), Buffer.initial(2), 5, 2)
    # the free place cycles fast clients, one a second: a step every 2 s, not every 10 s
    assert [step.buffer.clock_s for _, step in steps] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert all(0 not in [jr.final.client for jr in step.results] for _, step in steps[:4])
    # client 0 arrives at 10 s, four steps after it started, before client 2's update of that time
    assert [jr.final.client for jr in steps[4][1].results] == [0, 1] and steps[4][1].staleness == 2.0


def test_a_lost_update_frees_its_place_when_its_loss_is_known_and_a_step_still_takes_k():
    # client 1 drops out (known at 4 s), client 2 goes offline at 0.7 s before its upload (due at 1.5 s)
    env = Hand({0: 1.0, 1: 2.0, 2: 1.5, 3: 0.5}, lost={1: 4.0}, offline={2: 0.7})
    steps, _ = run_rounds(env, Buffer.initial(3), 1, 2)
    sim, step = steps[0]
    # 0, 1, 2 start at 0; 2 goes offline at 0.7 and 3 takes its place (arrives 1.2); 0 arrives at 1:
    # the buffer holds 0; 3 arrives at 1.2: the step, with K = 2 updates
    assert [(f.client, f.start_s) for f in sim.started] == [(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.7)]
    assert [jr.final.client for jr in step.results] == [0, 3] and step.buffer.clock_s == 1.2
    assert step.lost == 1 and [(f.client, f.event_s, f.lost) for f in step.buffer.pool] == [(1, 4.0, True)]


def test_max_staleness_drops_exactly_the_updates_staler_than_it():
    env = Hand({0: 10.0, 1: 1.0, 2: 1.0, 3: 1.0})
    for limit, stale in ((None, 0), (4, 0), (3, 1), (0, 1)):
        steps, _ = run_rounds(env, Buffer.initial(2), 5, 2, max_staleness=limit)
        # client 0 (10 s) arrives in round 5, four steps after it started; nothing else is stale
        assert [step.stale for _, step in steps] == [0, 0, 0, 0, stale]
        assert [jr.final.client for jr in steps[4][1].results] == ([0, 1] if stale == 0 else [1, 2])
        assert steps[4][1].buffer.clock_s == 10.0  # a dropped update does not count towards K


def test_the_waves_give_the_event_order_whatever_was_trained_before():
    """A pass with every update trained up front equals the waves' last pass."""
    env = Hand({0: 1.0, 1: 3.0, 2: 1.5, 3: 0.5})
    buf = Buffer.initial(2)
    for rnd in range(1, 4):
        everything = {c: upload(c, float(c)) for c in range(4)}
        direct = simulate(buf, rnd, 2, everything, env)
        steps, _ = run_rounds(env, buf, 1, 2)
        assert [f.client for f in direct.started] == [f.client for f in steps[0][0].started]
        assert direct.buffer.clock_s == steps[0][1].buffer.clock_s
        buf = steps[0][1].buffer


def test_a_fresh_async_step_is_a_synchronous_round_to_the_bit(tmp_path):
    iid = {"data.partition": "iid", "rounds": 4}
    sync = run_experiment(tiny_config(tmp_path / "s", **iid))
    fresh = {
        "deployment.mode": "async",
        "deployment.concurrency": 4,
        "deployment.buffer": 4,
        "deployment.staleness": "constant",
    }
    run = run_experiment(tiny_config(tmp_path / "a", **iid, **fresh))
    rows = [
        {k: v for k, v in r.items() if k not in ("staleness", "in_flight")} for r in without_times(run.rows)
    ]
    assert rows == without_times(sync.rows)
    assert all(r["staleness"] == 0.0 and r["in_flight"] == 0.0 for r in run.rows)


def test_fedbuff_with_the_buffer_the_cohort_and_no_staleness_is_fedavg(tmp_path):
    """Equal clients (IID, equal sizes), so FedAvg's weighting by size is FedBuff's uniform mean;
    FedBuff steps w + 1 * mean(w_k - w) where FedAvg takes mean(w_k): equal up to float rounding."""
    iid = {"data.partition": "iid", "rounds": 4, "output.checkpoint_every": 4}
    fresh = {
        "deployment.mode": "async",
        "deployment.concurrency": 4,
        "deployment.buffer": 4,
        "deployment.staleness": "constant",
    }
    fedavg = run_experiment(tiny_config(tmp_path / "avg", **iid))
    fedbuff = run_experiment(tiny_config(tmp_path / "buff", algo="fedbuff", **iid, **fresh))
    for a, b in zip(fedavg.rows, fedbuff.rows, strict=True):
        assert b["gm_gtest"] == pytest.approx(a["gm_gtest"], abs=0.01)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
    wa = checkpoint.load(tmp_path / "avg").snapshot.server_state.weights
    wb = checkpoint.load(tmp_path / "buff").snapshot.server_state.state.weights
    for name, arr in wa.items():
        np.testing.assert_allclose(wb.part(name), arr, atol=1e-5)


def test_fedbuffs_server_step_with_a_learning_rate_and_momentum():
    current, ups = w(1.0), [w(3.0), w(2.0)]
    step1, m1 = server_step(current, ups, 0.5, 0.0, None)
    assert step1.head[0] == pytest.approx(1.0 + 0.5 * 1.5) and m1 is None
    step2, m2 = server_step(current, ups, 0.5, 0.9, w(2.0))
    assert m2.head[0] == pytest.approx(0.9 * 2.0 + 1.5) and step2.head[0] == pytest.approx(1.0 + 0.5 * 3.3)


def test_busy_clients_are_not_started_again_and_every_step_takes_k(tmp_path, monkeypatch):
    from raysim.engine import buffered

    passes = []
    real = buffered.simulate

    def spy(buf, rnd, size, trained, env, **kw):
        sim = real(buf, rnd, size, trained, env, **kw)
        if not sim.need:  # the round's event order
            passes.append((buf.busy, sim))
        return sim

    monkeypatch.setattr(buffered, "simulate", spy)
    cfg = tiny_config(
        tmp_path, algo="fedbuff", rounds=6, **ASYNC, **{"deployment.concurrency": 6, "deployment.buffer": 2}
    )
    run = run_experiment(cfg)
    assert len(passes) == 6
    for busy, sim in passes:
        started = [f.client for f in sim.started]
        assert not set(started) & busy and len(set(started)) == len(started)
        assert sim.fired and len(sim.taken) == 2  # a step takes K = 2 updates, no fewer
    assert (
        max(r["staleness"] for r in run.rows) > 0
    )  # slower clients' updates arrive steps after they started


def test_a_checkpoint_keeps_the_updates_in_flight(tmp_path):
    from tests.engine.test_checkpoint import CtrlCAfter

    setup = {"algo": "fedbuff", "rounds": 4, **ASYNC, "deployment.concurrency": 6, "deployment.buffer": 2}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    assert run_experiment(cfg, [CtrlCAfter(2)]).stopped
    ckpt = checkpoint.load(tmp_path / "stopped")
    buf = ckpt.snapshot.server_state.buffer
    # five clients in flight, and the place the step's K-th arrival freed, filled from the next round's model
    assert len(buf.pool) == 5 and len(buf.free) == 1 and buf.free[0] == buf.clock_s > 0
    resumed = run_experiment(cfg, resume=ckpt)
    assert without_times(resumed.rows) == without_times(full.rows)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"algo": "fed3p2", "deployment.mode": "async"}, "fed3p2 cannot aggregate asynchronously"),
        (
            {"algo": "fedpac", "model": "cnn_pac", "deployment.mode": "async"},
            "fedpac cannot aggregate asynchronously",
        ),
        ({"algo": "scaffold", "deployment.mode": "async"}, "its aggregate is not a weighted average"),
        ({"algo": "fedbuff"}, "fedbuff aggregates asynchronously: it needs deployment.mode=async"),
        (
            {"deployment.mode": "async", "deployment.buffer": 5},
            "deployment.buffer (5) cannot exceed deployment.concurrency (4)",
        ),
        (
            {"deployment.mode": "async", "deployment.concurrency": 9},
            "deployment.concurrency (9) cannot exceed the clients that train (8)",
        ),
        (
            {"deployment.mode": "async", "deployment.devices": "fixed", "deployment.policy": "deadline"},
            "in async mode the server steps every deployment.buffer updates",
        ),
        ({"deployment.buffer": 2}, "read only in async mode"),
        ({"deployment.mode": "asynchronous"}, "deployment.mode"),
        (
            {"deployment.mode": "async", "deployment.concurrency": 0},
            "deployment.concurrency must be at least 1",
        ),
        ({"algo": "fedbuff", "deployment.mode": "async", "algo.server_lr": 0}, "server_lr must be above 0"),
        (
            {"algo": "fedbuff", "deployment.mode": "async", "algo.server_momentum": 1},
            "server_momentum must be below 1",
        ),
    ],
)
def test_async_runs_that_cannot_be_are_refused(settings, needle):
    from raysim.api import checked_experiment
    from raysim.errors import ConfigError

    base = {
        "data.dataset": "synthetic",
        "model": "mlp_fcd",
        "clients": 8,
        "participation": 0.5,
        "ray.executor": "serial",
    }
    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={**base, "paper_setup": False, **settings})
    assert needle in str(e.value)


def test_fedbuffs_paper_setup_turns_async_on():
    from raysim.api import checked_experiment

    base = {
        "data.dataset": "synthetic",
        "model": "mlp_fcd",
        "clients": 8,
        "ray.executor": "serial",
        "algo": "fedbuff",
    }
    assert checked_experiment(None, set=base).cfg.deployment.mode == "async"


def asynchronous_algorithms() -> list[str]:
    from raysim.capabilities.asynchronous import Asynchronous
    from raysim.registry import ALGORITHMS
    from tests.golden import CASES

    ours = sorted(
        n
        for n, c in ALGORITHMS.items()
        if c.__module__.startswith("algorithms.") and Asynchronous.of(c).possible
    )
    return [next(case for case, s in CASES.items() if s["algo"] == name) for name in ours]


@pytest.mark.parametrize("case", asynchronous_algorithms())
def test_every_algorithm_that_can_runs_asynchronously_with_stale_updates(case, tmp_path):
    from tests.golden import case_config

    buffer = 1 if case == "fedasync" else 2  # FedAsync mixes each arrival in: a buffer of one
    cfg = replace(
        case_config(case, tmp_path),
        rounds=3,
        **ASYNC,
        **{"deployment.concurrency": 4, "deployment.buffer": buffer},
    )
    run = run_experiment(cfg)
    assert [r["round"] for r in run.rows] == [1, 2, 3] and run.rows[-1]["sim_time_s"] > 0
    assert max(r["staleness"] for r in run.rows) > 0


def test_every_algorithm_runs_asynchronously_or_says_why_not_in_a_sentence():
    from raysim.capabilities.asynchronous import Asynchronous
    from raysim.registry import ALGORITHMS

    ours = {n: c for n, c in ALGORITHMS.items() if c.__module__.startswith("algorithms.")}
    able = {n for n, c in ours.items() if Asynchronous.of(c).possible}
    # FedAvg's family: one global model every client starts from, averaged back
    assert {"fedavg", "fedprox", "fedbuff", "fedper", "fedrep", "ditto", "local"} <= able
    assert not {"fed3p2", "fedpac", "scaffold", "fedfcd"} & able
    for name in set(ours) - able:
        why = Asynchronous.of(ours[name]).why_not
        assert why.endswith(".") and len(why.split(". ")) == 1, name
    for name in able:  # the hook the capability calls
        assert callable(getattr(ours[name], "started_from", None)), name
