"""Configurations that sweep a setting, drawn against it (raysim/suite/sweeps.py): the names read
as a grid writes them, the axes and panels they give, a sweep's default point placed at the value
its trial ran with, and on a real suite the page's figure carrying each series' final values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from raysim.commands.console import main as console_main
from raysim.suite.spec import yaml_safe_load
from raysim.suite.sweeps import figure, name_parts, numeric, sweep_figure, sweep_plan
from tests.engine.test_publish import make_suite_dir

KEYS = ["algo", "lr", "epochs", "local_epochs", "participation", "partition", "beta"]


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("fedavg_local_epochs=1_partition=shard_2", ("fedavg", {"local_epochs": "1", "partition": "shard_2"})),
        ("feddrplus_partition=shard_2_lr=0.1", ("feddrplus", {"partition": "shard_2", "lr": "0.1"})),
        ("fed3p2_last_beta=0.5", ("fed3p2_last", {"beta": "0.5"})),
        ("participation=0.3", ("", {"participation": "0.3"})),
        ("fedavg_epochsx=3", ("fedavg_epochsx=3", {})),  # no setting named epochsx
        ("fedper_dir01", ("fedper_dir01", {})),
    ],
)
def test_names_split_into_a_series_and_its_settings(name: str, want: tuple[str, dict[str, str]]) -> None:
    assert name_parts(name, KEYS) == want


def test_numeric_values_and_numbered_partitions() -> None:
    assert numeric("0.05") == ("", 0.05) and numeric(10) == ("", 10.0) and numeric("1e-3") == ("", 0.001)
    assert numeric("pathological_4") == ("pathological", 4.0) and numeric("dominant:20") == ("dominant", 20.0)
    assert numeric("dirichlet_0.1") == ("dirichlet", 0.1)
    assert numeric("kd+fd") is None and numeric(True) is None and numeric(float("nan")) is None and numeric("none") is None


def summary_of(configs: dict[str, list[str]], mean: dict[str, float] | None = None) -> dict[str, object]:
    """A summary whose configurations set ``configs``' settings, each at ``mean`` (gm_gtest)."""
    return {
        "configs": [
            {"config": c, "settings": s, "seeds": [0], "mean": {"gm_gtest": (mean or {}).get(c, 0.5)}, "std": {"gm_gtest": 0.0}}
            for c, s in configs.items()
        ]
    }


def test_a_key_of_two_values_or_of_words_picks_the_panel_and_two_axes_in_one_name_keep_the_larger(tmp_path: Path) -> None:
    configs = {
        f"fedavg_lr={lr}_partition={p}_rounds={r}": ["algo", "train.lr", "data.partition", "rounds"]
        for lr in ("0.01", "0.1", "0.3", "1")
        for p in ("shard_2", "dirichlet_0.1")
        for r in ("10", "20", "30")
    }
    plan = sweep_plan(summary_of(configs), tmp_path, {})
    assert plan is not None
    assert plan.axes == (("lr", "lr"),)  # rounds (3 values) beside lr (4) in the same names: a panel
    assert plan.panels[:2] == ("partition=shard_2, rounds=10", "partition=shard_2, rounds=20")
    assert len(plan.panels) == 6 and all(len(line.points) == 4 for line in plan.lines)
    # words, or two values only: no axis, no plan
    words = {f"fedavg_regularizers={r}": ["algo", "algo.regularizers"] for r in ("none", "kd", "prox", "kd+fd")}
    two = {f"fedavg_lr={lr}": ["algo", "train.lr"] for lr in ("0.01", "0.1")}
    kinds = {f"fedavg_partition={p}": ["algo", "data.partition"] for p in ("shard_2", "dirichlet_0.1", "pathological_2")}
    for configs in (words, two, kinds, {"fedavg": [], "fedper": []}):
        assert sweep_plan(summary_of(configs), tmp_path, {}) is None
    # a name of settings alone (a grid over the base's algorithm): its series is the algorithm
    alone = {f"lr={lr}": ["train.lr"] for lr in ("0.01", "0.1", "1")}
    plan = sweep_plan(summary_of(alone), tmp_path, {"base": {"algo": "fedper"}})
    assert plan is not None and [(ln.series, ln.algo, [x for x, _ in ln.points]) for ln in plan.lines] == [
        ("fedper", "fedper", [0.01, 0.1, 1.0])
    ]


SUITE = """
name: tiny_sweep
description: FedProx's mu swept from its default on two partitions, and FedAvg's participation
base:
  dataset: synthetic
  model: mlp_fcd
  clients: 4
  data.synthetic.num_classes: 6
  participation: 0.5
  rounds: 1
  local_epochs: 1
  batch_size: 20
  lr: 0.05
  output.tensorboard: false
  data.synthetic.shape: [1, 8, 8]
  data.synthetic.train_samples: 400
  data.synthetic.test_samples: 200
seeds: 0
grid:
  partition: ["dirichlet:0.5", "pathological:3"]
configs:
  - {name: fedprox, set: {algo: fedprox}}
  - {name: fedprox_mu=0.1, set: {algo: fedprox, algo.mu: 0.1}}
  - {name: fedprox_mu=1, set: {algo: fedprox, algo.mu: 1.0}}
  - {name: fedavg, set: {algo: fedavg}}
  - {name: fedavg_participation=0.25, set: {algo: fedavg, participation: 0.25}}
  - {name: fedavg_participation=1, set: {algo: fedavg, participation: 1.0}}
"""


def test_a_real_suite_gets_its_sweeps_drawn_with_the_default_points_at_their_own_values(tmp_path: Path) -> None:
    suite_dir = make_suite_dir(tmp_path, SUITE)
    summary = json.loads((suite_dir / "summary.json").read_text())
    plan = sweep_plan(summary, suite_dir, yaml_safe_load(suite_dir / "suite.yaml"))
    assert plan is not None
    assert plan.axes == (("mu", "mu"), ("participation", "participation"))
    assert plan.panels == ("partition=dirichlet_0.5", "partition=pathological_3")
    lines = {(line.axis, line.panel, line.series): line for line in plan.lines}
    assert len(lines) == 4
    for panel in plan.panels:
        # the default points: FedProx's own mu (its algorithm's default, set nowhere in the suite)
        # and the base's participation, each read from the trial's settings
        mu = lines["mu", panel, "fedprox"]
        assert mu.algo == "fedprox" and mu.points == ((0.01, f"fedprox_{panel}"), (0.1, f"fedprox_mu=0.1_{panel}"), (1.0, f"fedprox_mu=1_{panel}"))
        assert mu.default == f"fedprox_{panel}"
        part = lines["participation", panel, "fedavg"]
        assert [x for x, _ in part.points] == [0.25, 0.5, 1.0] and part.points[1][1] == part.default == f"fedavg_{panel}"
    # the figure: each point at its value's place, at the configuration's final mean over seeds
    out = tmp_path / "page"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc123"]) == 0
    page = (out / "README.md").read_text()
    section = page.split("## Against the swept settings")[1].split("\n## ")[0]
    assert "mu 0.01 (`fedprox`)" in section and "participation 0.5 (`fedavg`)" in section
    assert "![sweep_gm_gtest](sweep_gm_gtest.png)" in section and (out / "sweep_gm_gtest.png").stat().st_size > 5000
    means = {c["config"]: c["mean"]["gm_gtest"] for c in summary["configs"]}
    fig = figure(plan, summary, "gm_gtest")
    assert fig is not None
    grid = [ax for ax in fig.axes if ax.get_title()]
    assert [(ax.get_title(), ax.get_xlabel()) for ax in grid] == [
        ("partition=dirichlet_0.5", ""), ("partition=dirichlet_0.5", ""),
        ("partition=pathological_3", "mu"), ("partition=pathological_3", "participation"),
    ]  # fmt: skip
    for ax, (axis, panel) in zip(grid, [(a, p) for p in plan.panels for a in ("mu", "participation")], strict=True):
        line = next(x for x in plan.lines if x.axis == axis and x.panel == panel)
        [bars] = ax.containers  # one series a panel here: its errorbar's data line
        got = bars.lines[0]
        assert list(got.get_xdata()) == [0, 1, 2]
        assert all(math.isclose(y, 100 * means[c]) for y, (_, c) in zip(got.get_ydata(), line.points, strict=True))
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{x:g}" for x, _ in line.points]
    # a metric none of the configurations reports: no figure
    assert not sweep_figure(plan, summary, "lm_ptest", tmp_path / "none.png") and not (tmp_path / "none.png").exists()
