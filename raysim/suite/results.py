"""A suite's results: every trial's rows in ``metrics.parquet``, per configuration the mean and std
over seeds of the final, best and last-k metrics in ``summary.json``, and ``report.md`` with its
plots (:mod:`raysim.results.report`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from raysim.provenance import source_commit
from raysim.results.metrics import METRICS, MetricHistory
from raysim.suite.spec import TRIAL_FILE, Suite, yaml_safe_load


def equal_compute_of(run_dir: Path) -> tuple[int, int, int] | None:
    """(rounds, clients a round, clients) of the run that trains as many client-epochs as the
    finished run in ``run_dir`` with its rounds and local epochs; None if it is not finished or
    is itself a baseline."""
    trial = json.loads((run_dir / TRIAL_FILE).read_text())
    if trial.get("pair") or not (run_dir / "summary.json").exists():
        return None
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = yaml_safe_load(run_dir / "config.yaml")
    rounds, epochs, clients = int(summary["rounds"]), int(cfg["train"]["local_epochs"]), int(cfg["clients"])
    if rounds == 0 or epochs == 0:
        return None
    per_round = round(summary["client_epochs"] / (rounds * epochs))
    return rounds, max(1, min(clients, per_round)), clients


def collect(suite: Suite, suite_dir: Path) -> dict[str, Any]:
    """Every trial's rows into ``metrics.parquet`` (with its configuration, seed and sampled
    settings), the mean and std over seeds of each configuration's final, best and last-k metrics
    into ``summary.json``, and ``report.md`` with its plots. Returns the summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raysim.files import replaced_atomically

    settings = {c.name: dict(c.settings) for c in suite.configs}
    papers = {c.name: c.paper for c in suite.configs}
    paired: dict[str, set[str]] = {}  # a configuration -> its baselines at equal compute
    rows: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}  # a configuration (or, searched, a sample): its runs
    for path in sorted((suite_dir / "runs").glob(f"*/{TRIAL_FILE}")):
        run = path.parent
        if not (run / "metrics.parquet").exists():
            continue
        trial = json.loads(path.read_text())
        group = trial["config"] if not trial["sampled"] else run.name
        if trial.get("pair"):
            settings.setdefault(
                group,
                {**dict(suite.equal_compute.settings), **_pair_settings(run)} if suite.equal_compute else {},
            )
            papers.setdefault(group, "")
        elif group not in settings:
            settings[group] = {**settings[trial["config"]], **trial["sampled"]}
            papers[group] = papers[trial["config"]]
        if suite.equal_compute is not None and (pair := equal_compute_of(run)) is not None:
            paired.setdefault(group, set()).add(f"{suite.equal_compute.name}_r{pair[0]}_k{pair[1]}")
        trial_rows = pq.read_table(run / "metrics.parquet").to_pylist()
        history = MetricHistory(trial_rows)  # also for a trial a scheduler stopped early (no summary.json)
        last_k = int(yaml_safe_load(run / "config.yaml").get("eval", {}).get("last_k", 5))
        run_summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
        groups.setdefault(group, []).append(
            {
                "seed": trial["seed"],
                "rounds": trial_rows[-1]["round"] if trial_rows else 0,
                "final": history.final(),
                "best": history.best(),
                "last": history.last(last_k),
                # the simulated deployment's clock (raysim.deployment): its last evaluation's, and eval.target's
                "sim_time_s": trial_rows[-1].get("sim_time_s") if trial_rows else None,
                "target": run_summary.get("target"),
                "time_to_target_s": run_summary.get("time_to_target_s"),
                # differential privacy (raysim.privacy): the epsilon the trial spent, client-level
                # or (DP-SGD) the largest over its clients
                "epsilon": run_summary.get("epsilon", run_summary.get("example_epsilon")),
            }
        )
        for row in trial_rows:
            rows.append(
                {"config": group, "seed": trial["seed"], "trial": run.name, **trial["sampled"], **row}
            )
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with replaced_atomically(suite_dir / "metrics.parquet") as tmp:
        pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]), tmp)
    configs = [
        {
            "config": name,
            "settings": settings[name],
            "seeds": sorted(int(r["seed"]) for r in runs),
            "rounds": sorted({int(r["rounds"]) for r in runs}),
            "mean": _stat(runs, "final", np.mean),
            "std": _stat(runs, "final", np.std),
            "best_mean": _stat(runs, "best", np.mean),
            "last_mean": _stat(runs, "last", np.mean),
            "last_std": _stat(runs, "last", np.std),
            "paper": papers[name],
            "equal_compute": sorted(paired.get(name, ())),
            **_clock(runs),
            **_privacy(runs),
        }
        for name, runs in sorted(groups.items(), key=lambda kv: _order(suite, kv[0]))
    ]
    summary = {
        "suite": suite.name,
        "suite_dir": str(suite_dir),
        "commit": source_commit(),
        "trials": sum(len(v) for v in groups.values()),
        "configs": configs,
    }
    with replaced_atomically(suite_dir / "summary.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
    from raysim.results.report import write_suite_report
    from raysim.suite.layout import suite_layout

    write_suite_report(suite_dir, suite_layout(suite_dir, summary))
    return summary


def _pair_settings(run: Path) -> dict[str, Any]:
    cfg = yaml_safe_load(run / "config.yaml")
    return {"rounds": cfg.get("rounds"), "participation": cfg.get("participation")}


def _order(suite: Suite, group: str) -> tuple[int, str]:
    """Table order: the suite's configurations as listed (samples of a search after their own)."""
    names = [c.name for c in suite.configs]
    for i, name in enumerate(names):
        if group == name or group.startswith(f"{name}-seed"):
            return i, group
    return len(names), group


def _privacy(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A configuration's epsilon spent, the mean over its seeds' summaries (each trial's
    ``epsilon``, or under DP-SGD its ``example_epsilon``): only where its trials ran under DP."""
    spent = [float(r["epsilon"]) for r in runs if r.get("epsilon") is not None]
    return {"epsilon_mean": float(np.mean(spent))} if spent else {}


def _clock(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A configuration's simulated time (mean over seeds of each trial's last ``sim_time_s``), and
    with ``eval.target`` the target, the seeds that reached it and their mean simulated time to it:
    only where the trials ran a deployment whose devices take time."""
    times = [r["sim_time_s"] for r in runs if r.get("sim_time_s")]
    out: dict[str, Any] = {"sim_time_mean": float(np.mean(times))} if times else {}
    target = next((r["target"] for r in runs if r.get("target")), None)
    if target is not None:
        reached = [r["time_to_target_s"] for r in runs if r.get("time_to_target_s") is not None]
        out["target"] = target
        out["target_reached"] = f"{len(reached)}/{len(runs)}"
        out["time_to_target_mean"] = float(np.mean(reached)) if reached else None
    return out


def _stat(runs: list[dict[str, Any]], which: str, fn: Any) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for m in METRICS:
        vals = [r[which][m] for r in runs if r.get(which, {}).get(m) is not None]
        out[m] = float(fn(vals)) if vals and not any(math.isnan(v) for v in vals) else None
    return out


__all__ = ["collect", "equal_compute_of", "source_commit"]
