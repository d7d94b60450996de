"""A paper's claims, declared in a suite file and judged on the suite's own numbers, seed by seed.

A suite file's ``claims`` is a list; each claim cites where the paper makes it (``where``: a table,
figure or section) and reads one metric (``metric``: ``gm_gtest``, ``gm_ptest``, ``lm_ptest``, ...)
through one statistic of each trial (``stat``: ``final``, the value after the last round; ``last_k``,
the mean of the last k evaluations; ``best``, the highest evaluated value, the figure papers that
report their best accuracy give). Four forms:

- **figure**: ``{row: fedrod, paper: 92.7, within: 1.0}``: the row's value is within ``within``
  points (%) of the paper's figure; with ``side: at_least``, it is at least the paper's figure less
  ``within`` (the row reaches the paper's figure, however far above);
- **better**: ``{better: fed3p2, than: fedavg}``: the first row's value is above the second's;
- **order**: ``{order: [fed3p2, fedrod, feddyn]}``: the rows' values fall in that order, each
  above the next;
- **trend**: ``{trend: [rowA, rowB, rowC], direction: falls}`` (or ``rises``): along the rows (a
  grid's values in order) the value falls (or rises) at every step.

Each claim becomes a margin per seed, positive where it holds: ``within - |x - paper|`` for a
figure (``x - paper + within`` at least), ``a - b`` for better, the smallest step for an order or a trend (in points, %). Rows are
paired by seed (a seed's rows share its data split and initial model). The verdict over n seeds,
of which k hold:

- k = n: "holds on every seed";
- 0 < k < n: "holds on k of n";
- k = 0: "does not hold" when the mean margin is further below zero than the margins' standard
  deviation over the seeds, else "cannot be told" (the miss is inside the seed spread).

A claim whose rows or metric the suite lacks (a trial that did not finish, a metric the algorithm
does not report) is "cannot be told" with the reason. ``raysim report --publish`` writes each
claim with its per-seed values, the mean ± std of each row, its margins and its verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raysim.engine.setups import NOT_ITS, setting_of
from raysim.errors import ConfigError

STATS = ("final", "last_k", "best")
DIRECTIONS = ("rises", "falls")
SIDES = ("within", "at_least")
#: the verdicts, the only words a page's judgement is written in
HOLDS_EVERY, DOES_NOT_HOLD, CANNOT_BE_TOLD = "holds on every seed", "does not hold", "cannot be told"


@dataclass(frozen=True)
class Claim:
    """One claim: its ``kind`` (figure, better, order, trend), the ``rows`` it reads (configuration
    names, in the claim's order), the metric and statistic, and where the paper makes it."""

    kind: str
    rows: tuple[str, ...]
    metric: str
    stat: str
    where: str
    paper: float | None = None  # figure: the paper's value, %
    within: float | None = None  # figure: the tolerance, points
    direction: str | None = None  # trend: rises or falls
    side: str = "within"  # figure: within (either side) or at_least

    def text(self) -> str:
        """The claim in words, for the page."""
        m = f"{self.metric} ({self.stat.replace('_', '-')})"
        if self.kind == "figure" and self.side == "at_least":
            return f"`{self.rows[0]}` {m} at least the paper's {self.paper:g}" + (
                f" less {self.within:g}" if self.within else ""
            )
        if self.kind == "figure":
            return f"`{self.rows[0]}` {m} within {self.within:g} of the paper's {self.paper:g}"
        if self.kind == "better":
            return f"`{self.rows[0]}` above `{self.rows[1]}` on {m}"
        if self.kind == "order":
            return " > ".join(f"`{r}`" for r in self.rows) + f" on {m}"
        return f"{m} {self.direction} along " + ", ".join(f"`{r}`" for r in self.rows)


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    verdict: str
    seeds: tuple[int, ...]  # the seeds judged
    values: dict[str, list[float]]  # row -> its value on each judged seed, %
    margins: list[float]  # per judged seed, points; positive where the claim holds
    reason: str = ""  # why it cannot be told, where no number could


def _fields(entry: Mapping[str, Any], where: str, required: Sequence[str], optional: Sequence[str]) -> None:
    missing = [k for k in required if k not in entry]
    if missing:
        raise ConfigError(f"{where} needs {missing[0]!r}.")
    unknown = sorted(set(entry) - set(required) - set(optional))
    if unknown:
        raise ConfigError(f"{where} has an unknown entry {unknown[0]!r}.")


def parse_claims(data: Any, configs: Sequence[str], path: str = "the suite file") -> tuple[Claim, ...]:
    """The ``claims`` of a suite file, checked against its configurations' names."""
    from raysim.results.metrics import METRICS

    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError(f"claims in {path} is a list of claims, not {data!r}.")
    known = set(configs)
    out = []
    for i, entry in enumerate(data):
        where = f"Claim {i + 1} of {path}"
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"{where} is a table (e.g. {{row: fedavg, paper: 81.1, within: 1, ...}}), not {entry!r}."
            )
        common = ("metric", "stat", "where")
        rows: tuple[Any, ...]
        if "row" in entry:
            _fields(entry, where, ("row", "paper", "within", *common), ("side",))
            kind, rows = "figure", (entry["row"],)
        elif "better" in entry:
            _fields(entry, where, ("better", "than", *common), ())
            kind, rows = "better", (entry["better"], entry["than"])
        elif "order" in entry:
            _fields(entry, where, ("order", *common), ())
            kind, rows = "order", tuple(entry["order"]) if isinstance(entry["order"], list) else ()
        elif "trend" in entry:
            _fields(entry, where, ("trend", "direction", *common), ())
            kind, rows = "trend", tuple(entry["trend"]) if isinstance(entry["trend"], list) else ()
        else:
            raise ConfigError(
                f"{where} is none of the claim forms: give row (with paper and within), better (with than), order or trend."
            )
        if kind in ("order", "trend") and len(rows) < 2:
            raise ConfigError(f"{where}'s {kind} is a list of at least two configurations.")
        rows = tuple(str(r) for r in rows)
        for r in rows:
            if r not in known:
                raise ConfigError(f"{where} names {r!r}, which is no configuration of the suite.")
        if len(set(rows)) < len(rows):
            raise ConfigError(f"{where} names a configuration twice.")
        if entry["metric"] not in METRICS:
            raise ConfigError(f"{where}'s metric is one of {', '.join(METRICS)}, not {entry['metric']!r}.")
        if entry["stat"] not in STATS:
            raise ConfigError(f"{where}'s stat is one of {', '.join(STATS)}, not {entry['stat']!r}.")
        if not str(entry["where"]).strip():
            raise ConfigError(f"{where} must say where the paper makes it (a table, figure or section).")
        paper = within = None
        if kind == "figure":
            paper, within = (
                _number(entry["paper"], f"{where}'s paper"),
                _number(entry["within"], f"{where}'s within"),
            )
            if within < 0:
                raise ConfigError(f"{where}'s within is a tolerance in points, at least 0, not {within}.")
        side = str(entry.get("side", "within"))
        if side not in SIDES:
            raise ConfigError(f"{where}'s side is within or at_least, not {side!r}.")
        direction = None
        if kind == "trend":
            direction = str(entry["direction"])
            if direction not in DIRECTIONS:
                raise ConfigError(f"{where}'s direction is rises or falls, not {direction!r}.")
        out.append(
            Claim(
                kind,
                rows,
                str(entry["metric"]),
                str(entry["stat"]),
                str(entry["where"]),
                paper,
                within,
                direction,
                side,
            )
        )
    return tuple(out)


def claim_dict(claim: Claim) -> dict[str, Any]:
    """The claim as a suite file writes it (``parse_claims`` reads it back)."""
    common = {"metric": claim.metric, "stat": claim.stat, "where": claim.where}
    if claim.kind == "figure":
        side = {"side": claim.side} if claim.side != "within" else {}
        return {"row": claim.rows[0], "paper": claim.paper, "within": claim.within, **side, **common}
    if claim.kind == "better":
        return {"better": claim.rows[0], "than": claim.rows[1], **common}
    if claim.kind == "order":
        return {"order": list(claim.rows), **common}
    return {"trend": list(claim.rows), "direction": claim.direction, **common}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} is a number, not {value!r}.")
    return float(value)


def trial_values(
    rows: Sequence[dict[str, Any]], last_k: int
) -> dict[tuple[str, int], dict[str, dict[str, float]]]:
    """Each trial's statistics: (configuration, seed) -> stat -> metric -> value in %, from the
    suite's ``metrics.parquet`` rows (a metric a trial never reported is absent)."""
    from raysim.results.metrics import METRICS, MetricHistory

    by_trial: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_trial.setdefault((str(r["config"]), int(r["seed"])), []).append(r)
    out: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    for key, trial in by_trial.items():
        history = MetricHistory(sorted(trial, key=lambda r: r["round"]))
        stats = {"final": history.final(), "last_k": history.last(last_k), "best": history.best()}
        out[key] = {
            s: {
                m: 100.0 * float(v) for m in METRICS if (v := values.get(m)) is not None and not math.isnan(v)
            }
            for s, values in stats.items()
        }
    return out


def margin(claim: Claim, values: Sequence[float]) -> float:
    """The claim's margin on one seed, from its rows' values there (%): positive where it holds."""
    if claim.kind == "figure":
        assert claim.paper is not None and claim.within is not None
        if claim.side == "at_least":
            return values[0] - claim.paper + claim.within
        return claim.within - abs(values[0] - claim.paper)
    steps = [a - b for a, b in zip(values, values[1:], strict=False)]
    if claim.kind == "trend" and claim.direction == "rises":
        steps = [-s for s in steps]
    return min(steps)


def verdict_of(margins: Sequence[float]) -> str:
    """The verdict of a claim from its margins, one per seed (the module's docstring)."""
    n, k = len(margins), sum(m > 0 for m in margins)
    if n == 0:
        return CANNOT_BE_TOLD
    if k == n:
        return HOLDS_EVERY
    if k > 0:
        return f"holds on {k} of {n}"
    mean = float(np.mean(margins))
    spread = float(np.std(margins, ddof=1)) if n > 1 else 0.0
    return DOES_NOT_HOLD if -mean > spread else CANNOT_BE_TOLD


def judge(
    claim: Claim, trials: Mapping[tuple[str, int], Mapping[str, Mapping[str, float]]], seeds: Sequence[int]
) -> Verdict:
    """Judge ``claim`` on every seed where all its rows have the metric."""
    judged: list[int] = []
    values: dict[str, list[float]] = {r: [] for r in claim.rows}
    margins: list[float] = []
    missing: list[str] = []
    for seed in seeds:
        got = [trials.get((r, seed), {}).get(claim.stat, {}).get(claim.metric) for r in claim.rows]
        present = [v for v in got if v is not None]
        if len(present) < len(got):
            missing += [f"{r} seed {seed}" for r, v in zip(claim.rows, got, strict=True) if v is None]
            continue
        judged.append(seed)
        for r, v in zip(claim.rows, present, strict=True):
            values[r].append(v)
        margins.append(margin(claim, present))
    reason = f"no {claim.metric} for " + ", ".join(missing) if missing else ""
    verdict = verdict_of(margins) if not missing else CANNOT_BE_TOLD
    return Verdict(claim, verdict, tuple(judged), values, margins, reason)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return str(a) == str(b)


def shown(value: Any) -> str:
    """A setting's value as a page writes it (lists in brackets, booleans in lower case, a table of
    algorithms as ``value (algorithm)``)."""
    if isinstance(value, Mapping):
        return ", ".join(f"{shown(v)} ({k})" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return "unset" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def setting_differences(paper: Mapping[str, Any], ran: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per setting of the paper's (``paper_setting``: dotted keys) that some configuration
    ran otherwise: the paper's value, and each value run with the configurations that ran it (an
    ``algo.X`` the configuration's algorithm does not have is no difference). An ``algo.X`` given as
    a table of algorithms (``algo.lambda: {fedfcd: 1.0}``) is the paper's for those algorithms
    only (another's parameter of the same name means something else).
    ``ran``: configuration -> its resolved config as the run saved it."""
    out = []
    for key, stated in paper.items():
        per_algorithm = key.startswith("algo.") and isinstance(stated, Mapping)
        got: dict[str, list[str]] = {}
        for name, config in ran.items():
            if per_algorithm and str(config.get("algo")) not in stated:
                continue
            want = stated[str(config.get("algo"))] if per_algorithm else stated
            value = setting_of(config, key)
            if value is NOT_ITS:  # the algorithm has no such parameter: nothing to differ
                continue
            if not _same(value, want):
                got.setdefault(shown(value), []).append(name)
        if not got:
            continue
        if len(got) == 1 and len(next(iter(got.values()))) == len(ran):
            where = f"ran {next(iter(got))} (every configuration)"
        else:
            where = "ran " + "; ".join(
                f"{v} in " + ", ".join(f"`{n}`" for n in names) for v, names in got.items()
            )
        out.append(f"- `{key}`: the paper's {shown(stated)}; {where}")
    return out


#: phrases that pass a judgement: a page's verdicts are the computed ones, so its hand-written
#: notes may carry none of them (they explain and caveat)
VERDICT_PHRASES = (
    "holds on",
    "does not hold",
    "do not hold",
    "cannot be told",
    "reproduces",
    "reproduced",
    "confirms",
    "confirmed",
    "contradicts",
    "verdict",
)


def verdict_phrases(text: str) -> list[str]:
    """The judgement phrases of ``text`` (case-insensitive, whole words), in order of appearance."""
    import re

    pattern = re.compile(r"\b(" + "|".join(re.escape(p) for p in VERDICT_PHRASES) + r")\b", re.IGNORECASE)
    return [m.group(0) for m in pattern.finditer(text)]


def _pm(values: Sequence[float]) -> str:
    if not values:
        return "–"
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{np.mean(values):.2f} ± {std:.2f}"


def claims_table(verdicts: Sequence[Verdict]) -> str:
    """The page's table of claims: each with where the paper makes it, the values it read (each
    row's per-seed values and mean ± std, %), its per-seed margins and its verdict."""
    lines = [
        "| claim | where | values (%, per seed; mean ± std) | margin per seed (points) | verdict |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        c = v.claim
        shown = "; ".join(
            f"`{r}`: " + ", ".join(f"{x:.2f}" for x in v.values[r]) + f" ({_pm(v.values[r])})" for r in c.rows
        )
        margins = ", ".join(f"{m:+.2f}" for m in v.margins) or "–"
        verdict = f"**{v.verdict}**" + (f" ({v.reason})" if v.reason else "")
        cells = [c.text(), c.where, shown, margins, verdict]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = [
    "CANNOT_BE_TOLD",
    "DIRECTIONS",
    "DOES_NOT_HOLD",
    "HOLDS_EVERY",
    "SIDES",
    "STATS",
    "VERDICT_PHRASES",
    "Claim",
    "Verdict",
    "claim_dict",
    "claims_table",
    "judge",
    "margin",
    "parse_claims",
    "setting_differences",
    "shown",
    "verdict_phrases",
    "trial_values",
    "verdict_of",
]
