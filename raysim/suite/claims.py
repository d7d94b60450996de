"""A paper's claims, declared in a suite file and judged on the suite's own numbers, seed by seed.

A suite file's ``claims`` is a list; each claim cites where the paper makes it (``where``: a table,
figure or section) and reads one quantity of each trial (``metric``) through one statistic
(``stat``). The quantities (``QUANTITIES``):

- the accuracies ``gm_gtest``, ``gm_ptest``, ``lm_ptest``, ``updated_lm_ptest``, ``new_gm_ptest`` and
  ``new_lm_ptest``, in %, their means over the worst 10% of the clients (``lm_ptest_p10``, ...) and
  their sample-weighted means (``lm_ptest_weighted``, ...: the figure
  PFLlib reports);
- the analyses' means over the round's clients (``eval.analyses``, raysim/results/analysis.py:
  ``gm_obs_acc``, ``local_unobs_align``, ``local_obs_fdist``, ...), accuracies in %, the rest as
  recorded (cosines, norms, distances, angles in degrees), and ``train_loss``;
- ``cluster_purity``: a clustered algorithm's clusters against the clients' domains under
  ``data.feature_shift`` (the share of its clustered clients in their cluster's most common domain),
  in %;
- ``train_s_per_round``: the trial's training time over its rounds, in seconds (its
  ``summary.json``'s ``train_time_s`` over ``rounds``; trials that ran side by side count each
  other's load).

The statistics (``STATS``): ``final``, the value after the last round; ``last_k``, the mean of the
last k evaluations; ``best``, the highest evaluated value (an accuracy's only: the figure papers
that report their best accuracy give); ``mean``, the mean over the evaluated rounds (the only one
of ``train_s_per_round``, a mean over the run). Five forms:

- **figure**: ``{row: fedrod, paper: 92.7, within: 1.0}``: the row's value is within ``within``
  (in the quantity's unit: points for an accuracy) of the paper's figure; with ``side: at_least``,
  it is at least the paper's figure less ``within`` (the row reaches the paper's figure, however
  far above);
- **better**: ``{better: fed3p2, than: fedavg}``: the first row's value is above the second's (for a
  quantity where less is better, a time or a distance, name the row the paper says is larger first);
  ``than_metric`` reads the second row's value from another quantity of the same unit, where the
  paper compares one method's personalised models with another's global model (FedBN's local
  models against FedAvg's global one: ``{better: fedbn, than: fedavg, metric: lm_ptest,
  than_metric: gm_ptest}``);
- **order**: ``{order: [fed3p2, fedrod, feddyn]}``: the rows' values fall in that order, each
  above the next;
- **trend**: ``{trend: [rowA, rowB, rowC], direction: falls}`` (or ``rises``): along the rows (a
  grid's values in order) the value falls (or rises) at every step;
- **similar**: ``{similar: [rowA, rowB, rowC], within: 1.0}``: the rows' values lie within
  ``within`` of each other (a paper's "minimal impact", "similar"): the largest less the smallest
  is at most ``within``.

Each claim becomes a margin per seed, positive where it holds: ``within - |x - paper|`` for a
figure (``x - paper + within`` at least), ``a - b`` for better, the smallest step for an order or a
trend, ``within - (max - min)`` for similar (in the quantity's unit). Rows are
paired by seed (a seed's rows share its data split and initial model). The verdict over n seeds,
of which k hold:

- k = n: "holds on every seed";
- 0 < k < n: "holds on k of n";
- k = 0: "does not hold" when the mean margin is further below zero than the margins' standard
  deviation over the seeds (the sample std, ddof 1), else "cannot be told" (the miss is inside the seed spread).

A claim whose rows or metric the suite lacks (a trial that did not finish, a metric the algorithm
does not report) is "cannot be told" with the reason. ``raysim report --publish`` writes each
claim with its per-seed values, the mean ± std of each row, its margins and its verdict.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysim.engine.setups import NOT_ITS, setting_of
from raysim.errors import ConfigError

STATS = ("final", "last_k", "best", "mean")
#: the time a claim can read, from each trial's summary.json rather than metrics.parquet
TIME = "train_s_per_round"
#: a clustered algorithm's clusters against the clients' domains under data.feature_shift (a
#: share, read in % as an accuracy is)
PURITY = "cluster_purity"
DIRECTIONS = ("rises", "falls")
SIDES = ("within", "at_least")
#: the verdicts, the only words a page's judgement is written in
HOLDS_EVERY, DOES_NOT_HOLD, CANNOT_BE_TOLD = "holds on every seed", "does not hold", "cannot be told"


def quantities() -> tuple[str, ...]:
    """Every quantity a claim can read (the module's docstring)."""
    from raysim.results.analysis import ANALYSIS_COLUMNS
    from raysim.results.metrics import METRICS

    return (
        *METRICS, *(f"{m}_weighted" for m in METRICS), *(f"{m}_p10" for m in METRICS), PURITY, *ANALYSIS_COLUMNS,
        "train_loss", TIME,
    )  # fmt: skip


def is_accuracy(quantity: str) -> bool:
    """Whether a quantity is an accuracy (read in %, and the only kind with a best)."""
    from raysim.results.metrics import METRICS

    base = quantity.removesuffix("_weighted").removesuffix("_p10")
    return base in METRICS or quantity.endswith("_acc") or quantity == PURITY


def unit(quantity: str) -> str:
    """The unit a page writes a quantity's values and margins in ("" for a plain number)."""
    if is_accuracy(quantity):
        return "%"
    return "s" if quantity == TIME else "degrees" if quantity.endswith("_fangle") else ""


@dataclass(frozen=True)
class Claim:
    """One claim: its ``kind`` (figure, better, order, trend), the ``rows`` it reads (configuration
    names, in the claim's order), the metric and statistic, and where the paper makes it."""

    kind: str
    rows: tuple[str, ...]
    metric: str
    stat: str
    where: str
    paper: float | None = None  # figure: the paper's value, in the quantity's unit
    within: float | None = None  # figure: the tolerance, in the quantity's unit
    direction: str | None = None  # trend: rises or falls
    side: str = "within"  # figure: within (either side) or at_least
    than_metric: str | None = None  # better: the second row's quantity, where not ``metric``

    def metric_of(self, i: int) -> str:
        """The quantity the claim reads of its ``i``-th row."""
        return self.than_metric if i == 1 and self.than_metric is not None else self.metric

    def text(self) -> str:
        """The claim in words, for the page."""
        u = unit(self.metric)
        m = f"{self.metric} ({self.stat.replace('_', '-')}{', ' + u if u else ''})"
        if self.kind == "figure" and self.side == "at_least":
            return f"`{self.rows[0]}` {m} at least the paper's {self.paper:g}" + (
                f" less {self.within:g}" if self.within else ""
            )
        if self.kind == "figure":
            return f"`{self.rows[0]}` {m} within {self.within:g} of the paper's {self.paper:g}"
        if self.kind == "better" and self.than_metric is not None:
            return f"`{self.rows[0]}` {m} above `{self.rows[1]}` {self.than_metric}"
        if self.kind == "better":
            return f"`{self.rows[0]}` above `{self.rows[1]}` on {m}"
        if self.kind == "order":
            return " > ".join(f"`{r}`" for r in self.rows) + f" on {m}"
        if self.kind == "similar":
            return ", ".join(f"`{r}`" for r in self.rows) + f" within {self.within:g} of each other on {m}"
        return f"{m} {self.direction} along " + ", ".join(f"`{r}`" for r in self.rows)


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    verdict: str
    seeds: tuple[int, ...]  # the seeds judged
    values: dict[str, list[float]]  # row -> its value on each judged seed, in the quantity's unit
    margins: list[float]  # per judged seed, in the quantity's unit; positive where the claim holds
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
            _fields(entry, where, ("better", "than", *common), ("than_metric",))
            kind, rows = "better", (entry["better"], entry["than"])
        elif "order" in entry:
            _fields(entry, where, ("order", *common), ())
            kind, rows = "order", tuple(entry["order"]) if isinstance(entry["order"], list) else ()
        elif "trend" in entry:
            _fields(entry, where, ("trend", "direction", *common), ())
            kind, rows = "trend", tuple(entry["trend"]) if isinstance(entry["trend"], list) else ()
        elif "similar" in entry:
            _fields(entry, where, ("similar", "within", *common), ())
            kind, rows = "similar", tuple(entry["similar"]) if isinstance(entry["similar"], list) else ()
        else:
            raise ConfigError(
                f"{where} is none of the claim forms: give row (with paper and within), better (with than), order, trend (with direction) or similar (with within)."
            )
        if kind in ("order", "trend", "similar") and len(rows) < 2:
            raise ConfigError(f"{where}'s {kind} is a list of at least two configurations.")
        rows = tuple(str(r) for r in rows)
        for r in rows:
            if r not in known:
                raise ConfigError(f"{where} names {r!r}, which is no configuration of the suite.")
        if len(set(rows)) < len(rows):
            raise ConfigError(f"{where} names a configuration twice.")
        metric, stat = entry["metric"], entry["stat"]
        if metric not in quantities():
            raise ConfigError(f"{where}'s metric is one of {', '.join(quantities())}, not {metric!r}.")
        if stat not in STATS:
            raise ConfigError(f"{where}'s stat is one of {', '.join(STATS)}, not {stat!r}.")
        if metric == TIME and stat != "mean":
            raise ConfigError(f"{where}'s {TIME} is a mean over the run: its stat is mean, not {stat!r}.")
        if stat == "best" and not is_accuracy(metric):
            raise ConfigError(f"{where}'s stat best is an accuracy's highest value; {metric} takes final, last_k or mean.")
        than_metric = entry.get("than_metric")
        if than_metric is not None:
            if than_metric not in quantities():
                raise ConfigError(f"{where}'s than_metric is one of {', '.join(quantities())}, not {than_metric!r}.")
            if unit(than_metric) != unit(metric) or is_accuracy(than_metric) != is_accuracy(metric):
                raise ConfigError(f"{where} compares {metric} with {than_metric}, which is not in the same unit.")
            than_metric = str(than_metric)
        if not str(entry["where"]).strip():
            raise ConfigError(f"{where} must say where the paper makes it (a table, figure or section).")
        paper = within = None
        if kind == "figure":
            paper = _number(entry["paper"], f"{where}'s paper")
        if kind in ("figure", "similar"):
            within = _number(entry["within"], f"{where}'s within")
            if within < 0:
                raise ConfigError(f"{where}'s within is a tolerance, at least 0, not {within}.")
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
                than_metric,
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
        than = {"than_metric": claim.than_metric} if claim.than_metric is not None else {}
        return {"better": claim.rows[0], "than": claim.rows[1], **common, **than}
    if claim.kind == "order":
        return {"order": list(claim.rows), **common}
    if claim.kind == "similar":
        return {"similar": list(claim.rows), "within": claim.within, **common}
    return {"trend": list(claim.rows), "direction": claim.direction, **common}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} is a number, not {value!r}.")
    return float(value)


def _present(value: Any) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and not math.isnan(float(value))
    )


def trial_values(
    rows: Sequence[dict[str, Any]], last_k: int, times: Mapping[tuple[str, int], float] | None = None
) -> dict[tuple[str, int], dict[str, dict[str, float]]]:
    """Each trial's statistics: (configuration, seed) -> stat -> quantity -> value (accuracies in
    %), from the suite's ``metrics.parquet`` rows, and ``train_s_per_round``'s mean from ``times``
    (:func:`trial_times`). A quantity a trial never reported is absent."""
    read = [q for q in quantities() if q != TIME]
    by_trial: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_trial.setdefault((str(r["config"]), int(r["seed"])), []).append(r)
    out: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    for key, trial in by_trial.items():
        trial = sorted(trial, key=lambda r: r["round"])
        stats: dict[str, dict[str, float]] = {s: {} for s in STATS}
        for q in read:
            scale = 100.0 if is_accuracy(q) else 1.0
            values = [float(r[q]) for r in trial if _present(r.get(q))]
            if not values:
                continue
            last = trial[-1].get(q)
            if last is not None and _present(last):
                stats["final"][q] = scale * float(last)
            stats["last_k"][q] = scale * float(np.mean(values[-last_k:]))
            stats["mean"][q] = scale * float(np.mean(values))
            if is_accuracy(q):
                stats["best"][q] = scale * max(values)
        out[key] = stats
    for key, seconds in (times or {}).items():
        out.setdefault(key, {s: {} for s in STATS})["mean"][TIME] = seconds
    return out


def trial_timings(suite_dir: str | os.PathLike[str]) -> dict[tuple[str, int], tuple[float, float]]:
    """Each finished trial's training and evaluation time per round (s): (configuration, seed) ->
    its run's ``summary.json`` ``train_time_s`` and ``eval_time_s`` over ``rounds``."""
    import json

    out: dict[tuple[str, int], tuple[float, float]] = {}
    for s in sorted(Path(suite_dir, "runs").glob("*/summary.json")):
        trial_file = s.with_name("trial.json")
        if not trial_file.is_file():
            continue
        run, trial = json.loads(s.read_text()), json.loads(trial_file.read_text())
        rounds = int(run.get("rounds") or 0)
        if rounds > 0 and run.get("train_time_s") is not None:
            per_round = (float(run["train_time_s"]) / rounds, float(run.get("eval_time_s") or 0.0) / rounds)
            out[(str(trial["config"]), int(trial["seed"]))] = per_round
    return out


def trial_times(suite_dir: str | os.PathLike[str]) -> dict[tuple[str, int], float]:
    """Each finished trial's training time per round (s), ``train_s_per_round``'s value."""
    return {key: train for key, (train, _) in trial_timings(suite_dir).items()}


def margin(claim: Claim, values: Sequence[float]) -> float:
    """The claim's margin on one seed, from its rows' values there (%): positive where it holds."""
    if claim.kind == "figure":
        assert claim.paper is not None and claim.within is not None
        if claim.side == "at_least":
            return values[0] - claim.paper + claim.within
        return claim.within - abs(values[0] - claim.paper)
    if claim.kind == "similar":
        assert claim.within is not None
        return claim.within - (max(values) - min(values))
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
        got = [trials.get((r, seed), {}).get(claim.stat, {}).get(claim.metric_of(i)) for i, r in enumerate(claim.rows)]
        present = [v for v in got if v is not None]
        if len(present) < len(got):
            missing += [f"{r} seed {seed}" for r, v in zip(claim.rows, got, strict=True) if v is None]
            continue
        judged.append(seed)
        for r, v in zip(claim.rows, present, strict=True):
            values[r].append(v)
        margins.append(margin(claim, present))
    read = claim.metric if claim.than_metric is None else f"{claim.metric} or {claim.than_metric}"
    reason = f"no {read} for " + ", ".join(missing) if missing else ""
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
    row's per-seed values and mean ± std, in the claim's unit), its per-seed margins and its verdict."""
    lines = [
        "| claim | where | values (per seed; mean ± sample std) | margin per seed | verdict |",
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
    "TIME",
    "VERDICT_PHRASES",
    "Claim",
    "Verdict",
    "claim_dict",
    "claims_table",
    "is_accuracy",
    "judge",
    "margin",
    "parse_claims",
    "quantities",
    "setting_differences",
    "shown",
    "verdict_phrases",
    "trial_timings",
    "trial_times",
    "trial_values",
    "unit",
    "verdict_of",
]
