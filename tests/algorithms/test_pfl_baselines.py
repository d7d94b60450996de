"""FedDyn, Per-FedAvg, pFedMe and FedAMP: each one's defining property on the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.fedamp import attention
from algorithms.perfedavg import maml_step
from algorithms.pfedme import solve_inner
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import run_round, tiny_config, without_times


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _weights(*values):
    return ModelWeights(head=np.array(values, np.float32))


# ---------------------------------------------------------------------------------------- FedDyn


def test_feddyn_server_keeps_h_and_corrects_the_mean():
    from algorithms.feddyn import DynState, FedDyn, FedDynConfig

    algo = FedDyn(tiny_config(clients=8), FedDynConfig(alpha=0.5))
    state = DynState(_weights(1.0, 2.0), _weights(0.1, -0.1))
    results = [
        JobResult(Job((c,), None), (ClientResult(c, 10, 0.0, w),))
        for c, w in ((0, _weights(2.0, 2.0)), (1, _weights(4.0, 0.0)))
    ]
    new = algo.aggregate(state, 1, results)
    # h = h - alpha/N sum (theta_k - theta): deltas (1, 0) and (3, -2)
    h = np.array([0.1 - 0.5 / 8 * 4, -0.1 - 0.5 / 8 * -2])
    np.testing.assert_allclose(new.h.head, h, rtol=1e-6)
    np.testing.assert_allclose(new.weights.head, np.array([3.0, 1.0]) - h / 0.5, rtol=1e-6)  # mean - h/alpha
    # N counts the clients that train: with 2 of the 8 held out as newcomers, N = 6
    held_out = FedDyn(tiny_config(clients=8, **{"eval.new_clients": 0.25}), FedDynConfig(alpha=0.5))
    h6 = np.array([0.1 - 0.5 / 6 * 4, -0.1 - 0.5 / 6 * -2])
    np.testing.assert_allclose(held_out.aggregate(state, 1, results).h.head, h6, rtol=1e-6)


def test_feddyn_client_term_follows_its_update_and_stays_on_the_worker(tmp_path):
    from raysim.models import parameter_views

    ex = _executor(tmp_path, "feddyn", **{"algo.alpha": 0.1})
    sent = ex.server.state.weights
    (first,) = run_round(ex, 1, [3])
    g1 = ex.runtime.stored(3, "gradient")
    assert g1 is not None and ex.runtime.stored(2, "gradient") is None  # only where it trained
    # g_k = 0 - alpha (theta_k - theta^{t-1}) on the parameters
    want = {n: -0.1 * (first.weights.part(n).astype(np.float64) - sent.part(n)) for n in GLOBAL_PARTS}
    for n in GLOBAL_PARTS:
        np.testing.assert_allclose(g1.part(n), want[n], rtol=1e-4, atol=1e-7)
    sent2 = ex.server.state.weights
    (second,) = run_round(ex, 2, [3])
    g2 = ex.runtime.stored(3, "gradient")  # the kept term went into round 2 and was updated
    for n in GLOBAL_PARTS:
        np.testing.assert_allclose(
            g2.part(n), g1.part(n) - 0.1 * (second.weights.part(n).astype(np.float64) - sent2.part(n)), rtol=1e-4, atol=1e-7
        )
    assert len(parameter_views(ex.runtime.model, g2)) == len(list(ex.runtime.model.parameters())) - 2  # no phead
    # the linear term changes training: the same round without it gives another model
    fresh = _executor(tmp_path / "f", "feddyn", **{"algo.alpha": 0.1})
    fresh.server.state = ex.server.state.__class__(sent2, ex.server.state.h)
    (plain,) = run_round(fresh, 2, [3])
    assert not plain.weights.equals(second.weights)


# ---------------------------------------------------------------------------------------- Per-FedAvg


def _tiny_model():
    import torch

    from raysim.models import build_model

    torch.manual_seed(0)
    return build_model("mlp_fcd", (1, 2, 2), 3, seed=1).double()


def _batches(n=3):
    import torch

    g = torch.Generator().manual_seed(4)
    return [(torch.randn(5, 1, 2, 2, generator=g, dtype=torch.float64), torch.randint(0, 3, (5,), generator=g)) for _ in range(n)]


def test_per_fedavg_steps_are_the_maml_steps():
    """FO: w - beta grad f(w - alpha grad f(w; D); D'); HF: the same direction times (I - alpha H(w; D'')),
    H d by autograd's exact Hessian-vector product against the step's central difference."""
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.train import set_trainable

    alpha, beta = 0.1, 0.05
    batches = _batches()
    model = _tiny_model()
    params = set_trainable(model, GLOBAL_PARTS)
    w = [p.detach().clone() for p in params]

    def loss_at(ws, batch):
        with torch.no_grad():
            for p, v in zip(params, ws, strict=True):
                p.copy_(v)
        x, y = batch
        return F.cross_entropy(model(x), y)

    g = torch.autograd.grad(loss_at(w, batches[0]), params)
    w_inner = [a - alpha * b for a, b in zip(w, g, strict=True)]
    d = [t.detach() for t in torch.autograd.grad(loss_at(w_inner, batches[1]), params)]
    fo_want = [a - beta * b for a, b in zip(w, d, strict=True)]
    grads = torch.autograd.grad(loss_at(w, batches[2]), params, create_graph=True)
    hd = torch.autograd.grad(grads, params, grad_outputs=d)  # the exact H(w; D'') d
    hf_want = [a - beta * (b - alpha * c) for a, b, c in zip(w, d, hd, strict=True)]

    for variant, want in (("fo", fo_want), ("hf", hf_want)):
        with torch.no_grad():
            for p, v in zip(params, w, strict=True):
                p.copy_(v)
        maml_step(model, params, batches, alpha, beta, variant, delta=1e-5)
        for p, v in zip(params, want, strict=True):
            torch.testing.assert_close(p.detach(), v, rtol=0, atol=1e-8 if variant == "fo" else 1e-6)
    assert any((a - b).abs().max() > 1e-6 for a, b in zip(fo_want, hf_want, strict=True))  # the Hessian term matters


def test_per_fedavg_personalises_with_one_step_from_the_global_model(tmp_path):
    ex = _executor(tmp_path, "perfedavg", **{"algo.alpha": 0.05})
    run_round(ex, 1, [0, 1, 2, 3])
    evaluation = ex.server.evaluation()
    payload = evaluation.payload
    from raysim.toolkit.context import ClientContext

    before = payload.part("head").copy()
    pm = evaluation.personal_model(ex.runtime.algo, ClientContext(ex.runtime, 2, 1))
    from raysim.models import get_weights

    adapted = get_weights(pm, GLOBAL_PARTS)
    assert not adapted.equals(payload) and np.array_equal(payload.part("head"), before)  # the global model kept
    report = ex.evaluate(1)
    assert all(c.lm_correct is not None and c.gm_correct is not None for c in report.clients)


def test_per_fedavg_newcomers_adapt_by_the_one_step_of_a_new_user(tmp_path):
    """A newcomer (eval.new_clients) is the paper's new user: the meta-model after one alpha step
    on a batch of its own data (w - alpha grad, written out here), not epochs of fine-tuning."""
    import torch
    import torch.nn.functional as F

    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    newcomers = {"eval.new_clients": 0.25, "eval.new_client_epochs": 3}
    ex = _executor(tmp_path, "perfedavg", **{"algo.alpha": 0.05, **newcomers})
    run_round(ex, 1, list(ex.cfg.training_clients)[:4])
    evaluation = ex.server.evaluation()
    (newcomer, *_) = ex.cfg.new_clients
    ctx = ClientContext(ex.runtime, newcomer, 1)
    samples = ctx.samples_trained
    adapted = get_weights(evaluation.newcomer_model(ex.runtime.algo, ctx), GLOBAL_PARTS)
    ctx.load(evaluation.payload)
    x, y = next(iter(ctx.batches(0, stream="adapt")))
    params = [q for part in GLOBAL_PARTS for q in getattr(ctx.model, part).parameters()]
    grads = torch.autograd.grad(F.cross_entropy(ctx.model(x), y), params)
    with torch.no_grad():
        for q, g in zip(params, grads, strict=True):
            q.sub_(0.05 * g)
    want = get_weights(ctx.model, GLOBAL_PARTS)
    for part in GLOBAL_PARTS:
        np.testing.assert_allclose(adapted.part(part), want.part(part), rtol=1e-5, atol=1e-7)
    assert ctx.samples_trained == samples  # no epochs of fine-tuning
    report = ex.evaluate(1)
    assert {c.client for c in report.clients if c.new and c.lm_correct is not None} == set(ex.cfg.new_clients)


# ---------------------------------------------------------------------------------------- pFedMe


def test_pfedme_personal_model_solves_its_inner_problem():
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.train import set_trainable

    model = _tiny_model()
    params = set_trainable(model, GLOBAL_PARTS)
    batch = _batches(1)[0]
    local = [p.detach().clone() + 0.1 for p in params]
    lam = 15.0

    def grad_norm() -> float:
        x, y = batch
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        total = sum(((g + lam * (p - w)) ** 2).sum() for g, p, w in zip(grads, params, local, strict=True))
        return float(torch.sqrt(total.detach()))

    start = grad_norm()
    solve_inner(model, params, batch, local, lam, lr=0.05, steps=300)
    assert grad_norm() < 1e-6 * start  # theta is the minimiser of f + lambda/2 ||theta - w||^2


def test_pfedme_keeps_theta_uploads_w_and_the_server_mixes_with_beta(tmp_path):
    from algorithms.fedavg import GlobalState

    ex = _executor(tmp_path, "pfedme", **{"algo.beta": 2.0})
    algo = ex.server.algo
    state = GlobalState(_weights(1.0, 1.0))
    results = [
        JobResult(Job((c,), None), (ClientResult(c, n, 0.0, w),))
        for c, n, w in ((0, 10, _weights(2.0, 0.0)), (1, 30, _weights(4.0, 2.0)))
    ]
    new = algo.aggregate(state, 1, results)  # (1 - beta) w + beta mean (unweighted: 3, 1)
    np.testing.assert_allclose(new.weights.head, [-1.0 + 6.0, -1.0 + 2.0])
    (res,) = run_round(ex, 1, [1])
    theta = ex.runtime.kept(1)
    assert not theta.equals(res.weights)  # the personal theta stays; w_i goes up
    assert res.samples_trained == 5 * res.num_samples  # K = 5 steps a batch, one epoch


# ---------------------------------------------------------------------------------------- FedAMP


def test_fedamp_attention_is_a_distribution_that_favours_the_nearest():
    models = [_weights(0.0, 0.0), _weights(0.1, 0.0), _weights(3.0, 0.0), None]
    xi = attention(models, 0, alpha_k=0.5, sigma=1.0)
    assert xi.sum() == pytest.approx(1.0) and (xi >= 0).all() and xi[3] == 0
    assert xi[1] > xi[2] > 0
    assert xi[1] == pytest.approx(0.5 * np.exp(-0.01 / 1.0) / 1.0, rel=1e-6)
    assert xi[0] == pytest.approx(1 - xi[1] - xi[2])
    big = attention(models, 0, alpha_k=100.0, sigma=1.0)  # weights that would pass 1 are scaled
    assert big.sum() == pytest.approx(1.0) and big[0] == pytest.approx(0.0) and big[1] > big[2]
    assert attention(models, 3, 1.0, 1.0).sum() == 0  # no model of its own yet


def test_fedamp_sends_each_client_its_cloud_model(tmp_path):
    ex = _executor(tmp_path, "fedamp", participation=1.0, **{"algo.alpha_k": 0.5, "algo.sigma": 1e6})
    run_round(ex, 1, list(range(8)))
    jobs = ex.server.plan(2, [0, 1])
    models = ex.server.state.models
    xi = attention(models, 0, 0.5, 1e6)
    assert (xi > 0).sum() == 8
    want = sum(x * models[j].part("head").astype(np.float64) for j, x in enumerate(xi))
    np.testing.assert_allclose(jobs[0].payload.cloud.part("head"), want, rtol=1e-5, atol=1e-7)
    assert not jobs[0].payload.cloud.equals(jobs[1].payload.cloud)  # a cloud model per client


# ---------------------------------------------------------------------------------------- all four


@pytest.mark.parametrize("algo", ["feddyn", "perfedavg", "pfedme", "fedamp"])
def test_learns_and_reports_its_metrics(tmp_path, algo):
    result = run_experiment(tiny_config(tmp_path, algo=algo, rounds=3, participation=0.75))
    assert result.final["lm_ptest"] is not None or result.final["gm_gtest"] is not None
    assert result.rows[-1]["train_loss"] > 0


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["feddyn", "perfedavg", "pfedme", "fedamp"])
def test_serial_equals_ray(tmp_path, ray_local, algo):
    setup = {"algo": algo, "rounds": 2, "participation": 0.75, "eval.every": 1}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)


def test_pfedme_personal_model_never_solves_on_a_partial_batch(tmp_path, monkeypatch):
    """A client whose size leaves a remainder of 1 solves every inner problem on a full
    batch, so its kept theta_i never fitted a 1-sample batch (whatever train.drop_last says); a
    client smaller than a batch solves on all of its samples."""
    import algorithms.pfedme as pfedme

    sizes: list[int] = []
    real = pfedme.solve_inner

    def recording(model, params, batch, local, lam, lr, steps):
        sizes.append(int(batch[1].shape[0]))
        return real(model, params, batch, local, lam, lr, steps)

    monkeypatch.setattr(pfedme, "solve_inner", recording)
    n = [int(idx.size) for idx in prepare(tiny_config(tmp_path)).client_train]
    b = next(b for b in range(5, 40) if any(k % b == 1 for k in n))
    odd = next(c for c, k in enumerate(n) if k % b == 1)  # a batch size of b leaves one sample over
    ex = _executor(tmp_path / "odd", "pfedme", **{"train.batch_size": b})
    (res,) = run_round(ex, 1, [odd])
    assert set(sizes) == {b} and len(sizes) == n[odd] // b, (sizes, n[odd])
    assert res.samples_trained == 5 * b * (n[odd] // b)  # K = 5 steps on each full batch
    kept = ex.runtime.kept(odd)
    sizes.clear()
    ex = _executor(tmp_path / "small", "pfedme", **{"train.batch_size": n[odd] + 1})
    run_round(ex, 1, [odd])
    assert sizes == [n[odd]]  # fewer samples than a batch: one batch of them all
    assert not kept.equals(ex.runtime.kept(odd))
