"""FedAvg learns: on synthetic data accuracy rises well above chance within a few rounds."""

from __future__ import annotations

from raysim.engine.runner import run_experiment
from tests.conftest import tiny_config


def test_fedavg_accuracy_rises_well_above_chance(tmp_path):
    cfg = tiny_config(tmp_path, rounds=4, participation=1.0, **{"train.local_epochs": 2})
    result = run_experiment(cfg)
    accs = [row["gm_gtest"] for row in result.rows]
    chance = 1 / 10
    assert accs[0] < accs[-1]
    assert accs[-1] > 5 * chance, accs
    assert result.final["gm_ptest"] > 5 * chance
    assert result.final["lm_ptest"] is None  # FedAvg has no personal model
