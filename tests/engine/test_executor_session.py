"""The Ray executor owns Ray's lifecycle: it starts local Ray when none is running and
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
    # (ray.reuse_workers off, as by default: its actors end with it)
    on_ray = {"ray.executor": "ray", "ray.workers": 2, "ray.reuse_workers": False}
    result = run_experiment(tiny_config(tmp_path / "r", **on_ray))
    assert without_times(result.rows) == without_times(serial.rows)
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == address
    deadline = time.monotonic() + 30  # its actors are gone: their CPUs come back
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == cpus


@pytest.mark.ray
def test_a_runs_partition_picture_is_drawn_once_its_workers_actors_exist(tmp_path, ray_local, monkeypatch):
    """The partition picture is drawn once the executor asks for the data, after Ray is up and the
    workers' actors are created, in a thread of its own that the run waits for before it ends:
    drawn beside ``ray.init``, its CPU would slow Ray's start and so the workers'."""
    import threading

    from raysim.engine import runner
    from raysim.engine.executors import recovery

    events: list[tuple[str, str]] = []
    real_init = recovery.WorkerPool.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        events.append(("workers", threading.current_thread().name))

    real_picture = runner.picture_partition

    def picture(cfg, run_dir):
        draw = real_picture(cfg, run_dir)

        def drawn(data):
            events.append(("picture", threading.current_thread().name))
            draw(data)

        return drawn

    monkeypatch.setattr(recovery.WorkerPool, "__init__", init)
    monkeypatch.setattr(runner, "picture_partition", picture)
    result = run_experiment(tiny_config(tmp_path / "r", **{"ray.executor": "ray", "ray.workers": 1}))
    assert [e for e, _ in events] == ["workers", "picture"], events
    assert events[1][1] == "raysim-side" and events[0][1] != "raysim-side"
    assert (result.run_dir / "partition.png").is_file() and (result.run_dir / "partition.parquet").is_file()


@pytest.mark.ray
@pytest.mark.integration
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
        # the agent by its title, or by its script while it still imports (it starts beside the
        # workers); the raylet's own command line names that script too, further on
        "agents = sum('DashboardAgent' in line or 'dashboard/agent.py' in ' '.join(line.split()[:3]) for line in census.lines)\n"
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

    from raysim.engine.executors.ray_internals import when_registered

    address = ray.get_runtime_context().gcs_address
    node = ray.get_runtime_context().get_node_id()
    calls: list[tuple[str, str]] = []
    get_node = when_registered(lambda a, n: calls.append((a, n)) or "the node's info", timeout_s=2.0)
    t = time.monotonic()
    assert get_node(address, node) == "the node's info"
    registered = time.monotonic() - t
    t = time.monotonic()
    get_node(address, "ab" * 28)
    unknown = time.monotonic() - t
    assert calls == [(address, node), (address, "ab" * 28)]
    assert registered < 1.0 and unknown >= 2.0, (registered, unknown)


@pytest.mark.ray
def test_a_local_rays_agents_start_beside_the_run_and_yield_to_it(ray_local):
    """``session.lean_start``: the raylet registered with the ports written ahead of its agents
    (none for the minimal dashboard agent's services, and the runtime environment agent's chosen
    port, on which that agent then serves a task's environment), and Ray's Python helpers run at
    niceness 19 while the GCS and the raylet keep theirs."""
    import psutil
    import ray

    from raysim.engine.executors.session import DASHBOARD_AGENT, RUNTIME_ENV_AGENT

    here = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == here)
    assert (node["MetricsAgentPort"], node["MetricsExportPort"], node["DashboardAgentListenPort"]) == (-1, -1, -1)
    port = node["RuntimeEnvAgentPort"]
    assert port > 0

    @ray.remote(num_cpus=0)
    def read(name: str) -> str | None:
        return os.environ.get(name)

    assert ray.get(read.options(runtime_env={"env_vars": {"RAYSIM_SEEN": "yes"}}).remote("RAYSIM_SEEN")) == "yes"

    def line(p: psutil.Process) -> str:
        return " ".join(p.cmdline())

    daemons = {kind: [psutil.Process(i.process.pid) for i in infos] for kind, infos in ray._private.worker._global_node.all_processes.items()}
    (raylet,) = daemons["raylet"]
    agents = [c for c in raylet.children() if any(n in line(c) for n in DASHBOARD_AGENT + RUNTIME_ENV_AGENT)]
    (env_agent,) = [a for a in agents if any(n in line(a) for n in RUNTIME_ENV_AGENT)]
    assert len(agents) == 2
    assert any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in env_agent.net_connections())
    helpers = [*agents, *daemons["log_monitor"], *daemons["monitor"]]
    assert [p.nice() for p in helpers] == [19] * len(helpers)
    assert raylet.nice() == 0 and [p.nice() for p in daemons["gcs_server"]] == [0]


def test_a_client_workers_constructor_imports_pytorch():
    """A client worker's actor imports PyTorch as it is created, not when its data comes
    (``ClientWorker``): its process imports it while the driver loads the data."""
    code = (
        "import sys\n"
        "from raysim.engine.executors.actors import ClientWorker\n"
        "from tests.conftest import tiny_config\n"
        "before = 'torch' in sys.modules\n"
        "ClientWorker(tiny_config(), 0)\n"
        "print(before, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


@pytest.mark.ray
@pytest.mark.integration
def test_a_stopped_local_ray_leaves_no_process_even_on_a_busy_machine(tmp_path):
    """``session.stop_ray`` returns once every process of the Ray it started has ended: Ray's
    helpers run at niceness 19, and on a machine whose cores are busy a killed helper took a
    second or more to end (two of them outlived the stop in every try before it waited)."""
    code = (
        "import subprocess, ray\n"
        "from raysim.engine.executors import session\n"
        "from tests.conftest import tiny_config\n"
        "for _ in range(2):\n"
        "    assert session.start_ray(tiny_config())\n"
        "    name = ray._private.worker._global_node.session_name\n"
        "    session.stop_ray()\n"
        "    print(subprocess.run(['pgrep', '-f', name], capture_output=True, text=True).stdout.split())\n"
    )
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(min(os.cpu_count() or 2, 8))]
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "[]"], proc.stdout


def test_the_runner_does_not_import_ray():
    import ast

    tree = ast.parse((ROOT / "raysim" / "engine" / "runner.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m == "ray" or m.startswith(("ray.", "raysim.engine.executors.session")) for m in imported)


@pytest.mark.ray
@pytest.mark.integration
def test_a_local_run_prints_only_raysims_lines_and_stays_on_loopback(tmp_path):
    """No warning the user cannot act on (Ray's token authentication stays on, its notice
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


@pytest.mark.ray
def test_runs_on_a_session_reuse_the_actors_the_last_run_left_and_give_its_numbers(tmp_path, ray_local):
    """``ray.reuse_workers``: the next run of this process takes the last run's client-worker and
    server actors as they are (the same processes), and gives the serial numbers, personal state
    included (FedPer's heads live on the workers); a run that will not take them (the setting off)
    kills them first, so their CPUs are its own, and leaves nothing behind."""
    import ray

    from raysim.engine.executors import recovery

    def pids() -> set[int]:
        return {ray.get(a.__ray_call__.remote(lambda self: os.getpid())) for v in recovery._IDLE.values() for a in v}

    on = {"algo": "fedper", "ray.executor": "ray", "ray.workers": 2, "ray.reuse_workers": True}
    serial = run_experiment(tiny_config(tmp_path / "serial", algo="fedper"))
    first = run_experiment(tiny_config(tmp_path / "first", **on))
    left = pids()
    assert len(left) == 3  # two client workers and the server
    second = run_experiment(tiny_config(tmp_path / "second", **on))
    assert pids() == left  # the same processes again
    assert without_times(first.rows) == without_times(second.rows) == without_times(serial.rows)
    cpus = ray.cluster_resources()["CPU"]
    off = run_experiment(tiny_config(tmp_path / "off", **{**on, "ray.reuse_workers": False}))
    assert without_times(off.rows) == without_times(serial.rows)
    assert pids() == set() and all(not v for v in recovery._IDLE.values())
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ray.available_resources().get("CPU", 0) == cpus


@pytest.mark.ray
def test_an_idle_actor_that_died_is_passed_over_for_a_new_one(tmp_path, ray_local):
    """An actor left idle that dies before the next run (killed for memory, say) is not taken: the
    run starts a new one in its place and gives the serial numbers."""
    import ray

    from raysim.engine.executors import recovery

    on = {"ray.executor": "ray", "ray.workers": 2, "ray.reuse_workers": True}
    serial = run_experiment(tiny_config(tmp_path / "serial"))
    run_experiment(tiny_config(tmp_path / "first", **on))
    (clients,) = [v for k, v in recovery._IDLE.items() if k[2] == "client" and v]
    ray.kill(clients[-1], no_restart=True)
    again = run_experiment(tiny_config(tmp_path / "again", **on))
    assert without_times(again.rows) == without_times(serial.rows)
