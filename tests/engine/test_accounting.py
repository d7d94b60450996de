"""What a run records beside its accuracies: the last-k mean of each metric, for curves
that swing, and its compute (samples trained and client-epochs), to compare runs at equal compute."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from raysim.engine.runner import run_experiment
from raysim.results.metrics import MetricHistory
from raysim.results.output import TableWriter
from tests.conftest import tiny_config


def test_last_k_mean_on_a_hand_example():
    rows = [
        {"round": 1, "gm_gtest": 0.10, "gm_ptest": None, "lm_ptest": None},
        {"round": 2, "gm_gtest": 0.50, "gm_ptest": 0.4, "lm_ptest": None},
        {"round": 3, "gm_gtest": 0.20, "gm_ptest": float("nan"), "lm_ptest": None},
        {"round": 4, "gm_gtest": 0.80, "gm_ptest": 0.6, "lm_ptest": 0.9},
    ]
    h = MetricHistory(rows)
    last = h.last(3)
    assert last["gm_gtest"] == pytest.approx((0.5 + 0.2 + 0.8) / 3)
    assert last["gm_ptest"] == pytest.approx((0.4 + 0.6) / 2)  # the evaluations that have a value
    assert last["lm_ptest"] == 0.9
    assert h.last(1)["gm_gtest"] == 0.8 and h.last(10)["gm_gtest"] == pytest.approx(1.6 / 4)
    assert MetricHistory([]).last(5) == dict.fromkeys(
        ("gm_gtest", "gm_ptest", "lm_ptest", "updated_lm_ptest", "new_gm_ptest", "new_lm_ptest")
    )


def test_summary_has_the_last_k_mean_and_the_compute(tmp_path):
    cfg = tiny_config(tmp_path, rounds=4, participation=0.5, **{"eval.last_k": 2, "train.local_epochs": 2})
    result = run_experiment(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    g = [r["gm_gtest"] for r in result.rows]
    assert summary["last_k"] == 2 and summary["last"]["gm_gtest"] == pytest.approx((g[-1] + g[-2]) / 2)
    assert summary["last"]["lm_ptest"] is None
    # compute: every sampled client trains E passes over its own data each round
    sizes = [int(s.size) for s in result_data(cfg).client_train]
    from raysim import rng

    want = sum(2 * sizes[c] for r in range(1, 5) for c in rng.sample_clients(cfg.seed, r, 8, 4))
    assert summary["samples_trained"] == want
    assert summary["client_epochs"] == pytest.approx(4 * 4 * 2)
    rows = pq.read_table(tmp_path / "metrics.parquet").to_pylist()
    assert rows[-1]["samples_trained"] == want and rows[-1]["client_epochs"] == pytest.approx(32)
    assert rows[0]["client_epochs"] == pytest.approx(8)  # cumulative, round by round
    # the phases around the rounds: start-up counts from the process's start, before the run's own
    # set-up (data and executor); shutdown from the last round's end
    assert summary["startup_s"] >= summary["setup_time_s"] > 0 and summary["shutdown_s"] >= 0


def result_data(cfg):
    from raysim.engine.runner import prepare

    return prepare(cfg)


def test_the_tables_keep_a_column_that_first_appears_in_a_later_row(tmp_path):
    writer = TableWriter()
    writer.run_dir = tmp_path
    writer.on_eval(1, {"round": 1, "a": 1.0}, [])
    writer.on_eval(2, {"round": 2, "a": 2.0, "late": 3.0}, [])
    assert pq.read_table(tmp_path / "metrics.parquet").to_pylist() == [
        {"round": 1, "a": 1.0, "late": None},
        {"round": 2, "a": 2.0, "late": 3.0},
    ]


@pytest.mark.integration
def test_startup_counts_from_raysims_import_also_when_python_was_execd(tmp_path):
    """``scripts/setup.sh run`` installs, then ``exec``s Python: the process was created when the
    shell started, seconds before raysim did. startup_s counts raysim's own start-up only."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = (
        f"exec {sys.executable} {root / 'scripts' / 'run.py'} --algo fedavg --dataset synthetic --clients 4 "
        f"--rounds 1 --executor serial --no-progress --no-tensorboard -q --out {tmp_path / 'run'}"
    )
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", f"sleep 3; {run}"], capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["setup_time_s"] <= summary["startup_s"] < wall - 3  # not the shell's 3 s before the exec
