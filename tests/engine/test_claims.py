"""A paper's claims declared in a suite file and judged seed by seed (raysim/suite/claims.py); the
paper's setting against what ran; notes without verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from raysim.commands.console import main as console_main
from raysim.errors import ConfigError
from raysim.suite.claims import (
    CANNOT_BE_TOLD,
    DOES_NOT_HOLD,
    HOLDS_EVERY,
    claim_dict,
    judge,
    parse_claims,
    setting_differences,
    verdict_of,
    verdict_phrases,
)
from tests.engine.test_publish import SUITE, make_suite_dir

ROWS = ["a", "b", "c"]


def trials(values: dict[str, list[float]], metric: str = "gm_gtest", stat: str = "final") -> dict:
    """(row, seed) -> stat -> metric -> value, from each row's value per seed."""
    return {(r, s): {stat: {metric: v}} for r, vs in values.items() for s, v in enumerate(vs)}


def one(entry: dict) -> object:
    return parse_claims([{"metric": "gm_gtest", "stat": "final", "where": "Table 1", **entry}], ROWS)[0]


def test_one_seed_above_the_paper_and_one_below_holds_on_one_of_two():
    claim = one({"row": "a", "paper": 80.0, "within": 0.0, "side": "at_least"})
    v = judge(claim, trials({"a": [81.0, 79.0]}), [0, 1])
    assert v.verdict == "holds on 1 of 2"
    assert v.margins == [pytest.approx(1.0), pytest.approx(-1.0)]
    assert judge(claim, trials({"a": [81.0, 80.5]}), [0, 1]).verdict == HOLDS_EVERY


def test_a_figure_within_its_tolerance_either_side():
    claim = one({"row": "a", "paper": 80.0, "within": 1.0})
    assert judge(claim, trials({"a": [80.9, 79.2]}), [0, 1]).verdict == HOLDS_EVERY
    assert judge(claim, trials({"a": [81.5, 79.2]}), [0, 1]).verdict == "holds on 1 of 2"
    # both seeds 3 points off, 0.2 apart: beyond the spread
    assert judge(claim, trials({"a": [76.0, 76.2]}), [0, 1]).verdict == DOES_NOT_HOLD


def test_a_miss_inside_the_seed_spread_cannot_be_told():
    assert verdict_of([-0.1, -5.0]) == CANNOT_BE_TOLD  # mean -2.55, std 3.46
    assert verdict_of([-3.0, -3.2]) == DOES_NOT_HOLD
    assert verdict_of([0.5, 0.1, 2.0]) == HOLDS_EVERY
    assert verdict_of([0.5, -0.1, -2.0]) == "holds on 1 of 3"
    assert verdict_of([]) == CANNOT_BE_TOLD


def test_better_pairs_the_rows_seed_by_seed():
    claim = one({"better": "a", "than": "b"})
    v = judge(claim, trials({"a": [90.0, 70.0], "b": [80.0, 60.0]}), [0, 1])
    assert v.verdict == HOLDS_EVERY and v.margins == [10.0, 10.0]
    # a's mean is above b's, but seed 1 has b above
    v = judge(claim, trials({"a": [90.0, 60.0], "b": [70.0, 65.0]}), [0, 1])
    assert v.verdict == "holds on 1 of 2"


def test_better_may_read_the_second_row_from_another_accuracy():
    """FedBN's local models against FedAvg's global model: the first row's lm_ptest, the second's
    gm_ptest, seed by seed; a row without its quantity cannot be told, and says which."""
    claim = one({"better": "a", "than": "b", "metric": "lm_ptest", "than_metric": "gm_ptest"})
    values = {("a", 0): {"final": {"lm_ptest": 91.0, "gm_ptest": 50.0}}, ("b", 0): {"final": {"gm_ptest": 88.0, "lm_ptest": 99.0}}}
    v = judge(claim, values, [0])
    assert v.margins == [3.0] and v.verdict == HOLDS_EVERY
    assert claim.text() == "`a` lm_ptest (final, %) above `b` gm_ptest"
    v = judge(claim, {("a", 0): {"final": {"lm_ptest": 91.0}}, ("b", 0): {"final": {"lm_ptest": 80.0}}}, [0])
    assert v.verdict == CANNOT_BE_TOLD and "no lm_ptest or gm_ptest for b seed 0" == v.reason


def test_an_order_holds_where_every_step_does_and_a_trend_where_every_step_goes_its_way():
    order = one({"order": ["a", "b", "c"]})
    v = judge(order, trials({"a": [90.0, 90.0], "b": [85.0, 80.0], "c": [80.0, 81.0]}), [0, 1])
    assert v.margins == [5.0, -1.0] and v.verdict == "holds on 1 of 2"
    falls = one({"trend": ["a", "b", "c"], "direction": "falls"})
    rises = one({"trend": ["c", "b", "a"], "direction": "rises"})
    values = trials({"a": [90.0], "b": [85.0], "c": [82.0]})
    assert judge(falls, values, [0]).margins == [3.0] == judge(rises, values, [0]).margins


def test_similar_rows_lie_within_the_tolerance_of_each_other_seed_by_seed():
    claim = one({"similar": ["a", "b", "c"], "within": 1.0})
    v = judge(claim, trials({"a": [90.0, 90.0], "b": [90.4, 91.5], "c": [89.8, 90.2]}), [0, 1])
    assert v.margins == [pytest.approx(0.4), pytest.approx(-0.5)] and v.verdict == "holds on 1 of 2"
    assert "within 1 of each other on gm_gtest (final, %)" in claim.text()


def test_a_missing_number_cannot_be_told_and_says_which():
    claim = one({"better": "a", "than": "b"})
    v = judge(claim, trials({"a": [90.0, 91.0], "b": [80.0]}), [0, 1])
    assert v.verdict == CANNOT_BE_TOLD and "b seed 1" in v.reason


@pytest.mark.parametrize(
    ("entry", "sentence"),
    [
        ({"row": "z", "paper": 80, "within": 1}, "names 'z', which is no configuration of the suite"),
        (
            {"row": "a", "paper": 80, "within": 1, "stat": "median"},
            "stat is one of final, last_k, best, mean, not 'median'",
        ),
        ({"row": "a", "paper": 80, "within": 1, "metric": "accuracy"}, "metric is one of"),
        ({"row": "a", "paper": 80, "within": 1, "metric": "gm_class_acc"}, "metric is one of"),
        (
            {"better": "a", "than": "b", "metric": "train_s_per_round"},
            "train_s_per_round is a mean over the run: its stat is mean, not 'final'",
        ),
        (
            {"better": "a", "than": "b", "metric": "local_obs_fdist", "stat": "best"},
            "stat best is an accuracy's highest value; local_obs_fdist takes final, last_k or mean",
        ),
        ({"row": "a", "paper": "80%", "within": 1}, "paper is a number, not '80%'"),
        ({"row": "a", "paper": 80, "within": -1}, "within is a tolerance, at least 0"),
        ({"row": "a", "paper": 80, "within": 1, "side": "above"}, "side is within or at_least, not 'above'"),
        ({"row": "a", "paper": 80}, "needs 'within'"),
        ({"better": "a"}, "needs 'than'"),
        ({"order": ["a"]}, "order is a list of at least two configurations"),
        ({"trend": ["a", "b"], "direction": "up"}, "direction is rises or falls, not 'up'"),
        ({"best": "a"}, "none of the claim forms"),
        ({"similar": ["a", "b"]}, "needs 'within'"),
        ({"similar": "a", "within": 1}, "similar is a list of at least two configurations"),
        ({"similar": ["a", "b"], "within": -0.5}, "within is a tolerance, at least 0, not -0.5"),
        ({"row": "a", "paper": 80, "within": 1, "where": " "}, "must say where the paper makes it"),
        ({"better": "a", "than": "a"}, "names a configuration twice"),
        ({"better": "a", "than": "b", "than_metric": "gm_ptst"}, "than_metric is one of"),
        ({"better": "a", "than": "b", "than_metric": "train_loss"}, "compares gm_gtest with train_loss, which is not in the same unit"),
        ({"order": ["a", "b"], "than_metric": "gm_ptest"}, "unknown entry 'than_metric'"),
    ],
)
def test_a_bad_claim_is_refused_in_one_sentence(entry, sentence):
    with pytest.raises(ConfigError, match=sentence.replace("(", r"\(")):
        parse_claims([{"metric": "gm_gtest", "stat": "final", "where": "Table 1", **entry}], ROWS, "s.yaml")


def test_a_claim_reads_back_as_it_was_written():
    for entry in (
        {"row": "a", "paper": 80.0, "within": 1.0},
        {"row": "a", "paper": 80.0, "within": 0.0, "side": "at_least"},
        {"better": "a", "than": "b"},
        {"better": "a", "than": "b", "than_metric": "gm_ptest"},
        {"order": ["a", "b", "c"]},
        {"trend": ["a", "b"], "direction": "rises"},
        {"similar": ["a", "b", "c"], "within": 0.5},
    ):
        claim = one(entry)
        assert parse_claims([claim_dict(claim)], ROWS) == (claim,)


def test_the_settings_that_differ_from_the_papers_are_listed_every_one():
    ran = {
        "fedavg": {
            "algo": "fedavg",
            "rounds": 30,
            "data": {"dataset": "fmnist"},
            "train": {"lr": 0.01},
            "algo_params": {},
        },
        "fedfcd": {
            "algo": "fedfcd",
            "rounds": 30,
            "data": {"dataset": "fmnist"},
            "train": {"lr": 0.05},
            "algo_params": {},
        },
    }
    paper = {"rounds": 100, "data.dataset": "fmnist", "train.lr": 0.01, "algo.lambda": 5.0}
    lines = setting_differences(paper, ran)
    assert lines == [
        "- `rounds`: the paper's 100; ran 30 (every configuration)",
        "- `train.lr`: the paper's 0.01; ran 0.05 in `fedfcd`",
        # FedAvg has no lambda (no difference); FedFCD's default is 1.0 (its Config's)
        "- `algo.lambda`: the paper's 5.0; ran 1.0 in `fedfcd`",
    ]
    assert setting_differences({"rounds": 30}, ran) == []
    # lambda as FedFCD's only: GPFL's lambda is another parameter
    ran["gpfl"] = {"algo": "gpfl", "rounds": 30, "algo_params": {"lambda": 0.01}}
    assert setting_differences({"algo.lambda": {"fedfcd": 5.0}}, ran) == [
        "- `algo.lambda`: the paper's 5.0 (fedfcd); ran 1.0 in `fedfcd`"
    ]
    assert setting_differences({"algo.lambda": {"fedfcd": 1.0}}, ran) == []


def test_the_page_judges_the_suites_claims_and_lists_the_settings_that_differ(tmp_path: Path):
    text = (
        SUITE
        + """
paper_setting: {rounds: 100, clients: 6, lr: 0.01}
claims:
  - {better: fedrep_partition=dirichlet_0.1, than: fedavg_partition=dirichlet_0.1, metric: lm_ptest, stat: final, where: Table 1}
  - {row: fedavg_partition=dirichlet_0.5, paper: 81.1, within: 100, metric: gm_gtest, stat: best, where: Table 1}
"""
    )
    suite_dir = make_suite_dir(tmp_path, text)
    out = tmp_path / "page"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc"]) == 0
    page = (out / "README.md").read_text()
    assert "- `rounds`: the paper's 100; ran 3 (every configuration)" in page
    assert "- `train.lr`: the paper's 0.01; ran 0.05 (every configuration)" in page
    assert "`clients`" not in page.split("## The paper's setting")[1].split("## Claims")[0]
    claims = page.split("## Claims")[1]
    # FedAvg reports no lm_ptest: the first claim cannot be told, and says why
    assert "**cannot be told** (no lm_ptest for fedavg_partition=dirichlet_0.1 seed 0" in claims
    assert "**holds on every seed**" in claims  # within 100 points of anything
    # a newer suite file's claims judge an older suite directory
    newer = tmp_path / "newer.yaml"
    newer.write_text(
        SUITE
        + "claims:\n  - {row: fedavg_partition=dirichlet_0.5, paper: 181.1, within: 1, metric: gm_gtest, stat: best, where: T1}\n"
    )
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--suite-file", str(newer)]) == 0
    assert "**does not hold**" in (out / "README.md").read_text()  # some 100 points short on both seeds
    assert console_main(["report", str(suite_dir), "--suite-file", str(newer)]) == 2


def test_notes_carry_no_verdict():
    assert verdict_phrases("FedRep's heads help; the claim holds on both seeds.") == ["holds on"]
    assert verdict_phrases("Each client holds two classes; the split is the paper's.") == []
    assert verdict_phrases("This Reproduces the paper. It does not hold.") == ["Reproduces", "does not hold"]


def test_no_published_page_with_claims_has_a_verdict_in_its_notes():
    """A page's judgement is its computed claims; its notes.md explains and caveats."""
    pages = Path(__file__).resolve().parents[2] / "docs" / "results"
    for readme in pages.glob("*/README.md"):
        notes = readme.with_name("notes.md")
        if "## Claims" in readme.read_text() and notes.is_file():
            assert verdict_phrases(notes.read_text()) == [], notes


def test_the_page_gives_each_configurations_time_per_round_from_its_trials(tmp_path: Path):
    import json

    from raysim.suite.publish import time_table

    suite_dir = make_suite_dir(tmp_path)
    summary = json.loads((suite_dir / "summary.json").read_text())
    table = time_table(suite_dir, summary)
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == len(summary["configs"]) == 4
    name = summary["configs"][0]["config"]
    runs = [json.loads((suite_dir / "runs" / f"{name}-seed{s}" / "summary.json").read_text()) for s in (0, 1)]
    want = sum(r["train_time_s"] / r["rounds"] for r in runs) / 2
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:2] == [name, "2"] and float(cells[2]) == pytest.approx(want, abs=0.006)


def test_a_claim_reads_the_analyses_as_recorded_and_accuracies_in_percent():
    from raysim.suite.claims import trial_values

    rows = [
        {"config": "a", "seed": 0, "round": r, "gm_gtest": acc, "local_obs_fdist": d, "local_obs_acc": 0.5}
        for r, acc, d in ((5, 0.60, 4.0), (10, 0.70, 2.0), (15, 0.65, None))
    ]
    got = trial_values(rows, last_k=2, times={("a", 0): 1.25})[("a", 0)]
    assert got["final"]["gm_gtest"] == pytest.approx(65.0) and got["best"]["gm_gtest"] == pytest.approx(70.0)
    assert got["last_k"]["gm_gtest"] == pytest.approx(67.5) and got["mean"]["gm_gtest"] == pytest.approx(65.0)
    # a distance as recorded, its mean over the rounds that have it; no final where the last round lacks it
    assert got["mean"]["local_obs_fdist"] == pytest.approx(3.0) and "local_obs_fdist" not in got["final"]
    assert "local_obs_fdist" not in got["best"] and got["mean"]["local_obs_acc"] == pytest.approx(50.0)
    assert got["mean"]["train_s_per_round"] == 1.25


def test_the_page_judges_a_claim_on_the_time_per_round(tmp_path: Path):
    """A time claim reads each trial's own training time per round (its summary.json), the same
    figure as the page's time table, and the page gives its unit."""
    import json

    from raysim.suite.claims import trial_times

    text = (
        SUITE
        + """
claims:
  - {better: fedrep_partition=dirichlet_0.1, than: fedavg_partition=dirichlet_0.1, metric: train_s_per_round, stat: mean, where: Table 9}
"""
    )
    suite_dir = make_suite_dir(tmp_path, text)
    times = trial_times(suite_dir)
    assert len(times) == 8
    run = json.loads((suite_dir / "runs" / "fedavg_partition=dirichlet_0.1-seed1" / "summary.json").read_text())
    assert times[("fedavg_partition=dirichlet_0.1", 1)] == pytest.approx(run["train_time_s"] / run["rounds"])
    out = tmp_path / "page"
    assert console_main(["report", "--publish", str(suite_dir), str(out)]) == 0
    claims = (out / "README.md").read_text().split("## Claims")[1]
    row = next(line for line in claims.splitlines() if "train_s_per_round" in line)
    assert "train_s_per_round (mean, s)" in row
    margins = [(times[("fedrep_partition=dirichlet_0.1", s)] - times[("fedavg_partition=dirichlet_0.1", s)]) for s in (0, 1)]
    assert row.split(" | ")[3] == ", ".join(f"{m:+.2f}" for m in margins)
