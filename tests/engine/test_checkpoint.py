"""Checkpoint and resume: a run stopped after round r (Ctrl-C at a round boundary, or killed
outright) and resumed ends with exactly the metrics of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from raysim import checkpoint
from raysim.engine.runner import run_experiment
from raysim.results.output import BaseCallback
from tests.conftest import tiny_config, without_times

ROOT = Path(__file__).resolve().parents[2]

#: algorithms whose state lives in different places: personal heads (fedper), coordinator chains,
#: groupings, filters and a phase switch on the server (fed3p2), control variates (scaffold),
#: personal models (ditto), a prologue round and a server-trained head (fedfcd), and FedPAC's
#: per-client heads, centroids and collaboration weights, all held by the server
CASES: dict[str, dict[str, Any]] = {
    "fedper": {},
    "fed3p2": {
        "model": "cnn3p2_fmnist",
        "data.synthetic.shape": (1, 16, 16),
        "clients": 10,
        "algo.num_type_a": 3,
        "algo.num_type_b": 3,
        "train.lr": 0.01,
    },
    "scaffold": {},
    "ditto": {},
    "fedfcd": {},
    "fedpac": {"model": "cnn_pac", "data.synthetic.shape": (1, 16, 16)},
}


class CtrlCAfter(BaseCallback):
    """Sends this process SIGINT while round ``rnd`` is being logged, as a user's Ctrl-C would."""

    def __init__(self, rnd: int) -> None:
        self.rnd = rnd

    def on_round(self, stats: Any, round_time: float) -> None:
        if stats.rnd == self.rnd:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("algo", list(CASES))
def test_ctrl_c_then_resume_gives_the_uninterrupted_metrics(tmp_path, algo):
    setup = {"algo": algo, "rounds": 4, "participation": 0.75, "eval.every": 1, **CASES[algo]}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    first = run_experiment(cfg, [CtrlCAfter(2)])
    assert first.stopped and first.last_round == 2
    assert [r["round"] for r in first.rows] == [1, 2]
    ckpt = checkpoint.load(tmp_path / "stopped")
    assert ckpt.round == 2 and ckpt.algo == algo
    assert without_times(ckpt.rows) == without_times(full.rows[:2])
    if algo in ("fedper", "scaffold", "ditto", "fedfcd"):
        assert ckpt.snapshot.client_states, "the clients' personal state is in the checkpoint"
    resumed = run_experiment(cfg, resume=ckpt)
    assert not resumed.stopped and resumed.last_round == 4
    assert without_times(resumed.rows) == without_times(full.rows)
    on_disk = pq.read_table(tmp_path / "stopped" / "metrics.parquet").to_pylist()
    assert without_times(on_disk) == without_times(pq.read_table(tmp_path / "full" / "metrics.parquet").to_pylist())
    clients = pq.read_table(tmp_path / "stopped" / "clients.parquet").to_pylist()
    assert clients == pq.read_table(tmp_path / "full" / "clients.parquet").to_pylist()


def test_a_stop_asked_from_another_thread_is_ctrl_cs_stop(tmp_path):
    """``run_experiment(stop_when=...)``, asked at each round's end (a suite's Ctrl-C reaching its
    trials, which run in no main thread): the round it answers True in is the last, with its
    checkpoint, whatever ``output.checkpoint_every``; the run resumes to the uninterrupted metrics."""
    import threading

    setup = {"algo": "fedper", "rounds": 5, "eval.every": 1, "output.checkpoint_every": 0}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    asked: list[int] = []
    out: list[Any] = []

    def stop_when() -> bool:
        asked.append(len(asked) + 1)
        return len(asked) == 3

    thread = threading.Thread(target=lambda: out.append(run_experiment(cfg, stop_when=stop_when)))
    thread.start()
    thread.join()
    (first,) = out
    assert asked == [1, 2, 3]  # once a round, and not after the stop
    assert first.stopped and first.last_round == 3 and checkpoint.load(tmp_path / "stopped").round == 3
    assert json.loads((tmp_path / "stopped" / "summary.json").read_text())["stopped"] is True
    resumed = run_experiment(cfg, resume=checkpoint.load(tmp_path / "stopped"))
    assert not resumed.stopped and without_times(resumed.rows) == without_times(full.rows)


def test_periodic_checkpoints_hold_the_last_multiple_of_k(tmp_path):
    cfg = tiny_config(tmp_path, algo="fedper", rounds=5, **{"output.checkpoint_every": 2})
    run_experiment(cfg)
    ckpt = checkpoint.load(tmp_path)
    assert ckpt.round == 4 and [r["round"] for r in ckpt.rows] == [1, 2, 3, 4]
    assert not (tmp_path / "checkpoint.pkl.tmp").exists()


def test_resume_purges_tensorboard_events_after_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(tmp_path, rounds=4, **{"output.tensorboard": True, "eval.every": 1})
    run_experiment(cfg, [CtrlCAfter(2)])
    run_experiment(cfg, resume=checkpoint.load(tmp_path))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    # each step once: the stopped run's events after round 2 were purged. (The accumulator reads the
    # two runs' event files in their names' order, which two runs within one second need not keep.)
    assert sorted(e.step for e in acc.Scalars("accuracy/gm_gtest")) == [1, 2, 3, 4]


def run_cli(args: list[str], cwd: Path, **kw: Any) -> subprocess.Popen[str]:
    """``scripts/run.py ARGS`` in a process of its own (local Ray unless ARGS name a cluster)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAYSIM_LOG_LEVEL"] = "INFO"
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "run.py"), *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


CLI_ARGS = [
    "--algo", "fedper", "--dataset", "synthetic", "--model", "mlp_fcd", "--clients", "8",
    "--participation", "0.5", "--local-epochs", "1", "--threads", "1", "--no-progress", "--seed", "3",
    "--set", "data.synthetic.shape=1,8,8", "--set", "data.synthetic.train_samples=800",
]  # fmt: skip


def wait_for_rows(metrics: Path, proc: subprocess.Popen[str], rows: int, timeout: float = 180) -> None:
    """Until ``metrics`` (a run's metrics.parquet) has ``rows`` rows, while ``proc`` runs."""
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and pq.read_metadata(metrics).num_rows >= rows):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)


def _wait_for_checkpoint(path: Path, proc: subprocess.Popen[str], rnd: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and checkpoint.load(path.parent).round >= rnd:
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


@pytest.mark.integration
def test_killed_outright_then_resumed_from_the_cli(tmp_path):
    """SIGKILL (no clean-up at all) some time after round 3's checkpoint; ``--resume`` redoes the
    rounds after it and ends with the uninterrupted run's tables."""
    args = [*CLI_ARGS, "--executor", "serial", "--local-epochs", "5", "--rounds", "40"]
    full = run_cli([*args, "--out", str(tmp_path / "full")], tmp_path)
    assert full.wait(300) == 0, full.communicate()[1][-2000:]
    killed = run_cli([*args, "--checkpoint-every", "3", "--out", str(tmp_path / "killed")], tmp_path)
    _wait_for_checkpoint(tmp_path / "killed" / "checkpoint.pkl", killed, 3)
    killed.kill()
    killed.communicate()
    stopped_at = checkpoint.load(tmp_path / "killed").round
    assert 3 <= stopped_at < 40
    resumed = run_cli(["--resume", str(tmp_path / "killed"), "--no-progress"], tmp_path)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert f"resumed after round {stopped_at} of 40" in err
    assert json.loads(out.strip().splitlines()[-1])["rounds"] == 40
    for table in ("metrics.parquet", "clients.parquet"):
        a = pq.read_table(tmp_path / "full" / table).to_pylist()
        b = pq.read_table(tmp_path / "killed" / table).to_pylist()
        assert without_times(a) == without_times(b), table


@pytest.mark.ray
@pytest.mark.integration
def test_ctrl_c_on_a_local_ray_run_stops_at_a_round_boundary(tmp_path):
    """Ctrl-C in a terminal reaches the whole foreground process group (the driver and the Ray it
    started): the round finishes, a checkpoint is written, exit status 130, and ``--resume`` on Ray
    gives the serial run's metrics."""
    args = [*CLI_ARGS, "--workers", "2", "--local-epochs", "2", "--rounds", "20", "--checkpoint-every", "0"]
    proc = run_cli([*args, "--out", str(tmp_path / "run")], tmp_path, start_new_session=True)
    wait_for_rows(tmp_path / "run" / "metrics.parquet", proc, 2)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err and "Traceback" not in err
    ckpt = checkpoint.load(tmp_path / "run")
    assert 2 <= ckpt.round < 20 and json.loads(out.strip().splitlines()[-1])["stopped"]
    # two rounds on from the checkpoint (--rounds is what a resumed run may change), and the serial
    # run to there
    end = str(ckpt.round + 2)
    resumed = run_cli(["--resume", str(tmp_path / "run"), "--rounds", end, "--no-progress"], tmp_path)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    serial = run_cli([*args, "--rounds", end, "--executor", "serial", "--out", str(tmp_path / "serial")], tmp_path)
    assert serial.wait(300) == 0
    a = pq.read_table(tmp_path / "serial" / "metrics.parquet").to_pylist()
    b = pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist()
    assert without_times(a) == without_times(b)


def test_resume_refuses_what_it_cannot_do(tmp_path):
    run_experiment(tiny_config(tmp_path / "done", rounds=2, **{"output.checkpoint_every": 1}))
    cases = [
        (["--resume", str(tmp_path / "done"), "--lr", "0.5"], "train.lr cannot be changed"),
        (["--resume", str(tmp_path / "done")], "has done its 2 rounds"),
        (["--resume", str(tmp_path / "nothing")], "not a run directory"),
    ]
    (tmp_path / "nockpt").mkdir()
    (tmp_path / "nockpt" / "config.yaml").write_text((tmp_path / "done" / "config.yaml").read_text())
    cases.append((["--resume", str(tmp_path / "nockpt")], "holds no checkpoint"))
    for args, message in cases:
        proc = run_cli(args, tmp_path)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and message in err, (args, err)
        assert "Traceback" not in err
    proc = run_cli(["--resume", str(tmp_path / "done"), "--rounds", "3", "--no-progress"], tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert [r["round"] for r in pq.read_table(tmp_path / "done" / "metrics.parquet").to_pylist()] == [1, 2, 3]
