"""MOON and APFL: each one's defining property on the numbers, a short run that learns and reports
its metrics, serial against Ray, and the refusal of mistyped settings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms.apfl import mixed
from algorithms.moon import contrastive_term, moon_loss
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import BODY, GLOBAL_PARTS
from tests.conftest import assert_serial_equals_ray, run_round, tiny_config


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _context(ex, client, rnd):
    from raysim.toolkit.context import ClientContext

    return ClientContext(ex.runtime, client, rnd)


# ---------------------------------------------------------------------------------------- MOON


def test_moon_with_mu_zero_uploads_fedavgs_to_the_bit(tmp_path):
    moon = _executor(tmp_path / "m", "moon", **{"algo.mu": 0.0})
    fedavg = _executor(tmp_path / "f", "fedavg")
    for rnd in (1, 2):  # round 2 reads a kept previous model for client 3, the initial one for 5
        clients = [3, 1] if rnd == 1 else [3, 5]
        got, want = run_round(moon, rnd, clients), run_round(fedavg, rnd, clients)
        assert [r.client for r in got] == clients
        assert all(g.weights.equals(w.weights) for g, w in zip(got, want, strict=True))
        assert moon.server.state.weights.equals(fedavg.server.state.weights)


def _tiny_model(seed):
    from raysim.models import build_model

    return build_model("mlp_fcd", (1, 4, 4), 3, seed=seed).double()


def _cosine(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _l_con_by_hand(z, zg, zp, tau):
    """Eq. 3 as written, per sample, then the batch mean."""
    pos, neg = np.exp(_cosine(z, zg) / tau), np.exp(_cosine(z, zp) / tau)
    return float(np.mean(-np.log(pos / (pos + neg))))


def test_moon_contrastive_term_is_eq3_from_the_three_models_representations():
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.features import representation

    model, glob, prev = _tiny_model(1), _tiny_model(2), _tiny_model(3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1, 4, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (6,), generator=g)
    mu, tau = 2.0, 0.5
    loss = moon_loss(glob, prev, mu, tau)(model, x, y)
    with torch.no_grad():
        z, zg, zp = (representation(m, x).flatten(1).numpy() for m in (model, glob, prev))
        ce = float(F.cross_entropy(model(x), y))
    want = _l_con_by_hand(z, zg, zp, tau)
    assert want > 0.1  # three different models: a term far from zero
    assert float(loss.detach()) == pytest.approx(ce + mu * want, rel=1e-12)
    assert float(contrastive_term(*(torch.from_numpy(a) for a in (z, zg, zp)), tau)) == pytest.approx(
        want, rel=1e-12
    )
    loss.backward()  # only the model being trained gets a gradient
    assert all(p.grad is None for m in (glob, prev) for p in m.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.extractor.parameters())


def test_moon_negative_is_the_clients_previous_upload(tmp_path):
    import torch

    from raysim.models import get_weights, set_weights
    from raysim.toolkit.features import representation

    ex = _executor(tmp_path, "moon", **{"algo.mu": 1.0, "algo.tau": 0.5})
    algo = ex.runtime.algo
    assert ex.runtime.kept(3).part_names == ()  # nothing kept before it trains
    first, other = run_round(ex, 1, [3, 1])  # two clients: the new global model is neither's upload
    kept = ex.runtime.kept(3)
    assert kept.part_names == BODY and kept.equals(first.weights.select(BODY))  # what it keeps: its upload
    assert ex.runtime.kept(1).equals(other.weights.select(BODY)) and ex.runtime.kept(2).part_names == ()

    # round 2's loss reads it: its negative model holds the round-1 upload, and the term on a
    # batch is Eq. 3 from the received model, the model being trained and that upload
    payload = ex.server.plan(2, [3])[0].payload
    ctx = _context(ex, 3, 2)
    ctx.load(payload.weights)
    loss = algo.loss_fn(ctx, payload)
    assert get_weights(ctx.scratch_model("moon/previous"), BODY).equals(first.weights.select(BODY))
    x, y = (t[:20] for t in ctx.train_tensors())
    with torch.no_grad():
        z = representation(ctx.model, x).numpy().astype(np.float64)
        zg = z  # the model being trained is the received one at the first step
        prev = ctx.scratch_model("check/previous")
        set_weights(prev, first.weights)
        zp = representation(prev, x).numpy().astype(np.float64)
        ce = float(torch.nn.functional.cross_entropy(ctx.model(x), y))
        got = float(loss(ctx.model, x, y))
    assert got == pytest.approx(ce + _l_con_by_hand(z, zg, zp, 0.5), rel=1e-5)
    assert got - ce < math.log(2) - 1e-3  # z is nearer the global model's than the previous one's

    (second,) = run_round(ex, 2, [3])  # and after round 2 it keeps its round-2 upload
    assert ex.runtime.kept(3).equals(second.weights.select(BODY))
    assert not second.weights.select(BODY).equals(first.weights.select(BODY))

    # the same round 2 with the client's memory dropped (its negative the initial model) trains
    # another model: the training read what the client kept
    forgot = _executor(tmp_path / "forgot", "moon", **{"algo.mu": 1.0, "algo.tau": 0.5})
    run_round(forgot, 1, [3, 1])
    del forgot.runtime.memory[3]
    (plain,) = run_round(forgot, 2, [3])
    assert not plain.weights.equals(second.weights)


def test_moon_first_round_negative_is_the_initial_model(tmp_path):
    """Before a client first trains, its negative is the initial model, which in round 1 is the
    received one: z_glob = z_prev, l_con is log 2 on every batch and its gradient vanishes, so
    the upload is FedAvg's to float rounding."""
    (moon,) = run_round(_executor(tmp_path / "m", "moon", **{"algo.mu": 3.0}), 1, [3])
    (fedavg,) = run_round(_executor(tmp_path / "f", "fedavg"), 1, [3])
    assert moon.train_loss - fedavg.train_loss == pytest.approx(3.0 * math.log(2), abs=1e-5)
    for part in GLOBAL_PARTS:
        np.testing.assert_allclose(moon.weights.part(part), fedavg.weights.part(part), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------- APFL


def test_apfl_alpha_moves_by_the_derivative_of_eq8(tmp_path):
    """One step a round (each client's data is one batch): in round 1 v = w, so alpha's derivative
    <v - w, grad f(v_bar)> is exactly 0; in round 2 alpha moves by -lr times the derivative
    computed by hand at the kept v, the received w and the kept alpha."""
    import torch
    import torch.nn.functional as F

    from raysim.models import parameters_of, set_weights

    lr = 0.05
    ex = _executor(tmp_path, "apfl", **{"train.batch_size": 400, "train.lr": lr, "algo.alpha": 0.5})
    run_round(ex, 1, [3, 1])
    assert ex.runtime.stored(3, "alpha") == 0.5
    v = ex.runtime.kept(3)
    assert not v.equals(ex.server.state.weights)  # v moved (by alpha grad f(v_bar)) as w did
    w = ex.server.plan(2, [3])[0].payload.weights
    run_round(ex, 2, [3])
    got = ex.runtime.stored(3, "alpha")

    ctx = _context(ex, 3, 2)
    x, y = ctx.train_tensors()
    vm, wm, mm = (ctx.scratch_model(f"check/{n}") for n in ("v", "w", "mix"))
    set_weights(vm, v)
    set_weights(wm, w)
    set_weights(mm, w)
    with torch.no_grad():
        for pm, pv, pw in zip(*(parameters_of(m, GLOBAL_PARTS) for m in (mm, vm, wm)), strict=True):
            pm.copy_(0.5 * pv + 0.5 * pw)
    params = parameters_of(mm, GLOBAL_PARTS)
    for p in params:
        p.requires_grad_(True)
    mm.train()
    grads = torch.autograd.grad(F.cross_entropy(mm(x), y), params)
    derivative = sum(
        float(((pv - pw).detach().double() * g.double()).sum())
        for pv, pw, g in zip(
            parameters_of(vm, GLOBAL_PARTS), parameters_of(wm, GLOBAL_PARTS), grads, strict=True
        )
    )
    assert abs(derivative) > 1e-3
    assert got == pytest.approx(0.5 - lr * derivative, rel=1e-4)


def test_apfl_alpha_moves_after_a_round_and_stays_in_0_1(tmp_path):
    ex = _executor(tmp_path, "apfl", **{"algo.alpha": 0.5})
    run_round(ex, 1, [3, 1])
    alphas = [ex.runtime.stored(c, "alpha") for c in (3, 1)]
    assert all(a != 0.5 and 0 <= a <= 1 for a in alphas)
    assert ex.runtime.stored(2, "alpha") is None  # only where it trained
    fixed = _executor(tmp_path / "fixed", "apfl", **{"algo.alpha": 0.5, "algo.adapt_alpha": False})
    run_round(fixed, 1, [3])
    assert fixed.runtime.stored(3, "alpha") is None  # adapt_alpha=false: alpha stays the setting
    clipped = _executor(tmp_path / "clip", "apfl", **{"algo.alpha": 1.0, "algo.alpha_lr": 1e4})
    run_round(clipped, 1, [3])
    assert clipped.runtime.stored(3, "alpha") in (0.0, 1.0)  # a huge step is clipped to [0, 1]


def test_apfl_with_alpha_zero_fixed_is_fedavg_and_its_lm_is_the_gm(tmp_path):
    from raysim.models import get_weights

    apfl = _executor(tmp_path / "a", "apfl", **{"algo.alpha": 0.0, "algo.adapt_alpha": False})
    fedavg = _executor(tmp_path / "f", "fedavg")
    # w's step never reads v or alpha (Algorithm 1), so with any alpha, adapting or not, the
    # global model's trajectory is FedAvg's: the default settings too
    adaptive = _executor(tmp_path / "d", "apfl")
    for rnd, clients in ((1, [3, 1]), (2, [3, 5])):
        got, want, also = (
            run_round(apfl, rnd, clients),
            run_round(fedavg, rnd, clients),
            run_round(adaptive, rnd, clients),
        )
        assert all(g.weights.equals(w.weights) for g, w in zip(got, want, strict=True))
        assert all(g.weights.equals(w.weights) for g, w in zip(also, want, strict=True))
        assert apfl.server.state.weights.equals(fedavg.server.state.weights)
        assert adaptive.server.state.weights.equals(fedavg.server.state.weights)
    assert adaptive.runtime.stored(3, "alpha") != 0.5  # while its alpha moved
    evaluation = apfl.server.evaluation()
    for client in (3, 0):  # one that trained, one that never did
        pm = evaluation.personal_model(apfl.runtime.algo, _context(apfl, client, 2))
        assert get_weights(pm, GLOBAL_PARTS).equals(evaluation.payload)
    report = apfl.evaluate(2)
    assert all(c.lm_correct == c.gm_correct for c in report.clients)


def test_apfl_lm_is_the_mix_of_the_kept_state(tmp_path):
    from raysim.models import get_weights

    ex = _executor(tmp_path, "apfl", **{"algo.alpha": 0.3})
    run_round(ex, 1, [3, 1])
    run_round(ex, 2, [3])
    evaluation = ex.server.evaluation()
    w = evaluation.payload
    for client in (3, 1, 0):
        kept = ex.runtime.kept(client)
        v = kept if kept.part_names else ex.runtime.initial_weights.select(GLOBAL_PARTS)
        alpha = ex.runtime.stored(client, "alpha")
        alpha = 0.3 if alpha is None else alpha
        lm = get_weights(evaluation.personal_model(ex.runtime.algo, _context(ex, client, 2)), GLOBAL_PARTS)
        for part in GLOBAL_PARTS:
            want = alpha * v.part(part).astype(np.float64) + (1 - alpha) * w.part(part).astype(np.float64)
            np.testing.assert_allclose(lm.part(part), want, rtol=1e-6, atol=1e-7)
        assert not lm.equals(w) and not lm.equals(v)
    assert mixed(v, w, 1.0).equals(v.select(GLOBAL_PARTS)) and mixed(v, w, 0.0).equals(w.select(GLOBAL_PARTS))


def test_apfl_newcomer_personalises_from_the_global_model_and_keeps_nothing(tmp_path):
    """A held-out client: v starts from the global w, so with 0 epochs its model is w itself; with
    epochs, v and alpha train on the mixed model's cross-entropy (w fixed), which lowers that loss
    on its data, and nothing is kept or stored for it."""
    import torch
    import torch.nn.functional as F

    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    new = {"eval.new_clients": 0.25, "rounds": 2}
    for epochs in (0, 2):
        cfg = tiny_config(tmp_path / str(epochs), algo="apfl", **new, **{"eval.new_client_epochs": epochs})
        ex = SerialExecutor(cfg, prepare(cfg))
        for rnd in (1, 2):
            ex.train_round(rnd)
        evaluation = ex.server.evaluation()
        w = evaluation.payload
        c = cfg.new_clients[0]
        ctx = ClientContext(ex.runtime, c, 2, evaluating=True)
        got = get_weights(evaluation.newcomer_model(ex.runtime.algo, ctx), GLOBAL_PARTS)
        assert ex.runtime.kept(c).part_names == () and ex.runtime.stored(c, "alpha") is None
        assert evaluation.payload is w and ex.server.state.weights.equals(w)  # the global model untouched
        if epochs == 0:
            assert got.equals(w)
            continue
        assert not got.equals(w)
        x, y = ctx.train_tensors()
        losses = []
        for weights in (w, got):
            ctx.load(weights)
            with torch.no_grad():
                losses.append(float(F.cross_entropy(ctx.model(x), y)))
        assert losses[1] < losses[0]  # it adapted to its data


# ---------------------------------------------------------------------------------------- both


@pytest.mark.parametrize(
    ("algo", "changes", "metric"),
    [
        ("moon", {}, "gm_gtest"),
        ("moon", {"algo.ft_epochs": 1}, "lm_ptest"),  # MOON-FT
        ("apfl", {}, "lm_ptest"),
    ],
)
def test_learns_and_reports_its_metrics(tmp_path, algo, changes, metric):
    result = run_experiment(tiny_config(tmp_path, algo=algo, rounds=3, participation=0.75, **changes))
    assert result.final["gm_gtest"] is not None and result.final[metric] is not None
    assert result.final[metric] > 0.4  # 10 classes: well above chance after 3 rounds
    losses = [row["train_loss"] for row in result.rows]
    assert 0 < losses[-1] < losses[0]


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["moon", "apfl"])
def test_serial_equals_ray(tmp_path, ray_local, algo):
    assert_serial_equals_ray(tmp_path, algo=algo, rounds=2, participation=0.75, **{"eval.every": 1})


@pytest.mark.parametrize(
    ("algo", "name", "value"),
    [
        ("moon", "mu", -1),
        ("moon", "mu", "strong"),
        ("moon", "mu", float("nan")),
        ("moon", "tau", 0),
        ("moon", "tau", -0.5),
        ("moon", "tau", "warm"),
        ("apfl", "alpha", -0.1),
        ("apfl", "alpha", 1.5),
        ("apfl", "alpha", "half"),
        ("apfl", "adapt_alpha", "maybe"),
        ("apfl", "adapt_alpha", 2),
        ("apfl", "adapt_alpha", 0.5),
        ("apfl", "alpha_lr", 0),
        ("apfl", "alpha_lr", -0.01),
        ("apfl", "alpha_lr", "fast"),
    ],
)
def test_a_mistyped_setting_is_refused_in_one_sentence(tmp_path, algo, name, value):
    with pytest.raises(ConfigError) as refused:
        validate(tiny_config(tmp_path, algo=algo, **{f"algo.{name}": value}))
    sentence = str(refused.value)
    assert f"algo.{name}" in sentence and sentence.endswith(".") and "\n" not in sentence


def test_apfl_refuses_a_rate_for_a_fixed_alpha(tmp_path):
    with pytest.raises(ConfigError, match="alpha_lr is the step size of an adapting alpha"):
        validate(tiny_config(tmp_path, algo="apfl", **{"algo.adapt_alpha": False, "algo.alpha_lr": 0.1}))
    validate(tiny_config(tmp_path, algo="apfl", **{"algo.adapt_alpha": False, "algo.alpha": 0.25}))
