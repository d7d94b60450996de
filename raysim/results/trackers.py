"""Experiment trackers, each a callback of the run (``output.log``, ``--log mlflow,wandb``).

Each logs the same: the run's settings as parameters (the config flattened to dotted keys,
``train.lr``), every round's statistics (``train/loss``, ``time/round_s``, ``comm/bytes_up``, ...:
the names TensorBoard uses) and every evaluated round's row (``gm_gtest``, ``lm_ptest``, the
metrics other callbacks replied, ...) with the round as the step, and at the end the run
directory's files (metrics.parquet, summary.json, config.yaml, the pictures) and the summary.

- **MLflow** (:class:`MlflowTracker`): by default a store of its own in the run directory, an
  SQLite database with its artifacts beside it in ``RUN_DIR/mlruns`` (``mlflow ui
  --backend-store-uri sqlite:///RUN_DIR/mlruns/mlflow.db`` opens it); ``--tracking-uri``
  (``output.tracking_uri``) names a server or another store. The experiment is
  ``output.log_group`` (a suite's name), else "raysim"; the run is named after the run directory.
- **Weights & Biases** (:class:`WandbTracker`): the project "raysim", the group ``output.log_group``,
  files under ``RUN_DIR/wandb`` (the run's own files in its ``files/raysim/``). Offline unless ``WANDB_MODE`` says otherwise (``WANDB_MODE=online``
  with a key from ``wandb login``); an offline run is sent later with ``wandb sync RUN_DIR/wandb/offline-run-*``.

A resumed run (``--resume``) goes on logging into the same tracker run: its id is kept in the run
directory (``mlflow_run_id``, ``wandb_run_id``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from raysim.config import ExperimentConfig, to_dict
from raysim.errors import ConfigError
from raysim.records import RoundStats
from raysim.results.output import BaseCallback, Reply

#: what each tracker's package is installed as
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}
#: the local MLflow store's database, in RUN_DIR/mlruns
STORE_FILE = "mlflow.db"
#: the run directory's folders that are not the run's files (a tracker's own store and files)
OWN_FOLDERS = ("mlruns", "wandb", "tb")
OWN_FILES = ("checkpoint.pkl", "mlflow_run_id", "wandb_run_id")


#: the tracking URIs' schemes MLflow reads (a database's with its driver after a +)
SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks", "databricks-uc")


def check_trackers(cfg: ExperimentConfig) -> None:
    """Refuse, each in one sentence: a tracker of ``output.log`` whose package is not installed, a
    ``tracking_uri`` without MLflow or that MLflow cannot read, and a ``log_group`` without a tracker
    or empty."""
    out = cfg.output
    if out.tracking_uri is not None:
        scheme = urlsplit(out.tracking_uri.strip()).scheme.split("+")[0]
        if "mlflow" not in out.log:
            raise ConfigError("output.tracking_uri (--tracking-uri) is MLflow's and is read only with --log mlflow.")
        if scheme not in SCHEMES:
            raise ConfigError(
                f"output.tracking_uri {out.tracking_uri!r} is not a tracking URI MLflow reads; give a server "
                "(http://host:5000) or a store (sqlite:///path/mlflow.db)."
            )
    if out.log_group is not None and (not out.log or not out.log_group.strip()):
        why = "is empty" if out.log else "groups runs in a tracker, and output.log names none"
        raise ConfigError(f"output.log_group {why}.")
    for name in out.log:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(
                f"output.log names {name}, which is not installed: pip install {PACKAGES[name]} "
                "(or pip install 'raysim[tracking]')."
            )


def trackers(cfg: ExperimentConfig) -> list[BaseCallback]:
    """The callbacks ``output.log`` names, in its order."""
    makers: dict[str, Callable[[ExperimentConfig], BaseCallback]] = {"mlflow": MlflowTracker, "wandb": WandbTracker}
    check_trackers(cfg)
    return [makers[name](cfg) for name in cfg.output.log]


def flat_settings(cfg: ExperimentConfig) -> dict[str, str]:
    """The config as dotted keys and texts (``train.lr -> "0.05"``; a list as JSON)."""

    def walk(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                yield from walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (list, tuple, Mapping)):
            yield prefix, json.dumps(value)
        else:
            yield prefix, str(value)

    return dict(walk("", to_dict(cfg)))


def round_metrics(stats: RoundStats, round_time: float) -> dict[str, float]:
    """A round's statistics under TensorBoard's names."""
    out = {
        "train/loss": stats.train_loss,
        "train/clients": stats.clients,
        "time/round_s": round_time,
        "comm/bytes_down": stats.bytes_down,
        "comm/bytes_up": stats.bytes_up,
        "compute/samples_trained": stats.samples_trained,
        "compute/client_epochs": stats.client_epochs,
        "deployment/round_s": stats.sim_duration_s,
        "deployment/lost": stats.lost,
        "deployment/late": stats.late,
        **{f"algo/{name}": value for name, value in stats.scalars},
    }
    return {k: float(v) for k, v in out.items() if _number(v)}


def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """An evaluated row's numbers (the round itself is the step)."""
    return {k: float(v) for k, v in row.items() if k != "round" and _number(v)}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def run_files(run_dir: Path) -> list[Path]:
    """The run directory's files to keep with a tracker's run: all but the trackers' own stores and
    run ids, TensorBoard's events and the checkpoint."""
    return sorted(
        p for p in run_dir.rglob("*")
        if p.is_file() and p.relative_to(run_dir).parts[0] not in OWN_FOLDERS and p.name not in OWN_FILES
    )  # fmt: skip


class MlflowTracker(BaseCallback):
    """The run in MLflow (module docstring), through ``MlflowClient`` (no process-global active run,
    so runs in threads of one process each log to their own)."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.client: Any = None
        self.run_id = ""
        self.run_dir = Path(".")

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> Reply | None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.run_dir = run_dir
        store = run_dir.resolve() / "mlruns"
        uri = cfg.output.tracking_uri or default_store(store)
        self.client = MlflowClient(tracking_uri=uri)
        experiment_id = mlflow_experiment(self.client, cfg.output.log_group or "raysim", cfg.output.tracking_uri, store)
        saved = run_dir / "mlflow_run_id"
        if saved.is_file():  # a resumed run goes on in its tracker run
            self.run_id = saved.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return None
        tags = {"raysim.algo": cfg.algo, "raysim.dataset": cfg.data.dataset, "raysim.run_dir": str(run_dir)}
        run = self.client.create_run(experiment_id, run_name=run_dir.name, tags=tags)
        self.run_id = run.info.run_id
        saved.write_text(self.run_id + "\n")
        params = [Param(k, v[:6000]) for k, v in flat_settings(cfg).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        return None

    def _log(self, values: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def on_round(self, stats: RoundStats, round_time: float) -> Reply | None:
        self._log(round_metrics(stats, round_time), stats.rnd)
        return None

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply | None:
        self._log(row_metrics(row), rnd)
        return None

    def on_end(self, summary: dict[str, Any]) -> Reply | None:
        for path in run_files(self.run_dir):
            folder = path.parent.relative_to(self.run_dir).as_posix()
            self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder)
        self.client.set_terminated(self.run_id, "FINISHED" if not summary.get("stopped") else "KILLED")
        return None


def mlflow_experiment(client: Any, name: str, tracking_uri: str | None, store: Path) -> str:
    """The id of MLflow's experiment ``name`` in ``client``'s store, made if it is not there (its
    artifacts where :func:`artifact_location` says)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    return str(client.create_experiment(name, artifact_location=artifact_location(tracking_uri, store)))


def prepare_mlflow(tracking_uri: str, name: str) -> None:
    """Make an MLflow store's tables and its experiment ``name`` before several processes log to it
    at once (a suite's trials): two processes that each found the store empty would both create
    them, and one would fail."""
    from mlflow.tracking import MlflowClient

    mlflow_experiment(MlflowClient(tracking_uri=tracking_uri), name, tracking_uri, Path("."))


def default_store(store: Path) -> str:
    """The tracking URI of a local store in the folder ``store``: an SQLite database,
    ``sqlite:///STORE/mlflow.db``, which ``mlflow ui --backend-store-uri`` opens (MLflow 3 refuses
    new runs in its file store, which it keeps only for old ones), its artifacts in
    ``STORE/artifacts``."""
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / STORE_FILE}"


def artifact_location(tracking_uri: str | None, store: Path) -> str | None:
    """Where a new experiment keeps its artifacts: beside its local store (``STORE/artifacts``, for
    the run directory's store and a ``sqlite:///`` file given), not in the working directory where
    MLflow would put them (``./mlruns``); a server's own (None) otherwise."""
    if tracking_uri is None:
        return (store / "artifacts").as_uri()
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri.removeprefix("sqlite:///")).resolve().parent / "artifacts").as_uri()
    return None


def _mlflow_key(name: str) -> str:
    """A metric name as MLflow allows (letters, digits, ``_-./`` and spaces)."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)


class WandbTracker(BaseCallback):
    """The run in Weights & Biases (module docstring)."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.run: Any = None
        self.run_dir = Path(".")

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> Reply | None:
        import wandb

        self.run_dir = run_dir
        saved = run_dir / "wandb_run_id"
        run_id = saved.read_text().strip() if saved.is_file() else uuid.uuid4().hex[:12]
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "raysim"),
            group=cfg.output.log_group,
            name=run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(run_dir.resolve()),
            mode=cast(Any, os.environ.get("WANDB_MODE", "offline")),
            config=flat_settings(cfg),
            tags=[cfg.algo, cfg.data.dataset],
            reinit="create_new",
            # the process's output stays its own (the last line on stdout is the run's JSON), and
            # the machine's statistics and git state are not sampled: the run logs what raysim says
            settings=wandb.Settings(console="off", quiet=True, x_disable_stats=True, disable_git=True),
        )
        saved.write_text(run_id + "\n")
        return None

    def on_round(self, stats: RoundStats, round_time: float) -> Reply | None:
        self.run.log(round_metrics(stats, round_time), step=stats.rnd)
        return None

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply | None:
        self.run.log(row_metrics(row), step=rnd)
        return None

    def on_end(self, summary: dict[str, Any]) -> Reply | None:
        import shutil

        self.run.summary.update({k: v for k, v in summary.items() if _number(v)})
        for path in run_files(self.run_dir):  # the run's files under raysim/ (W&B's own config.yaml is beside)
            kept = Path(self.run.dir) / "raysim" / path.relative_to(self.run_dir)
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, kept)
        self.run.finish(exit_code=1 if summary.get("stopped") else 0)
        return None


__all__ = ["MlflowTracker", "WandbTracker", "check_trackers", "flat_settings", "round_metrics", "row_metrics", "trackers"]
