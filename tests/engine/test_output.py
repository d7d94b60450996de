"""The run directory: TensorBoard events, metrics.parquet, clients.parquet, the resolved config and
the CLI's closing JSON line, read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_cli_run_writes_tables_tensorboard_and_json(tmp_path):
    """scripts/run.py ends its process without the interpreter's teardown
    (raysim.commands.exit_process): every file is complete all the same."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable, str(ROOT / "scripts" / "run.py"), "--algo", "fedavg", "--dataset", "synthetic",
            "--model", "mlp_fcd", "--clients", "6", "--participation", "0.5", "--rounds", "4",
            "--eval-every", "2", "--local-epochs", "1", "--executor", "serial", "--out", str(out),
            "--set", "data.synthetic.shape=1,8,8", "--set", "data.synthetic.train_samples=600",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["run_dir"] == str(out) and summary["rounds"] == 4
    assert set(summary["final"]) == {"gm_gtest", "gm_ptest", "lm_ptest", "updated_lm_ptest"}
    assert summary["final"]["updated_lm_ptest"] is None  # eval.updated_lm is off

    metrics = pq.read_table(out / "metrics.parquet").to_pylist()
    assert [r["round"] for r in metrics] == [2, 4]
    assert metrics[-1]["gm_gtest"] == summary["final"]["gm_gtest"]
    assert all(0 <= r["gm_ptest"] <= 1 and r["lm_ptest"] is None for r in metrics)
    assert all(r["bytes_down"] > 0 and r["bytes_up"] > 0 for r in metrics)

    clients = pq.read_table(out / "clients.parquet").to_pylist()
    assert len(clients) == 2 * 6
    assert {r["client"] for r in clients} == set(range(6))
    last = [r for r in clients if r["round"] == 4]
    assert abs(sum(r["gm_ptest"] for r in last) / 6 - metrics[-1]["gm_ptest"]) < 1e-12

    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["algo"] == "fedavg" and cfg["clients"] == 6 and cfg["data"]["synthetic"]["shape"] == [1, 8, 8]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "accuracy/gm_gtest",
        "accuracy/gm_ptest",
        "train/loss",
        "time/round_s",
        "comm/bytes_down",
        "comm/bytes_up",
    } <= tags
    gm = acc.Scalars("accuracy/gm_gtest")
    assert [e.step for e in gm] == [2, 4]
    assert abs(gm[-1].value - summary["final"]["gm_gtest"]) < 1e-6
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    hist = acc.Histograms("clients/gm_ptest")
    assert [h.step for h in hist] == [2, 4] and hist[-1].histogram_value.num == 6
    # the partition picture, drawn beside the start, reaches TensorBoard once, as the file it wrote
    import io

    import numpy as np
    from PIL import Image

    [image] = acc.Images("data/partition")
    with Image.open(io.BytesIO(image.encoded_image_string)) as logged, Image.open(out / "partition.png") as drawn:
        assert image.step == 0 and np.array_equal(np.asarray(logged.convert("RGB")), np.asarray(drawn.convert("RGB")))


@pytest.mark.parametrize("fast", ["1", "0"])
def test_a_command_ends_at_once_with_its_output_flushed(fast):
    """exit_process: buffered output and logs are written and the status kept; the interpreter's
    teardown (here, an atexit hook) is skipped unless RAYSIM_FAST_EXIT=0."""
    probe = (
        "import atexit, logging, sys\n"
        "from raysim.commands import exit_process\n"
        "atexit.register(lambda: print('teardown', flush=True))\n"
        "logging.basicConfig(stream=sys.stderr, format='%(message)s')\n"
        "logging.getLogger('x').warning('logged')\n"
        "print('buffered', end='')\n"
        "exit_process(3)\n"
    )
    env = {**os.environ, "RAYSIM_FAST_EXIT": fast, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3
    assert proc.stdout == ("buffered" if fast == "1" else "bufferedteardown\n")
    assert proc.stderr.strip() == "logged"
