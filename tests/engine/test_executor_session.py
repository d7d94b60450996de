"""The Ray executor owns Ray's lifecycle (issue 11): it starts local Ray when none is running and
stops it at the end; inside a Ray session someone else started (a suite's trial, a notebook) it
neither starts nor stops Ray, and gives back what it took. The runner never imports Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysim.engine.runner import run_experiment
from tests.conftest import tiny_config, without_times

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
def test_runs_inside_a_ray_session_started_elsewhere_and_leaves_it_running(tmp_path, ray_local):
    import ray

    address = ray.get_runtime_context().gcs_address
    cpus = ray.cluster_resources()["CPU"]
    serial = run_experiment(tiny_config(tmp_path / "s"))
    result = run_experiment(tiny_config(tmp_path / "r", **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(result.rows) == without_times(serial.rows)
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == address
    deadline = time.monotonic() + 30  # its actors are gone: their CPUs come back
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == cpus


@pytest.mark.ray
def test_a_run_that_started_ray_stops_it(tmp_path):
    """...and every process of that Ray: its daemons, the workers, and the agents the raylet
    started (which outlive a raylet killed without its shutdown, unless raysim kills them too).
    The Ray it started has its dashboard agent but no dashboard head (``session.lean_start``)."""
    code = (
        "import psutil\n"
        "import raysim.engine.runner\n"
        "from raysim.results.output import BaseCallback\n"
        "from tests.conftest import tiny_config\n"
        "def args(p):\n"
        "    try:\n"
        "        return ' '.join(p.cmdline())\n"
        "    except psutil.Error:\n"
        "        return ''\n"
        "class Census(BaseCallback):\n"
        "    def on_round(self, stats, round_time):\n"
        "        self.procs = psutil.Process().children(recursive=True)\n"
        "        self.lines = [args(p) for p in self.procs]\n"
        "census = Census()\n"
        f"cfg = tiny_config({str(tmp_path)!r}, rounds=1, **{{'ray.executor': 'ray', 'ray.workers': 1}})\n"
        "raysim.engine.runner.run_experiment(cfg, [census])\n"
        "import ray\n"
        "gone, alive = psutil.wait_procs(census.procs, timeout=10)\n"
        "heads = sum('dashboard/dashboard.py' in line for line in census.lines)\n"
        "agents = sum('DashboardAgent' in line for line in census.lines)\n"
        "print('heads', heads, 'agents', agents)\n"
        "print('during the run', len(census.procs), 'left', [p.name() for p in alive])\n"
        "print('initialized', ray.is_initialized())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    dashboard, during, end = proc.stdout.strip().splitlines()[-3:]
    assert end == "initialized False"
    # gcs, raylet, the agents and the worker at least, and none of them left
    assert int(during.split()[3]) >= 5 and during.endswith("left []"), during
    assert dashboard == "heads 0 agents 1", dashboard  # the node's agent, and no dashboard head


@pytest.mark.ray
def test_a_starting_ray_asks_for_its_node_once_the_raylet_has_registered(ray_local):
    """``ray.init``'s wait for its node (``session.lean_start``): Ray's call is made as soon as the
    GCS lists the node alive, and for a node it does not list, after the poll's timeout."""
    import ray

    from raysim.engine.executors.session import _when_registered

    address = ray.get_runtime_context().gcs_address
    node = ray.get_runtime_context().get_node_id()
    calls: list[tuple[str, str]] = []
    get_node = _when_registered(lambda a, n: calls.append((a, n)) or "the node's info", timeout_s=2.0)
    t = time.monotonic()
    assert get_node(address, node) == "the node's info"
    registered = time.monotonic() - t
    t = time.monotonic()
    get_node(address, "ab" * 28)
    unknown = time.monotonic() - t
    assert calls == [(address, node), (address, "ab" * 28)]
    assert registered < 1.0 and unknown >= 2.0, (registered, unknown)


def test_the_runner_does_not_import_ray():
    import ast

    tree = ast.parse((ROOT / "raysim" / "engine" / "runner.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m == "ray" or m.startswith(("ray.", "raysim.engine.executors.session")) for m in imported)


@pytest.mark.ray
def test_a_local_run_prints_only_raysims_lines_and_stays_on_loopback(tmp_path):
    """Issue 25: no warning the user cannot act on (Ray's token authentication stays on, its notice
    goes), and local Ray on 127.0.0.1 even where nothing set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
    before Ray was imported."""
    import re

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ENABLE_WINDOWS", "RAY_AUTH_MODE", "RAY_ADDRESS"))}
    args = [
        "--algo", "fedavg", "--dataset", "synthetic", "--model", "mlp_fcd", "--clients", "4", "--rounds", "1",
        "--workers", "1", "--no-progress", "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run.py"), *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and all(re.match(r"^\d\d:\d\d:\d\d INFO raysim\.", line) for line in lines), proc.stderr
    assert any("started local Ray at 127.0.0.1:" in line for line in lines), proc.stderr
