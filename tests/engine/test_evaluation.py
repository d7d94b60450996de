"""Evaluation: the counts assembled from the workers' shares equal a direct per-client evaluation,
in both local test modes (matched: P-Tests drawn from G-Test; split: P-Tests from the pooled data)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.engine.executors.evaluation import assemble_report, eval_targets, split_targets
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare
from tests.conftest import tiny_config


@pytest.mark.parametrize("test_mode", ["matched", "split:0.25"])
def test_assembled_counts_equal_direct_evaluation(tmp_path, test_mode):
    cfg = tiny_config(tmp_path, **{"data.test_mode": test_mode})
    data = prepare(cfg)
    ex = SerialExecutor(cfg, data)
    ex.train_round(1, [0, 1, 2, 3])
    report = ex.evaluate(1)

    model = ex.server.evaluation().global_model(ex.runtime.algo, ex.runtime.model)
    model.eval()

    def correct(ds, idx):
        with torch.no_grad():
            x = torch.from_numpy(ds.features(idx))
            return int((model(x).argmax(1).numpy() == ds.y[idx]).sum())

    for c in report.clients:
        assert c.gm_correct == correct(data.ptest, data.client_test[c.client])
        assert c.n_test == len(data.client_test[c.client]) > 0
    assert report.gtest_correct == correct(data.gtest, np.arange(len(data.gtest)))
    assert report.gtest_total == len(data.gtest)

    # the same counts when the work is split over three workers
    targets = eval_targets(data)
    parts = [
        ex.runtime.evaluate(1, ex.server.evaluation(), chunk, []) for chunk in split_targets(targets, 3)
    ]
    again = assemble_report(data, targets, parts, has_global=True)
    assert again.clients == report.clients and again.gtest_correct == report.gtest_correct


def test_each_algorithms_evaluation_is_a_frozen_picklable_evaluation():
    """Evaluation is one hook: the base builds no model itself, and what an algorithm evaluates
    with is an :class:`Evaluation` subclass of its module that adds behaviour, no field, and travels
    to the workers pickled."""
    import dataclasses
    import pickle

    import algorithms  # noqa: F401  (registers every algorithm, and so defines their evaluations)
    from algorithms.base import Algorithm
    from raysim.engine.evaluation import Evaluation

    assert not [h for h in ("eval_payload", "global_model", "personal_model", "personal_forward") if hasattr(Algorithm, h)]

    def subclasses(cls: type) -> list[type]:
        return [s for c in cls.__subclasses__() for s in (c, *subclasses(c))]

    found = [c for c in subclasses(Evaluation) if c.__module__.startswith("algorithms.")]
    assert len(found) >= 10
    for cls in found:
        assert [f.name for f in dataclasses.fields(cls)] == ["payload"], cls
        ev = cls(None)
        back = pickle.loads(pickle.dumps(ev))
        assert type(back) is cls and back == ev
        with pytest.raises(dataclasses.FrozenInstanceError):
            ev.payload = 1  # type: ignore[misc]
