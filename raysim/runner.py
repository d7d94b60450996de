"""The round loop: the only loop over rounds in raysim (DESIGN.md, "The flow of one round").

    sample clients (seeded) -> executor.train_round (plan on the server, jobs on the workers,
    aggregate on the server) -> every k rounds executor.evaluate -> callbacks

Everything that can be wrong with the input is checked in :func:`prepare` before any work starts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from algorithms.base import algorithm_class, algorithm_params
from raysim import rng
from raysim.config import ExperimentConfig, evaluation_due, validate
from raysim.data import FederatedData, build_federated_data
from raysim.errors import ConfigError
from raysim.executors import Executor, RayExecutor, SerialExecutor
from raysim.metrics import MetricHistory, client_rows, summarize
from raysim.output import Callback, TableWriter, TensorBoardWriter, default_run_dir

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: Path
    rows: list[dict[str, Any]]
    final: dict[str, float | None]
    best: dict[str, float | None]
    train_time_s: float  # sum of the rounds' wall times (training only)
    eval_time_s: float
    setup_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "final": self.final,
            "best": self.best,
            "rounds": self.rows[-1]["round"] if self.rows else 0,
            "train_time_s": round(self.train_time_s, 3),
            "eval_time_s": round(self.eval_time_s, 3),
            "setup_time_s": round(self.setup_time_s, 3),
            "run_dir": str(self.run_dir),
        }


def check_config(cfg: ExperimentConfig) -> None:
    """Everything about ``cfg`` that can be checked without data or a cluster. (The model is built,
    and so checked against the data, where it runs: in the serial executor or the Ray workers; the
    driver never imports PyTorch.)"""
    validate(cfg)
    algorithm_params(cfg)  # unknown algorithm or parameter


def prepare(cfg: ExperimentConfig) -> FederatedData:
    """Check ``cfg``, then load and partition the data."""
    check_config(cfg)
    return build_federated_data(cfg.data, cfg.clients, cfg.seed)


def start(cfg: ExperimentConfig, data: FederatedData | None = None) -> tuple[Executor, FederatedData, bool]:
    """The configured executor on the prepared data, and whether Ray was started here (and must be
    stopped). Local Ray starts while the data loads in a thread (both are mostly waiting)."""
    if cfg.ray.executor == "serial":
        data = prepare(cfg) if data is None else data
        return SerialExecutor(cfg, data), data, False
    from raysim import ray_env

    check_config(cfg)
    started = False
    try:
        with ThreadPoolExecutor(1) as pool:
            loading = pool.submit(prepare, cfg) if data is None else None
            try:
                started = ray_env.start_ray(cfg)
            finally:
                data = loading.result() if loading is not None else data
        assert data is not None
        workers = ray_env.default_workers(cfg)
        ray_env.check_resources(cfg, workers)
        executor = RayExecutor(cfg, data, workers)
        return executor, executor.data, started
    except BaseException:
        if started:
            ray_env.stop_ray()
        raise


def run_experiment(
    cfg: ExperimentConfig,
    callbacks: Sequence[Callback] = (),
    *,
    data: FederatedData | None = None,
) -> RunResult:
    """Run ``cfg`` from round 1 to ``cfg.rounds``; write the run directory; return the metrics."""
    t0 = time.perf_counter()
    executor, data, started_ray = start(cfg, data)
    run_dir = default_run_dir(cfg)
    writers: list[Callback] = [TableWriter()]
    if cfg.output.tensorboard:
        writers.append(TensorBoardWriter())
    all_callbacks = [*writers, *callbacks]
    rows: list[dict[str, Any]] = []
    train_time = eval_time = 0.0
    setup_time = time.perf_counter() - t0
    try:
        for cb in all_callbacks:
            cb.on_start(cfg, run_dir)
        if algorithm_class(cfg.algo).prologue:  # round 0: every client, before training (FedFCD)
            executor.train_round(0, list(range(cfg.clients)))
        for rnd in range(1, cfg.rounds + 1):
            sampled = rng.sample_clients(cfg.seed, rnd, cfg.clients, cfg.clients_per_round)
            t = time.perf_counter()
            stats = executor.train_round(rnd, sampled)
            round_time = time.perf_counter() - t
            if stats.validate:  # the algorithm asked for the global model's validation accuracy
                accuracy = executor.validate(rnd)
                stats = dataclasses.replace(stats, scalars=(*stats.scalars, ("val_gm", accuracy)))
            train_time += round_time
            for cb in all_callbacks:
                cb.on_round(stats, round_time)
            if not evaluation_due(cfg, rnd):
                continue
            t = time.perf_counter()
            report = executor.evaluate(rnd)
            took = time.perf_counter() - t
            eval_time += took
            row: dict[str, Any] = {"round": rnd, **summarize(report)}
            row.update(
                train_loss=stats.train_loss,
                round_time_s=round_time,
                eval_time_s=took,
                bytes_down=stats.bytes_down,
                bytes_up=stats.bytes_up,
                **dict(stats.scalars),
            )
            rows.append(row)
            for cb in all_callbacks:
                cb.on_eval(rnd, row, client_rows(rnd, report))
    finally:
        executor.shutdown()
        if started_ray:
            from raysim import ray_env

            ray_env.stop_ray()
    history = MetricHistory(rows)
    result = RunResult(
        run_dir=run_dir,
        rows=rows,
        final=history.final(),
        best=history.best(),
        train_time_s=train_time,
        eval_time_s=eval_time,
        setup_time_s=setup_time,
    )
    summary = {"algo": cfg.algo, **result.summary(), "best_round": history.best_round()}
    for cb in all_callbacks:
        cb.on_end(summary)
    return result


__all__ = ["ConfigError", "RunResult", "check_config", "prepare", "run_experiment", "start"]
