"""A suite's curves as small multiples: one panel per regime (or per deployment, per privacy budget),
every algorithm family in its own colour, so that a page of a dozen or fifty configurations still
reads at a glance.

Which panel a configuration is drawn in, and under which label:

- where the suite file declares ``regimes`` (:mod:`raysim.suite.regimes`), a panel per regime, in
  the declared order, and the row's name (``fedper`` for ``fedper_dir01``) as the label;
- else where it declares ``against`` (:mod:`raysim.suite.against`), a panel per value of the axis
  (``epsilon = 3``), the series as the label;
- else from the names, where they split into two panels or more of two lines or more each: a
  grid's configurations (``fedbabu_last_partition=shard_2``, raysim.suite.spec.expand_grid) a
  panel per grid value (``partition=shard_2``), the rest of the name the label; else a
  configuration named ``ALGO_REST`` whose algorithm is ``ALGO`` (``fedbuff_stragglers``) is
  ``ALGO`` in panel ``REST``, where each panel holds two algorithms or more (the deployments page:
  a panel per deployment);
- otherwise every configuration is one line of one panel, its name the label.

A configuration that none of the rules places goes to a last panel, "other configurations".

Colours: each registered algorithm declares its family (``Algorithm.family``, one of
:data:`FAMILIES`); a family has one hue (matplotlib's tab10 colours), its lines shades of it and
different dash patterns, so that the families separate at a glance and the lines of one family
stay told apart; the legend, shared by the panels, lists the lines family by family. Every panel
has the same axes, the line of a label the same colour and dash in each.

A crowded page (a panel of more than :data:`MAX_LINES` lines from three families or more, at most
:data:`MAX_COLUMNS` panels: the table of every algorithm) is drawn as a grid instead: a column per
panel and a row per family, each cell that family's lines over the panel's other lines in light
grey (where the family stands among all), each row's legend beside it.
"""

from __future__ import annotations

import colorsys
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.results.metrics import metric_value

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: an algorithm's family (``Algorithm.family``) -> its title in the legend and its hue
FAMILIES: dict[str, tuple[str, str]] = {
    "global": ("one global model", "tab:blue"),
    "fixed_head": ("fixed classifier", "tab:purple"),
    "split": ("shared and personal parts", "tab:green"),
    "prototypes": ("shared prototypes", "tab:orange"),
    "personal": ("personal models", "tab:red"),
    "clustered": ("clustered", "tab:cyan"),
    "local": ("local only", "black"),
    "other": ("other", "tab:gray"),
}
#: the dash patterns that tell the lines of one family apart, in turn
DASHES = ("-", "--", "-.", ":")
#: the panel of the configurations that no rule places
OTHER_PANEL = "other configurations"
DPI = 120  # the pages' figures: a 7 x 4.5 inch plot is 840 x 540 pixels
PANEL_SIZE = (4.2, 3.1)  # inches, one panel
MAX_COLUMNS = 3
#: a panel of more lines than this, from three families or more, splits into a row per family
MAX_LINES = 12
CONTEXT_GREY = "0.82"  # the other families' lines in a family's cell
SINGLE_PANEL_SIZE = (6.0, 4.2)  # inches, a page's only panel
#: the legend's entry height and column width (inches): beside the panels in one column or two
#: where it fits, else beneath them
LEGEND_ENTRY_HEIGHT = 0.21
LEGEND_COLUMN_WIDTH = 2.3


@dataclass(frozen=True)
class Line:
    """One configuration's line: the panel it is drawn in, its label and its family."""

    config: str
    panel: str
    label: str
    family: str


#: the x axes a page's curves may be drawn against: the rows' column -> the axis's label
X_AXES = {
    "round": "round",
    "client_epochs": "client epochs (local epochs summed over the clients)",
    "sim_time_s": "simulated time (s)",
}


@dataclass(frozen=True)
class Layout:
    """The lines in the suite's order and the panels' titles in theirs ("" for a single panel);
    ``x``: the column of :data:`X_AXES` the accuracy curves are drawn against."""

    lines: tuple[Line, ...]
    panels: tuple[str, ...]
    x: str = "round"


def family_of(algo: str | None) -> str:
    """The family an algorithm declares, "other" for one that is not registered or declares none."""
    from raysim.registry import ALGORITHMS

    if algo is None or algo not in ALGORITHMS:
        return "other"
    family = str(getattr(ALGORITHMS.get(algo), "family", "other"))
    return family if family in FAMILIES else "other"


def split_suffix(config: str, suffixes: Sequence[str]) -> tuple[str, str] | None:
    """(prefix, suffix) of a configuration named PREFIX_SUFFIX for one of ``suffixes`` (the longest
    that matches wins), or None."""
    for suffix in sorted(suffixes, key=lambda s: -len(s)):
        if config.endswith("_" + suffix) and len(config) > len(suffix) + 1:
            return config[: -len(suffix) - 1], suffix
    return None


def layout(
    configs: Sequence[tuple[str, str | None]],
    panels_by_suffix: Sequence[tuple[str, str]] = (),
) -> Layout:
    """The lines of ``configs`` ((name, algorithm) in the suite's order). ``panels_by_suffix``:
    (name suffix, panel title) pairs, in panel order, from the suite file's ``regimes`` or
    ``against``; empty: panels from the names (the module's docstring)."""
    families = {name: family_of(algo) for name, algo in configs}
    placed: dict[str, tuple[str, str]] = {}  # config -> (panel, label)
    order: list[str] = []
    if panels_by_suffix:
        titles = dict(panels_by_suffix)
        for name, _ in configs:
            split = split_suffix(name, list(titles))
            if split is not None:
                placed[name] = (titles[split[1]], split[0])
        order = [title for _, title in panels_by_suffix if title in {p for p, _ in placed.values()}]
    else:
        placed = _by_grid(configs) or _by_algorithm(configs) or {name: ("", name) for name, _ in configs}
        order = list(dict.fromkeys(placed[name][0] for name, _ in configs))
    lines = []
    for name, _ in configs:
        panel, label = placed.get(name, (OTHER_PANEL, name))
        lines.append(Line(name, panel, label, families[name]))
    if any(line.panel == OTHER_PANEL for line in lines):
        order.append(OTHER_PANEL)
    return Layout(tuple(lines), tuple(order))


#: where a grid's part of a configuration's name begins (raysim.suite.spec.expand_grid): NAME_KEY=VALUE
_GRID_PART = re.compile(r"_(?=[A-Za-z][A-Za-z0-9]*=)")


def _grouped(placed: dict[str, tuple[str, str]], at_least: int) -> bool:
    """Whether ``placed`` (config -> (panel, label)) makes two panels or more, each of
    ``at_least`` labels or more."""
    labels: dict[str, set[str]] = {}
    for panel, label in placed.values():
        labels.setdefault(panel, set()).add(label)
    return len(labels) >= 2 and all(len(x) >= at_least for x in labels.values())


def _by_grid(configs: Sequence[tuple[str, str | None]]) -> dict[str, tuple[str, str]] | None:
    """A panel per value of a grid key that every name carries (``fedbabu_last_partition=shard_2``:
    ``fedbabu_last`` in panel ``partition=shard_2``), the key of fewest values first, where each
    panel holds two lines or more."""
    parts = {name: _GRID_PART.split(name) for name, _ in configs}
    keyed = {name: {p.split("=", 1)[0]: p for p in split[1:]} for name, split in parts.items()}
    common = set.intersection(*(set(k) for k in keyed.values())) if keyed else set()
    for key in sorted(common, key=lambda k: len({keyed[n][k] for n in keyed})):
        placed = {name: (keyed[name][key], "_".join(p for p in parts[name] if p != keyed[name][key])) for name in parts}
        if _grouped(placed, 2):
            return placed
    return None


def _by_algorithm(configs: Sequence[tuple[str, str | None]]) -> dict[str, tuple[str, str]] | None:
    """A panel per what follows the algorithm's name (``fedbuff_stragglers``: ``fedbuff`` in
    panel ``stragglers``; a name that is the algorithm's alone, in panel "as named"), where every
    name begins with its algorithm's and each panel holds two algorithms or more."""
    placed = {}
    for name, algo in configs:
        if algo and name.startswith(algo + "_") and len(name) > len(algo) + 1:
            placed[name] = (name[len(algo) + 1 :], algo)
        elif algo and name == algo:
            placed[name] = ("as named", algo)
        else:
            return None
    return placed if _grouped(placed, 2) else None


def styles(lines: Sequence[Line]) -> dict[str, tuple[tuple[float, float, float], str]]:
    """Each label's colour and dash pattern: its family's hue, the family's labels spread from
    darker to lighter shades and through :data:`DASHES`."""
    from matplotlib.colors import to_rgb

    labels: dict[str, list[str]] = {}
    for line in lines:
        family_labels = labels.setdefault(line.family, [])
        if line.label not in family_labels:
            family_labels.append(line.label)
    out = {}
    for family, names in labels.items():
        h, lightness, s = colorsys.rgb_to_hls(*to_rgb(FAMILIES[family][1]))
        for i, label in enumerate(names):
            # lightness from 0.25 to 0.6 across the family (one label: the hue itself)
            shade = lightness if len(names) == 1 else 0.25 + 0.35 * i / (len(names) - 1)
            out[label] = (colorsys.hls_to_rgb(h, shade, s), DASHES[i % len(DASHES)])
    return out


def legend_entries(
    lines: Sequence[Line], style: Mapping[str, tuple[tuple[float, float, float], str]], **line_kw: Any
) -> tuple[list[Any], list[str]]:
    """A legend's handles and labels for ``lines``: family by family (:data:`FAMILIES`' order), each
    family's title (a handle without a line) and then its labels in their order, each in its
    ``style``; ``line_kw``: more of the handles' line properties (a marker)."""
    from matplotlib.lines import Line2D

    handles: list[Any] = []
    labels: list[str] = []
    for family, (title, _) in FAMILIES.items():
        family_labels = list(dict.fromkeys(line.label for line in lines if line.family == family))
        if not family_labels:
            continue
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(title)
        for label in family_labels:
            colour, dash = style[label]
            handles.append(Line2D([], [], color=colour, linestyle=dash, linewidth=1.6, **line_kw))  # type: ignore[arg-type]
            labels.append("  " + label)
    return handles, labels


def bold_family_titles(legend: Any, handles: Sequence[Any]) -> None:
    """The family titles of a legend of :func:`legend_entries` in bold."""
    for text, handle in zip(legend.get_texts(), handles, strict=True):
        if handle.get_linestyle() == "None":
            text.set_fontweight("bold")


def bands(
    rows: Sequence[Mapping[str, Any]], metric: str, against: str = "round"
) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Each configuration's (x, mean, std) over its seeds of ``metric`` in %, by round: x the round,
    or another column of :data:`X_AXES` (``sim_time_s``, ``client_epochs``): its mean over the
    seeds at the round."""
    by_config: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for r in rows:
        v = metric_value(r.get(metric))
        if v is None:
            continue
        x = float(r["round"] if against == "round" else r.get(against) or 0.0)
        by_config.setdefault(str(r["config"]), {}).setdefault(int(r["round"]), []).append((x, v))
    out = {}
    for config, by_round in by_config.items():
        points = []  # (mean x, round, mean, std) per round
        for rnd, pairs in by_round.items():
            mean = sum(v for _, v in pairs) / len(pairs)
            std = math.sqrt(sum((v - mean) ** 2 for _, v in pairs) / len(pairs))
            points.append((sum(x for x, _ in pairs) / len(pairs), rnd, mean, std))
        # in time order (on the simulated clock a seed's round can end later than the next round's
        # mean over the seeds that reached it)
        points.sort()
        out[config] = ([p[0] for p in points], [100 * p[2] for p in points], [100 * p[3] for p in points])
    return out


def small_multiples(
    rows: Sequence[Mapping[str, Any]], metric: str, path: Path, plan: Layout, *, against: str = "round"
) -> bool:
    """``path``: :func:`figure` as a PNG. False, and no file, when no configuration has the metric."""
    fig = figure(rows, metric, plan, against=against)
    if fig is None:
        return False
    fig.savefig(path, format="png")
    return True


def _band(
    ax: Any, curve: tuple[list[float], list[float], list[float]], colour: Any, dash: str, zorder: float | None = None
) -> None:
    """One configuration's curve (:func:`bands`' x, mean, std) in ``ax``: the mean as a line with
    markers and a one-std band in its colour; ``zorder``: the band's layer, the line one above
    (matplotlib's defaults where None)."""
    xs, means, stds = curve
    above = {} if zorder is None else {"zorder": zorder + 1}
    ax.plot(xs, means, color=colour, linestyle=dash, linewidth=1.4, marker="o", markersize=2.5, **above)
    ax.fill_between(
        xs, [m - s for m, s in zip(means, stds, strict=True)], [m + s for m, s in zip(means, stds, strict=True)],
        color=colour, alpha=0.12, linewidth=0, **({} if zorder is None else {"zorder": zorder}),
    )  # fmt: skip


def _panel_axes(ax: Any, against: str) -> None:
    """A panel's grid and x axis: from 0, whole rounds where it is drawn against round."""
    from matplotlib.ticker import MaxNLocator

    ax.grid(True, alpha=0.4)
    ax.set_xlim(left=0)
    if against == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def figure(rows: Sequence[Mapping[str, Any]], metric: str, plan: Layout, *, against: str = "round") -> Figure | None:
    """A panel per ``plan``'s panel that has a line, each configuration's ``metric`` against round
    (or the simulated clock) as the mean over seeds with a one-std band; None when no
    configuration has the metric."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = bands(rows, metric, against)
    drawn = [line for line in plan.lines if line.config in data]
    if not drawn:
        return None
    panels = [p for p in plan.panels if any(line.panel == p for line in drawn)]
    families = [f for f in FAMILIES if any(line.family == f for line in drawn)]
    crowded = max(sum(line.panel == p for line in drawn) for p in panels) > MAX_LINES
    if crowded and len(families) >= 3 and len(panels) <= MAX_COLUMNS:
        return _family_grid(data, drawn, panels, families, metric, against)
    columns = min(len(panels), MAX_COLUMNS)
    grid_rows = math.ceil(len(panels) / columns)
    style = styles(drawn)
    panel_size = PANEL_SIZE if len(panels) > 1 else SINGLE_PANEL_SIZE
    height = panel_size[1] * grid_rows + 0.6
    entries = len({line.label for line in drawn}) + len({line.family for line in drawn})
    legend_columns = math.ceil(entries / max(1, int((height - 0.4) / LEGEND_ENTRY_HEIGHT)))
    beside = legend_columns <= 2
    legend_width = LEGEND_COLUMN_WIDTH * legend_columns if beside else 0.0
    fig = Figure(figsize=(panel_size[0] * columns + legend_width, height), dpi=DPI)  # a legend beneath adds its height
    FigureCanvasAgg(fig)
    axes = fig.subplots(grid_rows, columns, sharex=True, sharey=True, squeeze=False)
    for k, panel in enumerate(panels):
        ax = axes[k // columns][k % columns]
        for line in (x for x in drawn if x.panel == panel):
            _band(ax, data[line.config], *style[line.label])
        if panel:
            ax.set_title(panel, fontsize="medium")
        _panel_axes(ax, against)
    for k in range(len(panels), grid_rows * columns):  # the grid's empty cells
        axes[k // columns][k % columns].set_visible(False)
    for k in range(max(0, len(panels) - columns), len(panels)):  # the lowest panel of each column
        ax = axes[k // columns][k % columns]
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel(X_AXES[against])
    for row in axes:
        row[0].set_ylabel("accuracy (%)")
    handles, labels = legend_entries(drawn, style)
    if beside:
        legend = fig.legend(
            handles, labels, loc="upper left", bbox_to_anchor=(1 - legend_width / fig.get_figwidth(), 0.98),
            ncol=legend_columns, fontsize="small", frameon=False, handlelength=2.2,
        )  # fmt: skip
        area: tuple[float, float, float, float] = (0, 0, 1 - legend_width / fig.get_figwidth(), 1)
    else:  # a long legend goes beneath the panels, in as many columns as the figure's width holds
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        ncol = 2 * columns + 1
        while True:
            legend = fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize="x-small", frameon=False, handlelength=2.2)
            extent = legend.get_window_extent(renderer)
            if ncol == 1 or extent.width <= 0.98 * fig.bbox.width:
                break
            legend.remove()
            ncol -= 1
        below = extent.height / fig.dpi + 0.3
        fig.set_size_inches(fig.get_figwidth(), height + below)
        area = (0, below / fig.get_figheight(), 1, 1)
    bold_family_titles(legend, handles)
    over = X_AXES[against].split(" (")[0]
    fig.suptitle(f"{metric} against {over}: mean over seeds, band one std", fontsize="medium")
    fig.tight_layout(rect=area)
    return fig


def _family_grid(
    data: Mapping[str, tuple[list[float], list[float], list[float]]],
    drawn: Sequence[Line],
    panels: Sequence[str],
    families: Sequence[str],
    metric: str,
    against: str,
) -> Figure:
    """The crowded page's figure (the module's docstring): a column per panel, a row per family."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    style = styles(drawn)
    per_row = max(1, int((PANEL_SIZE[1] - 0.2) / LEGEND_ENTRY_HEIGHT))
    labels = {f: list(dict.fromkeys(line.label for line in drawn if line.family == f)) for f in families}
    legend_columns = max(math.ceil(len(names) / per_row) for names in labels.values())
    legend_width = LEGEND_COLUMN_WIDTH * legend_columns
    height = PANEL_SIZE[1] * len(families) + 0.6
    fig = Figure(figsize=(PANEL_SIZE[0] * len(panels) + legend_width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(families), len(panels), sharex=True, sharey=True, squeeze=False)
    for i, family in enumerate(families):
        for j, panel in enumerate(panels):
            ax = axes[i][j]
            for line in (x for x in drawn if x.panel == panel and x.family != family):
                xs, means, _ = data[line.config]
                ax.plot(xs, means, color=CONTEXT_GREY, linewidth=0.8, zorder=1)
            for line in (x for x in drawn if x.panel == panel and x.family == family):
                _band(ax, data[line.config], *style[line.label], zorder=2)  # over the grey lines
            if i == 0 and panel:
                ax.set_title(panel, fontsize="medium")
            _panel_axes(ax, against)
        axes[i][0].set_ylabel(f"{FAMILIES[family][0]}\naccuracy (%)", fontsize="small")
    for ax in axes[-1]:
        ax.set_xlabel(X_AXES[against])
    over = X_AXES[against].split(" (")[0]
    fig.suptitle(f"{metric} against {over}: mean over seeds, band one std; a row per family, the other families' lines in grey", fontsize="medium")
    fig.tight_layout(rect=(0, 0, 1 - legend_width / fig.get_figwidth(), 1 - 0.35 / height))  # the title's line above
    for i, family in enumerate(families):  # each row's legend beside its last panel, without the family's title
        top = axes[i][-1].get_position()
        handles, _ = legend_entries([x for x in drawn if x.family == family], style)
        fig.legend(
            handles[1:], labels[family], loc="upper left", bbox_to_anchor=(top.x1 + 0.01, top.y1),
            ncol=math.ceil(len(labels[family]) / per_row), fontsize="small", frameon=False, handlelength=2.2,
        )  # fmt: skip
    return fig


__all__ = ["DASHES", "FAMILIES", "MAX_LINES", "X_AXES", "Layout", "Line", "OTHER_PANEL", "bands", "bold_family_titles", "legend_entries", "family_of", "figure", "layout", "small_multiples", "split_suffix", "styles"]
