"""FedNova (algorithms/fednova.py): FedAvg when every client takes the same number of steps; under
partial work the normalised average of Eq. 6-7, by hand on the round's own uploads; a_i with
momentum against the sum of each gradient's weight in the change."""

from __future__ import annotations

import numpy as np

from algorithms.fednova import step_weight
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from tests.conftest import recording_aggregates, tiny_config, without_times

IID = {"data.partition": "iid", "eval.every": 1, "rounds": 2}


def test_equal_steps_give_fedavg(tmp_path):
    """iid over 8 clients: 100 samples each, 5 steps of 20 for every client; FedNova's normalised
    average is FedAvg's, to rounding."""
    nova = run_experiment(tiny_config(tmp_path / "n", algo="fednova", **IID)).rows
    avg = run_experiment(tiny_config(tmp_path / "a", algo="fedavg", **IID)).rows
    for a, b in zip(without_times(nova), without_times(avg), strict=True):
        assert a["round"] == b["round"] and abs(a["gm_gtest"] - b["gm_gtest"]) <= 1 / 400 + 1e-12
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-5


def test_partial_work_gives_the_normalised_average(tmp_path):
    """deployment.completeness=uniform:0.3: the clients take different numbers of steps; the new
    model is x - tau_eff sum_i p_i (x - y_i) / a_i over the uploads the server received (a_i with
    the run's momentum), and it is not FedAvg's size-weighted mean."""
    cfg = tiny_config(tmp_path, algo="fednova", **{**IID, "deployment.completeness": "uniform:0.3"})
    ex = SerialExecutor(cfg, prepare(cfg))
    got = recording_aggregates(ex)
    ex.train_round(1, [0, 1, 2, 3])
    state, results = got[0]
    x0 = state.weights
    finals = [jr.final for jr in results]
    steps = [r.extra.steps for r in finals]
    a = [step_weight(s, cfg.train.momentum) for s in steps]
    assert len(set(steps)) > 1 and [r.extra.a for r in finals] == a
    n = np.array([r.num_samples for r in finals], float)
    p = n / n.sum()
    tau_eff = float(p @ np.array(a))
    for part in x0.part_names:
        x = x0.part(part).astype(np.float64)
        ys = [r.weights.part(part).astype(np.float64) for r in finals]
        want = x - tau_eff * sum(pi * (x - y) / ai for pi, y, ai in zip(p, ys, a, strict=True))
        np.testing.assert_allclose(ex.server.state.weights.part(part), want, rtol=1e-6, atol=1e-7)
        fedavg = sum(pi * y for pi, y in zip(p, ys, strict=True))
        assert want.size == 0 or not np.allclose(want, fedavg, atol=1e-6)


def test_the_momentum_weight_is_each_gradients_total_weight():
    """Heavy ball buf <- rho buf + g, x <- x - lr buf: the gradient of step k enters the change with
    weight sum_{j=0}^{tau-1-k} rho^j; a_i sums these over the tau steps."""
    for tau in (1, 3, 7):
        for rho in (0.0, 0.5, 0.9):
            want = sum(sum(rho**j for j in range(tau - k)) for k in range(tau))
            assert step_weight(tau, rho) == __import__("pytest").approx(want)
