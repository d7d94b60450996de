"""Starting, joining and stopping Ray: the Ray executor's session.

Local by default: Ray starts in this process's session, bound to loopback (no port of a laptop run
needs to face the network; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every Ray address on
127.0.0.1). With ``--address`` or ``RAY_ADDRESS`` (as under ``ray job submit``) it joins that cluster
instead, after checking that the address answers at all, so a wrong address fails in seconds with one
sentence rather than after Ray's long retries.

What public Ray cannot do (a local Ray's start in half a second, its stop at once, workers asked
for ahead of a joined run) is done through Ray's private internals, all of them in
:mod:`raysim.engine.executors.ray_internals` (``RAYSIM_INTERNALS=0`` turns them off:
:mod:`raysim.internals`).
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysim.config import ExperimentConfig
from raysim.engine.executors import ray_internals
from raysim.engine.executors.ray_internals import DASHBOARD_AGENT, RUNTIME_ENV_AGENT, lean_start
from raysim.errors import ConfigError
from raysim.internals import ENV as INTERNALS_ENV
from raysim.internals import internals_on

__all__ = [
    "DASHBOARD_AGENT",
    "RUNTIME_ENV_AGENT",
    "check_reachable",
    "check_resources",
    "cluster_address",
    "default_workers",
    "joined_cluster",
    "lean_start",
    "local_ray_environment",
    "prestart_workers",
    "start_ray",
    "stop_ray",
    "worker_runtime_env",
]

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def local_ray_environment() -> None:
    """Environment for a Ray started here: loopback only and no usage reporting, and Ray's own
    settings for raysim's workers (:func:`ray_internals.local_environment`: client workers at
    normal priority, none started ahead, and Ray's token notice quiet).

    Set before Ray is imported, which reads some of it then; the daemons Ray starts read them from
    the environment they inherit."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray_internals.local_environment()


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


def worker_runtime_env(joining: bool = False) -> dict[str, Any] | None:
    """Workers must import raysim and algorithms. An installed raysim (``pip install -e .``, as
    scripts/setup.sh does) needs nothing; otherwise the project root goes on the workers'
    PYTHONPATH (a runtime environment costs each worker start about 0.7 s here). The workers of a
    cluster it is ``joining`` get the driver's ``RAYSIM_INTERNALS`` where it is set (a local Ray's
    workers inherit the driver's environment)."""
    env_vars = {}
    try:
        importlib.metadata.distribution("raysim")
    except importlib.metadata.PackageNotFoundError:
        env_vars["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
    if "RAYSIM_LOG_LEVEL" in os.environ:
        env_vars["RAYSIM_LOG_LEVEL"] = os.environ["RAYSIM_LOG_LEVEL"]
    if joining and os.environ.get(INTERNALS_ENV):
        env_vars[INTERNALS_ENV] = os.environ[INTERNALS_ENV]
    return {"env_vars": env_vars} if env_vars else None


def start_ray(cfg: ExperimentConfig) -> bool:
    """Start local Ray or join the configured cluster. Returns True when this call started Ray (and
    so should shut it down)."""
    internals_on()  # a mistyped switch refused before Ray starts
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = cluster_address(cfg)
    if address is None:
        local_ray_environment()
    elif address.split("://", 1)[-1].startswith(("127.0.0.1:", "localhost:")):
        # a cluster on this machine's loopback (cluster/local_cluster.sh): without this, Ray would
        # give the driver the machine's network address, which the cluster cannot reach
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return False
    # Ray reads this when it is imported; where something imported it before, it is set here too
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "").lower() in ("0", "false"):
        ray_internals.keep_on_loopback()
    runtime_env = worker_runtime_env(joining=address is not None)
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


#: where ``tests/engine/test_executor_session.py`` reads it (:func:`ray_internals.when_registered`)


def joined_cluster() -> bool:
    """Whether this process is connected to a Ray that it did not start (a cluster it joined);
    False where Ray's internals are off (:func:`ray_internals.joined_cluster`)."""
    return ray_internals.joined_cluster()


def prestart_workers(per_node: Mapping[str, int], keep_alive_s: float) -> int:
    """Ask each node's raylet in ``per_node`` (node id: count) for that many idle worker processes
    for the next run, kept at least ``keep_alive_s``; returns how many were asked for (0 where
    that cannot be done: :func:`ray_internals.prestart_workers`)."""
    return ray_internals.prestart_workers(per_node, keep_alive_s)


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
    """Disconnect from Ray and stop the processes of a Ray this process started, at once and
    without leaving one behind (:func:`ray_internals.shutdown`; Ray's graceful shutdown where its
    internals are off). A cluster this process joined is left running."""
    import ray

    def shutdown_ray() -> None:
        if ray.is_initialized():
            ray.shutdown()

    ray_internals.shutdown(shutdown_ray)
    sys.stdout.flush()
