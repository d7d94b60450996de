"""``*_p10``: the mean accuracy over the worst 10% of the clients (at least one), q-FFL's "worst
10%", beside the mean, the sample-weighted mean and the std, on hand-made evaluations."""

from __future__ import annotations

import pytest

from raysim.records import ClientEval, EvalReport
from raysim.results.metrics import summarize


def _report(lm: list[int], gm: list[int | None], n: int = 10) -> EvalReport:
    clients = tuple(ClientEval(k, n, g, c) for k, (c, g) in enumerate(zip(lm, gm, strict=True)))
    return EvalReport(clients, None, 0)


def test_the_worst_tenth_of_twenty_clients_is_the_two_lowest():
    lm = [9, 3, 7, 10, 8, 1, 9, 9, 6, 8, 7, 9, 10, 10, 5, 8, 7, 9, 9, 10]
    row = summarize(_report(lm, [5] * 20))
    assert row["lm_ptest_p10"] == pytest.approx((0.1 + 0.3) / 2)
    assert row["lm_ptest"] == pytest.approx(sum(lm) / 200)
    assert row["gm_ptest_p10"] == pytest.approx(0.5)


def test_a_handful_of_clients_have_their_worst_one_and_none_without_a_model():
    row = summarize(_report([4, 6, 9], [None, None, None]))
    assert row["lm_ptest_p10"] == pytest.approx(0.4)  # ceil(0.3) = 1 client
    assert row["gm_ptest_p10"] is None and row["gm_ptest"] is None
    eleven = summarize(_report([10] * 9 + [2, 5], [0] * 11))
    assert eleven["lm_ptest_p10"] == pytest.approx((0.2 + 0.5) / 2)  # ceil(1.1) = 2 clients
