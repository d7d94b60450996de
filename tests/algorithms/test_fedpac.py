"""FedPAC: the classifier-collaboration weights, the statistics, what is shared."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.collaboration import collaboration_matrix, combination_weights, repair_psd, solve_weights
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare
from raysim.weights import BODY
from raysim.wire import JobResult
from tests.conftest import tiny_config


def _random_stats(k=5, c=4, d=3, seed=0):
    g = np.random.default_rng(seed)
    return g.normal(size=(k, c, d)), g.uniform(0.1, 1.0, size=k)


def test_weights_are_a_distribution():
    h, v = _random_stats()
    alpha = combination_weights(h, v)
    assert alpha.shape == (5, 5)
    assert (alpha >= 0).all()
    np.testing.assert_allclose(alpha.sum(axis=1), 1.0, atol=1e-9)
    assert ((alpha == 0) | (alpha >= 1e-3)).all()  # small weights are zeroed, then renormalised


def test_two_clients_match_the_hand_solution():
    """P = [[V0, 0], [0, D + V1]] for client 0 (D = ||h0 - h1||^2): alpha_0 = (D + V1) / (V0 + D + V1)."""
    h = np.array([[[1.0, 0.0], [0.0, 2.0]], [[0.0, 1.0], [1.0, 1.0]]])  # (K=2, C=2, d=2)
    v = np.array([0.5, 0.25])
    d = float(((h[0] - h[1]) ** 2).sum())
    p = collaboration_matrix(h, v, 0)
    np.testing.assert_allclose(p, [[0.5, 0.0], [0.0, d + 0.25]])
    a0 = (d + 0.25) / (0.5 + d + 0.25)
    np.testing.assert_allclose(solve_weights(p, 0), [a0, 1 - a0], atol=1e-5)
    b1 = (d + 0.5) / (0.25 + d + 0.5)  # client 1, by symmetry
    np.testing.assert_allclose(combination_weights(h, v)[1], [1 - b1, b1], atol=1e-5)


def test_a_client_with_another_clients_statistics_puts_weight_on_it():
    h, v = _random_stats(k=4)
    h[2], v[2] = h[0], v[0]  # client 2 looks exactly like client 0
    alpha = combination_weights(h, v)
    assert alpha[0, 2] > 0.3 and alpha[2, 0] > 0.3
    np.testing.assert_allclose(alpha[0, 0], alpha[0, 2], atol=1e-4)


def test_non_psd_matrix_is_repaired():
    p = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1
    fixed = repair_psd(p)
    assert np.linalg.eigvalsh(fixed).min() >= -1e-12
    np.testing.assert_allclose(fixed, [[1.5, 1.5], [1.5, 1.5]])  # the -1 direction removed
    alpha = solve_weights(p, 0)  # solves on the repaired matrix instead of failing
    np.testing.assert_allclose(alpha.sum(), 1.0)
    assert (alpha >= 0).all()


def test_a_failed_solve_keeps_the_clients_own_head(monkeypatch):
    bad = np.array([[1.0, 0.0], [0.0, np.inf]])  # a diverged client's statistics
    np.testing.assert_array_equal(solve_weights(bad, 1), [0.0, 1.0])
    import cvxpy as cp

    def fail(self, *args, **kwargs):
        raise cp.error.SolverError("solver failed")

    monkeypatch.setattr(cp.Problem, "solve", fail)  # the solver itself fails
    np.testing.assert_array_equal(solve_weights(np.eye(3), 2), [0.0, 0.0, 1.0])


SETUP = {"algo": "fedpac", "participation": 1.0, "model": "cnn_pac", "data.synthetic.shape": (1, 16, 16)}


def test_heads_are_combined_as_stated_and_the_body_is_averaged(tmp_path):
    ex = SerialExecutor(cfg := tiny_config(tmp_path, **SETUP), prepare(cfg))
    algo, state = ex.server.algo, ex.server.state
    jobs = algo.plan(state, 1, [0, 1, 2])
    results = [JobResult(j, tuple(ex.runtime.run_chain(1, j.clients, j.payload, None))) for j in jobs]
    new = algo.aggregate(state, 1, results)
    finals = [jr.final for jr in results]
    ups = [r.extra for r in finals]
    alpha = combination_weights(np.stack([u.h for u in ups]), np.array([u.v for u in ups]))
    np.testing.assert_allclose(new.alpha, alpha)
    for i, r in enumerate(finals):  # client i's head = sum_j alpha_ij phi_j
        expected = sum(alpha[i, j] * finals[j].weights.part("head").astype(np.float64) for j in range(3))
        np.testing.assert_allclose(new.heads[r.client].part("head"), expected, atol=1e-6)
    n = np.array([r.num_samples for r in finals], dtype=np.float64)
    for part in BODY:
        body = sum(n[j] * finals[j].weights.part(part).astype(np.float64) for j in range(3)) / n.sum()
        np.testing.assert_allclose(new.body.part(part), body, atol=1e-6)
    assert new.heads[3] is None  # not sampled: no head yet


def test_statistics_are_taken_under_the_received_model(tmp_path):
    import torch

    from raysim.toolkit.features import pac_statistics

    z = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1])
    s = pac_statistics(z, y, 3)
    np.testing.assert_allclose(s.priors, [2 / 3, 1 / 3, 0])
    np.testing.assert_allclose(s.h, [[4 / 3, 0], [0, 2 / 3], [0, 0]])
    # V = (1/n) sum_c [p_c mean||z||^2 - p_c^2 ||mu_c||^2] = (1/3) [2/3*5 - 4/9*4 + 1/3*4 - 1/9*4]
    np.testing.assert_allclose(s.v, (2 / 3 * 5 - 4 / 9 * 4 + 1 / 3 * 4 - 1 / 9 * 4) / 3)


def test_no_collaboration_keeps_own_heads_and_lambda_zero_has_no_alignment(tmp_path):
    ex = SerialExecutor(cfg := tiny_config(tmp_path, **SETUP, **{"algo.combine": False}), prepare(cfg))
    algo, state = ex.server.algo, ex.server.state
    jobs = algo.plan(state, 1, [0, 1])
    results = [JobResult(j, tuple(ex.runtime.run_chain(1, j.clients, j.payload, None))) for j in jobs]
    new = algo.aggregate(state, 1, results)
    np.testing.assert_array_equal(new.alpha, np.eye(2))
    for jr in results:
        assert new.heads[jr.final.client].equals(jr.final.weights.select(("head",)))
    assert ex.server.algo.params.lam == 1.0
    cfg0 = tiny_config(tmp_path / "l0", **SETUP, **{"algo.lambda": 0})
    assert SerialExecutor(cfg0, prepare(cfg0)).server.algo.params.lam == 0.0


def test_a_bad_setting_is_one_sentence(tmp_path):
    from raysim.engine.experiment import validate as check_config
    from raysim.errors import ConfigError

    with pytest.raises(ConfigError, match="head_lr"):
        check_config(tiny_config(tmp_path, **SETUP, **{"algo.head_lr": 0}))


def test_tensorboard_shows_the_combination_weights_on_evaluated_rounds(tmp_path):
    import io

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raysim.engine.runner import run_experiment

    setup = {**SETUP, "participation": 0.5, "rounds": 4, "eval.every": 2, "output.tensorboard": True}
    cfg = tiny_config(tmp_path, **setup)
    run_experiment(cfg)
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    images = acc.Images("algo/alpha")
    assert [e.step for e in images] == [2, 4]  # one heat map per evaluated round
    # a k x k matrix of 12-pixel cells: 4 sampled clients in round 2, all 8 in the last round
    assert [(e.width, e.height) for e in images] == [(48, 48), (96, 96)]
    png = images[-1].encoded_image_string
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(io.BytesIO(png).getvalue()) > 50
    assert [e.step for e in acc.Scalars("algo/alpha_self")] == [1, 2, 3, 4]
    assert {"comm/bytes_down", "comm/bytes_up"} <= set(acc.Tags()["scalars"])


def test_png_encoder_round_trips_through_a_decoder():
    import zlib

    from raysim.results.tensorboard import encode_png, heat_map

    img = heat_map(np.array([[0.0, 1.0], [0.5, 0.25]]), cell=2)
    png = encode_png(img)
    # walk the chunks and inflate IDAT: rows of (filter byte 0, RGB pixels)
    pos, idat = 8, b""
    while pos < len(png):
        n = int.from_bytes(png[pos : pos + 4], "big")
        kind = png[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += png[pos + 8 : pos + 8 + n]
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(4, 1 + 4 * 3)
    assert (raw[:, 0] == 0).all()
    np.testing.assert_array_equal(raw[:, 1:].reshape(4, 4, 3), img)
    assert tuple(img[0, 0]) == (255, 255, 255) and tuple(img[0, 2]) == (8, 48, 107)  # 0 white, 1 blue


def test_every_client_takes_part_in_the_last_round(tmp_path):
    ex = SerialExecutor(
        cfg := tiny_config(tmp_path, **{**SETUP, "participation": 0.25, "rounds": 3}), prepare(cfg)
    )
    algo, state = ex.server.algo, ex.server.state
    assert [j.clients for j in algo.plan(state, 2, [1, 5])] == [(1,), (5,)]
    assert [j.clients[0] for j in algo.plan(state, 3, [1, 5])] == list(range(8))
    off = SerialExecutor(
        c := tiny_config(tmp_path / "off", **{**SETUP, "algo.all_in_last_round": False}), prepare(c)
    )
    assert len(off.server.algo.plan(off.server.state, 3, [1, 5])) == 2


@pytest.mark.parametrize("epochs", [0, 1])
def test_a_newcomer_trains_a_head_of_its_own_on_the_shared_body(tmp_path, epochs):
    """A client held out of training (eval.new_clients): the shared body as the server holds it,
    untouched, with the initial head; with eval.new_client_epochs 0 that head itself, with 1 the head
    trained (cross-entropy at head_lr, the body frozen) and nothing else moved."""
    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    cfg = tiny_config(
        tmp_path, algo="fedpac", participation=1.0, **{"eval.new_clients": 0.25, "eval.new_client_epochs": epochs}
    )
    ex = SerialExecutor(cfg, prepare(cfg))
    ex.train_round(1)
    state = ex.server.state
    evaluation = ex.server.algo.evaluation(state)
    c = cfg.new_clients[0]
    assert state.heads[c] is None  # it never trained
    ctx = ClientContext(ex.runtime, c, 1, evaluating=True)
    model = evaluation.newcomer_model(ex.runtime.algo, ctx)
    got = get_weights(model, (*BODY, "head"))
    assert got.select(BODY).equals(state.body)
    initial = ctx.initial_weights.select(("head",))
    assert got.select(("head",)).equals(initial) == (epochs == 0)
    assert ex.server.state is state and state.heads[c] is None
    report = ex.evaluate(1)
    assert all(r.lm_correct is not None for r in report.clients if r.new)
