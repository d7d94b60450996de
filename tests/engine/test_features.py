"""``eval.features`` (Fed3+2p's Fig. 3 for any run): after the last round, the features of a fixed
G-Test sample under the global model and each personal model, to features.parquet, and their t-SNE
(the picture, and in TensorBoard). The exported features and the t-SNE's input are the models' own."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import raysim
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.results.features import FEATURES_FILE, TSNE_FILE, feature_rows, feature_sample, tsne_input
from tests.conftest import tiny_config

SETUP = {"algo": "ditto", "rounds": 2, "eval.features": 40}


def test_the_exported_features_are_the_models_own_and_feed_the_tsne(tmp_path):
    import torch

    from raysim.toolkit.features import extract_features

    cfg = tiny_config(tmp_path, **SETUP)
    ex = SerialExecutor(cfg, prepare(cfg))
    for rnd in (1, 2):
        ex.train_round(rnd, [0, 3, 5, 6])
    report = ex.evaluate(2)
    names = [name for name, _ in report.features]
    assert names == ["global", *(f"client_{c}" for c in range(cfg.clients))]
    data = ex.runtime.data
    sample = feature_sample(cfg, len(data.gtest))
    assert len(sample) == 40 and np.array_equal(sample, feature_sample(cfg, len(data.gtest)))  # fixed by the seed
    x = torch.from_numpy(data.gtest.features(sample))
    model = ex.runtime.model
    evaluation = ex.server.evaluation()
    gm = evaluation.global_model(ex.runtime.algo, model)
    want = extract_features(gm, x).numpy()
    np.testing.assert_array_equal(dict(report.features)["global"], want)
    rows = feature_rows(2, sample, data.gtest.y[sample], report.features)
    got, labels = tsne_input(rows, personal=False)
    np.testing.assert_array_equal(got, want)  # the t-SNE embeds exactly these
    assert np.array_equal(labels, data.gtest.y[sample])
    personal, _ = tsne_input(rows, personal=True)
    assert personal.shape == (40 * cfg.clients, want.shape[1])
    # a client's features are those of its own personal model (Ditto's v_k), not the global model's
    from raysim.toolkit.context import ClientContext

    pm = evaluation.personal_model(ex.runtime.algo, ClientContext(ex.runtime, 3, 2))
    mine = extract_features(pm, x).numpy()
    np.testing.assert_array_equal(dict(report.features)["client_3"], mine)
    assert not np.array_equal(mine, want)


def test_a_run_writes_the_features_and_their_tsne(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_experiment(tiny_config(tmp_path, **SETUP, **{"output.tensorboard": True}))
    table = pd.read_parquet(tmp_path / FEATURES_FILE)
    assert set(table["round"]) == {2}
    assert table.groupby("model").size().to_dict() == {"global": 40, **{f"client_{c}": 40 for c in range(8)}}
    assert (tmp_path / TSNE_FILE).stat().st_size > 10_000
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    acc.Reload()
    assert "features/tsne" in acc.Tags()["images"]


def test_without_the_setting_nothing_is_exported(tmp_path):
    res = run_experiment(tiny_config(tmp_path, algo="ditto", rounds=1))
    assert not (tmp_path / FEATURES_FILE).exists() and res.rows
    with pytest.raises(ConfigError, match="eval.features must be at least 0"):
        raysim.make_config(dataset="synthetic", executor="serial", set={"eval.features": -1})


@pytest.mark.ray
def test_features_and_updated_models_are_the_same_on_serial_and_ray(tmp_path, ray_local):
    """Two workers with two job slots each: the global features come from the evaluation's one
    leading share, every client's from its own worker; the updated local models' lm_ptest too."""
    on_ray = {"ray.executor": "ray", "ray.workers": 2, "ray.jobs_per_worker": 2, "ray.cpus_per_worker": 0.5}
    run_experiment(tiny_config(tmp_path / "s", **SETUP))
    run_experiment(tiny_config(tmp_path / "r", **SETUP, **on_ray))
    a, b = (pd.read_parquet(tmp_path / d / FEATURES_FILE) for d in ("s", "r"))
    assert list(a["model"]) == list(b["model"]) and list(a["sample"]) == list(b["sample"])
    assert all(np.array_equal(x, y) for x, y in zip(a["feature"], b["feature"], strict=True))
    for algo, rounds in (("fedavg", 2), ("pacfl", 1)):  # no personal models; clustered (beside its own)
        lm = {"algo": algo, "rounds": rounds, "eval.updated_lm": True}
        s = run_experiment(tiny_config(tmp_path / f"{algo}-s", **lm))
        r = run_experiment(tiny_config(tmp_path / f"{algo}-r", **lm, **on_ray))
        for key in ("lm_ptest", "updated_lm_ptest"):
            assert [x[key] for x in s.rows] == [x[key] for x in r.rows]
            assert all(x[key] is not None for x in s.rows)
