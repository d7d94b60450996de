"""Suites: a whole table (configurations x seeds) as one command, on Ray Tune.

A :class:`Suite` is a list of named configurations (a paper table's rows), optionally crossed with a
grid of settings, times seeds; or a search over ranges of settings (any Tune search algorithm); with
or without a search, a Tune scheduler (e.g. ASHA) may stop its trials early. :func:`run_suite` runs
every trial on one Ray cluster with Ray Tune: each trial is one raysim experiment inside its own
placement group (a head bundle for the trial's driver and server, one bundle per client worker with
the run's CPU and GPU shares), so trials queue when the cluster is full instead of oversubscribing
it. A trial runs :func:`raysim.engine.runner.run_experiment` exactly as
``scripts/run.py`` would, with the same settings, so its numbers are that run's.

The suite directory holds ``suite.yaml`` (the suite), ``runs/<trial>/`` (each trial's run
directory: Parquet tables, TensorBoard, config, checkpoints), ``tune/`` (Tune's own state, for
``--resume``), and once the trials are done ``metrics.parquet`` (every trial's rows, with their
configuration and seed), ``summary.json`` (per configuration the mean and std over seeds of the
final, best and last-k metrics) and ``report.md`` with curves banded over seeds
(:mod:`raysim.results.report`). An interrupted suite (Ctrl-C, which stops each running trial at
the end of its round with a checkpoint, or a lost driver) is finished by :func:`run_suite` with
``resume=True`` (Tune's restore): finished trials are not run again, and the ones that were running
go on from their raysim checkpoint.

The run directories must be reachable from every node that runs a trial (one machine, or a shared
file system on a cluster), as the trials write them and the driver collects them.

The package is split by concern: :mod:`~raysim.suite.spec` (what a suite is, read and checked),
:mod:`~raysim.suite.tune` (running it on Ray Tune) and :mod:`~raysim.suite.results` (its tables).
"""

from raysim.suite.results import collect, equal_compute_of
from raysim.suite.spec import (
    RANGE,
    SCHEDULERS,
    SEARCH_METRICS,
    SEARCHERS,
    STARTS_FILE,
    SUITE_FILE,
    TRIAL_FILE,
    UNSCHEDULABLE,
    SchedulerSpec,
    SearchSpec,
    Suite,
    SuiteConfig,
    Trial,
    default_suite_dir,
    expand_grid,
    load_suite,
    make_suite,
    parse_range,
    parse_seeds,
    setting_key,
    suite_of,
    to_yaml,
    trial_experiment,
    trials,
    yaml_safe_load,
)
from raysim.suite.tune import run_suite, run_trial

__all__ = [
    "RANGE",
    "SCHEDULERS",
    "SEARCHERS",
    "SEARCH_METRICS",
    "STARTS_FILE",
    "SUITE_FILE",
    "TRIAL_FILE",
    "UNSCHEDULABLE",
    "SchedulerSpec",
    "SearchSpec",
    "Suite",
    "SuiteConfig",
    "Trial",
    "collect",
    "default_suite_dir",
    "equal_compute_of",
    "expand_grid",
    "trial_experiment",
    "load_suite",
    "make_suite",
    "parse_range",
    "parse_seeds",
    "run_suite",
    "run_trial",
    "setting_key",
    "suite_of",
    "to_yaml",
    "trials",
    "yaml_safe_load",
]
