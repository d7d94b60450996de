"""A suite's configurations read as series against a setting: a table and a figure per metric of the
final value against that setting (a privacy budget, a participation rate), beside the curves over
rounds that every page has.

A suite file's ``against`` names the axis and how a configuration's name places it there::

    against:
      axis: epsilon                                  # the setting's name on the page
      suffixes: {eps1: 1, eps3: 3, eps8: 8, inf: .inf}
      metrics: [gm_gtest, lm_ptest]

A configuration named ``SERIES_SUFFIX`` (``fedper_eps3``) is series ``SERIES`` at the suffix's value
(3); one whose name ends in no suffix is left out. The values are numbers (``.inf`` for a run
without the budget, drawn at the axis's right end as ∞); the points are evenly spaced in the
values' order, so a budget's steps (1, 3, 8, ∞) read as steps. :func:`parse_against` checks the
entry when the suite file is read; :func:`against_sections` writes the page's section and figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError
from raysim.results.curves import split_suffix

#: the entry's keys
KEYS = ("axis", "suffixes", "metrics")


@dataclass(frozen=True)
class Against:
    """``axis``: the setting's name; ``values``: each suffix's value, ascending (inf last);
    ``metrics``: the metrics shown."""

    axis: str
    values: tuple[tuple[str, float], ...]
    metrics: tuple[str, ...]

    def place(self, config: str) -> tuple[str, float] | None:
        """(series, value) of a configuration's name, or None where it ends in no suffix."""
        found = split_suffix(config, [s for s, _ in self.values])
        return None if found is None else (found[0], dict(self.values)[found[1]])


def check_entry(data: Any, name: str, keys: Sequence[str], where: str) -> None:
    """A page entry of a suite file (``against``, ``regimes``) is a mapping of ``keys`` and no other,
    refused in one sentence otherwise."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{name} in {where} is a mapping of {', '.join(keys[:-1])} and {keys[-1]}, not {data!r}.")
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise ConfigError(f"Unknown key {unknown[0]!r} in {name} of {where} (known: {', '.join(keys)}).")


def check_suffix(suffix: Any, name: str, where: str) -> None:
    """A name suffix of a page entry's ``suffixes``: letters and digits, no '_'."""
    if not isinstance(suffix, str) or not suffix or "_" in suffix:
        raise ConfigError(f"{name}.suffixes in {where}: {suffix!r} is not a name suffix (letters and digits, no '_').")


def parse_against(data: Any, configs: Sequence[str], where: str) -> Against:
    """The suite file's ``against`` entry, each mistake refused in one sentence: unknown keys, an
    axis that is no name, suffixes that are not names with numbers, a metric raysim does not report,
    and suffixes that place no configuration."""
    from raysim.results.report import DEFAULT_METRICS

    check_entry(data, "against", KEYS, where)
    axis = data.get("axis")
    if not isinstance(axis, str) or not axis.strip():
        raise ConfigError(f"against.axis in {where} names the setting on the axis (such as epsilon), not {axis!r}.")
    suffixes = data.get("suffixes")
    if not isinstance(suffixes, Mapping) or not suffixes:
        raise ConfigError(f"against.suffixes in {where} maps name suffixes to numbers (such as {{eps1: 1, inf: .inf}}).")
    values = []
    for suffix, value in suffixes.items():
        check_suffix(suffix, "against", where)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"against.suffixes in {where}: {suffix}'s value is a number (.inf allowed), not {value!r}.")
        values.append((suffix, float(value)))
    metrics = data.get("metrics", ["gm_gtest"])
    if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
        raise ConfigError(f"against.metrics in {where} is a list of metrics (such as [gm_gtest, lm_ptest]), not {metrics!r}.")
    for m in metrics:
        if m not in DEFAULT_METRICS:
            raise ConfigError(f"against.metrics in {where}: {m!r} is not one of {', '.join(DEFAULT_METRICS)}.")
    out = Against(axis.strip(), tuple(sorted(values, key=lambda sv: sv[1])), tuple(metrics))
    if not any(out.place(c) for c in configs):
        raise ConfigError(
            f"against.suffixes in {where} place no configuration: name them SERIES_SUFFIX (such as fedavg_{values[0][0]})."
        )
    return out


def value_label(value: float) -> str:
    """A value of the axis as the page shows it: ∞ for a run without the budget."""
    return "∞" if math.isinf(value) else f"{value:g}"


def _points(against: Against, summary: Mapping[str, Any], metric: str) -> dict[str, dict[float, tuple[float, float]]]:
    """series -> value -> (mean, std) of the final ``metric`` over seeds, in %."""
    out: dict[str, dict[float, tuple[float, float]]] = {}
    for c in summary["configs"]:
        placed = against.place(str(c["config"]))
        mean = c["mean"].get(metric)
        if placed is None or mean is None:
            continue
        series, value = placed
        out.setdefault(series, {})[value] = (100 * float(mean), 100 * float(c["std"].get(metric) or 0.0))
    return out


def _figure(against: Against, points: Mapping[str, Mapping[float, tuple[float, float]]], metric: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from raysim.results.report import DPI, FIGSIZE

    xs = [v for _, v in against.values]
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for series, by_value in points.items():
        at = [i for i, v in enumerate(xs) if v in by_value]
        ax.errorbar(
            at, [by_value[xs[i]][0] for i in at], yerr=[by_value[xs[i]][1] for i in at],
            marker="o", markersize=4, capsize=3, label=series,
        )  # fmt: skip
    ax.set_xticks(range(len(xs)), [value_label(v) for v in xs])
    ax.set_xlabel(against.axis)
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"final {metric} against {against.axis} (mean ± std over seeds)")
    ax.grid(True, alpha=0.4)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png")


def _spent(against: Against, suite_dir: Path) -> str:
    """A table of the privacy each series spent at each value, where the trials ran under DP: the
    noise multiplier and the epsilon of each trial's summary.json, mean over seeds."""
    found: dict[str, dict[float, list[tuple[float, float]]]] = {}
    for s in sorted((suite_dir / "runs").glob("*/summary.json")):
        run = json.loads(s.read_text())
        config = s.parent.name.rsplit("-seed", 1)[0]
        placed = against.place(config)
        if placed is None or run.get("epsilon") is None:
            continue
        found.setdefault(placed[0], {}).setdefault(placed[1], []).append(
            (float(run.get("noise_multiplier") or 0.0), float(run["epsilon"]))
        )
    if not found:
        return ""
    xs = [v for _, v in against.values]
    lines = [
        "| series | " + " | ".join(f"{against.axis} {value_label(v)}: sigma, epsilon spent" for v in xs) + " |",
        "|---|" + "---|" * len(xs),
    ]
    for series, by_value in found.items():
        cells = []
        for v in xs:
            got = by_value.get(v)
            if not got:
                cells.append("–")
                continue
            sigma = sum(g[0] for g in got) / len(got)
            eps = sum(g[1] for g in got) / len(got)
            cells.append(f"{sigma:.3f}, {eps:.3f}")
        lines.append(f"| {series} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def against_sections(against: Against, summary: Mapping[str, Any], suite_dir: Path, out: Path) -> tuple[list[str], list[Path]]:
    """The page's section (a table per metric, the privacy spent where there is any, the figures)
    and the figures written: ``against_<axis>_<metric>.png``."""
    from raysim.results.report import MISSING

    xs = [v for _, v in against.values]
    parts = [
        f"## Against {against.axis}",
        "",
        f"Each series' final value at each {against.axis}, in %, mean ± std over seeds (a configuration "
        f"SERIES_SUFFIX is series SERIES at the suffix's {against.axis}: "
        + ", ".join(f"`{s}` {value_label(v)}" for s, v in against.values)
        + ").",
        "",
    ]
    pngs = []
    for metric in against.metrics:
        points = _points(against, summary, metric)
        if not points:
            continue
        parts += [
            f"{metric}:",
            "",
            "| series | " + " | ".join(f"{against.axis} {value_label(v)}" for v in xs) + " |",
            "|---|" + "---|" * len(xs),
        ]
        for series, by_value in points.items():
            cells = [f"{by_value[v][0]:.2f} ± {by_value[v][1]:.2f}" if v in by_value else MISSING for v in xs]
            parts.append(f"| {series} | " + " | ".join(cells) + " |")
        parts.append("")
        path = out / f"against_{against.axis}_{metric}.png"
        _figure(against, points, metric, path)
        pngs.append(path)
    spent = _spent(against, suite_dir)
    if spent:
        parts += [
            "The privacy each trial spent, from its summary.json (mean over seeds): the noise multiplier "
            "sigma calibrated before round 1 and the epsilon after the last round, at the run's delta.",
            "",
            spent,
        ]
    parts += [*(f"![{p.stem}]({p.name})" for p in pngs), ""]
    return parts, pngs


__all__ = ["Against", "against_sections", "check_entry", "check_suffix", "parse_against", "value_label"]
