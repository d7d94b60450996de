"""FedDr+'s analyses (``eval.analyses``): per-class accuracy, accuracy, alignment and feature
norm on each client's observed and unobserved classes, for the global and the local models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.results.analysis import ANALYSIS_COLUMNS, ClassStats
from tests.conftest import run_round, tiny_config, without_times

SETUP = {"rounds": 2, "eval.every": 1, "data.partition": "shard:2", "eval.analyses": True}


def _manual(model, data, observed):
    """Accuracy, mean cos(f, v_y) and mean ||f|| of ``model`` on G-Test's observed and unobserved
    classes, computed here from scratch."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(data.gtest.features(np.arange(len(data.gtest))))
    y = torch.from_numpy(data.gtest.y)
    model.eval()
    with torch.no_grad():
        f = model.filter(model.extractor(x))
        pred = model.head(f).argmax(1)
        cos = F.cosine_similarity(f, model.head.weight[y], dim=1)
        norm = f.norm(dim=1)
    out = {}
    obs = torch.from_numpy(observed[data.gtest.y])
    for side, mask in (("obs", obs), ("unobs", ~obs)):
        out[f"{side}_acc"] = float((pred[mask] == y[mask]).double().mean())
        out[f"{side}_align"] = float(cos[mask].double().mean())
        out[f"{side}_norm"] = float(norm[mask].double().mean())
    return out


def test_class_stats_split_a_hand_example():
    y = np.array([0, 0, 1, 2, 2, 2])
    correct = np.array([1, 0, 1, 1, 1, 0], bool)
    align = np.array([0.5, 0.1, 0.9, -0.2, 0.4, 0.1])
    norm = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    s = ClassStats.of(y, correct, align, norm, 4)
    assert s.class_accuracy() == [0.5, 1.0, pytest.approx(2 / 3), None]
    got = s.split(np.array([True, False, True, False]))  # observed: classes 0 and 2
    assert got["obs_acc"] == pytest.approx(3 / 5) and got["unobs_acc"] == 1.0
    assert got["obs_align"] == pytest.approx((0.5 + 0.1 - 0.2 + 0.4 + 0.1) / 5)
    assert got["unobs_norm"] == 3.0 and got["obs_norm"] == pytest.approx(18 / 5)
    none = s.split(np.ones(4, bool))  # no unobserved class: no values
    assert none["unobs_acc"] is None and none["obs_acc"] == pytest.approx(4 / 6)


def test_observed_and_unobserved_partition_each_clients_test_samples(tmp_path):
    res = run_experiment(tiny_config(tmp_path, **SETUP))
    clients = pd.read_parquet(tmp_path / "clients.parquet")
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    cfg = tiny_config(tmp_path, **SETUP)
    data = prepare(cfg)
    y = data.gtest.y
    observed = data.train_label_counts() > 0
    for rnd, row in zip(metrics["round"], res.rows, strict=True):
        acc = np.array(row["gm_class_acc"], dtype=float)
        counts = np.bincount(y, minlength=10)
        assert float(np.dot(acc, counts) / counts.sum()) == pytest.approx(row["gm_gtest"], abs=1e-9)
        for _, c in clients[clients["round"] == rnd].iterrows():
            n_obs = int(observed[c["client"]][y].sum())
            assert 0 < n_obs < len(y)  # two shards: both sides are non-empty
            # the two sides are a partition of G-Test: their correct counts add up to the whole
            total = c["gm_obs_acc"] * n_obs + c["gm_unobs_acc"] * (len(y) - n_obs)
            assert total == pytest.approx(row["gm_gtest"] * len(y), abs=1e-6)
            # the class accuracies give the same split
            want = np.dot(acc * counts, observed[c["client"]]) / n_obs
            assert c["gm_obs_acc"] == pytest.approx(want, abs=1e-9)
    # local values only for the round's trained clients
    trained = clients[clients["round"] == 1]["local_obs_acc"].notna()
    assert 0 < trained.sum() < len(trained)
    assert set(ANALYSIS_COLUMNS) <= set(clients.columns)
    assert row["local_obs_acc"] == pytest.approx(
        clients[clients["round"] == 2]["local_obs_acc"].dropna().mean()
    )


def test_values_are_the_global_and_local_models_own_and_change_no_number(tmp_path):
    """The local values are those of the model the client's update left, the global ones those of
    the global model, each on its own observed classes; with analyses off, every number is the same."""
    from raysim.models import set_weights

    on = SerialExecutor(cfg := tiny_config(tmp_path / "on", **SETUP), prepare(cfg))
    off = SerialExecutor(cfg2 := tiny_config(tmp_path / "off", **{**SETUP, "eval.analyses": False}), prepare(cfg2))
    (a,) = run_round(on, 1, [2])
    (b,) = run_round(off, 1, [2])
    assert a.weights.equals(b.weights) and b.analysis is None
    data = off.runtime.data
    observed = data.train_label_counts()[2] > 0
    want = _manual(off.runtime.model, data, observed)  # the model client 2's update left
    for k, v in want.items():
        assert a.analysis[f"local_{k}"] == pytest.approx(v, rel=1e-5), k
    report = on.evaluate(1)
    set_weights(off.runtime.model, off.server.evaluation().payload)
    want = _manual(off.runtime.model, data, data.train_label_counts()[5] > 0)
    for k, v in want.items():
        assert report.clients[5].gm_split[k] == pytest.approx(v, rel=1e-5), k
    plain = off.evaluate(1)
    assert plain.gm_class_acc is None and plain.clients[5].gm_split is None
    assert [c.gm_correct for c in plain.clients] == [c.gm_correct for c in report.clients]


def test_analyses_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_experiment(tiny_config(tmp_path, **SETUP, **{"output.tensorboard": True}))
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"analysis/local_unobs_acc", "analysis/gm_obs_align", "classes/gm_acc/0"} <= tags
    assert [e.step for e in acc.Scalars("analysis/local_obs_norm")] == [1, 2]


@pytest.mark.ray
def test_analyses_are_the_same_on_serial_and_ray(tmp_path, ray_local):
    serial = run_experiment(tiny_config(tmp_path / "s", **SETUP))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **SETUP, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    a = pd.read_parquet(tmp_path / "s" / "clients.parquet")
    b = pd.read_parquet(tmp_path / "r" / "clients.parquet")
    pd.testing.assert_frame_equal(a, b)


def test_feature_drift_a_hand_example():
    """FedDr+'s Fig. 4 values for a sample whose feature turns from (0, 5) to (3, 4): distance
    sqrt(10), angle arccos(0.8) = 36.87 degrees, no change of norm; and (1, 0) to (0, 2): sqrt(5),
    90 degrees, norm +1."""
    from raysim.results.analysis import drift_split, feature_drift

    local = np.array([[3.0, 4.0], [0.0, 2.0], [2.0, 0.0]])
    start = np.array([[0.0, 5.0], [1.0, 0.0], [1.0, 0.0]])
    dist, angle, normdiff = feature_drift(local, start)
    assert dist == pytest.approx([np.sqrt(10), np.sqrt(5), 1.0])
    assert angle == pytest.approx([np.degrees(np.arccos(0.8)), 90.0, 0.0])
    assert normdiff == pytest.approx([0.0, 1.0, 1.0])
    got = drift_split(np.array([0, 1, 1]), (dist, angle, normdiff), np.array([True, False]))
    assert got["obs_fdist"] == pytest.approx(np.sqrt(10)) and got["obs_fnormdiff"] == pytest.approx(0.0)
    assert got["unobs_fangle"] == pytest.approx(45.0) and got["unobs_fdist"] == pytest.approx((np.sqrt(5) + 1) / 2)
    assert drift_split(np.array([0]), feature_drift(local[:1], start[:1]), np.array([True, False]))["unobs_fdist"] is None


def test_feature_drift_is_from_the_received_model_to_the_local_one(tmp_path):
    """Round 1's client starts from the initial model: its drift values are those of the features of
    the initial model and of the model its update left, computed here from scratch."""
    import torch

    from raysim.models import build_model, set_weights

    ex = SerialExecutor(cfg := tiny_config(tmp_path, **SETUP), prepare(cfg))
    (res,) = run_round(ex, 1, [2])
    data = ex.runtime.data
    start = build_model(cfg.model, data.train.input_shape, data.num_classes, 0)
    set_weights(start, ex.runtime.initial_weights)
    x = torch.from_numpy(data.gtest.features(np.arange(len(data.gtest))))
    local = ex.runtime.model
    for m in (start, local):
        m.eval()
    with torch.no_grad():
        f1 = local.filter(local.extractor(x)).double()
        f0 = start.filter(start.extractor(x)).double()
    dist = (f1 - f0).norm(dim=1)
    angle = torch.rad2deg(torch.arccos(torch.clamp(torch.nn.functional.cosine_similarity(f1, f0, dim=1), -1, 1)))
    normdiff = f1.norm(dim=1) - f0.norm(dim=1)
    seen = torch.from_numpy((data.train_label_counts()[2] > 0)[data.gtest.y])
    for side, mask in (("obs", seen), ("unobs", ~seen)):
        assert res.analysis[f"local_{side}_fdist"] == pytest.approx(float(dist[mask].mean()), rel=1e-4)
        assert res.analysis[f"local_{side}_fangle"] == pytest.approx(float(angle[mask].mean()), rel=1e-3)
        assert res.analysis[f"local_{side}_fnormdiff"] == pytest.approx(float(normdiff[mask].mean()), rel=1e-3, abs=1e-5)
    assert res.analysis["local_obs_fdist"] > 0
