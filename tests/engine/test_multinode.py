"""Several nodes: Fed3+2p on a real three-node Ray cluster (``ray.cluster_utils``: one GCS and
three raylets on this machine, one CPU each), its three one-CPU client workers one per node, so
coordinator chains pass their weights node to node and personal state lives on every node; the
metrics equal the single-node run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import without_times

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--algo", "fed3p2", "--dataset", "synthetic", "--model", "cnn3p2_fmnist", "--clients", "12",
    "--participation", "0.75", "--rounds", "4", "--local-epochs", "1", "--threads", "1", "--lr", "0.01",
    "--no-progress", "--set", "data.synthetic.shape=1,16,16", "--set", "data.synthetic.train_samples=800",
    "--set", "algo.num_type_a=3", "--set", "algo.num_type_b=3", "--set", "eval.every=1",
]  # fmt: skip


def _run(args: list[str], out: Path, env: dict[str, str]) -> tuple[list[dict], str]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run.py"), *ARGS, *args, "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=out.parent, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["rounds"] == 4
    rows = pq.read_table(out / "metrics.parquet").to_pylist()
    return without_times(rows), proc.stderr


@pytest.mark.ray
@pytest.mark.slow  # about a minute; a real cluster stays in the default suite (tests/engine/test_job_submit.py)
def test_fed3p2_on_three_nodes_equals_one_node(tmp_path):
    from ray.cluster_utils import Cluster

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    one_node, log = _run(["--workers", "3", "--cpus-per-worker", "0.5"], tmp_path / "one", env)
    assert "on 1 node(s)" in log
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        three_nodes, log = _run(
            ["--address", cluster.address, "--workers", "3", "--cpus-per-worker", "1"],
            tmp_path / "three",
            env,
        )
    finally:
        cluster.shutdown()
    # one CPU per node and per worker: a worker on each node (the single-node run's workers take
    # half a CPU each to fit this machine's two; every job trains with one thread either way)
    assert "3 client workers ready on 3 node(s)" in log, log[-2000:]
    assert [r["phase"] for r in one_node] == [1, 1, 2, 2]
    assert three_nodes == one_node
