"""The golden test: every registered algorithm, and the variants whose code paths differ, gives on
a short serial run exactly the metrics recorded in ``tests/golden_metrics.json`` (see
``tests/golden.py``): a change of structure moves no number, to the last bit."""

from __future__ import annotations

import json

import pytest

from tests.golden import CASES, GOLDEN_FILE, run_case

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
    # every recorded column, to the last bit (columns added since are not in the file)
    want = GOLDEN[name]["rows"]
    assert len(got["rows"]) == len(want)
    assert [{k: row[k] for k in w} for row, w in zip(got["rows"], want, strict=True)] == want
    assert got["clients"] == GOLDEN[name]["clients"]
