"""The deployment model wired into the engine: availability and dropout rates, the round's
close on hand-made results (a chain cut at its first late link), partial work, traces, the
summary's time to a target, and an ideal deployment that changes no number."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from raysim.config import replace
from raysim.deployment.clock import Device
from raysim.deployment.model import Deployment
from raysim.deployment.traces import MEGABIT, AvailabilityTrace, read_devices
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import tiny_config, without_times


def deployment(**settings) -> Deployment:
    cfg = tiny_config(clients=60, participation=0.2, rounds=1000)
    return Deployment(replace(cfg, **{f"deployment.{k}": v for k, v in settings.items()}))


def test_bernoulli_availability_and_dropout_keep_their_rates_over_many_rounds():
    d = deployment(availability="bernoulli:0.3", dropout=0.25)
    online = [[d.availability.online(d.cfg.seed, r, c, 0.0) for c in range(60)] for r in range(1, 401)]
    assert np.mean(online) == pytest.approx(0.3, abs=0.01)  # 24,000 draws: std 0.003
    for r in (1, 2, 3):  # only available clients are sampled, K of them when K are available
        sampled = d.sample(r, 0.0)
        pool = [c for c in range(60) if online[r - 1][c]]
        assert set(sampled) <= set(pool) and len(sampled) == min(12, len(pool))
    lost = [d.lost(r, c) for r in range(1, 401) for c in range(60)]
    assert np.mean(lost) == pytest.approx(0.25, abs=0.01)
    assert not any(d.lost(0, c) for c in range(60))  # a prologue over every client runs as it would


def test_diurnal_availability_follows_the_simulated_clock_and_sampling_follows_it():
    d = deployment(availability="diurnal:0.4", devices="fixed")  # tests/deployment/test_diurnal.py: its swing
    pattern = d.availability.pattern
    assert (pattern.mean, pattern.period_h, pattern.zones) == (0.4, 24.0, 1)
    assert pattern.amplitude == pytest.approx(0.32)
    peak, trough = 6 * 3600.0, 18 * 3600.0  # probability 0.72 and 0.08, every client alike
    assert pattern.probability(5, peak) == pytest.approx(0.72)
    assert pattern.probability(5, trough) == pytest.approx(0.08)
    for r in range(1, 40):
        at_peak = {c for c in range(60) if d.availability.online(d.cfg.seed, r, c, peak)}
        at_trough = {c for c in range(60) if d.availability.online(d.cfg.seed, r, c, trough)}
        assert at_trough <= at_peak  # one draw a (round, client), against a higher chance at the peak
        for t, pool in ((peak, at_peak), (trough, at_trough)):  # only the clients online at the round's start
            sampled = d.sample(r, t)
            assert set(sampled) <= pool and len(sampled) == min(12, len(pool))


def test_over_selection_samples_k_times_one_plus_x():
    d = deployment(devices="fixed", policy="overselect", overselect=0.5)
    assert d.cohort() == 18 and len(d.sample(1, 0.0)) == 18


def result(client: int, samples: int) -> ClientResult:
    return ClientResult(client, samples, 0.0, samples_trained=samples)


def test_a_deadline_cuts_a_chain_at_its_first_late_link():
    d = deployment(devices="fixed", policy="deadline", seconds_per_sample=0.01, latency_s=0.0)
    chain = JobResult(Job((4, 7, 9), "p"), (result(4, 100), result(7, 100), result(9, 100)))  # arrive at 1, 2, 3 s
    single = JobResult(Job((5,), "q"), (result(5, 300),))  # 3 s
    closed = d.close(1, [chain, single], deadline_s=2.5)
    assert [jr.job.clients for jr in closed.kept] == [(4, 7)]  # the chain goes on to 7, no further
    assert [r.client for r in closed.kept[0].results] == [4, 7] and closed.kept[0].job.payload == "p"
    assert closed.late == 2 and closed.duration_s == 2.5
    on_time = d.close(1, [chain, single], deadline_s=3.0)
    assert on_time.kept == [chain, single] and on_time.late == 0 and on_time.duration_s == 3.0


def test_over_selection_keeps_the_first_k_updates_to_arrive():
    d = deployment(devices="fixed", policy="overselect", seconds_per_sample=0.01, latency_s=0.0)
    results = [JobResult(Job((c,), "p"), (result(c, n),)) for c, n in ((0, 500), (1, 100), (2, 300), (3, 200))]
    closed = Deployment(replace(d.cfg, participation=2 / 60)).close(1, results, None)  # K = 2
    assert [jr.job.clients for jr in closed.kept] == [(1,), (3,)] and closed.late == 2
    assert closed.duration_s == pytest.approx(2.0)


def test_a_clients_time_counts_the_bytes_it_moved():
    d = deployment(devices="fixed", seconds_per_sample=0.0, latency_s=0.1, down_mbps=8.0, up_mbps=2.0)
    r = ClientResult(0, 10, 0.0, bytes_down=2_000_000, bytes_up=500_000, samples_trained=10)
    (arrival,) = d.arrivals([JobResult(Job((0,), None), (r,))])
    assert arrival.time_s == pytest.approx(0.1 + 2.0 + 0.1 + 2.0)  # 1 MB/s down, 0.25 MB/s up


def test_lost_clients_leave_the_plan_and_a_chain_goes_on_without_them():
    d = deployment(dropout=0.5)
    rnd = next(r for r in range(1, 50) if [d.lost(r, c) for c in (0, 1, 2)] == [False, True, False])
    jobs, lost = d.without_lost(rnd, [Job((0, 1, 2), "chain"), Job((1,), "alone")])
    assert jobs == [Job((0, 2), "chain")] and lost == [1, 1]


def test_an_ideal_deployment_changes_no_number_and_devices_alone_only_time_the_rounds(tmp_path):
    plain = run_experiment(tiny_config(tmp_path / "plain"))
    ideal = run_experiment(tiny_config(tmp_path / "ideal", **{"deployment.preset": "ideal"}))
    assert without_times(ideal.rows) == without_times(plain.rows)
    timed = run_experiment(tiny_config(tmp_path / "timed", **{"deployment.devices": "lognormal:0.5"}))
    def untimed(rows):
        return [{k: v for k, v in r.items() if k != "sim_time_s"} for r in without_times(rows)]

    assert untimed(timed.rows) == untimed(plain.rows)
    times = [r["sim_time_s"] for r in timed.rows]
    assert all(r["sim_time_s"] == 0.0 for r in plain.rows) and times == sorted(times) and times[0] > 0
    assert json.loads((tmp_path / "timed" / "summary.json").read_text())["sim_time_s"] == round(times[-1], 3)


def test_partial_work_trains_a_drawn_share_of_each_pass(tmp_path):
    cfg = tiny_config(tmp_path, clients=4, participation=1.0, **{"deployment.completeness": "uniform:0.2"})
    ex = SerialExecutor(cfg, prepare(cfg))
    got: list[ClientResult] = []
    inner = ex.server.aggregate
    ex.server.aggregate = lambda r, res: (got.extend(x for jr in res for x in jr.results), inner(r, res))[1]
    ex.train_round(1, [0, 1, 2, 3])
    d = Deployment(cfg)
    for r in got:
        n = r.num_samples
        steps = math.ceil(n / 20)  # one epoch of batches of 20
        done = max(1, math.floor(d.work_fraction(1, r.client) * steps))
        assert 0.2 <= d.work_fraction(1, r.client) < 1
        assert r.samples_trained == min(done * 20, n)  # full batches first, the partial one last


def test_the_summary_reports_the_simulated_time_to_a_target(tmp_path):
    cfg = tiny_config(tmp_path, rounds=4, **{"deployment.devices": "fixed", "eval.target": 0.3})
    run = run_experiment(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    hit = next(r for r in run.rows if r["gm_gtest"] >= 0.3)
    assert summary["target"] == {"metric": "gm_gtest", "accuracy": 0.3}
    assert summary["rounds_to_target"] == hit["round"] and summary["time_to_target_s"] == hit["sim_time_s"] > 0
    never = run_experiment(replace(cfg, **{"eval.target": 1.0, "output.out": str(tmp_path / "n")}))
    assert never.rows and json.loads((tmp_path / "n" / "summary.json").read_text())["time_to_target_s"] is None


def test_an_availability_trace_repeats_over_its_span_and_says_when_someone_comes_online(tmp_path):
    f = tmp_path / "avail.csv"
    f.write_text("client,start_s,end_s\n0,0,10\n0,50,60\n1,20,30\n")
    trace = AvailabilityTrace.read(str(f))
    assert trace.span_s == 60
    assert [trace.online(0, t) for t in (5, 15, 55, 65)] == [True, False, True, True]  # 65 is 5 again
    assert trace.online(3, 25) and not trace.online(2, 25)  # client 3 follows trace client 1, client 2 client 0
    everyone = [0, 1]
    assert trace.next_online_s(12, everyone) == 8 and trace.next_online_s(25, everyone) == 0
    assert trace.next_online_s(35, everyone) == 15
    # only the trace clients the run follows count: client 0 alone waits for 50 s, not 20
    assert trace.next_online_s(12, [0]) == 38 and trace.next_online_s(12, [2, 4]) == 38
    assert trace.next_online_s(12, []) == math.inf
    # online from its start to its upload, or lost when it goes offline
    assert trace.offline_at(0, 2, 8) is None and trace.offline_at(0, 2, 12) == 10
    assert trace.offline_at(0, 55, 65) is None  # 60 wraps to 0: still online until 70


def test_a_device_trace_takes_seconds_or_a_speed_and_is_reused_past_its_clients(tmp_path):
    seconds, speed = tmp_path / "seconds.csv", tmp_path / "speed.csv"
    seconds.write_text("client,seconds_per_sample,down_mbps,up_mbps,latency_s\n0,0.004,8,2,\n1,0.003,16,4,0.2\n")
    speed.write_text("client,speed,down_mbps,up_mbps,latency_s\n0,4,8,2,\n1,3,16,4,0.2\n")
    base = Device(0.001, 1.0, 1.0, 0.05)
    for f in (seconds, speed):
        assert read_devices(str(f), base) == (
            Device(pytest.approx(0.004), 8 * MEGABIT, 2 * MEGABIT, 0.05),
            Device(pytest.approx(0.003), 16 * MEGABIT, 4 * MEGABIT, 0.2),
        )
    d = deployment(devices="trace", devices_file=str(speed))
    assert d.devices[2] == d.devices[0] and d.devices[5] == d.devices[1]


BASE = {"data.dataset": "synthetic", "model": "mlp_fcd", "clients": 8, "ray.executor": "serial"}


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"deployment.dropout": 1.0}, "deployment.dropout must be below 1, not 1.0."),
        ({"deployment.dropout": -0.1}, "deployment.dropout must be at least 0"),
        ({"deployment.dropout": "often"}, "deployment.dropout"),
        ({"deployment.availability": "bernoulli:1.5"}, "probability P must be in (0, 1), not 1.5."),
        ({"deployment.availability": "bernoulli"}, "The bernoulli availability needs its probability P"),
        ({"deployment.availability": "sometimes"}, "Unknown availability 'sometimes'"),
        ({"deployment.availability": "trace"}, "deployment.availability=trace needs deployment.availability_file."),
        ({"deployment.availability_file": "a.csv"}, "availability_file is read only with deployment.availability=trace"),
        ({"deployment.completeness": "uniform:0"}, "least share F must be in (0, 1), not 0."),
        ({"deployment.completeness": "half"}, "Unknown completeness 'half'"),
        (
            {"deployment.completeness": "uniform", "train.batch_clients": 4},
            "deployment.completeness cannot be combined with train.batch_clients",
        ),
        ({"deployment.devices": "lognormal:-1"}, "log-std S must be positive, not -1."),
        ({"deployment.devices": "phones"}, "Unknown device model 'phones'"),
        ({"deployment.devices": "trace"}, "deployment.devices=trace needs deployment.devices_file."),
        ({"deployment.policy": "deadline"}, "The deadline policy needs devices that take time"),
        ({"deployment.policy": "overselect"}, "The overselect policy needs devices that take time"),
        ({"deployment.policy": "first"}, "deployment.policy"),
        ({"deployment.devices": "fixed", "deployment.deadline_s": 5}, "deadline_s is read only by the deadline policy"),
        ({"deployment.devices": "fixed", "deployment.policy": "deadline", "deployment.deadline_s": 0}, "above 0"),
        ({"deployment.overselect": 0}, "deployment.overselect must be above 0, not 0."),
        ({"deployment.preset": "nowhere.yaml"}, "--deployment takes a YAML file or a registered deployment"),
        ({"deployment.seconds_per_sample": -1}, "deployment.seconds_per_sample must be at least 0"),
        ({"deployment.up_mbps": 0}, "deployment.up_mbps must be above 0, not 0."),
        ({"eval.target": 1.5}, "eval.target must be at most 1, not 1.5 (an accuracy is a fraction: 0.8 for 80%)."),
        ({"eval.target": 0}, "eval.target must be above 0, not 0.0 (an accuracy is a fraction"),
        ({"eval.target_metric": "accuracy"}, "eval.target_metric"),
    ],
)
def test_bad_deployment_settings_are_refused_with_one_sentence(settings, needle):
    from raysim.api import checked_experiment
    from raysim.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={**BASE, **settings})
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("devices.csv", "client,down_mbps\n0,1\n", "lacks the column(s) up_mbps"),
        ("devices.csv", "client,seconds_per_sample,down_mbps,up_mbps\n0,fast,1,1\n", "Line 2 of"),
        ("devices.csv", "client,down_mbps,up_mbps\n0,1,1\n", "gives neither seconds_per_sample nor speed"),
        ("avail.csv", "client,start_s,end_s\n0,10,5\n", "end_s (5) must be after start_s (10)"),
        ("avail.csv", "client,start_s,end_s\n", "has no rows"),
        ("dep.yaml", "deployment:\n  dropout: 0.2\n  preset: ideal\n", "names another deployment"),
        ("dep.yaml", "droput: 0.2\n", "Unknown setting deployment.droput"),
    ],
)
def test_bad_deployment_files_are_refused(name, text, needle, tmp_path):
    from raysim.api import checked_experiment
    from raysim.errors import ConfigError

    f = tmp_path / name
    f.write_text(text)
    key = {"devices.csv": "devices", "avail.csv": "availability", "dep.yaml": "preset"}[name]
    settings = {f"deployment.{key}": "trace", f"deployment.{key}_file": str(f)}
    if key == "preset":
        settings = {"deployment.preset": str(f)}
    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={**BASE, **settings})
    assert needle in str(e.value)


def test_a_deployment_file_lies_beneath_the_settings_given(tmp_path):
    from raysim.api import checked_experiment

    f = tmp_path / "dep.yaml"
    f.write_text("deployment:\n  dropout: 0.2\n  devices: lognormal:0.5\n  policy: deadline\n")
    cfg = checked_experiment(None, set={**BASE, "deployment.preset": str(f), "deployment.dropout": 0.1}).cfg
    d = cfg.deployment
    assert (d.dropout, d.devices, d.policy) == (0.1, "lognormal:0.5", "deadline")
    named = checked_experiment(None, set={**BASE, "deployment.preset": "stragglers"}).cfg.deployment
    assert (named.devices, named.policy) == ("lognormal:1", "deadline")


def test_a_fedscale_device_trace_converts_to_raysims(tmp_path):
    import pickle
    import runpy
    from pathlib import Path

    main = runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "fedscale_devices.py"))["main"]
    fedscale = {
        7: {"computation": 50.0, "communication": 2000.0},
        3: {"computation": 10.0, "communication": 8000.0, "dl_kbps": 16000.0, "ul_kbps": 4000.0},
    }
    (tmp_path / "fedscale.pkl").write_bytes(pickle.dumps(fedscale))
    assert main([str(tmp_path / "fedscale.pkl"), str(tmp_path / "devices.csv")]) == 0
    got = read_devices(str(tmp_path / "devices.csv"), Device(latency_s=0.0))
    # client 3 first (by id): 3 x 10 ms a sample; FedScale's kilobit is 1,024 bits, so 16.384 and 4.096 Mbit/s
    assert got[0] == Device(pytest.approx(0.03), 16.384 * MEGABIT, 4.096 * MEGABIT, 0.0)
    assert got[1] == Device(pytest.approx(0.15), 2.048 * MEGABIT, 2.048 * MEGABIT, 0.0)


def test_tensorboard_plots_the_accuracies_against_the_simulated_clock(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(tmp_path, **{"output.tensorboard": True, "deployment.devices": "fixed", "deployment.dropout": 0.3})
    run = run_experiment(cfg)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("sim_time_ms/gm_gtest")]
    assert steps == [round(1000 * r["sim_time_s"]) for r in run.rows] and steps == sorted(steps)
    assert [e.value for e in acc.Scalars("sim_time_ms/gm_gtest")] == pytest.approx([r["gm_gtest"] for r in run.rows])
    lost = [e.value for e in acc.Scalars("deployment/lost")]
    assert len(lost) == cfg.rounds and sum(lost) > 0
    assert [r["updates_lost"] for r in run.rows] == [sum(lost[: r["round"]]) for r in run.rows]  # so far
    assert all(r["updates_late"] == 0 for r in run.rows)  # the all policy waits for every update


class EvenClientsOnly:
    """A user's availability model: only even-numbered clients, ever."""

    def online(self, seed: int, rnd: int, client: int, now_s: float) -> bool:
        return client % 2 == 0

    def next_online_s(self, now_s: float, clients) -> float:
        return 0.0


def make_even(param, d, n):  # the registry's maker: (param, deployment settings, clients) -> the model
    return EvenClientsOnly()


def test_a_users_own_availability_model_and_named_deployment_plug_in(tmp_path):
    from raysim.registry import AVAILABILITY, DEPLOYMENTS, DeploymentKind, Param

    if "test-even" not in AVAILABILITY:
        AVAILABILITY.register("test-even", DeploymentKind(make_even, Param("none"), "even clients only"))
        DEPLOYMENTS.register("test-even-slow", {"availability": "test-even", "devices": "fixed"})
    cfg = tiny_config(tmp_path, clients=10, participation=0.4, **{"deployment.preset": "test-even-slow"})
    from raysim.api import checked_experiment

    checked = checked_experiment(cfg)
    assert checked.cfg.deployment.availability == "test-even"
    d = Deployment(checked.cfg)
    assert all(c % 2 == 0 for r in range(1, 20) for c in d.sample(r, 0.0))
    run = run_experiment(checked)
    assert run.rows[-1]["sim_time_s"] > 0


def test_a_preset_applies_once_beneath_what_was_given_on_every_path(tmp_path):
    from raysim.api import checked_experiment
    from raysim.engine.experiment import validate

    # settings (the flags, a file, a suite): exactly what was given wins, a default value too
    cfg = checked_experiment(None, set={**BASE, "deployment.preset": "dropout30", "deployment.dropout": 0}).cfg
    assert (cfg.deployment.dropout, cfg.deployment.devices, cfg.deployment.preset) == (0.0, "fixed", None)
    # a config object (raysim.run, run_experiment): what differs from the defaults wins
    obj = tiny_config(tmp_path, **{"deployment.preset": "dropout30", "deployment.latency_s": 0.2})
    for d in (validate(obj).cfg.deployment, checked_experiment(obj).cfg.deployment):
        assert (d.dropout, d.devices, d.latency_s, d.preset) == (0.3, "fixed", 0.2, None)
    run = run_experiment(obj)
    assert run.rows[-1]["updates_lost"] > 0 and run.rows[-1]["sim_time_s"] > 0


def test_a_round_with_no_client_online_waits_until_one_is(tmp_path):
    f = tmp_path / "avail.csv"
    # nobody online before 5 s; then clients 0-3 (and, the trace reused, 4-7) for 1000 s
    f.write_text("client,start_s,end_s\n" + "".join(f"{c},5,1005\n" for c in range(4)))
    cfg = tiny_config(
        tmp_path,
        rounds=3,
        **{"deployment.availability": "trace", "deployment.availability_file": str(f), "deployment.devices": "fixed"},
    )
    run = run_experiment(cfg)
    first = run.rows[0]
    assert first["samples_trained"] == 0 and first["sim_time_s"] == 5.0  # round 1: no one, 5 s of waiting
    assert run.rows[1]["samples_trained"] > 0 and run.rows[1]["sim_time_s"] > 5.0
