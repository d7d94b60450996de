"""Compare finished (or stopped) runs: accuracy plots and a markdown table.

Reads what :mod:`raysim.results.output` leaves in a run directory (``config.yaml`` and ``metrics.parquet``;
``summary.json`` is not needed, so a run stopped early can be reported too) and writes, into an output
directory, one PNG per accuracy metric (``accuracy_<metric>.png``, accuracy in % against round, a line
per run), ``train_loss.png`` and ``report.md``: a table with each run's setting and, per metric, the
best value (with its round) and the final one, followed by links to the plots.

"Final" is the value at the last evaluated round, "best" the highest value with the earliest round
reaching it and "last k" the mean over the last k evaluations (the run's ``eval.last_k``), as in
``summary.json``. Bad input (a path that is not a run directory, wrong labels, a
malformed metric name) raises :class:`~raysim.errors.ConfigError` with one sentence.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError
from raysim.results.curves import DPI, Layout, small_multiples
from raysim.results.metrics import metric_value

log = logging.getLogger(__name__)

DEFAULT_METRICS: tuple[str, ...] = ("gm_gtest", "gm_ptest", "lm_ptest", "updated_lm_ptest", "new_gm_ptest", "new_lm_ptest")
MISSING = "–"  # an en dash: a value the run does not have
FIGSIZE = (7.0, 4.5)  # inches
REPORT_NAME = "report.md"
_METRIC_NAME = re.compile(r"[A-Za-z0-9_]+")


@dataclass
class Run:
    """One run directory: its label in plots and tables, its resolved config and its metrics rows."""

    path: Path
    label: str
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per evaluated round, by round

    def series(self, column: str) -> tuple[list[int], list[float]]:
        """The rounds and values where ``column`` has a value (null and NaN left out)."""
        rounds: list[int] = []
        values: list[float] = []
        for row in self.rows:
            v = metric_value(row.get(column))
            if v is None:
                continue
            rounds.append(int(row["round"]))
            values.append(v)
        return rounds, values

    def has(self, column: str) -> bool:
        """Whether ``column`` has a value in any row."""
        return bool(self.series(column)[0])

    @property
    def last_round(self) -> int | None:
        """The last evaluated round, or None for a run with no rows yet."""
        return int(self.rows[-1]["round"]) if self.rows else None

    def best(self, metric: str) -> tuple[float, int] | None:
        """The highest value of ``metric`` and the earliest round reaching it; None without values."""
        rounds, values = self.series(metric)
        if not values:
            return None
        value, neg_round = max(zip(values, (-r for r in rounds), strict=True))
        return value, -neg_round

    @property
    def last_k(self) -> int:
        """How many evaluations the run's last-k mean takes (its ``eval.last_k``; 5 by default)."""
        ev = self.config.get("eval")
        return int(ev.get("last_k", 5)) if isinstance(ev, dict) else 5

    def last(self, metric: str) -> float | None:
        """The mean of ``metric`` over its last :attr:`last_k` evaluations."""
        from raysim.results.metrics import MetricHistory

        return MetricHistory(self.rows).last(self.last_k, (metric,))[metric]

    def final(self, metric: str) -> float | None:
        """The value of ``metric`` at the last evaluated round (None where it is null there)."""
        return metric_value(self.rows[-1].get(metric)) if self.rows else None


def load_run(path: str | os.PathLike[str], label: str | None = None) -> Run:
    """Read ``config.yaml`` and ``metrics.parquet`` from a run directory.

    ``label`` defaults to the directory's name. A missing ``config.yaml`` leaves the config empty (its
    columns show as missing); a missing or unreadable ``metrics.parquet`` raises ConfigError.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p} does not exist.")
    metrics_path = p / "metrics.parquet"
    if not p.is_dir() or not metrics_path.is_file():
        raise ConfigError(f"{p} is not a raysim run directory (it has no metrics.parquet).")
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(metrics_path).to_pylist()
    except Exception as e:  # a truncated or foreign file is the user's input, not a bug here
        raise ConfigError(f"{metrics_path} cannot be read as Parquet ({e}).") from e
    if rows and "round" not in rows[0]:
        raise ConfigError(f"{metrics_path} has no 'round' column; it is not a raysim metrics table.")
    rows.sort(key=lambda r: r["round"])
    config: dict[str, Any] = {}
    config_path = p / "config.yaml"
    if config_path.is_file():
        import yaml

        try:
            loaded = yaml.safe_load(config_path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{config_path} is not valid YAML ({e}).") from e
        if isinstance(loaded, dict):
            config = loaded
    else:
        log.warning("%s has no config.yaml; its setting columns stay empty", p)
    if not (p / "summary.json").is_file():
        log.debug("%s has no summary.json (stopped early?); reporting the rounds it evaluated", p)
    return Run(path=p, label=label if label is not None else p.name, config=config, rows=rows)


def default_labels(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each directory's name; where names clash, as many trailing path parts as tell them apart."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    depth = [1] * len(parts)
    while True:
        labels = ["/".join(ps[-d:]) for ps, d in zip(parts, depth, strict=True)]
        counts = Counter(labels)
        grow = [i for i, lab in enumerate(labels) if counts[lab] > 1 and depth[i] < len(parts[i])]
        if not grow:
            break
        for i in grow:
            depth[i] += 1
    # the same directory given twice: number the repeats
    seen: Counter[str] = Counter()
    out = []
    for lab in labels:
        seen[lab] += 1
        out.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    return out


def load_runs(paths: Sequence[str | os.PathLike[str]], labels: Sequence[str] | None = None) -> list[Run]:
    """:func:`load_run` for each path, with ``labels`` or :func:`default_labels`."""
    if not paths:
        raise ConfigError("Give at least one run directory.")
    if labels is None:
        labels = default_labels(paths)
    elif len(labels) != len(paths):
        dirs = "run directory" if len(paths) == 1 else "run directories"
        raise ConfigError(f"{len(labels)} labels were given for {len(paths)} {dirs}; give one per run.")
    return [load_run(p, lab) for p, lab in zip(paths, labels, strict=True)]


def check_metric_names(metrics: Sequence[str]) -> None:
    """Raise ConfigError unless every name looks like a metrics column (letters, digits, _)."""
    for m in metrics:
        if not _METRIC_NAME.fullmatch(m):
            raise ConfigError(f"{m!r} is not a metric name (letters, digits and _ only).")


def available_metrics(runs: Sequence[Run], metrics: Sequence[str] = DEFAULT_METRICS) -> list[str]:
    """The metrics, in order and without repeats, that at least one run has values for."""
    return [m for m in dict.fromkeys(metrics) if any(r.has(m) for r in runs)]


def _md(text: Any) -> str:
    """A table cell: missing values as a dash, pipes escaped."""
    if text is None or text == "":
        return MISSING
    return str(text).replace("|", "\\|").replace("\n", " ")


def _pct(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.2f}"


def comparison_table(runs: Sequence[Run], metrics: Sequence[str]) -> str:
    """A markdown table, one row per run: label, algo, dataset, partition, clients, rounds run and,
    per metric, ``best (rBEST_ROUND)``, final and last-k mean accuracy in % with 2 decimals ("–"
    where missing).

    "rounds" is the last evaluated round, with "(of N)" where the config asked for N other rounds.
    """
    header = ["run", "algo", "dataset", "partition", "clients", "rounds"]
    for m in metrics:
        header += [f"{m} best (round)", f"{m} final", f"{m} last k"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        cfg = run.config
        data = cfg.get("data")
        if not isinstance(data, dict):
            data = {}
        rounds = MISSING if run.last_round is None else str(run.last_round)
        planned = cfg.get("rounds")
        if planned is not None and run.last_round != planned:
            rounds += f" (of {planned})"
        cells = [
            _md(run.label),
            _md(cfg.get("algo")),
            _md(data.get("dataset")),
            _md(data.get("partition")),
            _md(cfg.get("clients")),
            rounds,
        ]
        for m in metrics:
            best = run.best(m)
            cells.append(MISSING if best is None else f"{_pct(best[0])} (r{best[1]})")
            cells.append(_pct(run.final(m)))
            cells.append(_pct(run.last(m)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(runs: Sequence[Run], column: str, path: Path, title: str, ylabel: str, scale: float) -> None:
    # The object-oriented API on an Agg canvas: no pyplot, so no global backend or figure state is
    # touched (safe on a headless machine and when called from a notebook).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for run in runs:
        rounds, values = run.series(column)
        if rounds:
            ax.plot(rounds, [scale * v for v in values], marker="o", markersize=3, label=run.label)
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.4)
    if ax.lines:
        ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


def plot_metric(runs: Sequence[Run], metric: str, path: str | os.PathLike[str]) -> None:
    """A PNG of ``metric`` (a fraction, drawn in %) against round, a labelled line per run that has it."""
    _plot(runs, metric, Path(path), title=metric, ylabel="accuracy (%)", scale=100.0)


def plot_loss(runs: Sequence[Run], path: str | os.PathLike[str]) -> None:
    """A PNG of the mean training loss against round, a labelled line per run."""
    _plot(runs, "train_loss", Path(path), title="train_loss", ylabel="training loss", scale=1.0)


def write_report(
    runs: Sequence[Run], out_dir: str | os.PathLike[str], metrics: Sequence[str] = DEFAULT_METRICS
) -> list[Path]:
    """Write ``accuracy_<metric>.png`` for each metric some run has, ``train_loss.png`` (if any run has
    a loss) and ``report.md`` into ``out_dir`` (created if missing). Returns the paths written,
    ``report.md`` first."""
    check_metric_names(metrics)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    present = available_metrics(runs, metrics)
    for m in dict.fromkeys(metrics):
        if m not in present:
            log.info("no run has values for %s; no plot or column for it", m)
    pngs: list[Path] = []
    for m in present:
        png = out / f"accuracy_{m}.png"
        plot_metric(runs, m, png)
        pngs.append(png)
    if any(r.has("train_loss") for r in runs):
        png = out / "train_loss.png"
        plot_loss(runs, png)
        pngs.append(png)
    links = " ".join(f"![{p.stem}]({Path(os.path.relpath(p, out)).as_posix()})" for p in pngs)
    # each run's data picture (raysim.results.partition_view), as the run drew it at its start
    pictures = [(r.label, r.path / "partition.png") for r in runs if (r.path / "partition.png").is_file()]
    partitions = "".join(
        f"\n{_md(label)}:\n\n![partition]({Path(os.path.relpath(png, out)).as_posix()})\n" for label, png in pictures
    )
    text = (
        "# raysim run comparison\n\n"
        "Accuracies in %: the best value (with the round it was reached), the value at the last "
        "evaluated round, and the mean over the last k evaluations (the run's eval.last_k).\n\n"
        + comparison_table(runs, present)
        + ("\n" + links + "\n" if links else "")
        + ("\n## Partitions\n\nEach client's training-label counts (a column per client, a row per class).\n" + partitions if pictures else "")
    )
    report = out / REPORT_NAME
    report.write_text(text)
    log.info("wrote %s and %d plots", report, len(pngs))
    return [report, *pngs]


# --------------------------------------------------------------------------------------------------
# suites (raysim.suite)


def summary_metrics(summary: dict[str, Any], metrics: Sequence[str] = DEFAULT_METRICS) -> list[str]:
    """Those of ``metrics`` that some configuration of a suite's summary has a final value of."""
    return [m for m in metrics if any(c["mean"].get(m) is not None for c in summary["configs"])]


def suite_table(summary: dict[str, Any], metrics: Sequence[str] = DEFAULT_METRICS) -> str:
    """A markdown table, one row per configuration: its seeds, the rounds its trials ran and, per
    metric, the mean ± std over seeds of the final value and of the last-k mean, and the mean best;
    the paper's figure beside."""
    present = summary_metrics(summary, metrics)
    header = ["configuration", "seeds", "rounds"]
    for m in present:
        header += [f"{m} final", f"{m} last k", f"{m} best"]
    by_name = {c["config"]: c for c in summary["configs"]}
    paired = any(c.get("equal_compute") for c in summary["configs"])
    if paired:
        header += ["at equal compute", "its gm_gtest final", "its gm_gtest last k"]
    clocked = any(c.get("sim_time_mean") for c in summary["configs"])
    targets = {c["target"]["metric"] + " ≥ " + _pct(c["target"]["accuracy"]) for c in summary["configs"] if c.get("target")}
    if clocked:  # a simulated deployment (raysim.deployment)
        header.append("sim. time (s)")
    private = any(c.get("epsilon_mean") is not None for c in summary["configs"])
    if private:  # differential privacy (raysim.privacy)
        header.append("epsilon spent")
    if targets:
        header += [f"reached {', '.join(sorted(targets))}", "sim. time to it (s)"]
    header.append("paper")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in summary["configs"]:
        cells = [_md(c["config"]), str(len(c["seeds"])), ", ".join(map(str, c.get("rounds", [])))]
        for m in present:
            cells += [
                _pm(c["mean"].get(m), c["std"].get(m)),
                _pm(c["last_mean"].get(m), c["last_std"].get(m)),
                _pct(c["best_mean"].get(m)),
            ]
        if paired:  # the baseline trained as many client-epochs (one per distinct compute)
            pairs = [by_name[p] for p in c.get("equal_compute", []) if p in by_name]
            cells += [
                _md(", ".join(p["config"] for p in pairs)),
                _md(", ".join(_pm(p["mean"].get("gm_gtest"), p["std"].get("gm_gtest")) for p in pairs)),
                _md(", ".join(_pm(p["last_mean"].get("gm_gtest"), p["last_std"].get("gm_gtest")) for p in pairs)),
            ]
        if clocked:
            cells.append(_seconds(c.get("sim_time_mean")))
        if private:
            eps = c.get("epsilon_mean")
            cells.append(MISSING if eps is None else f"{eps:.3f}")
        if targets:
            cells += [c.get("target_reached", MISSING), _seconds(c.get("time_to_target_mean"))]
        cells.append(_md(c.get("paper")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def per_seed_table(rows: Sequence[dict[str, Any]], summary: dict[str, Any], last_k: int = 5) -> str:
    """A markdown table, one row per trial (configuration and seed, in the summary's order): per
    metric of the suite table, the trial's final value and its last-k mean, in %. ``rows`` are the
    suite's ``metrics.parquet`` rows (each with its ``config`` and ``seed``). A claim "holds on
    every seed" is read here."""
    from raysim.results.metrics import MetricHistory

    present = summary_metrics(summary)
    by_trial: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_trial.setdefault((str(r["config"]), int(r["seed"])), []).append(r)
    header = ["configuration", "seed"] + [f"{m} {k}" for m in present for k in ("final", "last k")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in summary["configs"]:
        for seed in c["seeds"]:
            trial = sorted(by_trial.get((c["config"], int(seed)), []), key=lambda r: r["round"])
            history = MetricHistory(trial)
            final, last = history.final(), history.last(last_k, present)
            cells = [_md(c["config"]), str(seed)]
            for m in present:
                cells += [_pct(metric_value(final.get(m))), _pct(last.get(m))]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def class_accuracy_table(rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> str:
    """A markdown table, one row per configuration (in the summary's order) and a column per class
    (0 to C - 1): the global model's accuracy on the class's G-Test samples (``gm_class_acc``, with
    ``eval.analyses``) at each trial's last evaluation that has it, the mean over the seeds, in %
    with one decimal ("–" where no seed has a value). ``rows`` are the suite's ``metrics.parquet``
    rows; "" when none has ``gm_class_acc``."""
    last: dict[tuple[str, int], tuple[int, list[Any]]] = {}  # a trial -> its last round with the list
    for r in rows:
        accs = r.get("gm_class_acc")
        key = (str(r["config"]), int(r["seed"]))
        if accs is not None and (key not in last or int(r["round"]) >= last[key][0]):
            last[key] = (int(r["round"]), list(accs))
    if not last:
        return ""
    num_classes = max(len(accs) for _, accs in last.values())
    header = ["configuration", *map(str, range(num_classes))]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in summary["configs"]:
        cells = [_md(c["config"])]
        for k in range(num_classes):
            values = [
                v
                for seed in c["seeds"]
                if (trial := last.get((c["config"], int(seed)))) is not None and k < len(trial[1])
                if (v := metric_value(trial[1][k])) is not None
            ]
            cells.append(MISSING if not values else f"{100 * sum(values) / len(values):.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def _pm(mean: float | None, std: float | None) -> str:
    if mean is None:
        return MISSING
    return f"{100 * mean:.2f} ± {100 * (std or 0.0):.2f}"


def curve_plots(rows: Sequence[dict[str, Any]], out: Path, plan: Layout) -> list[Path]:
    """``accuracy_<metric>.png`` against round (or ``plan.x``) for each metric present, and where the
    runs kept a simulated clock (``sim_time_s``) ``accuracy_<metric>_sim_time.png`` against it too:
    small multiples, ``plan``'s panels and families (:mod:`raysim.results.curves`)."""
    pngs = [
        out / f"accuracy_{m}.png" for m in DEFAULT_METRICS if small_multiples(rows, m, out / f"accuracy_{m}.png", plan, against=plan.x)
    ]
    if any(r.get("sim_time_s") for r in rows):
        pngs += [
            out / f"accuracy_{m}_sim_time.png"
            for m in DEFAULT_METRICS
            if small_multiples(rows, m, out / f"accuracy_{m}_sim_time.png", plan, against="sim_time_s")
        ]
    return pngs


def write_suite_report(
    suite_dir: str | os.PathLike[str], plan: Layout, out_dir: str | os.PathLike[str] | None = None
) -> list[Path]:
    """``report.md`` (the suite's table) and ``accuracy_<metric>.png`` (curves banded over seeds,
    laid out by ``plan``: raysim.suite.layout.suite_layout) from a suite directory's
    ``summary.json`` and ``metrics.parquet``, into ``out_dir`` (default the suite directory).
    Returns the paths written, ``report.md`` first."""
    import json

    import pyarrow.parquet as pq

    src = Path(suite_dir)
    summary_path, metrics_path = src / "summary.json", src / "metrics.parquet"
    if not summary_path.is_file() or not metrics_path.is_file():
        raise ConfigError(f"{src} is not a finished suite directory (it has no summary.json and metrics.parquet).")
    summary = json.loads(summary_path.read_text())
    rows = pq.read_table(metrics_path).to_pylist()
    out = Path(out_dir) if out_dir is not None else src
    out.mkdir(parents=True, exist_ok=True)
    pngs = curve_plots(rows, out, plan)
    links = " ".join(f"![{p.stem}]({p.name})" for p in pngs)
    text = (
        f"# Suite {summary['suite']}\n\n"
        "Accuracies in %, mean ± std over seeds: the value at the last round (final), the mean over "
        "the last k evaluations (last k), and the mean of each seed's best.\n\n"
        + suite_table(summary)
        + ("\n" + links + "\n" if links else "")
    )
    report = out / REPORT_NAME
    report.write_text(text)
    return [report, *pngs]


__all__ = [
    "DEFAULT_METRICS",
    "MISSING",
    "Run",
    "available_metrics",
    "curve_plots",
    "check_metric_names",
    "class_accuracy_table",
    "comparison_table",
    "default_labels",
    "load_run",
    "load_runs",
    "metric_value",
    "per_seed_table",
    "plot_loss",
    "plot_metric",
    "suite_table",
    "summary_metrics",
    "write_report",
    "write_suite_report",
]
