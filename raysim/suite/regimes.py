"""A suite's configurations read as rows of a table per regime, sorted: the page of every algorithm
under a few data regimes (``suites/pfl_benchmark.yaml``), with the global and the local models'
accuracies side by side.

A suite file's ``regimes`` names the regimes by the suffix of the configurations' names, the metric
each table is sorted by (descending), and the metrics it shows::

    regimes:
      suffixes: {dir01: "Dir(0.1)", pat2: "pathological:2", rot4: "rotate:4"}
      sort: [lm_ptest, gm_ptest]
      metrics: [gm_gtest, gm_ptest, lm_ptest, new_gm_ptest, new_lm_ptest]
      x: client_epochs

``x`` is what the page's curves are drawn against: ``round`` (the default), or ``client_epochs``
(the local epochs the clients have spent, summed), the one axis on which a row whose round is a
server step of one client's update (FedAsync) and a row whose round trains every client stand at
equal compute. A metric may also be an accuracy's mean over the worst 10% of the clients
(``lm_ptest_p10``), read from each trial's last evaluation in ``metrics.parquet``. A configuration
named ``ROW_SUFFIX`` (``fedper_dir01``) is row ``ROW`` of regime ``SUFFIX``. ``sort`` is a metric or
a list of them: each row is sorted by the first of them it has, so that ``[lm_ptest, gm_ptest]``
ranks an algorithm without local models by its global model on the clients' test data, the model
its clients use (as PFLlib's leaderboard ranks FedAvg among the personalised methods). A row with
none of them follows the others, sorted by its first metric present. Each table's last column is
the client epochs each row spent. Each table's rows whose every accuracy shown is within 5 points
of chance (1 / the dataset's classes) are named beneath it: the runs that diverged or learned
nothing, which a reader of a leaderboard must not take for a ranking. So are the trials whose
training loss is not finite at their last evaluation, by seed: a row whose one seed diverged can
sit far from chance in the mean over seeds, and its rank then says nothing either. And the rows
whose metric equals another row's to the bit at every evaluation of every seed are named together
(APFL's global model is FedAvg's, trained alike): one model computed twice, not two results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raysim.errors import ConfigError
from raysim.results.curves import split_suffix
from raysim.suite.against import check_entry, check_suffix

KEYS = ("suffixes", "sort", "metrics", "x")
#: the axes the curves may be drawn against (raysim.results.curves.X_AXES)
X_CHOICES = ("round", "client_epochs")
#: the suffix of an accuracy's mean over the worst 10% of the clients (raysim.results.metrics)
WORST = "_p10"
#: a row is near chance when every accuracy it shows is below chance plus this
NEAR_CHANCE = 0.05


@dataclass(frozen=True)
class Regimes:
    """``suffixes``: each regime's name suffix and its title, in order; ``sort``: the metrics the rows
    are sorted by, the first a row has; ``metrics``: the columns; ``x``: the curves' axis."""

    suffixes: tuple[tuple[str, str], ...]
    sort: tuple[str, ...]
    metrics: tuple[str, ...]
    x: str = "round"

    def place(self, config: str) -> tuple[str, str] | None:
        """(row, regime suffix) of a configuration's name, or None (the longest suffix wins)."""
        return split_suffix(config, [s for s, _ in self.suffixes])


def parse_regimes(data: Any, configs: Sequence[str], where: str) -> Regimes:
    """The suite file's ``regimes`` entry, each mistake refused in one sentence."""
    from raysim.results.report import DEFAULT_METRICS

    check_entry(data, "regimes", KEYS, where)
    suffixes = data.get("suffixes")
    if not isinstance(suffixes, Mapping) or not suffixes:
        raise ConfigError(f"regimes.suffixes in {where} maps name suffixes to titles (such as {{dir01: Dir(0.1)}}).")
    for suffix, title in suffixes.items():
        check_suffix(suffix, "regimes", where)
        if not isinstance(title, str) or not title:
            raise ConfigError(f"regimes.suffixes in {where}: {suffix}'s title is a text, not {title!r}.")
    metrics = data.get("metrics", ["gm_gtest", "gm_ptest", "lm_ptest"])
    if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
        raise ConfigError(f"regimes.metrics in {where} is a list of metrics (such as [gm_gtest, lm_ptest]), not {metrics!r}.")
    sort = data.get("sort", metrics[0])
    if isinstance(sort, str):
        sort = [sort]
    if not isinstance(sort, Sequence) or not sort:
        raise ConfigError(f"regimes.sort in {where} is a metric or a list of metrics (such as [lm_ptest, gm_ptest]), not {sort!r}.")
    for m in [*metrics, *sort]:
        if m not in DEFAULT_METRICS and not (isinstance(m, str) and m.removesuffix(WORST) in DEFAULT_METRICS):
            raise ConfigError(
                f"regimes in {where}: {m!r} is not one of {', '.join(DEFAULT_METRICS)}, nor one of them "
                f"with {WORST} (its mean over the worst 10% of the clients)."
            )
    x = data.get("x", "round")
    if x not in X_CHOICES:
        raise ConfigError(f"regimes.x in {where} is one of {', '.join(X_CHOICES)} (what the curves are drawn against), not {x!r}.")
    out = Regimes(tuple((str(k), str(v)) for k, v in suffixes.items()), tuple(sort), tuple(metrics), str(x))
    if not any(out.place(c) for c in configs):
        raise ConfigError(
            f"regimes.suffixes in {where} place no configuration: name them ROW_SUFFIX (such as fedavg_{next(iter(suffixes))})."
        )
    return out


def _with_worst(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """The summary's configurations, their ``mean`` and ``std`` gaining each ``*_p10`` metric of
    ``metrics``: its value at each trial's last evaluation, mean and population std over the seeds."""
    import numpy as np

    from raysim.suite.claims import trial_values

    worst = [m for m in metrics if m.endswith(WORST)]
    values = trial_values([dict(r) for r in rows], 1) if worst else {}
    out = []
    for c in summary["configs"]:
        mean, std = dict(c["mean"]), dict(c["std"])
        for m in worst:
            seeds = [values[key]["final"][m] / 100 for key in ((str(c["config"]), int(s)) for s in c["seeds"]) if m in values.get(key, {}).get("final", {})]
            mean[m], std[m] = (float(np.mean(seeds)), float(np.std(seeds))) if seeds else (None, None)
        out.append({**c, "mean": mean, "std": std})
    return out


def _last_rows(rows: Sequence[Mapping[str, Any]], column: str | None = None) -> dict[tuple[str, int], Mapping[str, Any]]:
    """Each trial's (configuration, seed) last evaluated row, by round; with ``column``, the last of
    the rows where it is not None."""
    last: dict[tuple[str, int], Mapping[str, Any]] = {}
    for r in rows:
        key = (str(r["config"]), int(r["seed"]))
        if (column is None or r.get(column) is not None) and (key not in last or r["round"] > last[key]["round"]):
            last[key] = r
    return last


def _client_epochs(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each configuration's compute: the clients' local epochs summed over its trial
    (``client_epochs`` at its last evaluated round), mean over its seeds; {} without the column."""
    by_config: dict[str, list[float]] = {}
    for (config, _), r in _last_rows(rows, "client_epochs").items():
        by_config.setdefault(config, []).append(float(r["client_epochs"]))
    return {c: sum(v) / len(v) for c, v in by_config.items()}


def _diverged(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[int], int]]:
    """Each configuration's seeds whose training loss is not finite (NaN or infinite) at the
    trial's last evaluated round, and its number of seeds: {} where none diverged. A trial with no
    training loss at that round (None) is not counted either way."""
    import math

    seeds: dict[str, list[int]] = {}
    out: dict[str, list[int]] = {}
    for (config, seed), r in sorted(_last_rows(rows).items()):
        seeds.setdefault(config, []).append(seed)
        loss = r.get("train_loss")
        if loss is not None and not math.isfinite(float(loss)):
            out.setdefault(config, []).append(seed)
    return {c: (s, len(seeds[c])) for c, s in out.items()}


def _equal(rows: Sequence[Mapping[str, Any]], names: Mapping[str, str], metrics: Sequence[str]) -> list[str]:
    """The rows (configurations ``names`` maps to their row names) whose ``metrics`` equal another
    row's to the bit at every evaluated round of every seed, each a group: ``"gm_gtest, gm_ptest:
    apfl = fedavg"``, the metrics that group the same rows together. A metric counts where a
    trial has it at some evaluation; the rows compared must have the same seeds and rounds."""
    series: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    for r in rows:
        config = str(r["config"])
        if config not in names:
            continue
        for m in metrics:
            if r.get(m) is not None:
                series.setdefault((config, m), {})[(int(r["seed"]), int(r["round"]))] = float(r[m])
    groups: dict[tuple[str, ...], list[str]] = {}
    for m in metrics:
        by_values: dict[tuple[tuple[tuple[int, int], float], ...], list[str]] = {}
        for (config, metric), values in series.items():
            if metric == m:
                by_values.setdefault(tuple(sorted(values.items())), []).append(names[config])
        for same in by_values.values():
            if len(same) > 1:
                groups.setdefault(tuple(sorted(same)), []).append(m)
    return [f"{', '.join(ms)}: {' = '.join(same)}" for same, ms in sorted(groups.items(), key=lambda g: (metrics.index(g[1][0]), g[0]))]


def regime_sections(
    regimes: Regimes, summary: Mapping[str, Any], num_classes: int | None, rows: Sequence[Mapping[str, Any]] = ()
) -> list[str]:
    """The page's section: a table per regime, its rows sorted by the first of ``regimes.sort`` each
    has (descending), the final values mean ± std over seeds, in %, and the compute each row spent;
    beneath each, the rows near chance, the trials that diverged and the rows that equal another
    (one model computed twice). ``rows``: the suite's ``metrics.parquet`` rows, which the ``*_p10``
    metrics, the client epochs and the equal rows are read from."""
    from raysim.results.report import MISSING

    chance = 1.0 / num_classes if num_classes else None
    worst = [m for m in regimes.metrics if m.endswith(WORST)]
    spent = _client_epochs(rows)
    first, *then = regimes.sort
    order = f"final `{first}`" + "".join(f", or `{m}` where a row has none" for m in then)
    parts = [
        "## By regime",
        "",
        f"Each regime's rows sorted by {order} (mean over seeds; rows without "
        + ("any" if then else "it")
        + " last), the global and the local models side by side: the final value, mean ± std over seeds, in %"
        + (
            f"; {', '.join(f'`{m}`' for m in worst)}: the mean over the worst 10% of the clients "
            "(at least one), the row's fairness"
            if worst
            else ""
        )
        + ("; client epochs: the compute the row spent, its clients' local epochs summed (mean over seeds)." if spent else "."),
        "",
    ]
    configs = _with_worst(summary, rows, [*regimes.metrics, *regimes.sort])
    diverged = _diverged(rows)
    for suffix, title in regimes.suffixes:
        members = []
        for c in configs:
            placed = regimes.place(str(c["config"]))
            if placed is not None and placed[1] == suffix:
                members.append((placed[0], c))
        if not members:
            continue

        def key(row: tuple[str, Mapping[str, Any]]) -> tuple[int, float]:
            c = row[1]
            value = next((c["mean"][m] for m in regimes.sort if c["mean"].get(m) is not None), None)
            if value is not None:
                return (0, -float(value))
            first = next((c["mean"][m] for m in regimes.metrics if c["mean"].get(m) is not None), None)
            return (1, -float(first) if first is not None else 0.0)

        members.sort(key=key)
        parts += [
            f"### {title}",
            "",
            "| | " + " | ".join(regimes.metrics) + (" | client epochs |" if spent else " |"),
            "|---|" + "---|" * (len(regimes.metrics) + bool(spent)),
        ]
        near, lost = [], []
        for name, c in members:
            values = [c["mean"].get(m) for m in regimes.metrics]
            cells = [
                MISSING if v is None else f"{100 * float(v):.2f} ± {100 * float(c['std'].get(m) or 0.0):.2f}"
                for m, v in zip(regimes.metrics, values, strict=True)
            ]
            if spent:
                used = spent.get(str(c["config"]))
                cells.append(MISSING if used is None else f"{used:.0f}")
            parts.append(f"| {name} | " + " | ".join(cells) + " |")
            shown = [float(v) for v in values if v is not None]
            if chance is not None and shown and all(v < chance + NEAR_CHANCE for v in shown):
                near.append(name)
            if str(c["config"]) in diverged:
                bad, of = diverged[str(c["config"])]
                lost.append(f"{name} (seed{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of {of})")
        parts.append("")
        if near and chance is not None:
            parts += [
                f"Near chance ({100 * chance:.0f}% for {num_classes} classes; every accuracy shown within "
                f"{100 * NEAR_CHANCE:.0f} points of it): {', '.join(near)}.",
                "",
            ]
        if lost:
            parts += [f"Diverged (training loss not finite at the last evaluation): {', '.join(lost)}.", ""]
        # (rows that learned nothing or diverged are alike without being one model)
        kept = {str(c["config"]): name for name, c in members if name not in near and str(c["config"]) not in diverged}
        equal = _equal(rows, kept, [m for m in regimes.metrics if not m.endswith(WORST)])
        if equal:
            parts += [f"Equal to the bit at every evaluation of every seed: {'; '.join(equal)}.", ""]
    return parts


__all__ = ["WORST", "X_CHOICES", "Regimes", "parse_regimes", "regime_sections"]
