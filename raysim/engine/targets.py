"""``eval.target`` and ``eval.target_metric``: which accuracy a run's target reads, and whether the
run reports it at all (docs/usage.md, "Simulated deployments"); the callbacks that track the target
(:class:`TargetTracker`, which also stops the run at it with ``eval.stop_at_target``) and end a run
at its simulated time budget (:class:`TimeBudget`).

A run's metric columns follow from its algorithm and settings (:mod:`raysim.results.metrics`):
``gm_gtest`` and ``gm_ptest`` where the algorithm has a global model, ``lm_ptest`` where it has
personal models or fine-tunes, or with ``eval.updated_lm``, and ``updated_lm_ptest`` with
``eval.updated_lm``; the others are null in every row. A target on a null column could never be
reached, so :func:`check_target` refuses it in the driver, before any work.
"""

from __future__ import annotations

import logging
from typing import Any

from raysim.capabilities.finetune import FineTune
from raysim.config import ExperimentConfig
from raysim.engine.hooks import AlgorithmHooks
from raysim.errors import ConfigError
from raysim.records import RoundStats
from raysim.results.metrics import METRICS, MetricHistory
from raysim.results.output import BaseCallback, Reply

log = logging.getLogger(__name__)


def reported_metrics(cfg: ExperimentConfig, algorithm: type[AlgorithmHooks]) -> tuple[str, ...]:
    """The accuracies a run of ``algorithm`` under ``cfg`` gives values to, in the tables' order."""
    has = {
        "gm_gtest": algorithm.evaluates_global(cfg),
        "gm_ptest": algorithm.evaluates_global(cfg),
        "lm_ptest": algorithm.evaluates_personal(cfg) or cfg.eval.updated_lm,
        "updated_lm_ptest": cfg.eval.updated_lm,
        "new_gm_ptest": cfg.eval.new_clients > 0 and algorithm.evaluates_global(cfg),
        "new_lm_ptest": algorithm.evaluates_newcomers(cfg),
    }
    return tuple(m for m in METRICS if has[m])


def target_metric(cfg: ExperimentConfig, algorithm: type[AlgorithmHooks]) -> str:
    """``eval.target_metric``, or by default the model the algorithm is judged by: lm_ptest where
    it has personal models, else gm_gtest."""
    if cfg.eval.target_metric != "auto":
        return cfg.eval.target_metric
    return "lm_ptest" if algorithm.evaluates_personal(cfg) else "gm_gtest"


def _why_not(metric: str, algorithm: type[AlgorithmHooks]) -> tuple[str, str]:
    """Why a run does not report ``metric``, and the settings that would make it report one (or "")."""
    if metric.startswith("gm_"):
        return "it has no global model", ""
    fine_tune = " or algo.ft_epochs > 0" if FineTune.of(algorithm).declared else ""
    return "it has no personal models", f"; eval.updated_lm=true{fine_tune} gives it one"


def check_target(cfg: ExperimentConfig, algorithm: type[AlgorithmHooks]) -> None:
    """Refuse a target on an accuracy the run does not report, and a target metric without a
    target (where it reads nothing), each in one sentence."""
    given = cfg.eval.target_metric != "auto"
    if cfg.eval.stop_at_target and cfg.eval.target is None:
        raise ConfigError("eval.stop_at_target stops a run at eval.target, which is not set (e.g. eval.target=0.8).")
    if not given and cfg.eval.target is None:
        return
    metric = target_metric(cfg, algorithm)
    if metric == "updated_lm_ptest" and not cfg.eval.updated_lm:
        raise ConfigError("eval.target_metric=updated_lm_ptest needs eval.updated_lm=true (it is that setting's column).")
    reported = reported_metrics(cfg, algorithm)
    if metric not in reported:
        setting = f"eval.target_metric={metric}" if given else f"eval.target (on {metric}, its default)"
        why, fix = _why_not(metric, algorithm)
        does = f"only {_words(reported)}" if reported else "and no other accuracy"
        raise ConfigError(
            f"{setting} can never be reached: {cfg.algo} reports no {metric} as this run is set ({why}), {does}{fix}."
        )
    if cfg.eval.target is None and given:
        raise ConfigError(
            f"eval.target_metric={metric} is read only with eval.target (the accuracy to reach, a fraction: "
            "eval.target=0.8 for 80%)."
        )


def out_of_time(cfg: ExperimentConfig, stats: RoundStats) -> bool:
    """Whether the simulated clock reached the run's budget (``deployment.time_budget_s``) in the
    round of ``stats``: the run's last round, and evaluated."""
    budget = cfg.deployment.time_budget_s
    return stats.rnd > 0 and budget is not None and stats.sim_clock_s >= budget


class TimeBudget(BaseCallback):
    """``deployment.time_budget_s``: stops the run after the round whose end reaches the budget
    (:func:`out_of_time`; the loop evaluates that round)."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg

    def on_round(self, stats: RoundStats, round_time: float) -> Reply | None:
        if not out_of_time(self.cfg, stats):
            return None
        log.info("the simulated clock reached %.6g s after round %d: the run's budget", stats.sim_clock_s, stats.rnd)
        return Reply(stop=True)


class TargetTracker(BaseCallback):
    """``eval.target``: the summary's ``target``, ``rounds_to_target`` and ``time_to_target_s``
    (the first evaluation at or above it, on the simulated clock), read from ``rows`` (the run's
    metric rows, a resumed run's included); with ``eval.stop_at_target`` the run ends after that
    evaluation."""

    def __init__(self, cfg: ExperimentConfig, algorithm: type[AlgorithmHooks], rows: list[dict[str, Any]]) -> None:
        assert cfg.eval.target is not None
        self.target, self.stop = cfg.eval.target, cfg.eval.stop_at_target
        self.metric = target_metric(cfg, algorithm)
        self.rows = rows

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply | None:
        value = row.get(self.metric)
        if not self.stop or value is None or value < self.target:
            return None
        log.info("%s reached %.4g (eval.target %.4g) at round %d: the run stops", self.metric, value, self.target, rnd)
        return Reply(stop=True)

    def on_end(self, summary: dict[str, Any]) -> Reply | None:
        return Reply(metrics=MetricHistory(self.rows).reaching(self.target, self.metric))


def _words(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


__all__ = ["TargetTracker", "TimeBudget", "check_target", "out_of_time", "reported_metrics", "target_metric"]
