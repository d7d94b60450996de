"""A suite's configurations that sweep a numeric setting, drawn as the papers draw a sensitivity
figure: each series' final value against the setting's values, instead of a curve per value over
rounds among dozens of others.

A suite names a swept configuration as a grid does (:func:`raysim.suite.spec.expand_grid`):
``NAME_KEY=VALUE``, KEY the last part of the setting (``fedavg_participation=0.05``,
``feddrplus_beta=0.3``, ``feddrplus_partition=shard_2_lr=0.1``). :func:`sweep_plan` reads the names:

- a name is a series (``fedavg``) and its ``KEY=VALUE`` parts, KEY one of the settings the suite
  sets (its configurations' and its grid's; the longest that matches, so ``local_epochs=1`` is one
  part);
- a KEY is an axis where its values are numbers, or one kind of partition with a number
  (``pathological_4``, ``dominant_20``: the number), and it takes three values or more, or two
  where some configurations are named without it (a sweep's default point makes the third); any
  other KEY (``partition=shard_2`` beside ``partition=dirichlet_0.1``, ``regularizers=kd``) picks the
  panel. Where a name carries two axes, the one of fewer values picks the panel instead;
- a configuration named without an axis's KEY but with the series and panel of configurations that
  carry it (the default point of a sensitivity sweep: ``fedavg_partition=shard_2`` beside
  ``fedavg_participation=0.05_partition=shard_2``) is drawn on that axis at its own value of the
  setting: the value its first trial ran with (``config.yaml``; an algorithm's parameter left at its
  default, the algorithm's default), where it is a number of the axis's kind.

:func:`sweep_sections` draws ``sweep_<metric>.png`` for each metric the suite reports: a row of
panels per panel value, a column per axis, each series' final value (mean ± std over seeds) at each
value of the setting, the points evenly spaced in the values' order (the same step for 0.05 -> 0.1
as for 0.1 -> 0.2, as a sweep over 1, 3, 5, 10 epochs reads); the series in their algorithm family's
colours (:mod:`raysim.results.curves`). A suite file's ``against`` (:mod:`raysim.suite.against`)
declares its one axis itself and gets no sweep figure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.suite.against import value_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: a value of a swept setting: a number, or a kind of partition with a number (``pathological_4``,
#: a name's form of ``pathological:4``)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")
_STEMMED = re.compile(r"^([A-Za-z][A-Za-z0-9]*?)[_:](-?\d+(?:\.\d+)?(?:e-?\d+)?)$")
#: an axis takes this many values or more (its default point counted); a key of fewer picks a panel
MIN_VALUES = 3


@dataclass(frozen=True)
class SweepLine:
    """One series on one axis in one panel: ``points`` (value, configuration), ascending;
    ``default``: the configuration among them named without the axis (drawn at the value its
    trials ran with), or None."""

    axis: str
    panel: str
    series: str
    algo: str | None
    points: tuple[tuple[float, str], ...]
    default: str | None = None


@dataclass(frozen=True)
class SweepPlan:
    """``axes``: each axis's KEY and its label (``partition`` of ``pathological_N``: "partition
    (pathological:N)"), in the names' order; ``panels``: the panel values, in the suite's order ("" for
    one); ``lines``: every series on every axis in every panel."""

    axes: tuple[tuple[str, str], ...]
    panels: tuple[str, ...]
    lines: tuple[SweepLine, ...]


def name_parts(name: str, keys: Sequence[str]) -> tuple[str, dict[str, str]]:
    """(series, {KEY: VALUE}) of a configuration's name: it splits before each ``_KEY=`` (or a
    leading ``KEY=``) whose KEY is one of ``keys``, the longest that matches."""
    by_length = sorted(set(keys), key=lambda k: -len(k))
    cuts: list[tuple[int, str]] = []  # (where the part begins, its key)
    i = 0
    while i < len(name):
        k = next((k for k in by_length if name.startswith(k + "=", i)), None) if i == 0 or name[i - 1] == "_" else None
        if k is None:
            i += 1
        else:  # (the key's own words are not read again: local_epochs= is not a part epochs=)
            cuts.append((i, k))
            i += len(k) + 1
    parts: dict[str, str] = {}
    for j, (i, k) in enumerate(cuts):
        end = cuts[j + 1][0] - 1 if j + 1 < len(cuts) else len(name)
        parts[k] = name[i + len(k) + 1 : end]
    series = name[: cuts[0][0] - 1] if cuts and cuts[0][0] > 0 else ("" if cuts else name)
    return series, parts


def numeric(value: Any) -> tuple[str, float] | None:
    """(stem, number) of a value of a swept setting: ("", 0.05) for 0.05 or "0.05", ("pathological",
    4.0) for ``pathological_4`` or ``pathological:4``; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(value) else ("", float(value))
    text = str(value)
    if _NUMBER.fullmatch(text):
        return "", float(text)
    m = _STEMMED.match(text)
    return (m.group(1), float(m.group(2))) if m else None


def _setting_value(run_dir: Path, setting: str) -> Any:
    """The value of the dotted ``setting`` the trial in ``run_dir`` ran with (``config.yaml``), an
    algorithm's parameter left at its default read from the algorithm; None where it cannot be told."""
    from raysim.suite.spec import yaml_safe_load

    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    data = yaml_safe_load(path)
    keys = setting.split(".")
    if keys[0] == "algo" and len(keys) == 2:
        params = data.get("algo_params") or {}
        if keys[1] in params:
            return params[keys[1]]
        try:
            from raysim.config import ExperimentConfig, from_dict
            from raysim.engine.experiment import algorithm_class, algorithm_params

            cfg = from_dict(ExperimentConfig, {k: v for k, v in data.items() if k != "output"})
            return getattr(algorithm_params(cfg, algorithm_class(cfg.algo)), keys[1], None)
        except Exception:  # an algorithm or setting this code no longer knows: the value is not told
            return None
    node: Any = data
    for k in keys:
        if not isinstance(node, Mapping) or k not in node:
            return None
        node = node[k]
    return node


def sweep_plan(summary: Mapping[str, Any], suite_dir: str | Path, spec: Mapping[str, Any]) -> SweepPlan | None:
    """The sweeps of the suite in ``suite_dir`` (the module's docstring), or None where it has none.
    ``summary`` and ``spec``: its ``summary.json`` and suite file, read."""
    from raysim.suite.layout import config_algorithms

    src = Path(suite_dir)
    configs = [str(c["config"]) for c in summary["configs"]]
    settings = {str(c["config"]): [str(s) for s in c.get("settings") or []] for c in summary["configs"]}
    keys = sorted({s.rsplit(".", 1)[-1] for names in settings.values() for s in names})
    if not keys:
        return None
    algos = config_algorithms(src, summary, spec)
    parsed = {c: name_parts(c, keys) for c in configs}
    # a name that is its settings alone (a grid over the base's algorithm): the series is the algorithm
    parsed = {c: (series or algos.get(c) or "run", parts) for c, (series, parts) in parsed.items()}
    values: dict[str, dict[str, tuple[str, float] | None]] = {}  # key -> value text -> numeric
    for _, parts in parsed.values():
        for k, v in parts.items():
            values.setdefault(k, {})[v] = numeric(v)
    everywhere = {k for k in values if all(k in parts for _, parts in parsed.values())}
    axes = [
        k for k, vs in values.items()
        if _one_kind(vs.values()) and (len(vs) >= MIN_VALUES or (len(vs) >= 2 and k not in everywhere))
    ]  # fmt: skip
    while True:  # a name with two axes: the one of fewer values picks the panel
        both = next(([a for a in axes if a in parts] for _, parts in parsed.values() if sum(a in parts for a in axes) > 1), None)
        if not both:
            break
        axes.remove(min(both, key=lambda a: (len(values[a]), axes.index(a))))
    if not axes:
        return None
    kinds = {a: next(v for v in values[a].values() if v is not None)[0] for a in axes}
    first_seed = {str(c["config"]): min(c["seeds"]) for c in summary["configs"] if c["seeds"]}
    panels: list[str] = []
    found: dict[tuple[str, str, str], dict[float, str]] = {}  # (axis, panel, series) -> value -> config
    axis_of: dict[str, str | None] = {}
    for c in configs:
        series, parts = parsed[c]
        panel = ", ".join(f"{k}={v}" for k, v in parts.items() if k not in axes)
        panels.append(panel)
        axis = next((a for a in axes if a in parts), None)
        axis_of[c] = axis
        if axis is not None:
            found.setdefault((axis, panel, series), {})[_x(values[axis][parts[axis]])] = c
    defaults: dict[tuple[str, str, str], str] = {}  # (axis, panel, series) -> its default point
    for c in configs:  # the default points: a series and panel that an axis sweeps, named without it
        if axis_of[c] is not None:
            continue
        series, parts = parsed[c]
        panel = ", ".join(f"{k}={v}" for k, v in parts.items())
        for axis in axes:
            line = found.get((axis, panel, series))
            if line is None:
                continue
            setting = _axis_setting(axis, [settings[x] for x in line.values()])
            got = numeric(_setting_value(src / "runs" / f"{c}-seed{first_seed[c]}", setting)) if setting and c in first_seed else None
            if got is not None and got[0] == kinds[axis] and got[1] not in line:
                line[got[1]] = c
                defaults[axis, panel, series] = c
    order = list(dict.fromkeys(panels))
    lines = [
        SweepLine(axis, panel, series, algos.get(next(iter(points.values()))), tuple(sorted(points.items())), defaults.get((axis, panel, series)))
        for (axis, panel, series), points in found.items()
    ]
    lines.sort(key=lambda ln: (axes.index(ln.axis), order.index(ln.panel)))
    labels = [(a, f"{a} ({kinds[a]}:N)" if kinds[a] else a) for a in axes]
    return SweepPlan(tuple(labels), tuple(p for p in order if any(ln.panel == p for ln in lines)), tuple(lines))


def _one_kind(vs: Any) -> bool:
    got = list(vs)
    return all(v is not None for v in got) and len({v[0] for v in got}) == 1


def _x(v: tuple[str, float] | None) -> float:
    assert v is not None  # an axis's values are numeric (sweep_plan)
    return v[1]


def _axis_setting(axis: str, names: Sequence[Sequence[str]]) -> str | None:
    """The dotted setting whose last part is ``axis``, as the swept configurations set it."""
    for ns in names:
        for s in ns:
            if s.rsplit(".", 1)[-1] == axis:
                return s
    return None


def sweep_figure(plan: SweepPlan, summary: Mapping[str, Any], metric: str, path: Path) -> bool:
    """``path``: :func:`figure` as a PNG. False, and no file, when no point has the metric."""
    fig = figure(plan, summary, metric)
    if fig is None:
        return False
    fig.savefig(path, format="png")
    return True


def figure(plan: SweepPlan, summary: Mapping[str, Any], metric: str) -> Figure | None:
    """A panel per (panel value, axis), each series' final ``metric`` (mean ± std over seeds, in %)
    at each value; None when no point has the metric."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from raysim.results.curves import (
        DPI,
        PANEL_SIZE,
        Line,
        bold_family_titles,
        family_of,
        legend_entries,
        styles,
    )

    means = {str(c["config"]): (c["mean"].get(metric), c["std"].get(metric)) for c in summary["configs"]}
    drawn = [ln for ln in plan.lines if any(means.get(c, (None,))[0] is not None for _, c in ln.points)]
    if not drawn:
        return None
    axes_keys = [a for a, _ in plan.axes if any(ln.axis == a for ln in drawn)]
    panels = [p for p in plan.panels if any(ln.panel == p for ln in drawn)]
    as_lines = [Line(ln.series, ln.panel, ln.series, family_of(ln.algo)) for ln in drawn]
    style = styles(as_lines)
    legend_width = 2.3
    fig = Figure(figsize=(PANEL_SIZE[0] * len(axes_keys) + legend_width, PANEL_SIZE[1] * len(panels) + 0.6), dpi=DPI)
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(panels), len(axes_keys), sharey=True, squeeze=False)
    labels = dict(plan.axes)
    for j, axis in enumerate(axes_keys):
        xs = sorted({x for ln in drawn if ln.axis == axis for x, _ in ln.points})
        for i, panel in enumerate(panels):
            ax = grid[i][j]
            for ln in (x for x in drawn if x.axis == axis and x.panel == panel):
                pts = [(xs.index(x), means[c]) for x, c in ln.points if means.get(c, (None,))[0] is not None]
                if not pts:
                    continue
                colour, dash = style[ln.series]
                ax.errorbar(
                    [p for p, _ in pts], [100 * float(m) for _, (m, _) in pts],
                    yerr=[100 * float(s or 0.0) for _, (_, s) in pts],
                    color=colour, linestyle=dash, linewidth=1.4, marker="o", markersize=3.5, capsize=3,
                )  # fmt: skip
            ax.set_xticks(range(len(xs)), [value_label(x) for x in xs])
            ax.set_xlim(-0.4, len(xs) - 0.6)
            ax.grid(True, alpha=0.4)
            if panel:
                ax.set_title(panel, fontsize="medium")
            if i == len(panels) - 1:
                ax.set_xlabel(labels[axis])
            if j == 0:
                ax.set_ylabel("accuracy (%)")
    handles, names = legend_entries(as_lines, style, marker="o", markersize=3.5)
    legend = fig.legend(
        handles, names, loc="upper left", bbox_to_anchor=(1 - legend_width / fig.get_figwidth(), 0.95),
        fontsize="small", frameon=False, handlelength=2.2,
    )  # fmt: skip
    bold_family_titles(legend, handles)
    fig.suptitle(f"final {metric} against each swept setting: mean ± std over seeds", fontsize="medium")
    fig.tight_layout(rect=(0, 0, 1 - legend_width / fig.get_figwidth(), 1))
    return fig


def sweep_sections(plan: SweepPlan, summary: Mapping[str, Any], out: Path) -> tuple[list[str], list[Path]]:
    """The page's section and the figures written, ``sweep_<metric>.png`` for each metric any
    swept configuration reports."""
    from raysim.results.report import DEFAULT_METRICS

    pngs = [out / f"sweep_{m}.png" for m in DEFAULT_METRICS if sweep_figure(plan, summary, m, out / f"sweep_{m}.png")]
    if not pngs:
        return [], []
    at: dict[tuple[str, float], list[str]] = {}  # (axis, value) -> the series drawn there unswept
    for ln in plan.lines:
        for x, c in ln.points:
            if c == ln.default and ln.series not in at.setdefault((ln.axis, x), []):
                at[ln.axis, x].append(ln.series)
    defaults = [f"{axis} {value_label(x)} ({', '.join(f'`{s}`' for s in names)})" for (axis, x), names in at.items()]
    parts = [
        "## Against the swept settings",
        "",
        "Each series' final value (mean ± std over seeds, in %) at each value of a setting its "
        "configurations sweep (named `SERIES_KEY=VALUE`), a column per setting and a row per value of "
        "the other settings the names carry; the values evenly spaced in their order."
        + (
            " A series' configuration named without the setting is drawn at the value its trials ran "
            "with: " + "; ".join(defaults) + "."
            if defaults
            else ""
        ),
        "",
        *(f"![{p.stem}]({p.name})" for p in pngs),
        "",
    ]
    return parts, pngs


__all__ = ["MIN_VALUES", "SweepLine", "SweepPlan", "figure", "name_parts", "numeric", "sweep_figure", "sweep_plan", "sweep_sections"]
