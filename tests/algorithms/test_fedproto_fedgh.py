"""FedProto and FedGH, the FedFCD paper's strongest baselines: what each sends, what is trained where."""

from __future__ import annotations

import numpy as np

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.toolkit.context import ClientContext
from raysim.toolkit.prototypes import ClassMeans, plain_means
from tests.conftest import run_round, tiny_config


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, participation=1.0, clients=6, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def test_fedproto_sends_prototypes_only_and_keeps_whole_models_personal(tmp_path):
    ex = _executor(tmp_path, "fedproto")
    got = run_round(ex, 1, list(range(6)))
    assert all(r.weights is None and isinstance(r.extra, ClassMeans) for r in got)
    protos, mask = plain_means(ClassMeans.stack([r.extra for r in got]))
    np.testing.assert_allclose(ex.server.state.protos, protos)  # unweighted mean over holders
    a, b = ex.runtime.kept(0), ex.runtime.kept(1)
    assert not np.array_equal(a.part("extractor"), b.part("extractor"))  # no averaging, ever
    assert not np.array_equal(a.part("head"), b.part("head"))
    before = ex.runtime.kept(0)
    run_round(ex, 2, [1, 2])  # client 0 not sampled: its model does not move
    assert ex.runtime.kept(0).equals(before)


def test_fedproto_predicts_by_the_nearest_global_prototype(tmp_path):
    import torch

    ex = _executor(tmp_path, "fedproto")
    ex.train_round(1, list(range(6)))
    evaluation = ex.server.evaluation()
    payload = evaluation.payload
    model = ex.runtime.model
    x = torch.randn(7, 1, 8, 8)
    scores = evaluation.forward(ex.runtime.algo, model)(x)
    z = model.filter(model.extractor(x))
    dist = torch.cdist(z, torch.from_numpy(payload.protos))
    dist[:, ~torch.from_numpy(payload.mask)] = float("inf")
    assert torch.equal(scores.argmax(1), dist.argmin(1))
    head = _executor(tmp_path / "h", "fedproto", **{"algo.predict": "head"}).runtime.algo
    assert evaluation.forward(head, model) is model


def test_fedgh_replaces_the_local_head_and_trains_the_global_head_on_the_server(tmp_path, monkeypatch):
    ex = _executor(tmp_path, "fedgh")
    head0 = ex.server.state.head
    loaded = []
    inner = ClientContext.train

    def spy(self, parts, lr, **kw):
        loaded.append((tuple(parts), self.weights(("head",))))
        return inner(self, parts, lr, **kw)

    monkeypatch.setattr(ClientContext, "train", spy)
    got = run_round(ex, 1, list(range(6)))
    assert all(h.equals(head0) for _, h in loaded)  # every client trains from the global head
    assert all(parts == ("extractor", "filter", "head") for parts, _ in loaded)
    assert all(r.weights is None and isinstance(r.extra, ClassMeans) for r in got)  # no weights sent
    assert not ex.server.state.head.equals(head0)  # the global head moved on the server
    a, b = ex.runtime.kept(0), ex.runtime.kept(1)
    assert not np.array_equal(a.part("extractor"), b.part("extractor"))  # bodies stay personal
    assert set(a.part_names) == {"extractor", "filter"}


def test_prototype_baselines_learn(tmp_path):
    for algo in ("fedproto", "fedgh"):
        r = run_experiment(tiny_config(tmp_path / algo, algo=algo, rounds=4, participation=1.0))
        assert r.final["gm_gtest"] is None and r.final["lm_ptest"] > 0.5, algo
