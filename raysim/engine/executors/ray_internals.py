"""Every use raysim makes of Ray's private internals, behind one door.

Written against Ray 2.60.0 (:data:`CHECKED_ON`; ``tests/engine/test_internals.py`` fails on
another version until these are checked on it). Each use below says why public Ray cannot do it,
and what happens without it: where Ray lacks the private function or attribute, or where
``RAYSIM_INTERNALS=0`` (:mod:`raysim.internals`) turns them all off, Ray does what its public API
does. No number of a run depends on any of them: they make a local Ray start and stop sooner,
lower the priority of Ray's helpers, and ask a cluster's raylets for workers ahead of a run.

The driver uses them (:mod:`raysim.engine.executors.session`); Ray is imported only when one is
called, so that importing the driver's side imports no Ray.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from raysim.internals import internals_on

__all__ = [
    "CHECKED_ON",
    "DASHBOARD_AGENT",
    "USES",
    "HELPERS_NICENESS",
    "RUNTIME_ENV_AGENT",
    "STOP_WAIT_S",
    "global_node",
    "joined_cluster",
    "keep_on_loopback",
    "lean_start",
    "local_environment",
    "prestart_workers",
    "shutdown",
    "when_registered",
]

log = logging.getLogger(__name__)

#: the Ray version these internals were written against and checked on
CHECKED_ON = "2.60.0"

#: what to check again on another Ray version: each private name used here, and what uses it
USES = (
    "RAY_worker_niceness and RAY_prestart_worker_first_driver (Ray's settings, local_environment)",
    "the logger ray._private.authentication.authentication_token_setup (local_environment)",
    "ray._private.ray_constants.ENABLE_RAY_CLUSTER (keep_on_loopback)",
    "ray._private.services.get_node, ray._private.utils.get_dashboard_dependency_error, "
    "ray._private.node.Node.start_raylet and Node.start_api_server, patched while ray.init runs (lean_start)",
    "ray._raylet.persist_port and its *_PORT_NAME constants; Node._ray_params, _session_dir, _node_id, "
    "_get_unused_port, _webui_url (_ports_ahead, lean_start)",
    "ray._private.state.GlobalState._initialize_global_state, "
    "ray._private.services._get_gcs_client_options (when_registered)",
    "ray._private.worker._global_node and its all_processes, kill_all_processes(allow_graceful=), "
    "session_name (global_node, shutdown, _helpers_yield)",
    "the command lines of Ray's agents (DASHBOARD_AGENT, RUNTIME_ENV_AGENT) and the session name in its "
    "processes' command lines (_helpers_yield, _kill_session)",
    "ray._private.grpc_utils.init_grpc_channel and ray.core.generated's NodeManagerService.PrestartWorkers "
    "(prestart_workers)",
)

HELPERS_NICENESS = 19
#: the raylet's agents, by their scripts or (once they have set it) their process titles
DASHBOARD_AGENT = (os.path.join("dashboard", "agent.py"), "DashboardAgent")
RUNTIME_ENV_AGENT = (os.path.join("runtime_env", "agent", "main.py"), "RuntimeEnvAgent")
#: how long :func:`shutdown` waits at most for the processes it killed to end
STOP_WAIT_S = 5.0

#: Ray's own settings (``ray_config_def.h``, read from ``RAY_<name>`` variables, not documented)
#: for a Ray started here:
#: - ``worker_niceness``: Ray starts its workers at niceness 15 to keep its daemons responsive;
#:   raysim's workers are the computation, and at niceness 15 any other process on the machine
#:   preempts them, which stalls intra-op threads waiting at their barriers.
#: - ``prestart_worker_first_driver``: when the first driver connects, the raylet starts a worker
#:   process per CPU for it before it answers: 0.5 s of ``ray.init`` on a 2-core machine.
#:   raysim's actors are created a moment later and wait for their workers' processes either way;
#:   without the prestart a run starts as soon or sooner (``scripts/bench/overhead.py``).
#: Off: Ray's defaults (workers at niceness 15, a worker per CPU started first).
SYSTEM_CONFIG = {"RAY_worker_niceness": "0", "RAY_prestart_worker_first_driver": "0"}
#: the logger of Ray's notice that token authentication is on for a local cluster, which the user
#: cannot act on (authentication stays on); off: the notice is printed
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def local_environment() -> None:
    """Ray's own settings for a Ray started here (:data:`SYSTEM_CONFIG`, unless set already) and
    its token notice quiet. Called before Ray is imported, which reads some of them then; the
    daemons Ray starts read them from the environment they inherit. Off: nothing."""
    if not internals_on():
        return
    for name, value in SYSTEM_CONFIG.items():
        os.environ.setdefault(name, value)
    logging.getLogger(TOKEN_NOTICE_LOGGER).setLevel(logging.ERROR)


def keep_on_loopback() -> None:
    """Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, into
    ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``, when it is imported; where something
    imported Ray before the variable was set, the constant is set here too. Off, or without that
    constant: the value Ray read at its import (a Ray imported first may give the driver the
    machine's network address)."""
    if not internals_on():
        return
    try:
        from ray._private import ray_constants

        if hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
            ray_constants.ENABLE_RAY_CLUSTER = False
    except ImportError:
        pass


@contextlib.contextmanager
def lean_start(runtime_env: bool = False) -> Iterator[None]:
    """While a local Ray starts (``ray.init``): none of the dashboard's processes that a local run
    never reads, and none of Ray's waits for them.

    - Its node's dashboard agent runs in Ray's minimal mode. The raylet waits for that agent's
      metrics exporter before it registers, and the full agent loads every dashboard module
      first: 4 of the 6.6 s that ``ray.init`` took on a 2-core machine. Ray starts the minimal
      agent when the dashboard's packages cannot be imported, which it asks of
      ``ray._private.utils.get_dashboard_dependency_error``; that answer is replaced for the
      start only.
    - No dashboard head (Ray's "API server"). With ``include_dashboard=False`` Ray still starts
      it, with its usage-statistics module alone (off here), and waits for it to publish its
      address before it starts the raylet: 0.5 of the remaining 2.1 s of ``ray.init``
      (``scripts/bench/overhead.py`` reports the start-up). ``ray._private.node.Node.start_api_server``
      does nothing for the start only; the node has no dashboard address, as when Ray's
      dashboard fails to start.
    - The raylet does not wait for its agents' Python processes to start (:func:`_ports_ahead`).
    - The driver asks for its node as soon as the raylet has registered (:func:`when_registered`).
    - Once ``ray.init`` has returned, Ray's Python helpers yield the CPUs to the run
      (:func:`_helpers_yield`); the runtime environment agent keeps its priority where the run
      has a runtime environment (``runtime_env``): every worker's start then waits for it.

    A local run reads nothing from the dashboard, its metrics, or the job and state APIs that the
    dashboard head serves (a cluster started with ``ray start`` keeps all of them, for ``ray job
    submit``). Where Ray lacks one of these functions, that part changes nothing; off, nothing
    does (Ray starts as its ``ray.init`` does)."""
    if not internals_on():
        yield
        return
    from ray._private import node, services, utils

    patches: list[tuple[Any, str, Any]] = []
    if getattr(services, "get_node", None) is not None:
        patches.append((services, "get_node", when_registered(services.get_node)))
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


def _ports_ahead(start_raylet: Any) -> Any:
    """Ray's ``Node.start_raylet``, after writing to the session's folder the ports that the
    raylet waits for its agents to write when they are up (0.7-2 s of imports on a 2-core machine,
    all of it in ``ray.init``): -1 (no service) for the minimal dashboard agent's metrics and HTTP
    ports, and for its metrics export port (the node then advertises none for Prometheus to
    scrape, which a local run never does), and for the runtime environment agent a free port,
    which the raylet then gives that agent to listen on. The agents write the same values when they
    are up, and start beside the run's workers instead of before them. Written with Ray's own
    ``ray._raylet.persist_port``, from the node's ``_ray_params``, ``_session_dir``, ``_node_id``
    and ``_get_unused_port``. Where one of these ports was configured, or Ray lacks these
    internals, nothing is written and the raylet waits for its agents as before."""

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


def when_registered(get_node: Any, timeout_s: float = 30.0, every_s: float = 0.02) -> Any:
    """Ray's ``ray._private.services.get_node(gcs_address, node_id)``, called once the GCS lists the
    node alive (polled every ``every_s``, for at most ``timeout_s``; then Ray's own retries and
    its error). ``ray.init`` asks the GCS for its node through that call, which sleeps a second
    between tries until the raylet has registered: a poll of the GCS's node table
    (``ray._private.state.GlobalState``) first answers within 20 ms of it. Where Ray lacks these
    internals, Ray's own call alone."""

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


def _helpers_yield(keep_runtime_env_agent: bool = False) -> None:
    """Lower to niceness 19 the Python helpers of the Ray this process started (its log monitor and
    autoscaler monitor, and its raylet's agents, found by their command lines), so that the run's
    workers come first on its cores: at the start they import Ray (1-2 s of CPU each) while the
    run's workers start and import PyTorch, on the same cores, and without the lower priority they
    slowed the workers' start by about what the raylet no longer waits. The runtime environment
    agent too unless ``keep_runtime_env_agent``. The GCS and the raylet keep theirs. Nothing
    without psutil, or for a Ray this process joined (the node's ``all_processes`` is Ray's)."""
    node = global_node()
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


def global_node() -> Any:
    """Ray's node object of this process's Ray session, ``ray._private.worker._global_node``: what
    it started (``all_processes``) and how to stop it; public Ray has neither. None when Ray is not
    initialised, or off."""
    if not internals_on():
        return None
    import ray

    if not ray.is_initialized():
        return None
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    return getattr(worker, "_global_node", None)


def joined_cluster() -> bool:
    """Whether this process is connected to a Ray that it did not start (a cluster it joined): its
    node started no process. False off (no worker is then asked for ahead: :func:`prestart_workers`)."""
    node = global_node()
    return node is not None and not getattr(node, "all_processes", None)


def prestart_workers(per_node: Mapping[str, int], keep_alive_s: float) -> int:
    """Ask each node's raylet in ``per_node`` (node id: count) to start that many idle worker
    processes for whichever job comes next (at most as many as the node has CPUs), kept at least
    ``keep_alive_s``. Returns how many were asked for: 0 where the job has a runtime environment,
    the call fails (logged, never raised), or off. The client workers' actors, created first, take
    them before the server's.

    Ray binds a worker process to the job whose work it first takes and ends it with that job, so
    each run on a running cluster starts its actors' processes afresh: on the critical path of an
    attached start-up, a process's start (0.8-1.1 s on 2 cores) and then, in a client worker, its
    import of PyTorch (1.2 s or more). A process the raylet starts with no job (its
    ``PrestartWorkers`` call without a job id, a gRPC call of the raylet's own that public Ray does
    not expose: ``ray._private.grpc_utils`` and ``ray.core.generated``; ``RAY_enable_worker_prestart``
    starts a node's first ones this way) is taken by the next job whose actor asks for a worker
    with its runtime environment: none, so only a job without one asks here. A raylet started with
    ``RAY_preload_python_modules=torch`` (``cluster/README.md``: for runs joined one after another)
    has such a process import PyTorch before it waits for work. Past ``keep_alive_s``, Ray's own
    rule applies to them as to any idle worker: a node keeps at most as many idle workers as it
    has CPUs. Without it, the next run starts its workers' processes cold."""
    if not internals_on():
        return 0
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


def shutdown(shutdown_ray: Callable[[], None]) -> None:
    """``shutdown_ray()`` (``ray.shutdown``), and with it the processes of a Ray this process
    started, at once.

    Ray's own shutdown sends each of its daemons SIGTERM and waits up to a second for it to go
    (the raylet, which first winds down its workers, takes the whole second): 1 s of every run.
    By the time raysim stops Ray, everything a run keeps is on disk or in this process and the
    client workers are killed, so the daemons are killed without the wait (the node's
    ``kill_all_processes(allow_graceful=False)``), and so are the processes they started (the
    raylet's agents, which a killed raylet leaves behind, and any worker still there). A worker
    the raylet was starting as it was killed (a run that fails while its actors start) is no
    daemon's child by then, and lives on: every process that names this Ray's session on its
    command line goes too (:func:`_kill_session`). A cluster this process joined is left running:
    its node here started nothing.

    Then it waits (at most :data:`STOP_WAIT_S`) until every process it killed has ended: a killed
    process ends only once it is scheduled, and Ray's helpers run at niceness 19
    (:func:`_helpers_yield`), which on a busy machine took them a second or more after a run that
    had already returned. Off, or without the node's internals: ``shutdown_ray()`` alone, Ray's
    graceful shutdown."""
    node = global_node()
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
    shutdown_ray()
    for proc in family:
        try:
            proc.kill()
        except Exception:  # gone already (psutil checks that the pid is still the same process)
            pass
    swept = _kill_session(session_name) if session_name else []
    _wait_ended([*daemons, *family, *swept], STOP_WAIT_S)


def _kill_session(session_name: str) -> list[Any]:
    """Kill every process of this machine but this one whose command line names Ray's session
    ``session_name`` (its daemons' and workers' ``--session-name=...``, its paths under the
    session's folder: how Ray 2.60.0 starts them); returns them (psutil handles). Nothing without
    psutil."""
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
