"""Running a suite on Ray Tune: each trial one raysim experiment inside its own placement group (a
head bundle for its driver and server, one bundle per client worker), restored and finished by
``resume``; a search's ranges sampled by Tune's search algorithms, and the trials (searched or
not) stopped early by its schedulers."""

from __future__ import annotations

import _thread
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.config import ExperimentConfig
from raysim.errors import ConfigError
from raysim.results.output import BaseCallback
from raysim.suite.results import collect, equal_compute_of
from raysim.suite.spec import (
    SCHEDULERS,
    STARTS_FILE,
    SUITE_FILE,
    TRIAL_FILE,
    Suite,
    Trial,
    base_for,
    parse_range,
    to_yaml,
    trial_experiment,
    trials,
    write_yaml,
)

if TYPE_CHECKING:
    from raysim.engine.experiment import Experiment

log = logging.getLogger(__name__)

#: in a trial's run directory: the sentence that refused it, found only with its data
REFUSED_FILE = "refused.txt"
#: in the suite directory while a Ctrl-C'd suite waits for its running trials to end their round
STOP_FILE = "stopping"
#: in the suite directory: a file per trial inside its run (its name), gone when the run returns
LIVE_DIR = "live"


def trial_resources(cfg: ExperimentConfig, driver_cpus: float) -> list[dict[str, float]]:
    """The trial's placement group: a head bundle for its driver and server, one per worker; a
    trial on the serial executor (:func:`~raysim.suite.spec.in_trial_process`) trains in its driver,
    whose one bundle then holds the worker's CPUs too."""
    if cfg.ray.executor == "serial":
        return [{"CPU": driver_cpus + cfg.ray.cpus_per_worker}]
    worker = {"CPU": cfg.ray.cpus_per_worker, "GPU": cfg.ray.gpus_per_worker}
    head = {"CPU": driver_cpus} if driver_cpus > 0 else {}
    return [head, *({k: v for k, v in worker.items() if v > 0} for _ in range(cfg.ray.workers or 1))]


def run_name(params: dict[str, Any], trial_id: str) -> str:
    """The run directory's name of the Tune trial ``trial_id`` with ``params``: the trial's name,
    with Tune's trial id beside when the search sampled it (several samples of one configuration)."""
    t = params["trial"]
    name = Trial(t["config"], int(t["seed"]), t["settings"]).name
    return f"{name}-{trial_id}" if params.get("search") else name


def run_trial(params: dict[str, Any], suite_dir: str) -> None:
    """One trial, inside its placement group on the suite's Ray session: the experiment as run.py
    runs it, reporting every evaluation to Tune; it goes on from its own checkpoint if it has one
    (a resumed suite). ``suite_dir`` is the directory the suite runs in now, handed to every trial
    at each start (not kept in the trial's parameters): a suite directory moved to another disk or
    machine resumes where it is."""
    from ray import tune

    from raysim import checkpoint as checkpoint_mod
    from raysim.engine.runner import run_experiment

    t = params["trial"]
    trial = Trial(t["config"], int(t["seed"]), t["settings"])
    sampled = params.get("search") or {}
    name = run_name(params, tune.get_context().get_trial_id())
    root = Path(suite_dir)
    run_dir = root / "runs" / name
    exp = in_suite_trackers(trial_experiment(trial, run_dir, sampled), str(t.get("suite", "")), root)
    if (run_dir / "summary.json").exists():  # finished before the suite was stopped: keep it
        tune.report(json.loads((run_dir / "summary.json").read_text())["final"])
        return
    stopping = root / STOP_FILE
    if stopping.exists():  # begun as the suite stops: it begins at --resume
        _wait_for_the_end()
    resume = None
    if (run_dir / checkpoint_mod.CHECKPOINT_FILE).exists():
        resume = checkpoint_mod.load(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / TRIAL_FILE).write_text(
        json.dumps({"config": trial.config, "seed": trial.seed, "sampled": sampled, "pair": t.get("pair", False)})
    )
    with open(root / STARTS_FILE, "a") as f:
        f.write(f"{name} {'resume' if resume else 'start'} {time.time():.3f} {os.getpid()}\n")
    live = root / LIVE_DIR / name
    live.parent.mkdir(exist_ok=True)
    live.write_text(f"{socket.gethostname()} {os.getpid()}")
    try:
        result = run_experiment(exp, [TuneReporter()], resume=resume, stop_when=stopping.exists)
    except ConfigError as e:  # what only the data tells (an impossible partition): the suite ends with it
        (run_dir / REFUSED_FILE).write_text(str(e))
        return
    finally:
        live.unlink(missing_ok=True)
    if result.stopped:  # by the suite's Ctrl-C, after a round, with its checkpoint: it goes on at --resume
        # the run's summary says so (stopped), but in a suite a trial's summary.json is its end
        (run_dir / "summary.json").unlink(missing_ok=True)
        _wait_for_the_end()
    with open(root / STARTS_FILE, "a") as f:  # its end: the page's elapsed time reads it, not file times
        f.write(f"{name} end {time.time():.3f} {os.getpid()}\n")


def _wait_for_the_end() -> None:
    """A trial stopped by the suite's Ctrl-C holds its place until Tune ends the stopped suite (which
    ends its process): a trial that returned would be a finished one to Tune, never resumed, and
    its resources would go to a trial not yet begun."""
    while True:
        time.sleep(60)


#: Tune's setting that leaves Ctrl-C to the caller of its run
_TUNE_SIGINT = "TUNE_DISABLE_SIGINT_HANDLER"


class GracefulStop:
    """A suite's Ctrl-C, while Tune runs its trials (in the main thread): each running trial stops
    at the end of its round with a checkpoint (the run's own Ctrl-C, asked through ``STOP_FILE``),
    and no trial begins; once none is left inside its run (``LIVE_DIR`` empty), Tune is stopped as
    its own Ctrl-C stops it, saving the trials as running, so --resume goes on from those
    checkpoints. A second Ctrl-C stops Tune at once (the trials then go on from their last periodic
    checkpoint); a third is Python's KeyboardInterrupt."""

    def __init__(self, suite_dir: Path) -> None:
        self.stopping, self.live = suite_dir / STOP_FILE, suite_dir / LIVE_DIR
        self._previous: Any = None
        self._tune_handler: str | None = None
        self._presses = 0
        self._done = threading.Event()

    def __enter__(self) -> GracefulStop:
        self._clear()  # what a suite killed outright left
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            # Tune's run would put its own Ctrl-C in place of this one (and does where this is off)
            self._tune_handler = os.environ.get(_TUNE_SIGINT)
            os.environ[_TUNE_SIGINT] = "1"
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            if self._tune_handler is None:
                os.environ.pop(_TUNE_SIGINT, None)
            else:
                os.environ[_TUNE_SIGINT] = self._tune_handler
        self._clear()

    def _clear(self) -> None:
        self.stopping.unlink(missing_ok=True)
        if self.live.is_dir():
            shutil.rmtree(self.live, ignore_errors=True)

    def _handle(self, signum: int, frame: Any) -> None:
        self._presses += 1
        if self._presses > 2:  # Tune's own stop is under way and slow: Python's Ctrl-C
            raise KeyboardInterrupt
        if self._presses == 2:
            log.warning("Ctrl-C again: stopping the suite now (Ctrl-C once more interrupts it)")
            self._stop_tune()
            return
        self.stopping.touch()
        log.warning(
            "Ctrl-C: the running trials (%d) stop after their round, each with a checkpoint, and no "
            "trial begins (Ctrl-C again stops at once)",
            sum(1 for _ in self._running()),
        )
        threading.Thread(target=self._until_none_is_running, name="raysim-suite-stop", daemon=True).start()

    def _until_none_is_running(self) -> None:
        while not self._done.wait(0.5):
            if not any(self._running()):
                self._stop_tune()
                return

    def _running(self) -> Iterator[Path]:
        """The trials inside their run: a file in ``LIVE_DIR`` each, but for one whose process on
        this machine is gone (a trial an early-stopping scheduler ended mid-report, whose actor Tune
        then ended, never removed its file)."""
        host = socket.gethostname()
        for path in self.live.glob("*") if self.live.is_dir() else ():
            try:
                where, pid = path.read_text().split()
            except (OSError, ValueError):
                continue
            if where != host or _alive(int(pid)):
                yield path

    def _stop_tune(self) -> None:
        """Tune's own stop (SIGUSR1, which Tune's run handles as its Ctrl-C: the experiment's state
        saved with the running trials as running), else a KeyboardInterrupt in the main thread."""
        handler = signal.getsignal(signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else None
        if callable(handler):
            os.kill(os.getpid(), signal.SIGUSR1)
        else:
            _thread.interrupt_main()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def suite_store(suite_dir: Path) -> str:
    """The MLflow store of a suite's trials that name no tracking server."""
    return f"sqlite:///{(suite_dir / 'mlruns' / 'mlflow.db').resolve()}"


def prepare_trackers(suite: Suite, suite_dir: Path, todo: list[Trial]) -> None:
    """Make the MLflow stores and experiments the trials will log to before they start at once."""
    from raysim.results.trackers import prepare_mlflow

    made = set()
    for t in todo:
        if "mlflow" not in (t.settings.get("output.log") or ()):
            continue
        uri = t.settings.get("output.tracking_uri") or suite_store(suite_dir)
        group = t.settings.get("output.log_group") or suite.name or suite_dir.name
        if (uri, group) not in made and str(uri).startswith("sqlite:///"):
            Path(str(uri).removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            prepare_mlflow(str(uri), str(group))
            made.add((uri, group))


def in_suite_trackers(exp: Experiment, suite_name: str, suite_dir: Path) -> Experiment:
    """A trial that logs to experiment trackers (``output.log``) logs grouped by its suite: the
    suite's name as MLflow's experiment and W&B's group (unless the suite sets ``output.log_group``),
    and, without a tracking server, one MLflow store for the whole suite
    (``sqlite:///SUITE_DIR/mlruns/mlflow.db``, its artifacts beside), which ``mlflow ui`` opens."""
    out = exp.cfg.output
    if not out.log:
        return exp
    uri = out.tracking_uri
    if uri is None and "mlflow" in out.log:
        uri = suite_store(suite_dir)
    output = dataclasses.replace(out, log_group=out.log_group or suite_name or suite_dir.name, tracking_uri=uri)
    return dataclasses.replace(exp, cfg=dataclasses.replace(exp.cfg, output=output))


class TuneReporter(BaseCallback):
    """Reports each evaluated round's metrics to Tune (for its schedulers and searchers): told after
    the writers, since a report can end the trial (an early-stopping scheduler) and the row must be
    written by then."""

    told_after_writers = True

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
        from ray import tune

        tune.report({k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None})


def run_suite(
    suite: Suite,
    suite_dir: str | Path,
    *,
    resume: bool = False,
    address: str | None = None,
    progress: bool = True,
    max_concurrent: int | None = None,
) -> dict[str, Any]:
    """Run (or, with ``resume``, finish) every trial of ``suite`` on one Ray session (local Ray
    unless ``address`` or RAY_ADDRESS names a cluster), at most ``max_concurrent`` at once (None: as
    many as fit), then, if the suite pairs its configurations with a baseline at equal compute, the
    baseline's trials; collect the results; return the summary, with the trials left
    ``unfinished`` by a Ctrl-C. The trials' datasets are found before Ray starts."""
    from raysim.data.loading import check_files
    from raysim.engine.executors import session

    if max_concurrent is not None and max_concurrent < 1:
        raise ConfigError(
            f"--max-concurrent must be at least 1 (leave it out to run as many trials at once as fit), "
            f"not {max_concurrent}."
        )

    # Tune's own console table and logger files: our progress line and run directories say it
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # without those loggers Tune's result grid finds no result.json in any trial and warns about
    # every trial at the end; raysim collects the trials' own tables instead (collect)
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    suite_dir = Path(suite_dir).resolve()
    if resume and not (suite_dir / SUITE_FILE).is_file():
        raise ConfigError(f"{suite_dir} holds no suite to resume (no {SUITE_FILE}).")
    if not resume and (suite_dir / SUITE_FILE).exists():
        raise ConfigError(f"{suite_dir} already holds a suite; --resume it, or give another --out.")
    configs = [trial_experiment(t, suite_dir).cfg for t in trials(suite)]
    for data in dict.fromkeys(c.data for c in configs):  # each dataset once, before Ray starts
        check_files(data)
    suite_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        write_yaml(suite_dir / SUITE_FILE, to_yaml(suite))
    base_cfg = configs[0]
    if address is not None:
        base_cfg = dataclasses.replace(base_cfg, ray=dataclasses.replace(base_cfg.ray, address=address))
    from raysim.engine.executors.recovery import release_idle

    started = session.start_ray(base_cfg)
    release_idle()  # actors runs of this process left idle (ray.reuse_workers) hold CPUs the trials need
    try:
        unfinished = _stage(suite, suite_dir, "tune", trials(suite), progress, max_concurrent)
        if suite.equal_compute is not None and not unfinished:
            pairs = equal_compute_trials(suite, suite_dir)
            unfinished = _stage(suite, suite_dir, "tune-equal-compute", pairs, progress, max_concurrent)
    finally:
        if started:
            session.stop_ray()
    return {**collect(suite, suite_dir), "unfinished": unfinished}


def _stage(
    suite: Suite, suite_dir: Path, name: str, todo: list[Trial], progress: bool, max_concurrent: int | None
) -> int:
    """One Tune experiment over ``todo`` (restored and finished if it was begun); the trials it
    left unfinished."""
    from ray import tune

    from raysim.suite.progress import SuiteProgress

    if not todo:
        return 0
    prepare_trackers(suite, suite_dir, todo)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, suite_dir=str(suite_dir)),
        lambda params: tune.PlacementGroupFactory(
            trial_resources(
                trial_experiment(Trial("resources", 0, params["trial"]["settings"]), suite_dir).cfg,
                suite.driver_cpus,
            ),
            strategy="PACK",
        ),
    )
    tune_dir = suite_dir / name
    if tune.Tuner.can_restore(str(tune_dir)):  # begun before: finish what is left
        tuner = tune.Tuner.restore(str(tune_dir), trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        samples = suite.search.samples if suite.search and name == "tune" else 1
        callbacks: list[tune.Callback] = [SuiteProgress(len(todo) * samples)] if progress else []
        tuner = tune.Tuner(
            trainable,
            param_space=_param_space(suite, suite_dir, todo, main=name == "tune"),
            # the baseline's trials at equal compute run to their end: none is searched or stopped early
            tune_config=_tune_config(
                suite if name == "tune" else dataclasses.replace(suite, search=None, scheduler=None), max_concurrent
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(suite_dir),
                verbose=0,
                callbacks=callbacks,
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
    with GracefulStop(suite_dir):
        grid = tuner.fit()
    refused = sorted((suite_dir / "runs").glob(f"*/{REFUSED_FILE}"))
    if refused:  # a trial's bad input found only with its data: one sentence, as for any bad input
        raise ConfigError(refused[0].read_text())
    if grid.errors:
        raise RuntimeError(f"{len(grid.errors)} trial(s) failed; the first: {grid.errors[0]}")
    return _left(suite, suite_dir, tune_dir, todo, main=name == "tune")


def _left(suite: Suite, suite_dir: Path, tune_dir: Path, todo: list[Trial], main: bool) -> int:
    """The trials a stopped stage leaves for --resume. Tune's saved state alone does not tell:
    it makes a grid's trials only as it reaches them (with a cap on those at once, the rest are
    not in it yet), and it counts a trial that finished before it began (a resumed record's, which
    it only reports again) as left until it reaches it. So: the trials Tune had not ended (in the
    state it saved when stopped; it then ends the trials it leaves, and its results call them all
    terminated) and those it had not made, less any with its summary.json."""
    from ray import tune

    def done(run: str) -> bool:
        return (suite_dir / "runs" / run / "summary.json").exists()

    made = {run_name(t.config, t.trial_id): t.status for t in tune.ExperimentAnalysis(str(tune_dir)).trials}
    left = sum(status != "TERMINATED" and not done(run) for run, status in made.items())
    if suite.search is not None and suite.search.space and main:  # its runs are named by Tune's trial ids
        return left + max(0, len(todo) * suite.search.samples - len(made))
    return left + sum(t.name not in made and not done(t.name) for t in todo)


def equal_compute_trials(suite: Suite, suite_dir: Path) -> list[Trial]:
    """The suite's baseline (``equal_compute``) paired with each finished trial: its rounds and local
    epochs, and the clients a round that make its client-epochs the trial's (from the trial's
    summary). One baseline trial for each distinct (rounds, clients a round, seed)."""
    assert suite.equal_compute is not None
    out: dict[str, Trial] = {}
    for path in sorted((suite_dir / "runs").glob(f"*/{TRIAL_FILE}")):
        pair = equal_compute_of(path.parent)
        if pair is None:
            continue
        rounds, per_round, clients = pair
        ec = suite.equal_compute
        name = f"{ec.name}_r{rounds}_k{per_round}"
        settings = {
            **base_for(suite.base, ec.settings),
            **ec.settings,
            "rounds": rounds,
            "participation": per_round / clients,
        }
        seed = int(json.loads(path.read_text())["seed"])
        out.setdefault(f"{name}-seed{seed}", Trial(name, seed, settings))
    return list(out.values())


def _param_space(suite: Suite, suite_dir: Path, todo: list[Trial], main: bool) -> dict[str, Any]:
    """Every trial (configuration and seed) as a grid; with a search, the sampled ranges beside."""
    from ray import tune

    space: dict[str, Any] = {
        "trial": tune.grid_search(
            [
                {
                    "config": t.config,
                    "seed": t.seed,
                    "settings": dict(t.settings),
                    "suite": suite.name,
                    "pair": not main,
                }
                for t in todo
            ]
        )
    }
    if suite.search is not None and main:
        space["search"] = {k: _tune_range(k, v) for k, v in suite.search.space.items()}
    return space


def _tune_range(key: str, text: str) -> Any:
    from ray import tune

    kind, values = parse_range(key, text)
    if kind == "choice":
        return tune.choice(values)
    return getattr(tune, kind)(*values)


def _tune_config(suite: Suite, max_concurrent: int | None) -> Any:
    """Tune's settings. A finished trial's actor is kept for the next trial of the same resources
    (``reuse_actors``): that trial starts in its process, PyTorch and raysim already imported, not
    in a new one (about 2 s a trial where commit 751e35a measured it). Every run seeds its generators
    and sets its threads itself, so its numbers are those of a fresh process (tested). A scheduler applies to
    the search's trials, or without a search to the grid's and seeds' (Tune's default variant
    generator)."""
    from ray import tune

    s = suite.search
    if s is None:
        sched = suite.scheduler
        return tune.TuneConfig(
            scheduler=_scheduler(sched.name, sched.metric, sched.mode, suite) if sched is not None else None,
            max_concurrent_trials=max_concurrent,
            reuse_actors=True,
        )
    algorithm = s.algorithm.lower()
    searcher = tune.search.create_searcher(algorithm, metric=s.metric, mode=s.mode) if algorithm != "random" else None
    scheduler = _scheduler(s.scheduler, s.metric, s.mode, suite) if s.scheduler is not None else None
    return tune.TuneConfig(
        num_samples=s.samples,
        search_alg=searcher,
        scheduler=scheduler,
        max_concurrent_trials=max_concurrent,
        reuse_actors=True,
    )


#: Tune's schedulers that stop every trial at ``max_t`` reports (their default: 100, or 81)
HORIZON_SCHEDULERS = ("asha", "async_hyperband", "asynchyperband", "hyperband", "hb_bohb")


def _scheduler(name: str, metric: str, mode: str, suite: Suite) -> Any:
    """Tune's scheduler ``name`` on ``metric`` in ``mode`` (checked by the suite's spec). One that
    stops every trial at ``max_t`` reports gets the suite's longest run's rounds, a bound on the
    evaluations any trial reports: its own default would cut a 500-round run after 100 reports."""
    from ray import tune

    kwargs: dict[str, Any] = {"metric": metric, "mode": mode}
    if name.lower() in HORIZON_SCHEDULERS:
        kwargs["max_t"] = max(trial_experiment(t, Path(".")).cfg.rounds for t in trials(suite))
    return tune.schedulers.create_scheduler(SCHEDULERS[name.lower()], **kwargs)


__all__ = ["TuneReporter", "equal_compute_trials", "run_suite", "run_trial", "trial_resources"]
