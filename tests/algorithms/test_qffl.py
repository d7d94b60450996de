"""q-FFL / q-FedAvg (algorithms/qffl.py): at q = 0 the uniform mean (FedAvg where the clients hold
equal data); at q > 0 the server step of Algorithm 2 by hand on the round's own uploads and losses,
each loss the client's mean cross-entropy at the received model."""

from __future__ import annotations

import numpy as np

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from tests.conftest import recording_aggregates, tiny_config, without_times

IID = {"data.partition": "iid", "eval.every": 1, "rounds": 2}


def test_q_zero_is_fedavg_on_equal_clients(tmp_path):
    q0 = without_times(run_experiment(tiny_config(tmp_path / "q", algo="qffl", **IID, **{"algo.q": 0.0})).rows)
    avg = without_times(run_experiment(tiny_config(tmp_path / "a", algo="fedavg", **IID)).rows)
    for a, b in zip(q0, avg, strict=True):
        assert abs(a["gm_gtest"] - b["gm_gtest"]) <= 1 / 400 + 1e-12 and abs(a["train_loss"] - b["train_loss"]) < 1e-5


def test_the_server_step_is_algorithm_2_by_hand(tmp_path):
    cfg = tiny_config(tmp_path, algo="qffl", **{"algo.q": 2.0, "data.partition": "dirichlet:0.3"})
    ex = SerialExecutor(cfg, prepare(cfg))
    got = recording_aggregates(ex)
    ex.train_round(1, [0, 2, 5, 7])
    state, results = got[0]
    w = state.weights
    finals = [jr.final for jr in results]
    losses = [r.extra for r in finals]
    assert all(v > 0 for v in losses) and len(set(losses)) == 4
    L, q = 1.0 / cfg.train.lr, 2.0
    flat = lambda m: np.concatenate([m.part(n).astype(np.float64) for n in w.part_names])  # noqa: E731
    x = flat(w)
    dws = [L * (x - flat(r.weights)) for r in finals]
    num = sum(f**q * dw for f, dw in zip(losses, dws, strict=True))
    den = sum(q * f ** (q - 1) * (dw @ dw) + L * f**q for f, dw in zip(losses, dws, strict=True))
    np.testing.assert_allclose(flat(ex.server.state.weights), x - num / den, rtol=1e-6, atol=1e-7)


def test_a_clients_reported_loss_is_its_cross_entropy_at_the_received_model(tmp_path):
    """Recomputed here in one pass over the client's whole training set (not in batches)."""
    import torch
    import torch.nn.functional as F

    from raysim.models import set_weights
    from raysim.toolkit.context import ClientContext

    cfg = tiny_config(tmp_path, algo="qffl")
    ex = SerialExecutor(cfg, prepare(cfg))
    got = recording_aggregates(ex)
    ex.train_round(1, [3])
    state, (jr,) = got[0]
    w = state.weights
    ctx = ClientContext(ex.runtime, 3, 1)
    x, y = ctx.train_tensors()
    model = ctx.scratch_model("check")
    set_weights(model, w)
    model.eval()
    with torch.no_grad():
        want = float(F.cross_entropy(model(x).double(), y))
    assert jr.final.extra == __import__("pytest").approx(want, rel=1e-5)
