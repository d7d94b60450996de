"""``eval.target`` and ``eval.target_metric``: which accuracy a run's target reads, and whether the
run reports it at all (docs/usage.md, "Simulated deployments").

A run's metric columns follow from its algorithm and settings (:mod:`raysim.results.metrics`):
``gm_gtest`` and ``gm_ptest`` where the algorithm has a global model, ``lm_ptest`` where it has
personal models or fine-tunes, or with ``eval.updated_lm``, and ``updated_lm_ptest`` with
``eval.updated_lm``; the others are null in every row. A target on a null column could never be
reached, so :func:`check_target` refuses it in the driver, before any work.
"""

from __future__ import annotations

from raysim.capabilities.finetune import FineTune
from raysim.config import ExperimentConfig
from raysim.engine.hooks import AlgorithmHooks
from raysim.errors import ConfigError
from raysim.results.metrics import METRICS


def reported_metrics(cfg: ExperimentConfig, algorithm: type[AlgorithmHooks]) -> tuple[str, ...]:
    """The accuracies a run of ``algorithm`` under ``cfg`` gives values to, in the tables' order."""
    has = {
        "gm_gtest": algorithm.evaluates_global(cfg),
        "gm_ptest": algorithm.evaluates_global(cfg),
        "lm_ptest": algorithm.evaluates_personal(cfg) or cfg.eval.updated_lm,
        "updated_lm_ptest": cfg.eval.updated_lm,
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
    fine_tune = " or algo.ft_epochs > 0" if FineTune.of(algorithm) is not None else ""
    return "it has no personal models", f"; eval.updated_lm=true{fine_tune} gives it one"


def check_target(cfg: ExperimentConfig, algorithm: type[AlgorithmHooks]) -> None:
    """Refuse a target on an accuracy the run does not report, and a target metric without a
    target (where it reads nothing), each in one sentence."""
    given = cfg.eval.target_metric != "auto"
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
    if cfg.eval.target is None:
        raise ConfigError(
            f"eval.target_metric={metric} is read only with eval.target (the accuracy to reach, a fraction: "
            "eval.target=0.8 for 80%)."
        )


def _words(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


__all__ = ["check_target", "reported_metrics", "target_metric"]
