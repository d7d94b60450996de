"""Joining an existing Ray cluster with --address: a real two-node cluster (``ray.cluster_utils``:
its own GCS and two raylets on this machine, one CPU each, so the two one-CPU client workers must
land on different nodes), with the same numbers as the serial run."""

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
    "--algo", "fedavg", "--dataset", "synthetic", "--model", "mlp_fcd", "--clients", "8",
    "--participation", "0.5", "--rounds", "2", "--local-epochs", "1", "--threads", "1",
    "--no-progress", "--set", "data.synthetic.shape=1,8,8", "--set", "data.synthetic.train_samples=800",
]  # fmt: skip


def _run(args, tmp_path, name, env=None):
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run.py"), *ARGS, *args, "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), pq.read_table(
        out / "metrics.parquet"
    ).to_pylist()


@pytest.mark.ray
def test_join_a_two_node_cluster_and_match_the_serial_run(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        # the driver joins with this process's settings, token authentication included: the
        # cluster's nodes were started from here with them
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        daemons = [p.process for node in cluster.list_all_nodes() for ps in node.all_processes.values() for p in ps]
        _, joined = _run(["--address", cluster.address, "--workers", "2"], tmp_path, "joined", env)
        # the run that joined the cluster left every daemon of it running
        assert daemons and all(p.poll() is None for p in daemons), [p.args[0] for p in daemons if p.poll() is not None]
        _, serial = _run(["--executor", "serial"], tmp_path, "serial")
        # with a cluster running on this machine, a run without --address still starts its own Ray
        # (plain ray.init() would join the cluster `ray start` or this test left behind)
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "run.py"), *ARGS, "--workers", "2", "--out", str(tmp_path / "local")],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        started = [line for line in proc.stderr.splitlines() if "started local Ray at" in line]
        assert started and cluster.address not in started[0], started
        assert without_times(joined) == without_times(serial)
    finally:
        cluster.shutdown()
