"""A suite's series against a setting (raysim/suite/against.py): the suite file's ``against`` refused
in one sentence where it is wrong; on a real suite run under client-level DP, the page's table
carries each series' final values from summary.json at each budget, the privacy each trial spent
from its own summary.json, and the figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from raysim.commands.console import main as console_main
from raysim.errors import ConfigError
from raysim.suite.against import parse_against
from raysim.suite.regimes import parse_regimes
from tests.engine.test_publish import make_suite_dir

CONFIGS = ["fedavg_inf", "fedavg_eps2", "fedper_inf", "fedper_eps2", "local_inf"]

SUITE = """
name: tiny_budget
description: two algorithms with and without client-level DP
base:
  dataset: synthetic
  model: mlp_fcd
  clients: 6
  participation: 0.5
  rounds: 1
  local_epochs: 1
  batch_size: 20
  lr: 0.05
  output.tensorboard: false
  data.synthetic.shape: [1, 8, 8]
  data.synthetic.train_samples: 600
  data.synthetic.test_samples: 300
seeds: 0
configs:
  - {name: fedavg_inf, set: {algo: fedavg}}
  - {name: fedavg_eps20, set: {algo: fedavg, privacy.clip: "1.0", privacy.target_epsilon: 20}}
  - {name: fedper_inf, set: {algo: fedper}}
  - {name: fedper_eps20, set: {algo: fedper, privacy.clip: "1.0", privacy.target_epsilon: 20}}
against:
  axis: epsilon
  suffixes: {eps20: 20, inf: .inf}
  metrics: [gm_gtest, lm_ptest]
regimes:
  suffixes: {inf: "no DP", eps20: "epsilon 20"}
  sort: [lm_ptest, gm_ptest]
  metrics: [gm_gtest, lm_ptest, lm_ptest_p10]
  x: client_epochs
"""


def test_a_suite_against_epsilon_gets_its_table_privacy_and_figures(tmp_path: Path) -> None:
    suite_dir = make_suite_dir(tmp_path, SUITE)
    out = tmp_path / "page"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc123"]) == 0
    page = (out / "README.md").read_text()
    section = page.split("## Against epsilon")[1].split("\n## ")[0]
    summary = {c["config"]: c for c in json.loads((suite_dir / "summary.json").read_text())["configs"]}
    tables = {"gm_gtest": section.split("gm_gtest:")[1].split("lm_ptest:")[0], "lm_ptest": section.split("lm_ptest:")[1].split("The privacy")[0]}
    # FedAvg has a global model and no local ones, FedPer (a personal head) the other way round
    for metric, series in (("gm_gtest", "fedavg"), ("lm_ptest", "fedper")):
        rows = {line.split(" | ")[0].strip("| "): line for line in tables[metric].splitlines() if line.startswith("| fed")}
        assert list(rows) == [series]
        cells = [c.strip() for c in rows[series].strip("|").split(" | ")][1:]
        for cell, suffix in zip(cells, ("eps20", "inf"), strict=True):
            c = summary[f"{series}_{suffix}"]
            assert cell == f"{100 * c['mean'][metric]:.2f} ± {100 * c['std'][metric]:.2f}"
    run = json.loads((suite_dir / "runs" / "fedper_eps20-seed0" / "summary.json").read_text())
    spent = [line for line in section.splitlines() if line.startswith("| fedper |") and "," in line][-1]
    assert f"{run['noise_multiplier']:.3f}, {run['epsilon']:.3f} | – |" in spent and 0 < run["epsilon"] <= 20
    # the suite's own table gives each configuration's epsilon spent, its summary's mean over seeds
    table = page.split("## Results")[1].split("<details>")[0]
    assert "epsilon spent" in table
    def cells(config: str) -> list[str]:
        row = next(line for line in table.splitlines() if line.startswith(f"| {config} |"))
        return [c.strip() for c in row.strip("|").split(" | ")]

    assert cells("fedper_eps20")[-2] == f"{run['epsilon']:.3f}" and cells("fedper_inf")[-2] == "–"  # (then the paper's)
    assert (out / "against_epsilon_gm_gtest.png").stat().st_size > 5000
    # by regime (raysim/suite/regimes.py): rows sorted by lm_ptest, or gm_ptest for FedAvg (no local
    # models), the values summary.json's, and the rows near chance (10 classes: every accuracy below
    # 15%) named (lm_ptest_p10: the worst 10% of FedPer's clients at the trial's last round, metrics.parquet's)
    import pyarrow.parquet as pq

    last = {}
    for r in sorted(pq.read_table(suite_dir / "metrics.parquet").to_pylist(), key=lambda r: r["round"]):
        last[r["config"]] = r
    by_regime = page.split("## By regime")[1].split("\n## ")[0]
    assert "`lm_ptest_p10`: the mean over the worst 10% of the clients" in by_regime
    assert "sorted by final `lm_ptest`, or `gm_ptest` where a row has none" in by_regime
    assert "| client epochs |" in by_regime
    for suffix, title in (("inf", "no DP"), ("eps20", "epsilon 20")):
        block = by_regime.split(f"### {title}")[1].split("### ")[0]
        rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in block.splitlines() if line.startswith("| fed")]
        used = {"fedper": summary[f"fedper_{suffix}"]["mean"]["lm_ptest"], "fedavg": summary[f"fedavg_{suffix}"]["mean"]["gm_ptest"]}
        assert [r[0] for r in rows] == sorted(used, key=lambda n: -used[n])
        for name, *cells in rows:
            c = summary[f"{name}_{suffix}"]
            for cell, m in zip(cells[:2], ("gm_gtest", "lm_ptest"), strict=True):
                v = c["mean"][m]
                assert cell == ("–" if v is None else f"{100 * v:.2f} ± {100 * c['std'][m]:.2f}")
            worst = last[f"{name}_{suffix}"]["lm_ptest_p10"]
            assert cells[2] == ("–" if worst is None else f"{100 * worst:.2f} ± 0.00")
            assert cells[3] == f"{last[f'{name}_{suffix}']['client_epochs']:.0f}"  # the compute spent, one seed
            assert name == "fedavg" or worst < c["mean"]["lm_ptest"]
        near = [n for n in ("fedper", "fedavg") if all(v < 1 / 10 + 0.05 for v in (summary[f"{n}_{suffix}"]["mean"][m] for m in ("gm_gtest", "lm_ptest")) if v is not None)]
        assert ("Near chance" in block) == bool(near) and all(n in block.split("Near chance")[-1] for n in near)
    assert (out / "against_epsilon_lm_ptest.png").is_file()
    # the curves against the clients' epochs, as the regimes entry says
    from raysim.suite.layout import suite_layout

    assert suite_layout(suite_dir).x == "client_epochs"


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ([1, 2], "is a mapping"),
        ({"axis": "epsilon", "suffixes": {"inf": math.inf}, "colour": "red"}, "Unknown key 'colour'"),
        ({"axis": "", "suffixes": {"inf": math.inf}}, "against.axis"),
        ({"axis": 3, "suffixes": {"inf": math.inf}}, "against.axis"),
        ({"axis": "epsilon", "suffixes": []}, "maps name suffixes"),
        ({"axis": "epsilon", "suffixes": {"eps_2": 2}}, "is not a name suffix"),
        ({"axis": "epsilon", "suffixes": {"eps2": "two"}}, "is a number"),
        ({"axis": "epsilon", "suffixes": {"eps2": True}}, "is a number"),
        ({"axis": "epsilon", "suffixes": {"eps2": 2}, "metrics": "gm_gtest"}, "is a list of metrics"),
        ({"axis": "epsilon", "suffixes": {"eps2": 2}, "metrics": ["gm_test"]}, "'gm_test' is not one of"),
        ({"axis": "epsilon", "suffixes": {"eps9": 9}}, "place no configuration"),
    ],
)
def test_a_wrong_against_entry_is_refused_in_one_sentence(entry, words) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        parse_against(entry, CONFIGS, "tiny.yaml")
    assert str(err.value).count(". ") == 0


def test_a_suffix_places_a_configuration_by_the_longest_match() -> None:
    against = parse_against({"axis": "q", "suffixes": {"q1": 0.1, "q01": 0.01}}, ["a_q01", "b_q1", "c"], "x")
    assert against.place("a_q01") == ("a", 0.01) and against.place("b_q1") == ("b", 0.1)
    assert against.place("c") is None and against.place("_q1") is None


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("dir01", "is a mapping"),
        ({"suffixes": {"inf": "no DP"}, "order": "up"}, "Unknown key 'order'"),
        ({"suffixes": []}, "maps name suffixes"),
        ({"suffixes": {"in_f": "no DP"}}, "is not a name suffix"),
        ({"suffixes": {"inf": 3}}, "title is a text"),
        ({"suffixes": {"inf": "no DP"}, "sort": "lm_test"}, "'lm_test' is not one of"),
        ({"suffixes": {"inf": "no DP"}, "metrics": ["lm_ptest_p20"]}, "'lm_ptest_p20' is not one of"),
        ({"suffixes": {"inf": "no DP"}, "metrics": ["lm_test_p10"]}, "'lm_test_p10' is not one of"),
        ({"suffixes": {"inf": "no DP"}, "metrics": "gm_gtest"}, "is a list of metrics"),
        ({"suffixes": {"inf": "no DP"}, "sort": []}, "is a metric or a list of metrics"),
        ({"suffixes": {"inf": "no DP"}, "sort": 3}, "is a metric or a list of metrics"),
        ({"suffixes": {"inf": "no DP"}, "sort": ["lm_ptest", "gm_test"]}, "'gm_test' is not one of"),
        ({"suffixes": {"inf": "no DP"}, "x": "epochs"}, "regimes.x in tiny.yaml is one of round, client_epochs"),
        ({"suffixes": {"inf": "no DP"}, "x": "sim_time_s"}, "regimes.x"),
        ({"suffixes": {"inf": "no DP"}, "x": 3}, "regimes.x"),
        ({"suffixes": {"dir01": "Dir(0.1)"}}, "place no configuration"),
    ],
)
def test_a_wrong_regimes_entry_is_refused_in_one_sentence(entry, words) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        parse_regimes(entry, CONFIGS, "tiny.yaml")
    assert str(err.value).count(". ") == 0


def test_each_regime_row_is_sorted_by_the_first_sort_metric_it_has() -> None:
    """FedAvg has no local models: sorted by lm_ptest alone it follows every row that has one; by
    [lm_ptest, gm_ptest] it takes its place by the global model its clients use."""
    from raysim.suite.regimes import regime_sections

    def config(name: str, **mean: float | None) -> dict:
        return {"config": name, "seeds": [0], "mean": mean, "std": {k: 0.0 for k in mean}}

    summary = {
        "configs": [
            config("fedavg_inf", gm_gtest=0.70, gm_ptest=0.80, lm_ptest=None),
            config("fedper_inf", gm_gtest=None, gm_ptest=None, lm_ptest=0.75),
            config("local_inf", gm_gtest=None, gm_ptest=None, lm_ptest=0.90),
        ]
    }

    def order(sort: object) -> list[str]:
        regimes = parse_regimes({"suffixes": {"inf": "no DP"}, "sort": sort, "metrics": ["gm_gtest", "gm_ptest", "lm_ptest"]}, CONFIGS, "x")
        lines = regime_sections(regimes, summary, 10)
        return [line.split(" | ")[0].strip("| ") for line in lines if line.startswith("| ") and not line.startswith("| |")]

    assert order("lm_ptest") == ["local", "fedper", "fedavg"]
    assert order(["lm_ptest", "gm_ptest"]) == ["local", "fedavg", "fedper"]
    assert order(["gm_ptest"]) == ["fedavg", "local", "fedper"]  # rows with none: by their first metric present


def test_the_trials_whose_training_loss_is_not_finite_are_named_by_seed_beneath_their_regime() -> None:
    """One seed of FedAS diverged (NaN from its second evaluation on): its row's mean stays far from
    chance, so only the per-seed check names it; a loss that was NaN and finite again by the last
    evaluation, an infinite one, and a trial without a training loss are read at the last round."""
    from raysim.suite.regimes import regime_sections

    nan, inf = float("nan"), float("inf")

    def config(name: str, lm: float) -> dict:
        return {"config": name, "seeds": [0, 1], "mean": {"lm_ptest": lm}, "std": {"lm_ptest": 0.0}}

    summary = {"configs": [config("fedas_inf", 0.52), config("feddbe_inf", 0.10), config("fedper_inf", 0.9), config("local_inf", 0.9)]}
    losses = {
        ("fedas_inf", 0): (0.3, 0.2), ("fedas_inf", 1): (0.3, nan),
        ("feddbe_inf", 0): (nan, nan), ("feddbe_inf", 1): (0.5, inf),
        ("fedper_inf", 0): (nan, 0.4), ("fedper_inf", 1): (0.5, 0.4),
        ("local_inf", 0): (None, None), ("local_inf", 1): (0.5, 0.4),
    }  # fmt: skip
    rows = [
        {"config": c, "seed": s, "round": rnd, "train_loss": loss, "lm_ptest": 0.5}
        for (c, s), pair in losses.items()
        for rnd, loss in zip((10, 5), pair[::-1], strict=True)  # the last round first: order is the round's
    ]
    regimes = parse_regimes({"suffixes": {"inf": "no DP"}, "metrics": ["lm_ptest"]}, CONFIGS, "x")
    block = "\n".join(regime_sections(regimes, summary, 10, rows))
    assert "Diverged (training loss not finite at the last evaluation): fedas (seed 1 of 2), feddbe (seeds 0, 1 of 2)." in block
    assert block.count("Diverged") == 1 and "Near chance (10% for 10 classes; every accuracy shown within 5 points of it): feddbe." in block
    assert "Diverged" not in "\n".join(regime_sections(regimes, summary, 10, [r for r in rows if r["config"] == "local_inf"]))


def test_rows_equal_to_the_bit_at_every_evaluation_of_every_seed_are_named_together() -> None:
    """APFL's global model is FedAvg's: its gm_* equal FedAvg's at every round of both seeds, and
    the page says so beneath the regime; Ditto's differ at one round of one seed, so it is not
    named; CFL's and FedClust's lm_ptest are equal (their gm_* absent); two rows at chance are
    alike without being one model, so they are left out."""
    from raysim.suite.regimes import regime_sections

    names = ["apfl_inf", "fedavg_inf", "ditto_inf", "cfl_inf", "fedclust_inf", "fedas_inf", "feddbe_inf"]
    summary = {"configs": [{"config": c, "seeds": [0, 1], "mean": {"gm_gtest": 0.5, "lm_ptest": 0.8}, "std": {}} for c in names]}
    summary["configs"][-2]["mean"] = summary["configs"][-1]["mean"] = {"gm_gtest": 0.1, "lm_ptest": 0.1}

    def row(config: str, seed: int, rnd: int) -> dict:
        gm = 0.5 + seed / 10 + rnd / 100
        lm = 0.7 + seed / 10 + rnd / 100
        if config in ("fedas_inf", "feddbe_inf"):
            return {"config": config, "seed": seed, "round": rnd, "gm_gtest": 0.1, "lm_ptest": 0.1}
        if config in ("cfl_inf", "fedclust_inf"):
            return {"config": config, "seed": seed, "round": rnd, "gm_gtest": None, "lm_ptest": lm}
        if config == "ditto_inf" and (seed, rnd) == (1, 10):
            gm += 1e-9
        return {"config": config, "seed": seed, "round": rnd, "gm_gtest": gm, "lm_ptest": lm + len(config) / 1000}

    rows = [row(c, s, rnd) for c in names for s in (0, 1) for rnd in (5, 10)]
    regimes = parse_regimes({"suffixes": {"inf": "no DP"}, "metrics": ["gm_gtest", "lm_ptest"]}, [*CONFIGS, *names], "x")
    block = "\n".join(regime_sections(regimes, summary, 10, rows))
    assert "Equal to the bit at every evaluation of every seed: gm_gtest: apfl = fedavg; lm_ptest: cfl = fedclust." in block, block
    # one seed alone equal is not enough
    rows = [r for r in rows if not (r["config"] == "fedclust_inf" and r["seed"] == 1)]
    block = "\n".join(regime_sections(regimes, summary, 10, rows))
    assert "Equal to the bit at every evaluation of every seed: gm_gtest: apfl = fedavg." in block, block
