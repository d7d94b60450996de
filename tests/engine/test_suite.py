"""Suites on Ray Tune: a table of configurations x seeds as one command, each trial one
raysim experiment in its own placement group, with the numbers of the same run through run.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from raysim import checkpoint
from raysim.commands.sweep import suite_from_args
from raysim.errors import ConfigError
from raysim.suite import SuiteConfig, expand_grid, load_suite, parse_seeds, trials
from raysim.suite.tune import LIVE_DIR, STOP_FILE
from tests.conftest import without_times

ROOT = Path(__file__).resolve().parents[2]
#: a few seconds a trial: synthetic 8x8 data, 8 clients, 2 rounds
TINY = [
    "--dataset", "synthetic", "--model", "mlp_fcd", "--clients", "8", "--rounds", "2", "--local-epochs", "1",
    "--participation", "0.5", "--batch-size", "20", "--lr", "0.05", "--partition", "dirichlet:0.5",
    "--set", "data.synthetic.shape=[1,8,8]", "--set", "data.synthetic.train_samples=800",
    "--set", "data.synthetic.test_samples=400", "--no-tensorboard",
]  # fmt: skip
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


# ---------------------------------------------------------------------------------------- reading


def test_seeds_and_grids_from_flags():
    assert parse_seeds("0-4") == (0, 1, 2, 3, 4) and parse_seeds("0,2,7") == (0, 2, 7) and parse_seeds(3) == (3,)
    with pytest.raises(ConfigError):
        parse_seeds("a-b")
    suite, _, _ = suite_from_args(
        ["--algo", "fedavg,fed3p2", "--seeds", "0-1", "--set", "algo.num_type_a=2,4", *TINY[:-1], "--rounds", "4"]
    )
    # num_type_a is Fed3+2p's: FedAvg runs once, Fed3+2p once per value
    assert [c.name for c in suite.configs] == ["fedavg", "fed3p2_num_type_a=2", "fed3p2_num_type_a=4"]
    assert suite.configs[1].settings == {"algo": "fed3p2", "algo.num_type_a": "2"}
    assert suite.base["rounds"] == "4" and suite.base["train.local_epochs"] == "1"
    assert len(trials(suite)) == 6 and {t.seed for t in trials(suite)} == {0, 1}
    # a bracketed value is one list, not a grid
    suite, _, _ = suite_from_args(["--set", "train.lr_milestones=[0.5,0.75]", *TINY[:-1]])
    assert len(suite.configs) == 1 and suite.base["train.lr_milestones"] == "[0.5,0.75]"


def test_every_trial_is_checked_before_anything_runs():
    with pytest.raises(ConfigError, match="Unknown algorithm 'nope'"):
        suite_from_args(["--algo", "fedavg,nope", *TINY[:-1]])
    with pytest.raises(ConfigError, match="needs images of at least 16x16"):
        suite_from_args(["--algo", "fed3p2", *TINY[:-1], "--model", "cnn3p2_fmnist"])
    with pytest.raises(ConfigError, match="name a search with --search"):
        suite_from_args(["--set", "train.lr=loguniform(0.001,0.1)", *TINY[:-1]])


#: a grid of two trials without a search: the scheduler is for these
SCHEDULED = ["--algo", "fedavg", *TINY, "--lr", "0.05,0.0001"]


def _never_run(*args, **kwargs):
    raise AssertionError("a refused suite reached run_suite (and Ray)")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--scheduler", "ashaa"], "Unknown scheduler 'ashaa' (known: asha, async_hyperband,"),
        (["--scheduler", "ASHA "], "Unknown scheduler 'ASHA '"),
        (["--scheduler", "hyperband2"], "Unknown scheduler 'hyperband2'"),
        (["--scheduler", ""], "Unknown scheduler ''"),
        (["--scheduler", "pbt"], "The scheduler pbt needs trials that save Tune checkpoints"),
        (["--scheduler", "pb2"], "The scheduler pb2 needs trials that save Tune checkpoints"),
        (["--scheduler", "resource_changing"], "The scheduler resource_changing needs trials that save"),
        (["--scheduler", "hb_bohb"], "hb_bohb goes with the search algorithm bohb"),
        (["--scheduler", "asha", "--metric", "gm_gtset"], "Unknown metric 'gm_gtset' to schedule on"),
        (["--scheduler", "asha", "--metric", "accuracy"], "Unknown metric 'accuracy' to schedule on"),
        (["--scheduler", "asha", "--metric", "GM_GTEST"], "Unknown metric 'GM_GTEST' to schedule on"),
        (["--scheduler", "asha", "--metric", ""], "Unknown metric '' to schedule on"),
        (["--scheduler", "asha", "--metric", "lm_ptest"], "fedavg has no personal models, so its trials report no lm_ptest"),
        (["--scheduler", "asha", "--metric", "updated_lm_ptest"], "updated_lm_ptest is reported only with eval.updated_lm"),
        (["--scheduler", "asha", "--algo", "fedavg,local"], "local has no global model, so its trials report no gm_gtest"),
        (["--scheduler", "asha", "--mode", "maximum"], "Argument --mode: invalid choice: 'maximum'"),
        (["--scheduler", "asha", "--mode", "Max"], "Argument --mode: invalid choice: 'Max'"),
        (["--scheduler", "asha", "--mode", ""], "Argument --mode: invalid choice: ''"),
        (["--metric", "gm_ptest"], "--metric 'gm_ptest' is for a search or a scheduler to optimise"),
        (["--mode", "min"], "--mode 'min' is for a search or a scheduler to optimise"),
    ],
    ids=lambda v: " ".join(map(repr, v[-2:])) if isinstance(v, list) else None,
)
def test_a_bad_scheduler_is_refused_in_one_sentence_before_ray_starts(flags, needle, monkeypatch, capsys):
    """Without a search, as with one: the command exits 2 with one line on stderr, never reaching
    run_suite (which starts Ray)."""
    import raysim.suite
    from raysim.commands.sweep import main

    monkeypatch.setattr(raysim.suite, "run_suite", _never_run)
    assert main([*SCHEDULED, *flags, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("raysim: error: ") and needle in err, err


@pytest.mark.parametrize(
    ("how", "given", "needle"),
    [
        ("api", {"scheduler": "ashaa"}, "Unknown scheduler 'ashaa'"),
        ("api", {"scheduler": "asha", "mode": "Max"}, "The scheduler's mode is max or min, not 'Max'."),
        ("api", {"scheduler": "asha", "mode": ""}, "The scheduler's mode is max or min, not ''."),
        ("api", {"scheduler": "asha", "metric": "gm_test"}, "Unknown metric 'gm_test' to schedule on"),
        ("file", "scheduler: ashaa", "Unknown scheduler 'ashaa'"),
        ("file", "scheduler: ''", "Unknown scheduler ''"),
        ("file", "scheduler: pbt", "The scheduler pbt needs trials that save Tune checkpoints"),
        ("file", "scheduler: {name: asha, metric: gm_gtset}", "Unknown metric 'gm_gtset' to schedule on"),
        ("file", "scheduler: {name: asha, mode: up}", "The scheduler's mode is max or min, not 'up'."),
        ("file", "scheduler: {nme: asha}", "is a name (e.g. asha) or a table of name, metric and mode"),
        ("file", "scheduler: 3", "is a name (e.g. asha) or a table of name, metric and mode, not 3."),
        (
            "file",
            "search: {space: {train.lr: 'loguniform(0.001, 0.1)'}}\nscheduler: asha",
            "give its scheduler under search (search.scheduler), not beside it.",
        ),
    ],
)
def test_a_bad_scheduler_from_the_api_or_a_suite_file_is_refused(tmp_path, monkeypatch, how, given, needle):
    import raysim
    import raysim.suite

    monkeypatch.setattr(raysim.suite, "run_suite", _never_run)
    small = {"dataset": "synthetic", "model": "mlp_fcd", "clients": 8, "rounds": 2}
    with pytest.raises(ConfigError) as refused:
        if how == "api":
            raysim.sweep(algo="fedavg", out=tmp_path / "suite", **small, **given)
        else:
            (tmp_path / "s.yaml").write_text(f"name: s\nbase: {json.dumps(small)}\nconfigs: [{{name: a}}]\n{given}\n")
            raysim.sweep(tmp_path / "s.yaml", out=tmp_path / "suite")
    sentence = str(refused.value)
    assert needle in sentence and "\n" not in sentence and sentence.endswith("."), sentence


def test_a_scheduler_without_a_search_goes_to_tune_for_the_grid_and_its_seeds(tmp_path):
    """From the flags, a suite file or the API alike: Tune's scheduler on the metric and mode, kept
    in suite.yaml for --resume; a flag's scheduler goes to a suite file's search if it has one."""
    from ray.tune.schedulers import AsyncHyperBandScheduler, MedianStoppingRule

    from raysim.suite import SchedulerSpec, suite_of, to_yaml
    from raysim.suite.spec import write_yaml
    from raysim.suite.tune import _tune_config

    suite, _, _ = suite_from_args([*SCHEDULED, "--scheduler", "asha", "--metric", "train_loss", "--mode", "min"])
    assert suite.search is None and suite.scheduler == SchedulerSpec("asha", "train_loss", "min")
    tuned = _tune_config(suite, None)
    assert isinstance(tuned.scheduler, AsyncHyperBandScheduler) and tuned.search_alg is None
    assert (tuned.scheduler.metric, tuned.scheduler._mode) == ("train_loss", "min")
    # its horizon is the suite's rounds, not Tune's default of 100 reports (which cut longer runs)
    long, _, _ = suite_from_args([*SCHEDULED, "--scheduler", "asha", "--rounds", "150"])
    assert _tune_config(long, None).scheduler._max_t == 150
    write_yaml(tmp_path / "suite.yaml", to_yaml(suite))
    assert load_suite(tmp_path / "suite.yaml").scheduler == suite.scheduler
    (tmp_path / "s.yaml").write_text(
        "name: s\nbase: {dataset: synthetic, model: mlp_fcd, clients: 8, rounds: 2}\nconfigs: [{name: a}]\n"
        "scheduler: median_stopping_rule\n"
    )
    from_file = suite_of(tmp_path / "s.yaml")
    assert from_file.scheduler == SchedulerSpec("median_stopping_rule")
    assert isinstance(_tune_config(from_file, None).scheduler, MedianStoppingRule)
    assert suite_of(tmp_path / "s.yaml", scheduler="asha", metric="gm_ptest").scheduler == SchedulerSpec("asha", "gm_ptest")
    (tmp_path / "search.yaml").write_text(
        "name: s\nbase: {dataset: synthetic, model: mlp_fcd, clients: 8, rounds: 2}\nconfigs: [{name: a}]\n"
        "search: {space: {train.lr: 'loguniform(0.001, 0.1)'}}\n"
    )
    searched = suite_of(tmp_path / "search.yaml", scheduler="asha")
    assert searched.scheduler is None and searched.search is not None and searched.search.scheduler == "asha"
    assert _tune_config(suite_from_args(SCHEDULED)[0], None).scheduler is None  # Tune's FIFO: every trial to its end


@pytest.mark.parametrize(
    ("flags", "serial", "bundles"),
    [
        ([], True, [{"CPU": 1.0}]),  # one one-slot CPU worker: trained in the trial's own process
        (["--workers", "2"], False, [{}, {"CPU": 1.0}, {"CPU": 1.0}]),
        (["--cpus-per-worker", "2"], False, [{}, {"CPU": 2.0}]),  # two job slots train side by side
        (["--gpus-per-worker", "0.5"], False, [{}, {"CPU": 1.0, "GPU": 0.5}]),
    ],
)
def test_a_one_worker_cpu_trial_runs_serially_in_its_own_process(tmp_path, flags, serial, bundles):
    from raysim.suite.spec import trial_experiment
    from raysim.suite.tune import trial_resources

    suite, _, _ = suite_from_args(["--algo", "fedavg", *flags, *TINY])
    cfg = trial_experiment(trials(suite)[0], tmp_path).cfg
    assert (cfg.ray.executor == "serial") is serial
    assert trial_resources(cfg, 0.0) == bundles


def test_a_suite_file_with_configurations_and_a_grid(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "name: table\n"
        "base: {dataset: synthetic, model: mlp_fcd, clients: 8, rounds: 2}\n"
        "seeds: 0-2\n"
        "configs:\n"
        "  - {name: fedavg, set: {algo: fedavg}, paper: '81.1'}\n"
        "  - {name: prox, set: {algo: fedprox}}\n"
        "grid: {algo.mu: [0.01, 0.1], local_epochs: [1, 2]}\n"
    )
    suite = load_suite(tmp_path / "s.yaml")
    names = [c.name for c in suite.configs]
    assert names == [
        "fedavg_local_epochs=1",
        "fedavg_local_epochs=2",
        "prox_mu=0.01_local_epochs=1",
        "prox_mu=0.01_local_epochs=2",
        "prox_mu=0.1_local_epochs=1",
        "prox_mu=0.1_local_epochs=2",
    ]
    assert suite.configs[0].paper == "81.1" and suite.seeds == (0, 1, 2)
    assert suite.configs[2].settings == {"algo": "fedprox", "algo.mu": 0.01, "train.local_epochs": 1}
    (tmp_path / "bad.yaml").write_text("name: x\nconfigs: [{set: {algo: fedavg}}]\n")
    with pytest.raises(ConfigError, match="needs a name"):
        load_suite(tmp_path / "bad.yaml")
    assert expand_grid([SuiteConfig("a", {"algo": "fedavg"})], {}) == (SuiteConfig("a", {"algo": "fedavg"}),)


# ---------------------------------------------------------------------------------------- running


def _run_py(args: list[str], out: Path) -> list[dict]:
    from raysim.commands.run import main

    assert main([*args, "--executor", "serial", "--no-progress", "-q", "--out", str(out)]) == 0
    return pq.read_table(out / "metrics.parquet").to_pylist()


@pytest.mark.ray
@pytest.mark.integration
def test_a_suite_gives_the_numbers_of_the_same_runs_through_run_py(tmp_path, ray_local, capsys):
    """The command's suite, its trials' numbers those of run.py; and with --publish PAGE_DIR, once
    it has finished, its record in PAGE_DIR/suite and its page in PAGE_DIR (the page raysim report
    --publish draws from that record), notes.md kept."""
    from raysim.commands.console import main as console_main
    from raysim.commands.sweep import main

    page = tmp_path / "docs" / "results" / "tiny"
    page.mkdir(parents=True)
    (page / "notes.md").write_text("Why the rows differ.\n")
    argv = ["--algo", "fedavg,fedprox", "--seeds", "0-1", *TINY, "--out", str(tmp_path / "suite"), "--publish", str(page)]
    assert main([*argv, "--no-progress", "-q"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["page"] == str(page.resolve() / "README.md")
    summary = json.loads((tmp_path / "suite" / "summary.json").read_text())
    assert summary["trials"] == 4
    assert sorted(p.name for p in (page / "suite" / "runs").iterdir()) == sorted(f"{a}-seed{s}" for a in ("fedavg", "fedprox") for s in (0, 1))
    again = tmp_path / "again"
    again.mkdir()
    shutil.copyfile(page / "notes.md", again / "notes.md")
    assert console_main(["report", "--publish", str(page / "suite"), str(again)]) == 0
    assert (page / "README.md").read_text() == (again / "README.md").read_text()
    assert "Why the rows differ." in (page / "README.md").read_text() and "| fedprox |" in (page / "README.md").read_text()
    table = pq.read_table(tmp_path / "suite" / "metrics.parquet").to_pylist()
    finals: dict[str, list[float]] = {}
    for algo in ("fedavg", "fedprox"):
        for seed in (0, 1):
            want = _run_py(["--algo", algo, "--seed", str(seed), *TINY], tmp_path / f"{algo}{seed}")
            got = [
                {k: v for k, v in r.items() if k not in ("config", "seed", "trial")}
                for r in table
                if r["config"] == algo and r["seed"] == seed
            ]
            assert without_times(got) == without_times(want), (algo, seed)
            finals.setdefault(algo, []).append(want[-1]["gm_gtest"])
    for c in summary["configs"]:
        assert c["seeds"] == [0, 1]
        assert c["mean"]["gm_gtest"] == pytest.approx(np.mean(finals[c["config"]]), abs=1e-12)
        assert c["std"]["gm_gtest"] == pytest.approx(np.std(finals[c["config"]]), abs=1e-12)
        assert c["mean"]["lm_ptest"] is None
    assert (tmp_path / "suite" / "report.md").read_text().count("| fedprox |") == 1
    assert (tmp_path / "suite" / "accuracy_gm_gtest.png").stat().st_size > 5000
    # two trials at a time on the 2 CPUs: the third and fourth ran in the first two's processes
    log = [line.split() for line in (tmp_path / "suite" / "trial_starts.log").read_text().splitlines()]
    starts = [line for line in log if line[1] == "start"]
    assert len(starts) == 4 and len({line[3] for line in starts}) == 2
    # each trial's end after its start, from the same process
    ends = {line[0]: line for line in log if line[1] == "end"}
    assert sorted(ends) == sorted(line[0] for line in starts)
    assert all(float(ends[s[0]][2]) > float(s[2]) and ends[s[0]][3] == s[3] for s in starts)


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        ("a_file", "--publish takes the page's directory; "),
        ("suite/page", "--publish writes the page outside the suite directory"),
        ("suite", "--publish writes the page outside the suite directory"),
        ("not_a_record", "is not a suite's record"),
    ],
)
def test_a_bad_publish_directory_is_refused_in_one_sentence_before_ray_starts(tmp_path, monkeypatch, capsys, where, needle):
    import raysim.suite
    from raysim.commands.sweep import main

    monkeypatch.setattr(raysim.suite, "run_suite", _never_run)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "not_a_record" / "suite").mkdir(parents=True)
    (tmp_path / "not_a_record" / "suite" / "my_thesis.tex").write_text("x")
    argv = ["--algo", "fedavg", *TINY, "--out", str(tmp_path / "suite"), "--publish", str(tmp_path / where), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("raysim: error: ") and needle in err, err
    assert (tmp_path / "not_a_record" / "suite" / "my_thesis.tex").exists()


@pytest.mark.ray
@pytest.mark.integration
def test_trials_that_do_not_fit_at_once_queue_instead_of_oversubscribing(tmp_path, ray_local):
    """Two trials of two 0.75-CPU workers each on a 2-CPU cluster: one at a time, from the
    cluster's own view (its placement groups and free CPUs), both done."""
    import ray

    from raysim.suite import run_suite

    suite, _, _ = suite_from_args(
        ["--algo", "fedavg", "--seeds", "0-1", "--workers", "2", "--cpus-per-worker", "0.75", *TINY]
    )
    seen = {"created": 0, "pending": 0, "min_free": 2.0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            groups = ray.util.placement_group_table().values()
            created = sum(g["state"] == "CREATED" for g in groups)
            seen["created"] = max(seen["created"], created)
            seen["pending"] = max(seen["pending"], sum(g["state"] == "PENDING" for g in groups))
            seen["min_free"] = min(seen["min_free"], ray.available_resources().get("CPU", 0.0))
            time.sleep(0.05)

    # what is free before the suite (a worker of an earlier test in this session may still be going)
    before = ray.available_resources().get("CPU", 0.0)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        summary = run_suite(suite, tmp_path / "suite", progress=False)
    finally:
        done.set()
        watcher.join()
    assert summary["trials"] == 2
    assert seen["created"] == 1  # never two trials' 1.5 CPUs on 2
    assert seen["min_free"] >= before - 1.5 - 1e-9  # the one trial takes its 1.5 CPUs, no more
    starts = (tmp_path / "suite" / "trial_starts.log").read_text().split("\n")
    assert sorted(line.split()[1] for line in starts if line) == ["end"] * 2 + ["start"] * 2


@pytest.mark.ray
@pytest.mark.integration
def test_an_interrupted_or_killed_suite_resumes_to_the_same_table_without_rerunning_finished_trials(
    tmp_path, ray_local
):
    """Three trials, one at a time, a checkpoint every 8 of their 40 rounds. Ctrl-C once the first
    is done and the second has a checkpoint: the second ends its round and writes a checkpoint of
    it, so every row it wrote is in it; --resume, then kill -9 of the driver (and with it its local
    Ray) once the second is done and the third has a checkpoint; --resume again. The finished trials
    never run again, the stopped ones go on from their checkpoints, and the table and summary.json
    are the uninterrupted suite's. The suite directory is moved between the stop and the first
    --resume (as to another machine): the resumed trials write where it now is."""
    from raysim.suite import run_suite
    from raysim.suite.records import copy_record

    run = [*TINY, "--rounds", "40", "--checkpoint-every", "8", "--eval-every", "2"]
    sweep = [sys.executable, str(ROOT / "scripts" / "sweep.py")]
    begun, stopped = tmp_path / "begun", tmp_path / "stopped"

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*sweep, *args, "--no-progress"], env=ENV, cwd=ROOT, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def wait_until(proc: subprocess.Popen[str], finished: int, suite_dir: Path = stopped) -> None:
        """Until ``finished`` trials are done and another has a checkpoint but no summary yet."""

        def there() -> bool:
            runs = list((suite_dir / "runs").glob("*")) if (suite_dir / "runs").exists() else []
            done = [r for r in runs if (r / "summary.json").exists()]
            going = [r for r in runs if (r / "checkpoint.pkl").exists() and not (r / "summary.json").exists()]
            return len(done) == finished and bool(going)

        deadline = time.monotonic() + 240
        while not there() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert there(), proc.stderr.read()[-3000:] if proc.poll() is not None else "timed out"

    def finished() -> set[str]:
        return {p.parent.name for p in (stopped / "runs").glob("*/summary.json")}

    proc = start("--algo", "fedavg", "--seeds", "0-2", "--max-concurrent", "1", "--driver-cpus", "1", *run, "--out", str(begun))
    wait_until(proc, 1, begun)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "--resume" in err and "stop after their round" in err, err[-3000:]
    assert "raysim: 2 trial(s) unfinished" in err, err[-3000:]  # the stopped one and the one not begun
    (going,) = [r for r in (begun / "runs").glob("*") if not (r / "summary.json").exists()]
    rows = pq.read_table(going / "metrics.parquet").column("round").to_pylist()
    stopped_at = checkpoint.load(going).round
    assert stopped_at > 8 and stopped_at >= max(rows)  # past its periodic checkpoint, and no row lost
    assert not (begun / STOP_FILE).exists() and not (begun / LIVE_DIR).exists()
    shutil.move(begun, stopped)
    (first,) = finished()
    proc = start("--resume", str(stopped))
    wait_until(proc, 2)
    os.kill(proc.pid, signal.SIGKILL)  # the driver, at once
    proc.communicate(timeout=60)
    os.killpg(proc.pid, signal.SIGKILL)  # and what it started: nothing of that Ray session goes on
    (second,) = finished() - {first}
    resumed = subprocess.run(
        [*sweep, "--resume", str(stopped), "--no-progress"], env=ENV, cwd=ROOT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    starts = [line.split() for line in (stopped / "trial_starts.log").read_text().splitlines()]
    assert [s[1] for s in starts if s[0] == first] == ["start", "end"]  # a finished trial ran once
    assert [s[1] for s in starts if s[0] == second] == ["start", "resume", "end"]  # ... the stopped one went on
    (third,) = {s[0] for s in starts} - {first, second}
    assert [s[1] for s in starts if s[0] == third][-2:] == ["resume", "end"]  # ... and so did the killed one
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["trials"] == 3 and summary["configs"][0]["seeds"] == [0, 1, 2]
    whole, _, _ = suite_from_args(["--algo", "fedavg", "--seeds", "0-2", *run])
    run_suite(whole, tmp_path / "whole", progress=False)

    def rows(suite_dir: Path) -> list[dict]:  # every round's numbers of every seed, in seed order
        table = pq.read_table(suite_dir / "metrics.parquet").to_pylist()
        return without_times(sorted(table, key=lambda r: (r["seed"], r["round"])))

    assert rows(stopped) == rows(tmp_path / "whole")  # (a suite's rows are run.py's: the test above)

    def table_of(suite_dir: Path) -> dict:
        return {k: v for k, v in json.loads((suite_dir / "summary.json").read_text()).items() if k != "suite_dir"}

    assert table_of(stopped) == table_of(tmp_path / "whole")
    assert not begun.exists()  # nothing went back to where the suite began
    # its record (raysim.suite.records: kilobytes a trial) carried elsewhere without the first
    # trial: --resume of the record runs that trial alone, from its start; stopped again, it says
    # one trial is left (not the finished ones Tune had yet to report); the last --resume goes on
    # from its checkpoint to the same table
    carried = tmp_path / "carried"
    copy_record(stopped, carried)
    shutil.rmtree(carried / "runs" / first)
    before = (carried / "trial_starts.log").read_text().splitlines()
    proc = start("--resume", str(carried))  # a trial and its driver's CPU fill the two: one at a time
    wait_until(proc, 2, carried)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "raysim: 1 trial(s) unfinished" in err, err[-3000:]
    run_suite(load_suite(carried / "suite.yaml"), carried, resume=True, progress=False)
    after = (carried / "trial_starts.log").read_text().splitlines()
    assert after[: len(before)] == before
    assert [line.split()[:2] for line in after[len(before) :]] == [[first, "start"], [first, "resume"], [first, "end"]]
    assert table_of(carried) == table_of(tmp_path / "whole")


@pytest.mark.ray
def test_a_random_search_with_asha_early_stopping(tmp_path, ray_local):
    from raysim.suite import run_suite

    suite, _, _ = suite_from_args(
        ["--algo", "fedavg", "--set", "train.lr=loguniform(0.001,0.3)", "--search", "random", "--samples", "4",
         "--scheduler", "asha", "--metric", "gm_gtest", *TINY, "--rounds", "4"]
    )  # fmt: skip
    summary = run_suite(suite, tmp_path / "suite", progress=False)
    lrs = [c["settings"]["train.lr"] for c in summary["configs"]]
    assert len(lrs) == 4 and len(set(lrs)) == 4 and all(0.001 <= lr <= 0.3 for lr in lrs)
    for c in summary["configs"]:  # each sample ran; ASHA may have stopped some before round 4
        assert len(c["rounds"]) == 1 and 1 <= c["rounds"][0] <= 4
        assert c["mean"]["gm_gtest"] is not None
    rows = pq.read_table(tmp_path / "suite" / "metrics.parquet").to_pylist()
    assert {r["train.lr"] for r in rows} == set(lrs)  # every row knows its sample
    assert "search" in load_suite(tmp_path / "suite" / "suite.yaml").__dict__ and load_suite(
        tmp_path / "suite" / "suite.yaml"
    ).search.scheduler == "asha"


@pytest.mark.ray
def test_asha_stops_a_grid_trial_early_that_runs_to_its_end_without_it(tmp_path, ray_local):
    """No search: a grid of lr 0.05 (G-Test 0.46 after round 1) then lr 0.0001 (0.14), one at a
    time, under ASHA (its first rung at the first report): the second trails the first at round 1
    and is stopped there, with that round's numbers. Without a scheduler (Tune's FIFO, as every
    other suite test runs) the same trial runs its 3 rounds, as through run.py."""
    from raysim.suite import run_suite

    grid = [*SCHEDULED, "--rounds", "3"]
    suite, _, _ = suite_from_args([*grid, "--scheduler", "asha"])
    summary = run_suite(suite, tmp_path / "suite", progress=False, max_concurrent=1)
    assert {c["config"]: c["rounds"] for c in summary["configs"]} == {"lr=0.05": [3], "lr=0.0001": [1]}
    stopped = pq.read_table(tmp_path / "suite" / "runs" / "lr=0.0001-seed0" / "metrics.parquet").to_pylist()
    whole = _run_py(["--algo", "fedavg", *TINY, "--lr", "0.0001", "--rounds", "3"], tmp_path / "whole")
    assert [r["round"] for r in whole] == [1, 2, 3]
    assert without_times(stopped) == without_times(whole[:1])


@pytest.mark.parametrize("path", sorted((ROOT / "suites").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_suite_file_loads_and_every_trial_validates(path):
    suite = load_suite(path)  # make_suite validates every trial's config, as run.py would
    assert suite.configs and len(trials(suite)) == len(suite.configs) * len(suite.seeds)


@pytest.mark.ray
@pytest.mark.integration
def test_each_configuration_is_paired_with_the_baseline_at_equal_compute(tmp_path, ray_local):
    """Fed3+2p's 'all' reading trains every client in phase 1: 8 + 4 client-epochs over 2 rounds of
    one epoch, so its FedAvg pair takes 6 clients a round; the plain reading trains 4 + 4, as FedAvg
    at its own participation."""
    from raysim.suite import SuiteConfig, make_suite, run_suite

    flags, _, _ = suite_from_args(["--algo", "fed3p2", "--set", "algo.num_type_a=2", "--set", "algo.num_type_b=2", *TINY])
    suite = make_suite(
        name="pairs",
        base=flags.base,
        configs=[SuiteConfig("all", {"algo.chain_sampling": "all"}), SuiteConfig("global")],
        grid={},
        seeds=[0],
        equal_compute=SuiteConfig("fedavg", {"algo": "fedavg"}),
    )
    summary = run_suite(suite, tmp_path / "suite", progress=False)
    by_name = {c["config"]: c for c in summary["configs"]}
    assert by_name["all"]["equal_compute"] == ["fedavg_r2_k6"]
    assert by_name["global"]["equal_compute"] == ["fedavg_r2_k4"]
    for reading, pair in (("all", "fedavg_r2_k6"), ("global", "fedavg_r2_k4")):
        ours = json.loads((tmp_path / "suite" / "runs" / f"{reading}-seed0" / "summary.json").read_text())
        theirs = json.loads((tmp_path / "suite" / "runs" / f"{pair}-seed0" / "summary.json").read_text())
        assert theirs["client_epochs"] == pytest.approx(ours["client_epochs"])
        assert by_name[pair]["settings"]["algo"] == "fedavg"
    assert "at equal compute" in (tmp_path / "suite" / "report.md").read_text()


def test_a_suites_ctrl_c_waits_for_the_trials_in_their_run_then_stops_tune(tmp_path):
    """GracefulStop (Tune's run emulated by a SIGUSR1 handler, as Tune's run installs): the first
    Ctrl-C writes the stop file and stops Tune only once no trial is inside its run (one whose
    process is gone does not count); a second stops Tune at once; a third is a KeyboardInterrupt.
    Leaving puts back the Ctrl-C handler and Tune's setting, and removes the files."""
    import socket

    from raysim.suite.tune import GracefulStop

    stopped: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: stopped.append(1))
    before = signal.getsignal(signal.SIGINT)
    gone = subprocess.Popen(["true"])
    gone.wait()
    live = tmp_path / LIVE_DIR
    live.mkdir()
    (live / "left-by-a-killed-suite-seed0").write_text(f"{socket.gethostname()} {os.getpid()}")

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 10
        while len(stopped) < n and time.monotonic() < deadline:
            time.sleep(0.05)

    try:
        with GracefulStop(tmp_path):
            assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1" and not live.exists()  # cleared
            live.mkdir()
            (live / "running-seed0").write_text(f"{socket.gethostname()} {os.getpid()}")
            (live / "ended-seed0").write_text(f"{socket.gethostname()} {gone.pid}")
            signal.raise_signal(signal.SIGINT)
            assert (tmp_path / STOP_FILE).exists()
            time.sleep(1.5)
            assert stopped == []  # a trial is still inside its run
            (live / "running-seed0").unlink()
            wait_for(1)
            assert stopped == [1]
            signal.raise_signal(signal.SIGINT)
            wait_for(2)
            assert stopped == [1, 1]
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is before and "TUNE_DISABLE_SIGINT_HANDLER" not in os.environ
        assert not (tmp_path / STOP_FILE).exists() and not live.exists()
    finally:
        signal.signal(signal.SIGUSR1, previous)
