"""Under ``data.feature_shift`` a run reports G-Test per domain (``gm_gtest_domain_D``) and the
personalised models per domain (``lm_ptest_domain_D``), from the same predictions as the totals;
and the reports are the same on the serial and the Ray executors."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from tests.conftest import tiny_config, without_times

SHIFT = {"data.feature_shift": "rotate:4", "rounds": 2, "eval.every": 1}


def test_g_test_is_reported_per_domain_from_the_global_models_predictions(tmp_path):
    cfg = tiny_config(tmp_path, algo="fedavg", **SHIFT)
    ex = SerialExecutor(cfg, prepare(cfg))
    for rnd in (1, 2):
        ex.train_round(rnd)
    report = ex.evaluate(2)
    data = ex.data
    assert len(report.gtest_domains) == 4 and sum(n for _, n in report.gtest_domains) == len(data.gtest)
    # each domain's copy of G-Test, predicted by hand with the global model
    import torch

    from raysim.models import set_weights

    model = ex.runtime.model
    set_weights(model, ex.server.state.weights)
    model.eval()
    x, y = ex.runtime.gather(data.gtest, np.arange(len(data.gtest)))
    with torch.no_grad():
        right = (model(x).argmax(1) == y).cpu().numpy()
    for d, (correct, total) in enumerate(report.gtest_domains):
        assert total == int((data.gtest_domains == d).sum())
        assert correct == int(right[data.gtest_domains == d].sum())
    assert report.gtest_correct == int(right.sum())


def test_the_rows_carry_each_domains_figures_and_clients_parquet_each_clients_domain(tmp_path):
    run = run_experiment(tiny_config(tmp_path, algo="fedper", **SHIFT))
    row = run.rows[-1]
    clients = [r for r in pq.read_table(tmp_path / "clients.parquet").to_pylist() if r["round"] == 2]
    assert {r["domain"] for r in clients} == {0, 1, 2, 3}
    for d in range(4):
        own = [r["lm_ptest"] for r in clients if r["domain"] == d]
        assert row[f"lm_ptest_domain_{d}"] == pytest.approx(np.mean(own))
    assert "gm_gtest_domain_0" not in row  # FedPer has no global model
    plain = run_experiment(tiny_config(tmp_path / "plain", algo="fedper", rounds=1))
    assert not any("domain" in k for k in plain.rows[-1])  # no shift, no domain columns


@pytest.mark.ray
def test_serial_equals_ray_under_a_feature_shift(tmp_path, ray_local):
    setup = {"algo": "fedavg", **SHIFT, "data.feature_shift": "corrupt:3", "eval.new_clients": 0.25}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["gm_gtest_domain_2"] is not None


def test_cluster_purity_is_the_share_of_clients_in_their_clusters_most_common_domain():
    from raysim.data.feature_shift import assign_domains, cluster_purity

    cfg = tiny_config(clients=8, **{"data.feature_shift": "rotate:4"})
    domains = assign_domains(8, 4, cfg.seed)
    by_domain = [[c for c in range(8) if domains[c] == d] for d in range(4)]
    assert cluster_purity(cfg, by_domain) == 1.0
    assert cluster_purity(cfg, [list(range(8))]) == 2 / 8  # one cluster: its commonest domain holds 2 of 8
    mixed = [by_domain[0] + by_domain[1][:1], by_domain[1][1:] + by_domain[2] + by_domain[3]]
    assert cluster_purity(cfg, mixed) == (2 + 2) / 8
    assert cluster_purity(tiny_config(clients=8), by_domain) is None  # no shift, no purity
    held = tiny_config(clients=8, **{"data.feature_shift": "rotate:4", "eval.new_clients": 0.25})
    others = [c for c in range(8) if c not in held.new_clients]  # the held-out clients are left out
    assert cluster_purity(held, [list(range(8))]) == np.bincount(domains[others]).max() / 6


def test_a_clustered_run_logs_its_purity_each_round(tmp_path):
    from algorithms.ifca import membership
    from raysim.data.feature_shift import cluster_purity

    cfg = tiny_config(tmp_path, algo="ifca", participation=1.0, **SHIFT, **{"algo.num_clusters": 4})
    ex = SerialExecutor(cfg, prepare(cfg))
    ex.train_round(1)
    state = ex.server.state
    want = cluster_purity(cfg, membership(state.chosen, len(state.models)))
    assert want is not None
    run = run_experiment(tiny_config(tmp_path / "run", algo="ifca", participation=1.0, **SHIFT, **{"algo.num_clusters": 4}))
    assert run.rows[0]["cluster_purity"] == pytest.approx(want)
