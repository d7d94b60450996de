"""The round loop: the only loop over rounds in raysim (docs/design.md, "The flow of one round").

    sample clients (seeded) -> executor.train_round (plan on the server, jobs on the workers,
    aggregate on the server) -> every k rounds executor.evaluate -> callbacks

Everything that can be wrong with the input and be known without the data is checked
(:func:`raysim.engine.experiment.validate`) before any work starts. The runner knows no executor by name and
never imports Ray: it starts the configured one from :data:`raysim.registry.EXECUTORS`, which owns
its cluster.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim import checkpoint as checkpoint_mod
from raysim.capabilities.extra_rounds import ExtraRounds
from raysim.checkpoint import Checkpoint
from raysim.config import ExperimentConfig, evaluation_due
from raysim.data import FederatedData, build_federated_data
from raysim.data.loading import DataLoad
from raysim.engine.executors.base import Executor
from raysim.engine.experiment import Experiment, validate
from raysim.engine.targets import target_metric
from raysim.errors import ConfigError, RunAborted
from raysim.records import EvalReport, RunTotals
from raysim.registry import DATASETS, EXECUTORS, load_ref
from raysim.results.metrics import MetricHistory, client_rows, summarize, with_updated_lm
from raysim.results.output import Callback, TableWriter, TensorBoardWriter, default_run_dir

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: Path
    rows: list[dict[str, Any]]
    final: dict[str, float | None]
    best: dict[str, float | None]
    #: the mean of each metric over its last ``last_k`` evaluations (for curves that swing)
    last: dict[str, float | None]
    last_k: int
    totals: RunTotals
    setup_time_s: float
    #: seconds from the start (:func:`startup_origin`) to the first round's dispatch (imports, data,
    #: Ray and the workers), and from the last round's end to the executor's shutdown returning
    startup_s: float = 0.0
    shutdown_s: float = 0.0
    last_round: int = 0  # the last round completed
    stopped: bool = False  # stopped early by Ctrl-C, with a checkpoint to resume from
    worker_restarts: int = 0  # client workers replaced after dying
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def train_time_s(self) -> float:
        return self.totals.train_time_s

    @property
    def eval_time_s(self) -> float:
        return self.totals.eval_time_s

    def summary(self) -> dict[str, Any]:
        return {
            "final": self.final,
            "best": self.best,
            "last": self.last,
            "last_k": self.last_k,
            "rounds": self.last_round,
            "stopped": self.stopped,
            "sim_time_s": round(self.totals.sim_time_s, 3),
            "samples_trained": self.totals.samples_trained,
            "client_epochs": round(self.totals.client_epochs, 3),
            "train_time_s": round(self.totals.train_time_s, 3),
            "eval_time_s": round(self.totals.eval_time_s, 3),
            "setup_time_s": round(self.setup_time_s, 3),
            "startup_s": round(self.startup_s, 3),
            "shutdown_s": round(self.shutdown_s, 3),
            "worker_restarts": self.worker_restarts,
            "run_dir": str(self.run_dir),
        }


class StopRequest:
    """Ctrl-C (SIGINT) during a run asks it to stop at the next round boundary, with a checkpoint;
    a second Ctrl-C interrupts at once. Only in the main thread (where Python delivers signals)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("Ctrl-C: stopping after this round, with a checkpoint (Ctrl-C again stops at once)")

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


_ran_before = False  # whether this process has started a run


def startup_origin(called_at: float) -> float:
    """Where a run's ``startup_s`` counts from (seconds since the epoch): the process's first run
    from raysim's import (imports, data, Ray and the workers; an ``exec`` of Python counts from
    there too), a later run of the same process (the API in a notebook, a test session) from its
    own call."""
    import raysim

    global _ran_before
    first, _ran_before = not _ran_before, True
    return raysim.IMPORTED_AT if first else called_at


def prepare(cfg: ExperimentConfig) -> FederatedData:
    """Check ``cfg``, then load and partition the data."""
    validate(cfg)
    return build_federated_data(cfg.data, cfg.clients, cfg.seed)


def checked(cfg: ExperimentConfig | Experiment) -> Experiment:
    """``cfg`` checked: an :class:`Experiment` (already checked by :func:`validate`) as it is, a
    bare config validated now."""
    return cfg if isinstance(cfg, Experiment) else validate(cfg)


class SideWork:
    """``work(data)`` (e.g. the run's partition picture) in a thread of its own, started when called
    with the data; :meth:`wait` joins it. The run needs nothing it makes."""

    def __init__(self, work: Callable[[FederatedData], None]) -> None:
        self.work = work
        self._thread: threading.Thread | None = None

    def __call__(self, data: FederatedData) -> None:
        self._thread = threading.Thread(target=self.work, args=(data,), name="raysim-side", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


def start(
    experiment: ExperimentConfig | Experiment,
    data: FederatedData | None = None,
    on_data: Callable[[FederatedData], None] | None = None,
) -> Executor:
    """The configured executor, running, on ``data`` (or on the data the config names, loaded in a
    thread of its own while the executor starts its cluster). ``on_data(data)`` is called when the
    executor asks for the data: a Ray executor asks once Ray is up and its client workers' actors
    are created, so that side work (:class:`SideWork`, e.g. the run's partition picture) runs beside
    the workers' start, not beside Ray's own (issue 29: drawn beside ``ray.init``, the picture's CPU
    slowed it, and with it the start of the workers' processes)."""
    exp = checked(experiment)
    cfg = exp.cfg
    executor_cls = load_ref(EXECUTORS.get(cfg.ray.executor).cls)
    if data is not None:
        result: Callable[[], FederatedData] = lambda: data  # noqa: E731
    else:  # the files are found (a missing dataset refused) before the cluster starts
        loading = DataLoad(cfg.data, cfg.clients, cfg.seed)
        if DATASETS.get(cfg.data.dataset).reads_files:
            loading.wait_found()
        result = loading.result

    def load() -> FederatedData:
        loaded = result()
        if on_data is not None:
            on_data(loaded)
        return loaded

    executor: Executor = executor_cls.start(exp, load)
    return executor


def picture_partition(cfg: ExperimentConfig, run_dir: Path) -> Callable[[FederatedData], None]:
    """``on_data`` writing the run's partition picture and table (:mod:`raysim.results.partition_view`); a
    failure to draw is a warning, not the run's end."""

    def draw(data: FederatedData) -> None:
        from raysim.results.partition_view import PICTURE, write_partition

        try:
            write_partition(data, run_dir / PICTURE, cfg.data.partition, cfg.data.dataset)
        except Exception as e:  # e.g. an unwritable directory: the run goes on without its picture
            log.warning("the partition picture was not written (%s)", e)

    return draw


def run_experiment(
    experiment: ExperimentConfig | Experiment,
    callbacks: Sequence[Callback] = (),
    *,
    data: FederatedData | None = None,
    resume: Checkpoint | None = None,
) -> RunResult:
    """Run the experiment from round 1 (or on from the checkpoint ``resume``) to its last round;
    write the run directory, with a checkpoint every ``output.checkpoint_every`` rounds and when
    stopped by Ctrl-C or a failure; return the metrics. A bare config is checked here; an
    :class:`Experiment` (from :func:`raysim.engine.experiment.validate`) was checked already."""
    t0 = time.perf_counter()
    origin = startup_origin(time.time())
    exp = checked(experiment)
    cfg = exp.cfg
    if resume is not None and resume.algo != cfg.algo:
        raise ConfigError(f"The checkpoint is of a {resume.algo} run, not of {cfg.algo}.")
    if resume is None and cfg.output.out and (Path(cfg.output.out).expanduser() / "summary.json").exists():
        raise ConfigError(
            f"The run directory {cfg.output.out} holds a finished run; give another --out, or go on "
            f"with it by --resume {cfg.output.out} --rounds N."
        )
    run_dir = default_run_dir(cfg)
    picture = SideWork(picture_partition(cfg, run_dir))
    try:
        executor = start(exp, data, picture)
    except BaseException:
        picture.wait()
        raise
    rows: list[dict[str, Any]] = list(resume.rows) if resume else []
    all_client_rows: list[dict[str, Any]] = list(resume.client_rows) if resume else []
    writers: list[Callback] = [TableWriter(rows, all_client_rows)]
    if cfg.output.tensorboard:
        writers.append(TensorBoardWriter(purge_step=resume.round + 1 if resume else None))
    all_callbacks = [*writers, *callbacks]
    totals = dataclasses.replace(resume.totals) if resume else RunTotals()
    last_round = resume.round if resume else -1
    stopped = out_of_time = False

    def checkpoint() -> Checkpoint:
        snapshot = executor.snapshot()
        return Checkpoint(
            snapshot=snapshot,
            rows=[r for r in rows if r["round"] <= snapshot.round],
            client_rows=[r for r in all_client_rows if r["round"] <= snapshot.round],
            totals=dataclasses.replace(totals),
            algo=cfg.algo,
        )

    setup_time = time.perf_counter() - t0
    startup = shutdown = 0.0
    try:
        if resume is not None:
            executor.restore(resume.snapshot)
            log.info("resumed after round %d of %d", resume.round, cfg.rounds)
        for cb in all_callbacks:
            cb.on_start(cfg, run_dir)
        extra = ExtraRounds.of(exp.algorithm)
        first = last_round + 1 if resume else extra.first_round()
        startup = time.time() - origin
        with StopRequest() as stop:
            for rnd in range(first, cfg.rounds + 1):
                if rnd == 0:  # the prologue: every client, before training (FedFCD, PACFL, FedClust)
                    t = time.perf_counter()
                    stats = executor.train_round(0, list(range(cfg.clients)))
                    totals.add_round(stats, time.perf_counter() - t, 0.0)  # FedClust's warm-up trains
                else:
                    report, out_of_time = _one_round(
                        cfg,
                        executor,
                        rnd,
                        all_callbacks,
                        rows,
                        all_client_rows,
                        totals,
                        extra.epilogue,
                        exp.algorithm.evaluates_personal(cfg),
                    )
                    if report is not None and report.features:  # eval.features, after the last round
                        _export_features(cfg, executor.data, report, rnd, run_dir, all_callbacks)
                executor.end_round(rnd)
                last_round = rnd
                every = cfg.output.checkpoint_every
                if stop.requested or (every > 0 and rnd > 0 and rnd % every == 0):
                    checkpoint_mod.save(run_dir, checkpoint())
                if rnd > 0 and out_of_time:  # deployment.time_budget_s: the clock reached it
                    log.info("the simulated clock reached %.6g s after round %d: the run's budget", totals.sim_time_s, rnd)
                    break
                if stop.requested and rnd < cfg.rounds:
                    stopped = True
                    log.warning("stopped after round %d; resume with --resume %s", rnd, run_dir)
                    break
    except RunAborted as e:
        raise RunAborted(f"{e} {_rescue(run_dir, checkpoint)}") from None
    finally:
        t_end = time.perf_counter()
        executor.shutdown()
        shutdown = time.perf_counter() - t_end
        picture.wait()
    history = MetricHistory(rows)
    result = RunResult(
        run_dir=run_dir,
        rows=rows,
        final=history.final(),
        best=history.best(),
        last=history.last(cfg.eval.last_k),
        last_k=cfg.eval.last_k,
        totals=totals,
        setup_time_s=setup_time,
        startup_s=startup,
        shutdown_s=shutdown,
        last_round=max(last_round, 0),
        stopped=stopped,
        worker_restarts=executor.restarts,
    )
    summary = {"algo": cfg.algo, **result.summary(), "best_round": history.best_round()}
    if cfg.eval.target is not None:  # the first evaluation at or above the target, on the simulated clock
        summary.update(history.reaching(cfg.eval.target, target_metric(cfg, exp.algorithm)))
    for cb in all_callbacks:
        cb.on_end(summary)
    return result


def _export_features(
    cfg: ExperimentConfig,
    data: FederatedData,
    report: EvalReport,
    rnd: int,
    run_dir: Path,
    callbacks: Sequence[Callback],
) -> None:
    """``eval.features``: the last evaluation's features of the fixed G-Test sample to
    features.parquet, their t-SNE to features_tsne.png and to the callbacks that take pictures
    (TensorBoard's ``features/tsne``); :mod:`raysim.results.features`."""
    from raysim.results.features import feature_rows, feature_sample, write_features

    sample = feature_sample(cfg, len(data.gtest))
    rows = feature_rows(rnd, sample, data.gtest.y[sample], report.features)
    picture = write_features(run_dir, rows, cfg.seed)
    for cb in callbacks:
        on_image = getattr(cb, "on_image", None)
        if on_image is not None:
            on_image("features/tsne", picture, rnd)


def _one_round(
    cfg: ExperimentConfig,
    executor: Executor,
    rnd: int,
    callbacks: Sequence[Callback],
    rows: list[dict[str, Any]],
    all_client_rows: list[dict[str, Any]],
    totals: RunTotals,
    epilogue: bool,
    personal: bool,
) -> tuple[EvalReport | None, bool]:
    """Train round ``rnd`` (validated in it, if the algorithm asks), and after the last the
    algorithm's ``epilogue`` pass; evaluate if due; add the round to ``totals``. Returns the
    evaluation, if there was one, and whether the simulated clock reached the run's time budget
    (``deployment.time_budget_s``: the round is then the run's last, and evaluated)."""
    t = time.perf_counter()
    stats = executor.train_round(rnd)  # the clients the server samples (all, without a deployment)
    round_time = time.perf_counter() - t
    budget = cfg.deployment.time_budget_s
    out_of_time = budget is not None and stats.sim_clock_s >= budget
    if rnd == cfg.rounds and epilogue:
        # the epilogue: every client, after the last training and before the last evaluation
        # (plan and aggregate see round T + 1), e.g. SphereFed's calibration statistics
        t = time.perf_counter()
        after = executor.train_round(cfg.rounds + 1, list(range(cfg.clients)))
        totals.add_round(after, time.perf_counter() - t, 0.0)
    for cb in callbacks:
        cb.on_round(stats, round_time)
    if not evaluation_due(cfg, rnd) and not out_of_time:
        totals.add_round(stats, round_time, 0.0)
        return None, False
    t = time.perf_counter()
    report = executor.evaluate(rnd)
    if cfg.eval.updated_lm:  # updated_lm_ptest; and lm_ptest, for an algorithm without personal models
        report = with_updated_lm(report, stats.updated_lm, as_lm=not personal)
    took = time.perf_counter() - t
    totals.add_round(stats, round_time, took)
    row: dict[str, Any] = {"round": rnd, **summarize(report)}
    row.update(
        train_loss=stats.train_loss,
        round_time_s=round_time,
        eval_time_s=took,
        bytes_down=stats.bytes_down,
        bytes_up=stats.bytes_up,
        samples_trained=totals.samples_trained,  # so far, every round counted
        client_epochs=totals.client_epochs,
        sim_time_s=totals.sim_time_s,  # the simulated clock (deployment.*), at the round's end
        updates_lost=totals.updates_lost,  # so far: the deployment's lost and late updates
        updates_late=totals.updates_late,
        **dict(stats.scalars),
    )
    rows.append(row)
    per_client = client_rows(rnd, report)
    if cfg.eval.analyses:  # the round's local models (raysim.results.analysis), beside the global model's
        from raysim.results.analysis import ANALYSIS_COLUMNS, mean_over_clients

        local = dict(stats.client_analyses)
        keys = tuple(k for k in ANALYSIS_COLUMNS if k.startswith("local_"))
        for r in per_client:
            r.update(local.get(r["client"], dict.fromkeys(keys)))
        row.update(mean_over_clients(list(local.values()), keys))
    all_client_rows.extend(per_client)
    for cb in callbacks:
        cb.on_eval(rnd, row, per_client)
    return report, out_of_time


def _rescue(run_dir: Path, checkpoint: Callable[[], Checkpoint]) -> str:
    """After a failure: write the last completed round's checkpoint if its states can still be
    fetched (a dead server leaves them in the object store), and say how to resume."""
    resume_hint = f"resume with: python scripts/run.py --resume {run_dir}"
    try:
        ckpt = checkpoint()
    except Exception as e:  # the cluster is gone with the states: the last checkpoint on disk stands
        log.warning("the last round's state could not be fetched (%s)", e)
    else:
        if ckpt.round >= 0:
            checkpoint_mod.save(run_dir, ckpt)
            return f"A checkpoint of round {ckpt.round} was written to {run_dir}; {resume_hint}"
    try:
        on_disk = checkpoint_mod.load(run_dir)
    except ConfigError:
        return "No checkpoint was written before the failure (see output.checkpoint_every)."
    return f"The last checkpoint in {run_dir} is of round {on_disk.round}; {resume_hint}"


__all__ = ["ConfigError", "RunAborted", "RunResult", "StopRequest", "prepare", "run_experiment", "start"]
