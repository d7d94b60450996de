"""SphereFed and FedETF, FedDr+'s feature-normalised baselines: what is fixed, what trains,
what is averaged and the closed-form calibration, checked on the numbers."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from tests.conftest import run_round, tiny_config, without_times

SETTINGS = {"spherefed": {"train.lr": 0.5}, "fedetf": {"train.lr": 0.1, "algo.ft_alternations": 2}}


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, **{**SETTINGS[algo], **changes})
    return SerialExecutor(cfg, prepare(cfg))


def _features(model, x):
    import torch

    from raysim.toolkit.features import representation

    with torch.no_grad():
        return representation(model, x).double()


# ------------------------------------------------------------------------------------------ SphereFed
def test_spherefed_trains_normalised_features_against_a_fixed_orthonormal_classifier(tmp_path):
    ex = _executor(tmp_path, "spherefed")
    w0 = ex.server.state.weights
    head = w0.part("head").reshape(10, -1).astype(np.float64)
    np.testing.assert_allclose(head @ head.T, np.eye(10), atol=1e-5)  # C orthonormal rows
    results = run_round(ex, 1, [0, 1, 2, 3])
    assert all(set(r.weights.part_names) == {"extractor", "filter"} for r in results)  # W is not sent
    w1 = ex.server.state.weights
    assert np.array_equal(w1.part("head"), w0.part("head"))  # fixed during training
    assert not np.array_equal(w1.part("extractor"), w0.part("extractor"))
    from raysim.models import set_weights

    model = ex.runtime.model
    set_weights(model, w1)
    x, _ = ex.runtime.gather(ex.runtime.data.train, ex.runtime.data.client_train[0])
    np.testing.assert_allclose(_features(model, x).norm(dim=1).numpy(), 1.0, atol=1e-6)


def test_spherefed_loss_is_the_mean_squared_error_to_the_one_hot_label(tmp_path):
    import torch

    from algorithms.spherefed import sphere_mse

    ex = _executor(tmp_path, "spherefed")
    model = ex.runtime.model
    x, y = ex.runtime.gather(ex.runtime.data.train, ex.runtime.data.client_train[1])
    with torch.no_grad():
        out = model(x).double()
        target = torch.zeros_like(out)
        target[torch.arange(len(y)), y] = 1.0
        want = float(((out - target) ** 2).sum() / out.numel())
        assert float(sphere_mse(model, x, y)) == pytest.approx(want, rel=1e-5)


def test_spherefed_ce_reading_trains_with_cross_entropy_on_the_cosine_logits(tmp_path):
    import torch
    import torch.nn.functional as F

    from algorithms.spherefed import sphere_ce

    ex = _executor(tmp_path / "ce", "spherefed", **{"algo.loss": "ce"})
    model = ex.runtime.model
    x, y = ex.runtime.gather(ex.runtime.data.train, ex.runtime.data.client_train[1])
    with torch.no_grad():
        cos = F.normalize(model.filter[0](model.extractor(x)), dim=1) @ model.head.weight.T
        assert float(sphere_ce(model, x, y)) == pytest.approx(float(F.cross_entropy(cos, y)), rel=1e-5)
    (ce,) = run_round(ex, 1, [2])
    (mse,) = run_round(_executor(tmp_path / "mse", "spherefed"), 1, [2])
    assert not ce.weights.equals(mse.weights)
    with pytest.raises(ConfigError, match="loss"):
        validate(tiny_config(tmp_path, algo="spherefed", **{"algo.loss": "l1"}))


def test_spherefed_calibrated_classifier_is_its_closed_form_over_every_clients_data(tmp_path):
    """After the last round every client sends V_k = sum z z^T and U_k = sum z e_y^T under the final
    body; the head becomes ((V + lambda I)^-1 U)^T, lambda = ridge trace(V) / d, which is where
    the ridge objective's gradient is zero."""
    from raysim.models import set_weights

    ex = _executor(tmp_path, "spherefed", rounds=2)
    run_round(ex, 1, [0, 1, 2, 3])
    run_round(ex, 2, [2, 3, 4, 5])
    before = ex.server.state.weights
    got = run_round(ex, 3, list(range(8)))  # the epilogue: round T + 1, every client
    assert [r.client for r in got] == list(range(8))
    assert all(r.weights is None and r.samples_trained == 0 for r in got)
    after = ex.server.state.weights
    for part in ("extractor", "filter"):
        assert np.array_equal(after.part(part), before.part(part))  # the body is not changed
    model = copy.deepcopy(ex.runtime.model)
    set_weights(model, before)
    model.eval()
    data = ex.runtime.data
    idx = np.concatenate([data.client_train[c] for c in range(8)])
    x, y = ex.runtime.gather(data.train, idx)
    z = _features(model, x).numpy()
    e = np.eye(10)[y.numpy()]
    v, u = z.T @ z, z.T @ e
    d = z.shape[1]
    lam = 1e-3 * np.trace(v) / d
    want = np.linalg.solve(v + lam * np.eye(d), u).T
    cal = after.part("head").reshape(10, d)
    np.testing.assert_allclose(cal, want, rtol=1e-4, atol=1e-6)
    grad = cal.astype(np.float64) @ (v + lam * np.eye(d)) - u.T  # d/dW of the ridge objective / 2
    assert np.abs(grad).max() < 1e-3 * np.abs(u).max()
    # the run: calibrated at the last round only; calibrate=false keeps W
    cal_run = run_experiment(tiny_config(tmp_path / "a", algo="spherefed", rounds=2, **SETTINGS["spherefed"]))
    plain = run_experiment(
        tiny_config(tmp_path / "b", algo="spherefed", rounds=2, **SETTINGS["spherefed"], **{"algo.calibrate": False})
    )
    assert cal_run.rows[-1]["gm_gtest"] != plain.rows[-1]["gm_gtest"]


def test_spherefed_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="calib_ridge"):
        validate(tiny_config(tmp_path, algo="spherefed", **{"algo.calib_ridge": -1.0}))
    with pytest.raises(ConfigError, match="at least the class count"):
        validate(tiny_config(tmp_path, algo="spherefed", **{"data.synthetic.num_classes": 200}))


# --------------------------------------------------------------------------------------------- FedETF
def test_fedetf_trains_projection_and_temperature_while_the_etf_stays_fixed(tmp_path):
    ex = _executor(tmp_path, "fedetf")
    s0, w0 = ex.server.state.scale, ex.server.state.weights
    m = w0.part("head").reshape(10, 10).astype(np.float64)  # rows m_c of the simplex ETF
    gram = m @ m.T
    np.testing.assert_allclose(np.diag(gram), 1.0, atol=1e-5)
    np.testing.assert_allclose(gram[~np.eye(10, dtype=bool)], -1.0 / 9.0, atol=1e-5)
    assert s0 == 1.0
    results = run_round(ex, 1, [0, 1, 2, 3])
    state = ex.server.state
    assert np.array_equal(state.weights.part("head"), w0.part("head"))  # the ETF is fixed
    assert not np.array_equal(state.weights.part("filter"), w0.part("filter"))  # the projection trains
    scales = [float(r.extra[0]) for r in results]
    sizes = np.array([r.num_samples for r in results], dtype=np.float64)
    assert all(s != 1.0 for s in scales)  # the temperature trains on each client ...
    assert state.scale == pytest.approx(float(np.dot(sizes / sizes.sum(), scales)), rel=1e-9)  # ... and is averaged
    # the projection layer is Linear(filter_dim, C) with bias, followed by L2 normalisation
    proj = ex.runtime.model.filter[0]
    assert (proj.in_features, proj.out_features, proj.bias is not None) == (100, 10, True)
    x, _ = ex.runtime.gather(ex.runtime.data.train, ex.runtime.data.client_train[0])
    np.testing.assert_allclose(_features(ex.runtime.model, x).norm(dim=1).numpy(), 1.0, atol=1e-6)


def test_fedetf_balanced_loss_is_the_balanced_softmax_with_absent_classes_counted_once(tmp_path):
    import torch

    from algorithms.fedetf import balanced_etf_loss, class_counts
    from raysim.toolkit.context import ClientContext

    ex = _executor(tmp_path, "fedetf", **{"data.partition": "shard:2"})
    ctx = ClientContext(ex.runtime, 2, 1)
    ctx.load(ex.server.state.weights)
    counts = class_counts(ctx)
    x, y = ctx.train_tensors()
    raw = torch.bincount(y, minlength=10)
    assert (raw == 0).any() and torch.equal(counts, torch.where(raw > 0, raw, 1))
    s = torch.tensor(2.5)
    with torch.no_grad():
        logits = (2.5 * ctx.model(x)).double()
        n = counts.double()
        num = n[y] * torch.exp(logits[torch.arange(len(y)), y])
        den = (n * torch.exp(logits)).sum(1)
        want = float(-torch.log(num / den).mean())
        assert float(balanced_etf_loss(s, counts)(ctx.model, x, y)) == pytest.approx(want, rel=1e-5)


def test_fedetf_ft_tunes_the_etf_and_the_projection_in_turn_on_a_local_copy(tmp_path):
    """FedETF-FT: the body and s with the balanced loss, then the ETF alone and the projection alone;
    the global model and the server's state are untouched."""
    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    ex = _executor(tmp_path, "fedetf", rounds=1, **{"algo.ft_epochs": 1})
    run_round(ex, 1, [0, 1, 2, 3])
    state = copy.deepcopy(ex.server.state)
    evaluation = ex.server.evaluation()
    tuned = get_weights(evaluation.personal_model(ex.runtime.algo, ClientContext(ex.runtime, 1, 1)), ("extractor", "filter", "head"))
    for part in ("extractor", "filter", "head"):
        assert not np.array_equal(tuned.part(part), state.weights.part(part)), part
    assert ex.server.state.weights.equals(state.weights) and ex.server.state.scale == state.scale
    # with no alternations only the first step runs: the ETF stays the global one
    ex0 = _executor(tmp_path / "b", "fedetf", rounds=1, **{"algo.ft_epochs": 1, "algo.ft_alternations": 0})
    run_round(ex0, 1, [0, 1, 2, 3])
    m0 = ex0.server.evaluation().personal_model(ex0.runtime.algo, ClientContext(ex0.runtime, 1, 1))
    assert np.array_equal(get_weights(m0, ("head",)).head, ex0.server.state.weights.head)


def test_a_fedetf_newcomer_adapts_the_body_for_its_epochs_and_keeps_the_etf(tmp_path):
    """A newcomer takes FedETF-FT's first pass only, the body and s with the balanced loss for
    eval.new_client_epochs (by hand here), and not the ETF and projection alternations after it:
    it adapts for as many epochs as every algorithm's newcomer, whatever algo.ft_alternations."""
    from algorithms.fedetf import balanced_etf_loss, class_counts
    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext
    from raysim.weights import BODY

    parts = ("extractor", "filter", "head")
    new = {"eval.new_clients": 0.25, "eval.new_client_epochs": 1, "algo.ft_alternations": 20}
    ex = _executor(tmp_path, "fedetf", rounds=1, **new)
    newcomer = ex.cfg.new_clients[0]
    run_round(ex, 1, list(ex.cfg.training_clients))
    algo, state = ex.runtime.algo, ex.server.state
    got = get_weights(ex.server.evaluation().newcomer_model(algo, ClientContext(ex.runtime, newcomer, 1, evaluating=True)), parts)
    ctx = ClientContext(ex.runtime, newcomer, 1, evaluating=True)
    ctx.load(algo.ft_weights(state))
    scale = algo._scale(ctx, state.scale)
    ctx.train(BODY, algo.lr(1), epochs=1, loss_fn=balanced_etf_loss(scale, class_counts(ctx)), extra=[scale], stream="newcomer")
    want = get_weights(ctx.model, parts)
    for part in parts:
        np.testing.assert_array_equal(got.part(part), want.part(part))
    assert np.array_equal(got.head, state.weights.head)  # the ETF as the server holds it
    assert not np.array_equal(got.part("filter"), state.weights.part("filter"))  # the body adapted


def test_fedetf_settings_are_checked(tmp_path):
    for bad, match in (
        ({"algo.temperature": 0.0}, "temperature"),
        ({"algo.ft_alternations": -1}, "ft_alternations"),
        ({"algo.ft_etf_lr": 0.0}, "ft_etf_lr"),
    ):
        with pytest.raises(ConfigError, match=match):
            validate(tiny_config(tmp_path, algo="fedetf", **bad))


# -------------------------------------------------------------------------------------------- both
@pytest.mark.parametrize("algo", ["spherefed", "fedetf"])
def test_regularisers_change_training_and_none_is_the_plain_algorithm(tmp_path, algo):
    (plain,) = run_round(_executor(tmp_path / "p", algo), 1, [2])
    (none,) = run_round(_executor(tmp_path / "n", algo, **{"algo.regularizers": []}), 1, [2])
    assert none.weights.equals(plain.weights)
    for name in ("prox", "kd", "ntd", "ld", "fd"):
        (res,) = run_round(_executor(tmp_path / name, algo, **{"algo.regularizers": [name]}), 1, [2])
        assert not res.weights.equals(plain.weights), name


@pytest.mark.parametrize("algo", ["spherefed", "fedetf"])
def test_they_learn_on_separable_data(tmp_path, algo):
    res = run_experiment(tiny_config(tmp_path, algo=algo, rounds=3, **SETTINGS[algo]))
    assert res.rows[-1]["gm_gtest"] > 0.6
    assert math.isfinite(res.rows[-1]["train_loss"])


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["spherefed", "fedetf"])
def test_serial_equals_ray(tmp_path, ray_local, algo):
    setup = {"algo": algo, "rounds": 2, "participation": 0.5, "eval.every": 1, "algo.ft_epochs": 1, **SETTINGS[algo]}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["lm_ptest"] is not None
