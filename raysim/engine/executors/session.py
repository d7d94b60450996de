"""Starting, joining and stopping Ray: the Ray executor's session.

Local by default: Ray starts in this process's session, bound to loopback (no port of a laptop run
needs to face the network; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every Ray address on
127.0.0.1). With ``--address`` or ``RAY_ADDRESS`` (as under ``ray job submit``) it joins that cluster
instead, after checking that the address answers at all, so a wrong address fails in seconds with one
sentence rather than after Ray's long retries.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from raysim.config import ExperimentConfig
from raysim.errors import ConfigError

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def local_ray_environment() -> None:
    """Environment for a Ray started here: loopback only, no usage reporting, token authentication
    without its warning, client workers at normal priority, and no workers started ahead.

    - Ray starts its workers at niceness 15 (``RAY_worker_niceness``) to keep its daemons
      responsive; raysim's workers are the computation, and at niceness 15 any other process on
      the machine preempts them, which stalls intra-op threads waiting at their barriers.
    - When the first driver connects, Ray's raylet starts a worker process per CPU for it before
      it answers (``RAY_prestart_worker_first_driver``): 0.5 s of ``ray.init`` on a 2-core
      machine (issue 29). raysim's actors are created a moment later and wait for their workers'
      processes either way; without the prestart, a run starts as soon or sooner
      (``scripts/bench/overhead.py``'s start-up; interleaved runs in issue 29's note).

    Set before Ray is imported, which reads some of it then; the daemons Ray starts read them from
    the environment they inherit."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    # Ray turns token authentication on for a local cluster by default and says so in a warning the
    # user cannot act on: authentication stays on, the warning goes
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


def cluster_address(cfg: ExperimentConfig) -> str | None:
    """The cluster to join: ``ray.address``, else ``RAY_ADDRESS``; None (start Ray here) when
    neither is set or the address is ``local`` (e.g. to resume a cluster's run on a laptop)."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or None
    return None if address == "local" else address


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise ConfigError unless ``host:port`` (or ``ray://host:port``) accepts a TCP connection."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1].rstrip("/")
    if target.startswith(("http", "https")):
        return
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"The Ray address {address!r} is not of the form host:port.")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ConfigError(f"The Ray cluster at {address} cannot be reached ({e.strerror or e}).") from None


def worker_runtime_env() -> dict[str, Any] | None:
    """Workers must import raysim and algorithms. An installed raysim (``pip install -e .``, as
    scripts/setup.sh does) needs nothing; otherwise the project root goes on the workers'
    PYTHONPATH (a runtime environment costs each worker start about 0.7 s here)."""
    env_vars = {}
    try:
        importlib.metadata.distribution("raysim")
    except importlib.metadata.PackageNotFoundError:
        env_vars["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
    if "RAYSIM_LOG_LEVEL" in os.environ:
        env_vars["RAYSIM_LOG_LEVEL"] = os.environ["RAYSIM_LOG_LEVEL"]
    return {"env_vars": env_vars} if env_vars else None


def start_ray(cfg: ExperimentConfig) -> bool:
    """Start local Ray or join the configured cluster. Returns True when this call started Ray (and
    so should shut it down)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = cluster_address(cfg)
    if address is None:
        local_ray_environment()
    elif address.split("://", 1)[-1].startswith(("127.0.0.1:", "localhost:")):
        # a cluster on this machine's loopback (cluster/local_cluster.sh): without this, Ray would
        # give the driver the machine's network address, which the cluster cannot reach
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return False
    # Ray reads this when it is imported; where something imported it before, it is set here too
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "").lower() in ("0", "false"):
        ray_constants.ENABLE_RAY_CLUSTER = False
    runtime_env = worker_runtime_env()
    if address is not None:
        check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING, runtime_env=runtime_env)
        except Exception as e:  # connection and auth failures: the user's cluster, not a bug
            reason = str(e).splitlines()[0].rstrip(".")
            raise ConfigError(
                f"Could not join the Ray cluster at {address} ({reason}); if it uses token authentication, "
                "set RAY_AUTH_MODE=token and put its token in ~/.ray/auth_token or RAY_AUTH_TOKEN."
            ) from None
        log.info("joined the Ray cluster at %s", address)
        return True
    kwargs: dict[str, object] = {}
    if cfg.ray.object_store_mb:
        kwargs["object_store_memory"] = cfg.ray.object_store_mb * 1024 * 1024
    with lean_start(runtime_env=runtime_env is not None):
        ray.init(
            address="local",  # a new Ray of our own, even where `ray start` left a cluster running
            include_dashboard=False,
            logging_level=logging.WARNING,
            runtime_env=runtime_env,
            **kwargs,  # type: ignore[arg-type]
        )
    log.info(
        "started local Ray at %s (%s CPUs)",
        ray.get_runtime_context().gcs_address,
        ray.cluster_resources().get("CPU"),
    )
    return True


@contextlib.contextmanager
def lean_start(runtime_env: bool = False) -> Iterator[None]:
    """While a local Ray starts: none of the dashboard's processes that a local run never reads.

    - Its node's dashboard agent runs in Ray's minimal mode. The raylet waits for that agent's
      metrics exporter before it registers, and the full agent loads every dashboard module
      first: 4 of the 6.6 s that ``ray.init`` took here (issue 29). Ray starts the minimal agent
      when the dashboard's packages cannot be imported, which it asks of
      ``ray._private.utils.get_dashboard_dependency_error``; that answer is replaced for the
      start only.
    - No dashboard head (Ray's "API server"). With ``include_dashboard=False`` Ray still starts
      it, with its usage-statistics module alone (off here), and waits for it to publish its
      address before it starts the raylet: 0.5 of the remaining 2.1 s of ``ray.init``
      (``scripts/bench/overhead.py`` reports the start-up), and a Python process's start on
      the run's cores. ``ray._private.node.Node.start_api_server`` does nothing for the start
      only; the node has no dashboard address, as when Ray's dashboard fails to start.
    - The raylet does not wait for its agents' Python processes to start. It registers with the
      GCS only once it has read the ports its two agents (the dashboard agent and the runtime
      environment agent) write to the session's folder when they are up: 0.7-2 s of imports on a
      2-core machine, all of it in ``ray.init`` (issue 29). The minimal dashboard agent's ports
      are known before it starts (it serves neither metrics nor HTTP and writes -1 for each), and
      the runtime environment agent's is chosen here and given to it: :func:`_ports_ahead` writes
      them, with Ray's own ``persist_port``, before the raylet starts, and the agents start
      beside the run's workers instead of before them. The agents write the same values when
      they are up.
    - The driver asks for its node as soon as the node's raylet has registered, not on the next of
      Ray's 1-s retries: ``ray.init`` asks the GCS for the node through a call that, until the
      raylet registers, sleeps a second between tries (issue 29). :func:`_when_registered` polls
      the GCS's node table every 20 ms first, then makes Ray's call.
    - Ray's Python helpers yield the CPUs to the run: once ``ray.init`` has returned, the agents,
      the log monitor and the autoscaler's monitor run at niceness 19 (:func:`_helpers_yield`). At
      the start they import Ray (1-2 s of CPU each) while the run's workers start and import
      PyTorch, on the same cores; at niceness 19 they take what the workers leave. The runtime
      environment agent keeps its priority where the run has a runtime environment
      (``runtime_env``): every worker's start then waits for it.

    A local run reads nothing from the dashboard, its metrics, or the job and state APIs that
    the dashboard head serves (a cluster started with ``ray start`` keeps all of them, for ``ray
    job submit``). Where a Ray lacks one of these functions, that part changes nothing."""
    from ray._private import node, services, utils

    patches: list[tuple[Any, str, Any]] = []
    if getattr(services, "get_node", None) is not None:
        patches.append((services, "get_node", _when_registered(services.get_node)))
    if getattr(utils, "get_dashboard_dependency_error", None) is not None:
        patches.append(
            (utils, "get_dashboard_dependency_error", lambda: ImportError("raysim: a local Ray runs its agent minimal"))
        )
        if getattr(node.Node, "start_raylet", None) is not None:  # ports known only for a minimal agent
            patches.append((node.Node, "start_raylet", _ports_ahead(node.Node.start_raylet)))
    if getattr(node.Node, "start_api_server", None) is not None:

        def no_api_server(self: Any, **_: Any) -> None:
            self._webui_url = None

        patches.append((node.Node, "start_api_server", no_api_server))
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    _helpers_yield(keep_runtime_env_agent=runtime_env)


HELPERS_NICENESS = 19
#: the raylet's agents, by their scripts or (once they have set it) their process titles
DASHBOARD_AGENT = (os.path.join("dashboard", "agent.py"), "DashboardAgent")
RUNTIME_ENV_AGENT = (os.path.join("runtime_env", "agent", "main.py"), "RuntimeEnvAgent")


def _helpers_yield(keep_runtime_env_agent: bool = False) -> None:
    """Lower to niceness 19 the Python helpers of the Ray this process started (its log monitor and
    autoscaler monitor, and its raylet's agents), so that the run's workers come first on its
    cores; the runtime environment agent too unless ``keep_runtime_env_agent``. The GCS and the
    raylet keep theirs. Nothing without psutil, or for a Ray this process joined."""
    node = _global_node()
    names = DASHBOARD_AGENT if keep_runtime_env_agent else DASHBOARD_AGENT + RUNTIME_ENV_AGENT
    helpers = []
    for kind, proc in _daemons(node):
        try:
            if kind in ("log_monitor", "monitor"):
                helpers.append(proc)
            elif kind == "raylet":
                helpers += [c for c in proc.children() if any(n in " ".join(c.cmdline()) for n in names)]
        except Exception:  # gone already
            pass
    for proc in helpers:
        try:
            proc.nice(max(proc.nice(), HELPERS_NICENESS))
        except Exception:  # gone already
            pass


def _ports_ahead(start_raylet: Any) -> Any:
    """Ray's ``Node.start_raylet``, after writing to the session's folder the ports that the
    raylet waits for its agents to write: -1 (no service) for the minimal dashboard agent's
    metrics and HTTP ports, and for its metrics export port (the node then advertises none for
    Prometheus to scrape, which a local run never does), and for the runtime environment agent a
    free port, which the raylet then gives that agent to listen on. Where one of these ports was
    configured, or Ray lacks these internals, nothing is written and the raylet waits for its
    agents as before."""

    def start_raylet_ports_ahead(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            from ray._raylet import (  # type: ignore[attr-defined]
                DASHBOARD_AGENT_LISTEN_PORT_NAME,
                METRICS_AGENT_PORT_NAME,
                METRICS_EXPORT_PORT_NAME,
                RUNTIME_ENV_AGENT_PORT_NAME,
                persist_port,
            )

            params = self._ray_params
            # the HTTP port (52365 by default) is one the minimal agent never listens on
            if not (params.metrics_agent_port or params.metrics_export_port or params.runtime_env_agent_port):
                params.runtime_env_agent_port = self._get_unused_port()
                ports = {
                    METRICS_AGENT_PORT_NAME: -1,
                    METRICS_EXPORT_PORT_NAME: -1,
                    DASHBOARD_AGENT_LISTEN_PORT_NAME: -1,
                    RUNTIME_ENV_AGENT_PORT_NAME: params.runtime_env_agent_port,
                }
                for name, port in ports.items():
                    persist_port(self._session_dir, self._node_id, name, port)
        except Exception as e:  # a Ray without these internals: its raylet waits for its agents
            log.debug("could not write the agents' ports ahead (%s)", e)
        return start_raylet(self, *args, **kwargs)

    return start_raylet_ports_ahead


def _when_registered(get_node: Any, timeout_s: float = 30.0, every_s: float = 0.02) -> Any:
    """Ray's ``services.get_node(gcs_address, node_id)``, called once the GCS lists the node alive
    (polled every ``every_s``, for at most ``timeout_s``; then Ray's own retries and its error)."""

    def get_node_when_registered(gcs_address: str, node_id: str) -> Any:
        try:
            from ray._private import services, state

            table = state.GlobalState()
            table._initialize_global_state(services._get_gcs_client_options(gcs_address))
            try:
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    if any(n.get("NodeID") == node_id and n.get("Alive") for n in table.node_table()):
                        break
                    time.sleep(every_s)
            finally:
                table.disconnect()
        except Exception as e:  # a Ray without these internals: its own call alone
            log.debug("could not poll the GCS for the node (%s)", e)
        return get_node(gcs_address, node_id)

    return get_node_when_registered


def _global_node() -> Any:
    """Ray's node object of this process's Ray session (None when Ray is not initialised)."""
    import ray

    return getattr(ray._private.worker, "_global_node", None) if ray.is_initialized() else None


def joined_cluster() -> bool:
    """Whether this process is connected to a Ray that it did not start (a cluster it joined)."""
    node = _global_node()
    return node is not None and not getattr(node, "all_processes", None)


def prestart_workers(per_node: Mapping[str, int], keep_alive_s: float) -> int:
    """Ask each node's raylet in ``per_node`` (node id: count) to start that many idle worker
    processes for whichever job comes next (at most as many as the node has CPUs), kept at least
    ``keep_alive_s``. Returns how many were asked for: 0 where the job has a runtime environment, or
    the call fails (logged, never raised). The client workers' actors, created first, take them
    before the server's.

    Ray binds a worker process to the job whose work it first takes and ends it with that job, so
    each run on a running cluster starts its actors' processes afresh: on the critical path of an
    attached start-up, a process's start (0.8-1.1 s on 2 cores) and then, in a client worker, its
    import of PyTorch (1.2 s or more; issue 29). A process the raylet starts with no job (its
    ``PrestartWorkers`` call without a job id; ``RAY_enable_worker_prestart`` starts a node's first
    ones this way) is taken by the next job whose actor asks for a worker with its runtime
    environment: none, so only a job without one asks here. A raylet started with
    ``RAY_preload_python_modules=torch`` (``cluster/README.md``: for runs joined one after another)
    has such a process import PyTorch before it waits for work. Past ``keep_alive_s``, Ray's own rule applies to them as to
    any idle worker: a node keeps at most as many idle workers as it has CPUs."""
    import ray

    try:
        if ray.get_runtime_context().runtime_env:
            return 0
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

        asked = 0
        for node in ray.nodes():
            if not node.get("Alive") or per_node.get(node["NodeID"], 0) < 1:
                continue
            # a raylet starts at most as many worker processes at once as it has CPUs; it drops the rest
            count = min(per_node[node["NodeID"]], max(1, int(node.get("Resources", {}).get("CPU", 1))))
            channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
            try:
                node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
                    node_manager_pb2.PrestartWorkersRequest(  # type: ignore[attr-defined]
                        language=common_pb2.PYTHON,  # type: ignore[attr-defined]
                        keep_alive_duration_secs=math.ceil(keep_alive_s),
                        num_workers=count,
                    ),
                    timeout=5,
                )
            finally:
                channel.close()
            asked += count
        return asked
    except Exception as e:  # a Ray without this call, or a node gone: the next run starts cold
        log.debug("could not prestart workers for the next run (%s)", e)
        return 0


def default_workers(cfg: ExperimentConfig) -> int:
    """As many client workers as the cluster's CPUs (or GPUs, when workers take GPUs) allow."""
    import ray

    if cfg.ray.workers is not None:
        return cfg.ray.workers
    res = ray.cluster_resources()
    counts = []
    if cfg.ray.cpus_per_worker > 0:
        counts.append(math.floor(res.get("CPU", 1) / cfg.ray.cpus_per_worker + 1e-9))
    if cfg.ray.gpus_per_worker > 0:
        counts.append(math.floor(res.get("GPU", 0) / cfg.ray.gpus_per_worker + 1e-9))
    n = min(counts) if counts else 1
    if n < 1:
        raise ConfigError(
            f"The Ray cluster has {res.get('CPU', 0):g} CPUs and {res.get('GPU', 0):g} GPUs, too few for one "
            f"worker of {cfg.ray.cpus_per_worker:g} CPUs and {cfg.ray.gpus_per_worker:g} GPUs."
        )
    return n


def check_resources(cfg: ExperimentConfig, workers: int) -> None:
    import ray

    res = ray.cluster_resources()
    need_cpu = workers * cfg.ray.cpus_per_worker
    need_gpu = workers * cfg.ray.gpus_per_worker
    if need_cpu > res.get("CPU", 0) + 1e-9 or need_gpu > res.get("GPU", 0) + 1e-9:
        raise ConfigError(
            f"{workers} workers need {need_cpu:g} CPUs and {need_gpu:g} GPUs but the Ray cluster has "
            f"{res.get('CPU', 0):g} CPUs and {res.get('GPU', 0):g} GPUs."
        )


def stop_ray() -> None:
    """Disconnect from Ray and stop the processes of a Ray this process started, at once.

    Ray's own shutdown sends each of its daemons SIGTERM and waits up to a second for it to go
    (the raylet, which first winds down its workers, takes the whole second): 1 s of every run
    here. By the time raysim stops Ray, everything a run keeps is on disk or in this process and
    the client workers are killed, so the daemons are killed without the wait (Ray's
    ``kill_all_processes(allow_graceful=False)``), and so are the processes they started (the
    raylet's agents, which a killed raylet leaves behind, and any worker still there). A worker
    the raylet was starting as it was killed (a run that fails while its actors start) is no
    daemon's child by then, and lives on: every process that names this Ray's session on its
    command line goes too (:func:`_kill_session`). A cluster this process joined is left running:
    its node here started nothing.

    Then it waits (at most ``STOP_WAIT_S``) until every process it killed has ended: a killed
    process ends only once it is scheduled, and Ray's helpers run at niceness 19
    (:func:`_helpers_yield`), which on a busy machine took them a second or more after a run that
    had already returned.
    """
    import ray

    node = _global_node()
    kill = getattr(node, "kill_all_processes", None)
    family: list[Any] = []
    daemons: list[Any] = []
    session_name = None
    if callable(kill):
        daemons = [proc for _, proc in _daemons(node)]
        family = _descendants(daemons)
        if getattr(node, "all_processes", None):  # daemons this process started, not a cluster it joined
            session_name = getattr(node, "session_name", None)

        def without_grace(**kwargs: Any) -> Any:
            return kill(**{**kwargs, "allow_graceful": False})

        node.kill_all_processes = without_grace
    if ray.is_initialized():
        ray.shutdown()
    for proc in family:
        try:
            proc.kill()
        except Exception:  # gone already (psutil checks that the pid is still the same process)
            pass
    swept = _kill_session(session_name) if session_name else []
    _wait_ended([*daemons, *family, *swept], STOP_WAIT_S)
    sys.stdout.flush()


STOP_WAIT_S = 5.0


def _kill_session(session_name: str) -> list[Any]:
    """Kill every process of this machine but this one whose command line names Ray's session
    ``session_name`` (its daemons' and workers' ``--session-name=...``, its paths under the
    session's folder); returns them (psutil handles). Nothing without psutil."""
    try:
        import psutil
    except ImportError:
        return []
    me = os.getpid()
    killed = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.info["pid"] != me and any(session_name in arg for arg in proc.info["cmdline"] or ()):
                proc.kill()
                killed.append(proc)
        except Exception:  # gone already, or not ours to kill
            pass
    return killed


def _daemons(node: Any) -> list[tuple[str, Any]]:
    """(kind, psutil handle) of each daemon of Ray's ``node`` that this process started and that is
    still there (``node.all_processes``: none for a cluster it joined, and none without psutil)."""
    try:
        import psutil
    except ImportError:
        return []
    out = []
    for kind, infos in (getattr(node, "all_processes", None) or {}).items():
        for info in infos:
            try:
                out.append((kind, psutil.Process(info.process.pid)))
            except Exception:  # gone already, or not a process of this machine's
                pass
    return out


def _wait_ended(procs: list[Any], timeout_s: float, every_s: float = 0.01) -> None:
    """Wait until none of ``procs`` (psutil handles) runs, a zombie counting as ended (a process
    whose parent, or a container's first process, has not reaped it), for at most ``timeout_s``."""

    def running(proc: Any) -> bool:
        try:
            return bool(proc.is_running() and proc.status() != "zombie")
        except Exception:  # gone
            return False

    deadline = time.monotonic() + timeout_s
    while any(running(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(every_s)


def _descendants(daemons: list[Any]) -> list[Any]:
    """The processes that ``daemons`` (psutil handles) started, and theirs."""
    out = []
    for proc in daemons:
        try:
            out += proc.children(recursive=True)
        except Exception:  # already gone
            pass
    return out
