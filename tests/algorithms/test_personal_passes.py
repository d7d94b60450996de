"""The shared-and-personal family describes its local update once, as passes: one-by-one
training and batched training (``train.batch_clients``) both read that description, so a changed
pass shows up in both."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.fedper import FedRep
from algorithms.personal import Pass
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare
from raysim.weights import BODY
from tests.conftest import run_round, tiny_config

CNN = {"model": "cnn3p2_fmnist", "data.synthetic.shape": (1, 16, 16), "data.synthetic.separation": 1.0}


def _round(tmp_path, batch_clients):
    cfg = tiny_config(tmp_path, algo="fedrep", participation=1.0, **CNN, **{"train.batch_clients": batch_clients})
    ex = SerialExecutor(cfg, prepare(cfg))
    received = ex.server.state.weights
    results = run_round(ex, 1, [0, 1, 2])
    return ex, received, results


@pytest.mark.parametrize("batch_clients", [1, 3])
def test_a_changed_pass_shows_up_in_one_by_one_and_batched_training(tmp_path, monkeypatch, batch_clients):
    from raysim.toolkit.train import cross_entropy

    ex, received, results = _round(tmp_path / "as_is", batch_clients)
    assert all(not r.weights.select(BODY).equals(received.select(BODY)) for r in results)  # the body trains
    # the description changed on purpose: the head alone, one epoch
    monkeypatch.setattr(FedRep, "passes", lambda self: [Pass(("head",), cross_entropy, 1)])
    ex, received, results = _round(tmp_path / "head_only", batch_clients)
    sizes = [int(ex.data.client_train[c].size) for c in (0, 1, 2)]
    for r, n in zip(results, sizes, strict=True):
        assert r.weights.select(BODY).equals(received.select(BODY))  # uploaded as received: untrained
        assert r.samples_trained == n  # one epoch of the head
        head = ex.runtime.kept(r.client).part("head")
        assert not np.array_equal(head, ex.runtime.initial_weights.part("head"))  # the head trained, kept


@pytest.mark.parametrize("batch_clients", [1, 3])
def test_fed3p2s_update_description_drives_one_by_one_and_batched_training(tmp_path, monkeypatch, batch_clients):
    """Fed3+2p maps each payload kind to one Update; a changed one (phase 1's loss made flat, so
    that nothing moves) shows up in both kinds of training."""
    import dataclasses

    from algorithms.fed3p2 import Fed3p2
    from raysim.toolkit.train import cross_entropy

    def flat(model, x, y):
        return 0.0 * cross_entropy(model, x, y)

    real = Fed3p2.update
    monkeypatch.setattr(Fed3p2, "update", lambda self, ctx, q: dataclasses.replace(real(self, ctx, q), loss=flat))
    cfg = tiny_config(
        tmp_path, algo="fed3p2", participation=1.0, **CNN,
        **{"train.batch_clients": batch_clients, "algo.coordinators": False, "train.weight_decay": 0.0},
    )  # fmt: skip
    ex = SerialExecutor(cfg, prepare(cfg))
    received = ex.server.state.gm
    results = run_round(ex, 1, [0, 1, 2])
    assert len(results) == 3 and all(r.weights.equals(received) for r in results)  # nothing moved
