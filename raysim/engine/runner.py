"""The round loop: the only loop over rounds in raysim (docs/design.md, "The flow of one round").

    sample clients (seeded) -> executor.train_round (plan on the server, jobs on the workers,
    aggregate on the server) -> callbacks' on_round -> every k rounds executor.evaluate ->
    callbacks' on_eval

Everything else a run does is a callback (:mod:`raysim.results.output`), told in order: the run's
own measures (:class:`~raysim.engine.targets.TimeBudget`, :class:`~raysim.engine.targets.TargetTracker`,
:class:`~raysim.results.features.FeatureExport`), the user's, and the writers (the tables,
TensorBoard, the trackers, :class:`Checkpointer`). Any of them may add metrics to the round's row
and stop the run after the round.

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
from raysim.engine.experiment import Experiment, resolved_params, validate
from raysim.engine.private import privacy_summary
from raysim.engine.targets import TargetTracker, TimeBudget, out_of_time
from raysim.errors import ConfigError, RunAborted
from raysim.plugins import registered_callbacks
from raysim.provenance import source_commit
from raysim.records import EvalReport, RoundStats, RunTotals
from raysim.registry import DATASETS, EXECUTORS, MODELS, load_ref
from raysim.results.metrics import MetricHistory, client_rows, summarize, with_updated_lm
from raysim.results.output import (
    BaseCallback,
    Callback,
    Callbacks,
    Reply,
    TableWriter,
    TensorBoardWriter,
    default_run_dir,
)
from raysim.results.trackers import check_trackers, trackers

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
    #: privacy.*: epsilon, delta, noise_multiplier, accountant, sampling (raysim.privacy)
    privacy: dict[str, Any] = field(default_factory=dict)
    #: the machine that ran the round loop (:func:`machine`)
    machine: dict[str, Any] = field(default_factory=dict)
    #: the commit of the code that ran it (raysim.provenance.source_commit; None outside a checkout)
    commit: str | None = None
    #: the algorithm's settings as the run used them, defaults included (experiment.resolved_params)
    algo_params: dict[str, Any] = field(default_factory=dict)

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
            **self.privacy,
            "algo_params": self.algo_params,
            "machine": self.machine,
            "commit": self.commit,
            "run_dir": str(self.run_dir),
        }


def _processor() -> str:
    """The processor's model name: /proc/cpuinfo's on Linux, else what :mod:`platform` says."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, Any]:
    """What the numbers depend on beyond the config and the seed: the processor, the instruction set
    PyTorch's CPU kernels dispatch to (``cpu_capability``: AVX512, AVX2, ...; floating-point results
    differ between them in the last bits, and over many rounds in the digits shown), the CPUs, the
    GPU where this process used one (asking otherwise would start CUDA here), and the versions. The
    process's own machine: Ray workers on other nodes, or on a GPU this process never touched, may
    differ."""
    import os
    import platform

    import torch

    gpu = torch.cuda.get_device_name(torch.cuda.current_device()) if torch.cuda.is_initialized() else None
    return {
        "processor": _processor(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


class StopRequest:
    """Ctrl-C (SIGINT) during a run asks it to stop at the next round boundary, with a checkpoint;
    a second Ctrl-C interrupts at once. Only in the main thread (where Python delivers signals);
    ``asked``, where given, is asked at each round's end (:meth:`poll`) and asks the same stop when
    it answers True (a suite's Ctrl-C reaching its trials, which run in no main thread)."""

    def __init__(self, asked: Callable[[], bool] | None = None) -> None:
        self.requested = False
        self.asked = asked
        self._previous: Any = None

    def poll(self) -> bool:
        """Whether the run is to stop after this round: Ctrl-C's request, or ``asked``'s."""
        if not self.requested and self.asked is not None and self.asked():
            self.requested = True
            log.warning("asked to stop: stopping after this round, with a checkpoint")
        return self.requested

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
    data = build_federated_data(cfg.data, cfg.clients, cfg.seed)
    check_batches(cfg, data)
    return data


def check_batches(cfg: ExperimentConfig, data: FederatedData) -> None:
    """Refuse, once the split is known and before any training, a run whose model cannot train on
    a batch of one sample (a BatchNorm after a fully connected layer) where a client's training set
    would leave one sample for an epoch's last batch; and, with ``train.drop_last``, a run where a
    client (one that trains or a newcomer, which adapts on its own) has fewer training samples than
    a batch, so no batch at all (it would never train, and Per-FedAvg's personalisation step needs
    one)."""
    b = cfg.train.batch_size
    if cfg.train.drop_last:
        short = [c for c, idx in enumerate(data.client_train) if idx.size < b]
        if short:
            raise ConfigError(
                f"Client {short[0]} has {data.client_train[short[0]].size} training samples, fewer than "
                f"a batch of {b}, and train.drop_last=true leaves it none to train on: set a smaller "
                "batch size or train.drop_last=false."
            )
        return
    if MODELS.get(cfg.model).single_sample_batches:
        return
    odd = [c for c, idx in enumerate(data.client_train) if idx.size % b == 1]
    if odd:
        raise ConfigError(
            f"The model {cfg.model} cannot train on a batch of one sample, which client {odd[0]}'s "
            f"{data.client_train[odd[0]].size} training samples leave at batch size {b}: set "
            "train.drop_last=true or another batch size."
        )


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
    the workers' start, not beside Ray's own (drawn beside ``ray.init``, the picture's CPU slowed
    it, and with it the start of the workers' processes)."""
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
        check_batches(cfg, loaded)
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
    stop_when: Callable[[], bool] | None = None,
) -> RunResult:
    """Run the experiment from round 1 (or on from the checkpoint ``resume``) to its last round, or
    until a callback stops it (:class:`~raysim.results.output.Reply`); write the run directory, with
    a checkpoint every ``output.checkpoint_every`` rounds and when stopped by Ctrl-C or a failure;
    return the metrics. ``stop_when`` is asked at the end of each round; True stops the run as
    Ctrl-C does, after that round with a checkpoint (``stopped`` in the result), from any thread.
    ``callbacks`` are told after the run's own measures (the target, the features) and before its
    writers (the tables, TensorBoard, the trackers, the checkpoints), so that the metrics they
    reply are written. A bare config is checked here; an :class:`Experiment`
    (from :func:`raysim.engine.experiment.validate`) was checked already."""
    t0 = time.perf_counter()
    origin = startup_origin(time.time())
    exp = checked(experiment)
    users = Callbacks([*callbacks, *registered_callbacks(exp.cfg)]).callbacks  # checked before any work
    run_dir = _run_dir(exp.cfg, resume)
    picture = SideWork(picture_partition(exp.cfg, run_dir))
    try:
        executor = start(exp, data, picture)
    except BaseException:
        picture.wait()
        raise
    loop = Loop.of(exp, executor, run_dir, resume, stop_when)
    loop.callbacks = Callbacks(in_order(exp, loop, users, resume))
    setup_time, startup, shutdown = time.perf_counter() - t0, 0.0, 0.0
    try:
        if resume is not None:
            executor.restore(resume.snapshot)
            log.info("resumed after round %d of %d", resume.round, exp.cfg.rounds)
        loop.callbacks.start(exp.cfg, run_dir)
        first = loop.last_round + 1 if resume else ExtraRounds.of(exp.algorithm).first_round()
        startup = time.time() - origin
        loop.run(first)
    except RunAborted as e:
        raise RunAborted(f"{e} {_rescue(run_dir, loop.checkpoint)}") from None
    finally:
        t_end = time.perf_counter()
        executor.shutdown()
        shutdown = time.perf_counter() - t_end
        picture.wait()
    history = MetricHistory(loop.rows)
    result = RunResult(
        run_dir=run_dir, rows=loop.rows, final=history.final(), best=history.best(),
        last=history.last(exp.cfg.eval.last_k), last_k=exp.cfg.eval.last_k, totals=loop.totals,
        setup_time_s=setup_time, startup_s=startup, shutdown_s=shutdown, last_round=max(loop.last_round, 0),
        stopped=loop.interrupted, worker_restarts=executor.restarts,
        privacy=privacy_summary(exp.cfg, exp.algorithm, max(loop.last_round, 0), loop.rows, exp.params),
        machine=machine(), commit=source_commit(), algo_params=resolved_params(exp),
    )  # fmt: skip
    loop.callbacks.end({"algo": exp.cfg.algo, **result.summary(), "best_round": history.best_round()})
    return result


def _run_dir(cfg: ExperimentConfig, resume: Checkpoint | None) -> Path:
    """The run's directory (:func:`~raysim.results.output.default_run_dir`); refused in one sentence
    where ``resume`` is another algorithm's, where the directory holds a finished run that is not
    being resumed, and where the trackers' settings cannot be
    (:func:`~raysim.results.trackers.check_trackers`)."""
    check_trackers(cfg)
    if resume is not None and resume.algo != cfg.algo:
        raise ConfigError(f"The checkpoint is of a {resume.algo} run, not of {cfg.algo}.")
    if resume is None and cfg.output.out and (Path(cfg.output.out).expanduser() / "summary.json").exists():
        raise ConfigError(
            f"The run directory {cfg.output.out} holds a finished run; give another --out, or go on "
            f"with it by --resume {cfg.output.out} --rounds N."
        )
    return default_run_dir(cfg)


@dataclass
class Loop:
    """The round loop and what its rounds share: the run's config, executor and callbacks, the
    totals and metric rows so far (a resumed run's from its checkpoint), the last round completed,
    the round's evaluation (None where it was not evaluated) and Ctrl-C's stop request."""

    cfg: ExperimentConfig
    executor: Executor
    run_dir: Path
    #: the algorithm's pass after the last round's training, and whether it has personal models
    epilogue: bool
    personal: bool
    totals: RunTotals
    rows: list[dict[str, Any]]
    client_rows: list[dict[str, Any]]
    last_round: int = -1
    #: whether the current round is evaluated (known once it is trained), and its evaluation
    evaluating: bool = False
    report: EvalReport | None = None
    callbacks: Callbacks = field(default_factory=lambda: Callbacks([]))
    ctrl_c: StopRequest = field(default_factory=lambda: StopRequest())

    @classmethod
    def of(
        cls, exp: Experiment, executor: Executor, run_dir: Path, resume: Checkpoint | None,
        stop_when: Callable[[], bool] | None = None,
    ) -> Loop:
        cfg = exp.cfg
        loop = cls(
            cfg, executor, run_dir, ExtraRounds.of(exp.algorithm).epilogue, exp.algorithm.evaluates_personal(cfg),
            RunTotals(), [], [], ctrl_c=StopRequest(stop_when),
        )  # fmt: skip
        if resume is not None:
            loop.totals, loop.last_round = dataclasses.replace(resume.totals), resume.round
            loop.rows, loop.client_rows = list(resume.rows), list(resume.client_rows)
        return loop

    @property
    def interrupted(self) -> bool:
        """Stopped by Ctrl-C before its last round, with a checkpoint to resume from."""
        return self.ctrl_c.requested and self.last_round < self.cfg.rounds

    def run(self, first: int) -> None:
        """Rounds ``first`` to the last (0: the algorithm's prologue), until a callback stops the run."""
        with self.ctrl_c:
            for rnd in range(first, self.cfg.rounds + 1):
                if rnd == 0:  # the prologue: every client, before training (FedFCD, PACFL, FedClust)
                    self._prologue()
                else:
                    self._one_round(rnd)
                self.last_round = rnd
                if self.callbacks.stop and rnd < self.cfg.rounds:
                    if self.interrupted:
                        log.warning("stopped after round %d; resume with --resume %s", rnd, self.run_dir)
                    return

    def _prologue(self) -> None:
        t = time.perf_counter()
        stats = self.executor.train_round(0, list(self.cfg.training_clients))
        self.totals.add_round(stats, time.perf_counter() - t, 0.0)  # FedClust's warm-up trains
        self.executor.end_round(0)

    def _one_round(self, rnd: int) -> None:
        """Train round ``rnd`` (validated in it, if the algorithm asks), and after the last the
        algorithm's ``epilogue`` pass; tell the callbacks ``on_round``; evaluate if due
        (``eval.every``, the last round, the round that reaches ``deployment.time_budget_s``), add
        its row to the rows and tell them ``on_eval``. The round is complete (``end_round``) before
        the callbacks are told of it last: ``on_round`` where it is not evaluated, else ``on_eval``."""
        cfg, executor = self.cfg, self.executor
        t = time.perf_counter()
        stats = executor.train_round(rnd)  # the clients the server samples (all, without a deployment)
        round_time = time.perf_counter() - t
        if rnd == cfg.rounds and self.epilogue:
            # the epilogue: every client, after the last training and before the last evaluation
            # (plan and aggregate see round T + 1), e.g. SphereFed's calibration statistics
            t = time.perf_counter()
            after = executor.train_round(cfg.rounds + 1, list(cfg.training_clients))
            self.totals.add_round(after, time.perf_counter() - t, 0.0)
        self.report, took = None, 0.0
        self.evaluating = evaluation_due(cfg, rnd) or out_of_time(cfg, stats)
        if not self.evaluating:
            executor.end_round(rnd)
            self.totals.add_round(stats, round_time, 0.0)
        self.callbacks.round(stats, round_time)
        if not self.evaluating:
            return
        t = time.perf_counter()
        self.report = executor.evaluate(rnd)
        if cfg.eval.updated_lm:  # updated_lm_ptest; and lm_ptest, for an algorithm without personal models
            self.report = with_updated_lm(self.report, stats.updated_lm, as_lm=not self.personal)
        took = time.perf_counter() - t
        executor.end_round(rnd)
        self.totals.add_round(stats, round_time, took)
        row, per_client = _row(self.report, stats, self.totals, round_time, took, cfg.eval.analyses)
        self.rows.append(row)
        self.client_rows.extend(per_client)
        self.callbacks.eval(rnd, row, per_client)

    def checkpoint(self) -> Checkpoint:
        """The last completed round's checkpoint."""
        snapshot = self.executor.snapshot()
        return Checkpoint(
            snapshot=snapshot,
            rows=[r for r in self.rows if r["round"] <= snapshot.round],
            client_rows=[r for r in self.client_rows if r["round"] <= snapshot.round],
            totals=dataclasses.replace(self.totals),
            algo=self.cfg.algo,
        )


def _row(
    report: EvalReport, stats: RoundStats, totals: RunTotals, round_time: float, took: float, analyses: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An evaluated round's row of metrics.parquet and its clients' rows of clients.parquet."""
    rnd = stats.rnd
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
    per_client = client_rows(rnd, report)
    if analyses:  # the round's local models (raysim.results.analysis), beside the global model's
        from raysim.results.analysis import ANALYSIS_COLUMNS, mean_over_clients

        local = dict(stats.client_analyses)
        keys = tuple(k for k in ANALYSIS_COLUMNS if k.startswith("local_"))
        for r in per_client:
            r.update(local.get(r["client"], dict.fromkeys(keys)))
        row.update(mean_over_clients(list(local.values()), keys))
    return row, per_client


class Checkpointer(BaseCallback):
    """``RUN_DIR/checkpoint.pkl`` after every ``output.checkpoint_every``-th round and after the
    round in which Ctrl-C was pressed (or ``stop_when`` answered True), which it then stops the
    run after (a Ctrl-C in the prologue stops after round 1). Told last, once the round is
    complete and its row too: at ``on_eval`` for an evaluated round, else at ``on_round``."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def on_round(self, stats: RoundStats, round_time: float) -> Reply | None:
        return None if self.loop.evaluating else self._save(stats.rnd)

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply | None:
        return self._save(rnd)

    def _save(self, rnd: int) -> Reply | None:
        every, stop = self.loop.cfg.output.checkpoint_every, self.loop.ctrl_c.poll()
        if stop or (every > 0 and rnd % every == 0):
            checkpoint_mod.save(self.loop.run_dir, self.loop.checkpoint())
        return Reply(stop=True) if stop else None


def in_order(exp: Experiment, loop: Loop, users: Sequence[Callback], resume: Checkpoint | None) -> list[Callback]:
    """The run's callbacks in the order they are told: its own measures (the time budget, the
    target, the features), the ``users``' callbacks, the writers (the tables and summary.json,
    TensorBoard, the trackers of ``output.log``), the users' callbacks told after the writers
    (:attr:`~raysim.results.output.BaseCallback.told_after_writers`), and last the checkpoints."""
    cfg, out = loop.cfg, list[Callback]()
    if cfg.deployment.time_budget_s is not None:
        out.append(TimeBudget(cfg))
    if cfg.eval.target is not None:
        out.append(TargetTracker(cfg, exp.algorithm, loop.rows))
    if cfg.eval.features:
        from raysim.results.features import FeatureExport

        out.append(FeatureExport(lambda: loop.executor.data.gtest.y, lambda: loop.report))
    late = [cb for cb in users if getattr(cb, "told_after_writers", False)]
    out.extend(cb for cb in users if cb not in late)
    out.append(TableWriter(resume.rows, resume.client_rows) if resume else TableWriter())
    if cfg.output.tensorboard:
        out.append(TensorBoardWriter(purge_step=resume.round + 1 if resume else None))
    return [*out, *trackers(cfg), *late, Checkpointer(loop)]


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


__all__ = ["Checkpointer", "ConfigError", "Loop", "in_order", "RunAborted", "RunResult", "StopRequest", "prepare", "run_experiment", "start"]
