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

    model = ex.runtime.algo.global_model(ex.runtime.model, ex.server.eval_payload())
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
        ex.runtime.evaluate(1, ex.server.eval_payload(), chunk, []) for chunk in split_targets(targets, 3)
    ]
    again = assemble_report(data, targets, parts, has_global=True)
    assert again.clients == report.clients and again.gtest_correct == report.gtest_correct
