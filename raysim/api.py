"""raysim's Python API: ``raysim.run``, ``raysim.sweep``, ``raysim.load``.

::

    import raysim

    result = raysim.run(algo="fedavg", dataset="synthetic", clients=10, rounds=2, executor="serial")
    result.metrics          # a pandas DataFrame: one row per evaluated round
    result.clients          # per client and evaluated round
    result.partition        # per client: sizes, classes, label entropy, label counts
    result.summary["final"]["gm_gtest"], result.run_dir

Settings are the command line's: a config (an :class:`~raysim.config.ExperimentConfig`, a dict of
settings, or a YAML/TOML/JSON file), then keyword overrides named as the flags with underscores
(``local_epochs=5`` for ``--local-epochs 5``), then ``set={"algo.mu": 0.1}`` for any dotted setting,
as ``--set``; the paper setup of the algorithm goes beneath them as on the command line. ``scripts/run.py``
and the ``raysim`` command call the same :func:`make_config` and :func:`run`, so the two give the same
numbers. A user's own algorithm, dataset, partition or model, registered from their code before the
call, reaches the Ray workers by itself (:mod:`raysim.plugins`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.config import ExperimentConfig, load_config_file, merge, set_dotted, to_dict
from raysim.errors import ConfigError
from raysim.keywords import flag_keys

if TYPE_CHECKING:
    import pandas as pd

    from raysim.engine.experiment import Experiment
    from raysim.results.output import Callback

def settings_of(given: Mapping[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    """``set=``'s settings: a mapping of dotted keys to values, or ``--set``'s ``KEY=VALUE`` texts."""
    if given is None:
        return {}
    if isinstance(given, Mapping):
        return dict(given)
    if isinstance(given, str) or not isinstance(given, Sequence):
        raise ConfigError(
            f"set= takes a mapping of settings, e.g. {{'train.lr': 0.1}}, or a list of 'KEY=VALUE', not {given!r}."
        )
    out: dict[str, Any] = {}
    for item in given:
        key, sep, value = str(item).partition("=")
        if not sep:
            raise ConfigError(f"set= takes KEY=VALUE texts, not {item!r}.")
        out[key.strip()] = value.strip()
    return out


def make_config(
    config: ExperimentConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    set: Mapping[str, Any] | Sequence[str] | None = None,  # noqa: A002 - the name of the --set flag
    **flags: Any,
) -> ExperimentConfig:
    """The experiment these settings give, resolved (paper setup beneath) and validated."""
    return checked_experiment(config, set=set, **flags).cfg


def checked_experiment(
    config: ExperimentConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    set: Mapping[str, Any] | Sequence[str] | None = None,  # noqa: A002 - the name of the --set flag
    **flags: Any,
) -> Experiment:
    """:func:`make_config`'s experiment as :func:`raysim.engine.experiment.validate` returns it (the
    config and its algorithm, looked up and checked once), which a run takes without checking it
    again."""
    from raysim.deployment.model import apply_preset
    from raysim.engine.experiment import resolve_config, validate

    keys = flag_keys()
    unknown = sorted(set_ for set_ in flags if set_ not in keys)
    if unknown:
        raise ConfigError(f"Unknown setting {unknown[0]!r} (known: {', '.join(sorted(keys))}, and set={{...}}).")
    given: dict[str, Any] = {}
    for name, value in flags.items():
        if value is not None:
            set_dotted(given, keys[name], value)
    for key, value in settings_of(set).items():
        set_dotted(given, key, value)
    if isinstance(config, ExperimentConfig):
        # already resolved: no paper setup goes beneath it again (as when a run is resumed); its
        # --deployment beneath its own deployment settings first, since the object carries them all
        config = apply_preset(config)
        cfg = resolve_config(merge({**to_dict(config), "paper_setup": False}, given))
        cfg = dataclasses.replace(cfg, paper_setup=config.paper_setup)
    else:
        base = dict(config) if isinstance(config, Mapping) else load_config_file(config) if config else {}
        cfg = resolve_config(merge(base, given))
    return validate(cfg)


@dataclass
class Result:
    """A run's results, read from its directory with pandas: ``metrics`` (metrics.parquet),
    ``clients`` (clients.parquet), ``partition`` (partition.parquet; None for a run from before
    it existed), ``summary`` (summary.json; empty for a run that did not end) and ``config``
    (config.yaml, as nested settings)."""

    run_dir: Path
    metrics: pd.DataFrame
    clients: pd.DataFrame
    partition: pd.DataFrame | None
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> dict[str, Any]:
        """The metrics at the last evaluated round (the summary's ``final``)."""
        out: dict[str, Any] = self.summary.get("final", {})
        return out

    def __repr__(self) -> str:
        return f"Result({str(self.run_dir)!r}, {len(self.metrics)} evaluated rounds, final={self.final})"


def load(run_dir: str | os.PathLike[str]) -> Result:
    """A run directory's results (also a stopped run's: the rounds it evaluated)."""
    import pandas as pd

    p = Path(run_dir)
    if not (p / "metrics.parquet").is_file():
        raise ConfigError(f"{p} is not a raysim run directory (it has no metrics.parquet).")
    clients = pd.read_parquet(p / "clients.parquet") if (p / "clients.parquet").is_file() else pd.DataFrame()
    partition = pd.read_parquet(p / "partition.parquet") if (p / "partition.parquet").is_file() else None
    summary = json.loads((p / "summary.json").read_text()) if (p / "summary.json").is_file() else {}
    config = load_config_file(p / "config.yaml") if (p / "config.yaml").is_file() else {}
    return Result(p, pd.read_parquet(p / "metrics.parquet"), clients, partition, summary, config)


def run(
    config: ExperimentConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    set: Mapping[str, Any] | Sequence[str] | None = None,  # noqa: A002 - the name of the --set flag
    callbacks: Sequence[Callback] = (),
    log: str | Sequence[str] | None = None,
    tracking_uri: str | None = None,
    **flags: Any,
) -> Result:
    """Run one experiment (see the module docstring for the settings). ``callbacks`` are told
    every round and evaluation, and may add metrics to the round's row and stop the run
    (:class:`raysim.results.output.Callback`, :class:`~raysim.results.output.Reply`); ``log``
    names experiment trackers (``"mlflow,wandb"`` or a list, as ``--log``) and ``tracking_uri``
    MLflow's server (``--tracking-uri``). Returns its :class:`Result`."""
    from raysim.engine.runner import run_experiment
    from raysim.plugins import used_plugins

    tracking = {"output.log": log, "output.tracking_uri": tracking_uri}
    set = {**settings_of(set), **{k: v for k, v in tracking.items() if v is not None}}
    exp = checked_experiment(config, set=set, **flags)
    cfg = dataclasses.replace(exp.cfg, plugins=used_plugins(exp.cfg))
    exp = dataclasses.replace(exp, cfg=cfg)
    extra = list(callbacks)
    if cfg.output.progress:
        from raysim.results.output import ProgressBar

        extra.append(ProgressBar())
    result = run_experiment(exp, extra)
    return load(result.run_dir)


@dataclass
class SuiteResult:
    """A suite's results: ``table`` (a row per configuration: its settings, seeds, and the mean and
    standard deviation of each metric over them), ``trials`` (every trial's evaluated rounds, with
    its configuration and seed) and ``summary`` (the suite's summary.json as it is)."""

    suite_dir: Path
    table: pd.DataFrame
    trials: pd.DataFrame
    summary: dict[str, Any]


def sweep(
    suite: str | os.PathLike[str] | None = None,
    *,
    seeds: str | Sequence[int] | None = None,
    out: str | os.PathLike[str] | None = None,
    name: str | None = None,
    max_concurrent: int | None = None,
    progress: bool = False,
    search: str | None = None,
    samples: int | None = None,
    scheduler: str | None = None,
    metric: str | None = None,
    mode: str | None = None,
    set: Mapping[str, Any] | Sequence[str] | None = None,  # noqa: A002 - the name of the --set flag
    **flags: Any,
) -> SuiteResult:
    """Run a suite (a suite file's configurations x seeds, on Ray Tune) as ``scripts/sweep.py``
    does: ``flags`` and ``set`` override every trial's settings (a list value is a grid over its
    values, a tuple one value, e.g. a shape; a text such as ``"loguniform(1e-3, 0.1)"`` a range for
    ``search``); ``seeds`` e.g. ``"0-2"`` or ``[0, 1]``; ``search``, ``samples``, ``scheduler``
    (with or without a search: e.g. ``"asha"`` stops the grid's trials early), ``metric`` and
    ``mode`` as the command's flags."""
    from raysim.suite import RANGE, default_suite_dir, run_suite, setting_key, suite_of

    keys = flag_keys()
    settings = settings_of(set)
    for key, value in flags.items():
        if key not in keys:
            raise ConfigError(f"Unknown setting {key!r} (known: {', '.join(sorted(keys))}, and set={{...}}).")
        settings[keys[key]] = value
    base: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    space: dict[str, str] = {}
    for key, value in settings.items():
        key = setting_key(key)
        if isinstance(value, list):  # a grid over the values
            grid[key] = value
        elif isinstance(value, str) and RANGE.match(value):  # a range for the search
            space[key] = value
        else:  # one value (a tuple too, e.g. a shape)
            base[key] = list(value) if isinstance(value, tuple) else value
    built = suite_of(
        Path(suite) if suite is not None else None, base=base, grid=grid, space=space, seeds=seeds,
        name=name, search=search, samples=4 if samples is None else samples, scheduler=scheduler,
        metric=metric, mode=mode,
    )  # fmt: skip
    suite_dir = Path(out) if out is not None else default_suite_dir(built)
    summary = run_suite(built, suite_dir, progress=progress, max_concurrent=max_concurrent)
    return load_suite_result(summary["suite_dir"])


def load_suite_result(suite_dir: str | os.PathLike[str]) -> SuiteResult:
    """A finished suite directory's results (summary.json, metrics.parquet) as DataFrames."""
    import pandas as pd

    p = Path(suite_dir)
    if not (p / "summary.json").is_file() or not (p / "suite.yaml").is_file():
        raise ConfigError(f"{p} holds no finished suite (no suite.yaml and summary.json).")
    summary = json.loads((p / "summary.json").read_text())
    rows = []
    for c in summary.get("configs", []):
        row: dict[str, Any] = {"config": c["config"], **c.get("settings", {}), "seeds": c.get("seeds")}
        for kind in ("mean", "std", "last_mean", "last_std"):
            for metric, value in (c.get(kind) or {}).items():
                row[f"{metric}_{kind}"] = value
        rows.append(row)
    trials = pd.read_parquet(p / "metrics.parquet") if (p / "metrics.parquet").is_file() else pd.DataFrame()
    return SuiteResult(p, pd.DataFrame(rows), trials, summary)


__all__ = ["Result", "SuiteResult", "checked_experiment", "load", "load_suite_result", "make_config", "run", "sweep"]
