"""The golden test: every registered algorithm, and the variants whose code paths differ, gives on
a short serial run the metrics recorded in ``tests/golden_metrics.json`` (``tests/golden.py``): a
change of structure moves no number past the float tolerance that kernel choices need, on any
processor, and a change that means something is caught."""

from __future__ import annotations

import json

import pytest

from tests.golden import ATOL, BASE, CASES, GOLDEN_FILE, RTOL, mismatches, run_case

GOLDEN = json.loads(GOLDEN_FILE.read_text())


def test_every_registered_algorithm_has_a_golden_case():
    from raysim.registry import ALGORITHMS

    covered = {CASES[name]["algo"] for name in GOLDEN}
    ours = {name for name, cls in ALGORITHMS.items() if cls.__module__.startswith("algorithms.")}  # not a test's
    assert ours <= covered


@pytest.mark.parametrize("name", sorted(CASES))
def test_metrics_equal_the_recorded_ones(name, tmp_path):
    assert name in GOLDEN, f"no recorded metrics for {name}: run python -m tests.golden {name}"
    got = json.loads(json.dumps(run_case(name, tmp_path)))  # the same float round trip as the file
    off = mismatches(got, GOLDEN[name], name)
    assert not off, "\n".join(off[:20])


def test_the_comparison_takes_what_kernels_change_and_refuses_what_a_change_does():
    want = {"rows": [{"round": 1, "train_loss": 2.0, "gm_gtest": 0.5, "lm_ptest": None}], "clients": []}
    same = {"rows": [{"round": 1, "train_loss": 2.0 * (1 + 7e-6), "gm_gtest": 0.5, "lm_ptest": None, "new": 1}]}
    assert mismatches({**same, "clients": []}, want) == []  # the largest spread measured across kernels
    moved = json.loads(json.dumps(want))
    moved["rows"][0]["train_loss"] = 2.0 * (1 + 2 * RTOL) + ATOL
    assert mismatches(moved, want) == [".rows[0].train_loss: 2.000401, recorded 2.0 (off by 0.0002 of it)"]
    for key, value in (("round", 2), ("gm_gtest", 0.5025), ("lm_ptest", 0.5), ("gm_gtest", None)):
        changed = json.loads(json.dumps(want))
        changed["rows"][0][key] = value
        assert len(mismatches(changed, want)) == 1, key
    assert mismatches({"rows": [], "clients": []}, want) == [".rows: 0 items, recorded 1"]


def test_a_learning_rate_one_thousandth_higher_fails_the_check(tmp_path):
    """The deliberate small change the tolerance must not hide: FedAvg's rate times 1.001."""
    got = json.loads(json.dumps(run_case("fedavg", tmp_path, **{"train.lr": BASE["train.lr"] * 1.001})))
    off = mismatches(got, GOLDEN["fedavg"], "fedavg")
    assert any("train_loss" in line for line in off), off
