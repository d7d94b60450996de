"""Shared fixtures. Ray started by the tests stays on loopback and reports nothing."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# PyTorch's CPU kernels are the processor's own choice, as in a user's runs (no ATEN_CPU_CAPABILITY,
# ONEDNN_MAX_CPU_ISA or MKL_CBWR is set): a test comparing numbers with a recording or another way of
# computing them (the golden metrics, tests/golden.py; batched against one-by-one training) holds
# within a bound measured across kernel choices, and the tests of what must agree to the bit (serial
# against Ray, any workers, slots or resumption) compare runs made on the same machine.
# decoded datasets (raysim.data.datasets.cache_dir) go to a folder of this test session's, not the
# user's cache; the process that makes it removes it when it exits (a decoded Fashion-MNIST is
# 53 MB, and a folder left by every session had filled this machine's disk)
if "RAYSIM_CACHE_DIR" not in os.environ:
    os.environ["RAYSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="raysim-test-cache-")
    atexit.register(shutil.rmtree, os.environ["RAYSIM_CACHE_DIR"], True)

from raysim.config import ExperimentConfig, replace  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """One intra-op thread in the test processes, as every executor trains
    (``ExperimentConfig.train_threads``): PyTorch's default, a thread a core, had the two test
    processes' threads spin against each other on two cores in the tests that run no experiment
    (nearly four times their time with ``-n 2``). Here, not at import: a process that imports this module
    for :func:`tiny_config` keeps its own imports."""
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start Ray (mostly waiting on it) first, those starting a Ray of their own (in a
    subprocess, the longest) before those sharing the session's: with ``-n 2`` (pytest-xdist, as
    scripts/setup.sh runs the suite) the long ones then overlap each other and the short ones fill
    the end, instead of one long test running alone at the end."""

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("ray") is None:
            return 2
        return 1 if "ray_local" in getattr(item, "fixturenames", ()) else 0

    items.sort(key=weight)  # stable: each group keeps its order


def tiny_config(tmp_path: Any = None, **changes: Any) -> ExperimentConfig:
    """A seconds-long experiment on synthetic data (dotted keys allowed in ``changes``)."""
    base = {
        "algo": "fedavg",
        "model": "mlp_fcd",
        "clients": 8,
        "participation": 0.5,
        "rounds": 3,
        "seed": 3,
        "data.dataset": "synthetic",
        "data.partition": "dirichlet:0.5",
        "data.synthetic.train_samples": 800,
        "data.synthetic.test_samples": 400,
        "data.synthetic.shape": (1, 8, 8),
        "train.local_epochs": 1,
        "train.batch_size": 20,
        "train.lr": 0.05,
        "ray.executor": "serial",
        "ray.cpus_per_worker": 1,
        # a Ray run on the session's Ray (the ray_local fixture) takes the actors the last one left
        # (every test that starts Ray of its own starts its actors afresh)
        "ray.reuse_workers": True,
        "output.progress": False,
        "output.tensorboard": False,
    }
    if tmp_path is not None:
        base["output.out"] = str(tmp_path)
    base.update(changes)
    return replace(ExperimentConfig(), **base)


def without_times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric rows without their wall times (``*_time_s``, which differ from run to run; the
    simulated clock's ``sim_time_s`` stays): what two runs that must give the same numbers are
    compared on."""
    return [{k: v for k, v in row.items() if not k.endswith("_time_s") or k == "sim_time_s"} for row in rows]


def assert_serial_equals_ray(tmp_path: Any, **setup: Any) -> list[dict[str, Any]]:
    """Run ``setup`` (settings over :func:`tiny_config`) on the serial executor and on Ray with two
    workers; assert their rows are the same, wall times aside; return the serial run's rows."""
    from raysim.engine.runner import run_experiment

    serial = run_experiment(tiny_config(tmp_path / "serial", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "ray", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    return serial.rows


def run_round(executor: Any, rnd: int, clients: list[int]) -> list[Any]:
    """Run round ``rnd`` on a SerialExecutor and return every ClientResult the server received."""
    got: list[Any] = []
    inner = executor.server.aggregate

    def aggregate(r: int, results: Any) -> Any:
        got.extend(x for jr in results for x in jr.results)
        return inner(r, results)

    executor.server.aggregate = aggregate
    try:
        executor.train_round(rnd, clients)
    finally:
        executor.server.aggregate = inner
    return got


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """One local Ray for the whole session (2 CPUs, loopback), shut down at the end."""
    import ray

    from raysim.engine.executors.session import lean_start, local_ray_environment

    if not ray.is_initialized():
        local_ray_environment()  # as a local run starts it (workers at normal priority, none started ahead)
        with lean_start():  # ... and seconds sooner
            # a Ray of its own, even where `ray start` left a cluster (or its address file) here
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture
def executors(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The executors ``run_experiment`` starts in this test, so that it can kill their actors."""
    import raysim.engine.runner

    started: list[Any] = []
    real_start = raysim.engine.runner.start

    def start(*args: Any, **kwargs: Any) -> Any:
        executor = real_start(*args, **kwargs)
        started.append(executor)
        return executor

    monkeypatch.setattr(raysim.engine.runner, "start", start)
    return started


def recording_aggregates(executor: Any) -> list[tuple[Any, list[Any]]]:
    """From now on, the (server state, results) of each aggregate ``executor``'s algorithm makes
    (on a SerialExecutor), kept in the list returned."""
    got: list[tuple[Any, list[Any]]] = []
    inner = executor.server.algo.aggregate

    def aggregate(state: Any, rnd: int, results: Any) -> Any:
        got.append((state, list(results)))
        return inner(state, rnd, results)

    executor.server.algo.aggregate = aggregate
    return got
