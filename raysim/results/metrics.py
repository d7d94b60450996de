"""The metrics every algorithm reports (docs/usage.md, "Metrics").

- ``gm_gtest``: the global model on G-Test (the official test set, whole).
- ``gm_ptest``: the global model on each client's P-Test, averaged over clients.
- ``lm_ptest``: each client's personalised model on its own P-Test, averaged over clients.
- ``updated_lm_ptest`` (``eval.updated_lm``, any algorithm): each client's model as its local update
  in the evaluated round left it, on its own P-Test, averaged over the clients trained in that
  round. For an algorithm without personal models it is also its ``lm_ptest``.
- ``new_gm_ptest`` and ``new_lm_ptest`` (``eval.new_clients``): the global model, and each newcomer's
  model (adapted as the algorithm's evaluation says a newcomer would), on the P-Tests of the clients
  held out of training; ``gm_ptest`` and ``lm_ptest`` are then over the clients that train.
- ``gm_gtest_domain_D`` and ``lm_ptest_domain_D`` (``data.feature_shift``): the global model on
  domain D's copy of G-Test, and the personalised models of domain D's training clients.

Averages are unweighted (the mean over clients, as FedFCD, FedPAC and FedDr+ report) and
sample-weighted (``*_weighted``); ``*_std`` is the standard deviation across clients (FedDr+'s
"± (Y)") and ``*_p10`` the mean over the worst 10% of the clients (at least one; q-FFL's "worst
10%", Li, Sanjabi, Beirami and Smith, ICLR 2020, Table 1). A metric that does not apply to an
algorithm is None (null in the tables).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raysim.records import ClientEval, EvalReport

METRICS = ("gm_gtest", "gm_ptest", "lm_ptest", "updated_lm_ptest", "new_gm_ptest", "new_lm_ptest")


def metric_value(value: Any) -> float | None:
    """A metric's value from a table's row, None where it has none (null, or NaN in a column)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _client_summary(correct: Sequence[int | None], totals: Sequence[int]) -> dict[str, float | None]:
    pairs = [(c, n) for c, n in zip(correct, totals, strict=True) if c is not None and n > 0]
    if not pairs:
        return {"mean": None, "weighted": None, "std": None, "p10": None}
    acc = np.array([c / n for c, n in pairs])
    worst = np.sort(acc)[: max(1, math.ceil(0.1 * len(acc)))]
    return {
        "mean": float(acc.mean()),
        "weighted": float(sum(c for c, _ in pairs) / sum(n for _, n in pairs)),
        "std": float(acc.std()),
        "p10": float(worst.mean()),
    }


def summarize(report: EvalReport) -> dict[str, Any]:
    """One row of metrics.parquet from one evaluation (numbers, and with ``eval.analyses`` the
    list ``gm_class_acc``)."""
    trained = [c for c in report.clients if not c.new]
    held = [c for c in report.clients if c.new]
    row: dict[str, Any] = {
        "gm_gtest": (report.gtest_correct / report.gtest_total)
        if report.gtest_correct is not None and report.gtest_total > 0
        else None,
    }
    updated = [c.ulm_correct for c in trained]
    columns: list[tuple[str, list[ClientEval], list[int | None]]] = [
        ("gm_ptest", trained, [c.gm_correct for c in trained]),
        ("lm_ptest", trained, [c.lm_correct for c in trained]),
        *([("updated_lm_ptest", trained, updated)] if any(u is not None for u in updated) else []),
    ]
    if held:  # eval.new_clients
        columns.append(("new_gm_ptest", held, [c.gm_correct for c in held]))
        columns.append(("new_lm_ptest", held, [c.lm_correct for c in held]))
    for name, clients, values in columns:
        s = _client_summary(values, [c.n_test for c in clients])
        row[name] = s["mean"]
        row[f"{name}_weighted"] = s["weighted"]
        row[f"{name}_std"] = s["std"]
        row[f"{name}_p10"] = s["p10"]
    for d, (correct, total) in enumerate(report.gtest_domains):  # data.feature_shift
        row[f"gm_gtest_domain_{d}"] = correct / total if total else None
    domains = sorted({c.domain for c in trained if c.domain is not None})
    for d in domains:
        own = [c for c in trained if c.domain == d]
        row[f"lm_ptest_domain_{d}"] = _client_summary([c.lm_correct for c in own], [c.n_test for c in own])["mean"]
    if report.gm_class_acc is not None:  # eval.analyses (raysim.results.analysis)
        from raysim.results.analysis import SPLIT_KEYS, mean_over_clients

        row["gm_class_acc"] = report.gm_class_acc
        splits = [{f"gm_{k}": v for k, v in (c.gm_split or {}).items()} for c in report.clients]
        row.update(mean_over_clients(splits, tuple(f"gm_{k}" for k in SPLIT_KEYS)))
    return row


def with_updated_lm(report: EvalReport, updated: Sequence[tuple[int, int]], as_lm: bool) -> EvalReport:
    """``report`` with each client's ``ulm_correct`` its updated local model's (``eval.updated_lm``:
    the round's trained clients; the others have none), and where ``as_lm`` (an algorithm without
    personal models) its ``lm_correct`` the same."""
    by_client = dict(updated)
    clients = tuple(
        dataclasses.replace(
            c,
            ulm_correct=by_client.get(c.client),
            lm_correct=by_client.get(c.client) if as_lm else c.lm_correct,
        )
        for c in report.clients
    )
    return dataclasses.replace(report, clients=clients)


def client_rows(rnd: int, report: EvalReport) -> list[dict[str, Any]]:
    """Rows of clients.parquet: a row per client per evaluated round (with ``eval.new_clients``,
    whether the client was held out of training, ``new``; with ``data.feature_shift``, its ``domain``)."""
    held = any(c.new for c in report.clients)
    return [
        {
            "round": rnd,
            "client": c.client,
            "n_test": c.n_test,
            "gm_ptest": None if c.gm_correct is None or c.n_test == 0 else c.gm_correct / c.n_test,
            "lm_ptest": None if c.lm_correct is None or c.n_test == 0 else c.lm_correct / c.n_test,
            **({} if c.ulm_correct is None or c.n_test == 0 else {"updated_lm_ptest": c.ulm_correct / c.n_test}),
            **{f"gm_{k}": v for k, v in (c.gm_split or {}).items()},
            **({"new": c.new} if held else {}),
            **({} if c.domain is None else {"domain": c.domain}),
        }
        for c in report.clients
    ]


@dataclass
class MetricHistory:
    """Best, final and last-k mean of each metric over the evaluated rounds."""

    rows: list[dict[str, Any]]

    def final(self) -> dict[str, float | None]:
        last = self.rows[-1] if self.rows else {}
        return {m: last.get(m) for m in METRICS}

    def best(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for m in METRICS:
            vals = [r[m] for r in self.rows if r.get(m) is not None and not math.isnan(r[m])]
            out[m] = max(vals) if vals else None
        return out

    def last(self, k: int, metrics: Sequence[str] = METRICS) -> dict[str, float | None]:
        """The mean of each metric over its last ``k`` evaluations (those where it has a value):
        a figure for curves that swing from round to round, where the final value is luck."""
        out: dict[str, float | None] = {}
        for m in metrics:
            vals = [r[m] for r in self.rows if r.get(m) is not None and not math.isnan(r[m])][-k:]
            out[m] = float(np.mean(vals)) if vals else None
        return out

    def reaching(self, target: float, metric: str) -> dict[str, Any]:
        """``eval.target``: the first evaluation where ``metric`` is at least ``target``: its round
        and its simulated time (``sim_time_s``); None for both if no evaluation reached it."""
        hit = next((r for r in self.rows if r.get(metric) is not None and r[metric] >= target), None)
        return {
            "target": {"metric": metric, "accuracy": target},
            "rounds_to_target": hit["round"] if hit else None,
            "time_to_target_s": hit.get("sim_time_s") if hit else None,
        }

    def best_round(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for m in METRICS:
            vals = [(r[m], -r["round"]) for r in self.rows if r.get(m) is not None]
            out[m] = -max(vals)[1] if vals else None
        return out
