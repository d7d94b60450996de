"""FedNTD and FedExP (FedDr+'s global-model baselines): each one's defining property on the
numbers."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult, WeightsPayload
from tests.conftest import assert_serial_equals_ray, run_round, tiny_config


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, **changes)
    return SerialExecutor(cfg, prepare(cfg))


# ---------------------------------------------------------------------------------------- FedNTD


def test_not_true_distillation_is_the_kl_over_the_other_classes():
    import torch

    from raysim.toolkit.distill import not_true_distillation

    student = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.3, 0.1, 1.5, -0.4]], dtype=torch.float64)
    teacher = torch.tensor([[0.0, 1.0, 0.2, -0.5], [1.0, -1.0, 0.7, 0.4]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    tau = 3.0

    def hand(s, t):  # tau^2 * mean_b sum_{c != y_b} p_c log(p_c / q_c), softmaxes over c != y_b at tau
        total = 0.0
        for b in range(2):
            others = [c for c in range(4) if c != int(y[b])]
            zs = np.array([float(s[b, c]) for c in others]) / tau
            zt = np.array([float(t[b, c]) for c in others]) / tau
            q = np.exp(zs) / np.exp(zs).sum()
            p = np.exp(zt) / np.exp(zt).sum()
            total += float(np.sum(p * np.log(p / q)))
        return tau * tau * total / 2

    got = float(not_true_distillation(student, teacher, y, tau))
    assert got == pytest.approx(hand(student, teacher), rel=1e-12) and got > 0
    # the true class's logit plays no part, on either side
    s2, t2 = student.clone(), teacher.clone()
    s2[0, 0], s2[1, 2], t2[0, 0], t2[1, 2] = -7.0, 9.0, 4.0, -3.0
    assert float(not_true_distillation(s2, t2, y, tau)) == pytest.approx(got, rel=1e-12)
    # zero when the two agree on the not-true classes (whatever the true class's logit)
    assert float(not_true_distillation(s2, student, y, tau)) == pytest.approx(0.0, abs=1e-12)
    # the teacher gets no gradient
    s3, t3 = student.clone().requires_grad_(), teacher.clone().requires_grad_()
    not_true_distillation(s3, t3, y, tau).backward()
    assert (
        t3.grad is None
        and s3.grad is not None
        and float(s3.grad[0, 0]) == 0.0
        and float(s3.grad[1, 2]) == 0.0
    )


def test_fedntd_objective_is_ce_plus_beta_ntd_against_the_received_model(tmp_path):
    import torch
    import torch.nn.functional as F

    from raysim.models import set_weights
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.distill import not_true_distillation

    ex = _executor(tmp_path, "fedntd", **{"algo.beta": 2.0, "algo.tau": 2.0})
    algo, rt = ex.runtime.algo, ex.runtime
    sent = ex.server.state.weights
    ctx = ClientContext(rt, 1, 1)
    ctx.load(sent)
    loss = algo.loss_fn(ctx, WeightsPayload(sent, 0.1))
    x, y = rt.gather(rt.data.train, rt.data.client_train[1])
    model = ctx.model
    with torch.no_grad():
        at_global = float(loss(model, x, y))
        assert at_global == pytest.approx(float(F.cross_entropy(model(x), y)), rel=1e-6)  # NTD is 0 there
        other = {n: p + 0.05 * torch.randn_like(p) for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            p.copy_(other[n])
        teacher = ctx.scratch_model("teacher")  # holds the received model
        want = F.cross_entropy(model(x), y) + 2.0 * not_true_distillation(model(x), teacher(x), y, 2.0)
        assert float(loss(model, x, y)) == pytest.approx(float(want), rel=1e-6)
        assert float(want) > float(F.cross_entropy(model(x), y))  # away from it, the term is positive
    set_weights(model, sent)
    # beta = 0 is FedAvg to the bit
    (ntd,) = run_round(_executor(tmp_path / "b0", "fedntd", **{"algo.beta": 0.0}), 1, [2])
    (avg,) = run_round(_executor(tmp_path / "avg", "fedavg"), 1, [2])
    (with_ntd,) = run_round(_executor(tmp_path / "b1", "fedntd"), 1, [2])
    assert ntd.weights.equals(avg.weights)
    assert not with_ntd.weights.equals(avg.weights)  # the term changes training


# ---------------------------------------------------------------------------------------- FedExP


def _w(*values):
    return ModelWeights(head=np.array(values, np.float32))


def test_fedexp_step_is_its_formula_and_at_least_one():
    from algorithms.fedexp import extrapolation_step

    w = _w(1.0, 1.0)
    # two clients of 10 and 30 samples moving in nearly opposite directions: a large step
    uploads = [_w(2.0, 1.0), _w(0.0, 1.2)]  # Delta_1 = (-1, 0), Delta_2 = (1, -0.2)
    new, eta = extrapolation_step(w, uploads, [10, 30], epsilon=0.001)
    p = np.array([0.25, 0.75])
    deltas = np.array([[-1.0, 0.0], [1.0, -0.2]])
    mean_delta = p @ deltas
    want = max(1.0, float(p @ (deltas**2).sum(1)) / (2 * (float(mean_delta @ mean_delta) + 0.001)))
    assert eta == pytest.approx(want, rel=1e-6) and eta > 1
    np.testing.assert_allclose(new.head, np.array([1.0, 1.0]) - eta * mean_delta, rtol=1e-6)
    # clients that agree: the spread equals ||Delta||^2 and the step is FedAvg's (eta_g = 1)
    same = [_w(0.5, 2.0), _w(0.5, 2.0)]
    new, eta = extrapolation_step(w, same, [1, 3], epsilon=0.001)
    assert eta == 1.0 and np.allclose(new.head, [0.5, 2.0])
    # updates that cancel exactly: epsilon bounds the step, the model does not move
    new, eta = extrapolation_step(w, [_w(2.0, 1.0), _w(0.0, 1.0)], [1, 1], epsilon=0.001)
    assert eta == pytest.approx(1.0 / (2 * 0.001)) and np.allclose(new.head, [1.0, 1.0])


def test_fedexp_leaves_running_statistics_at_the_mean_and_out_of_its_norms():
    """An entry marked as a BatchNorm running statistic counts in neither norm and takes the
    uploads' mean: the step on the other entries is the one computed without it."""
    from algorithms.fedexp import extrapolation_step

    w = ModelWeights(head=np.array([1.0, 1.0, 0.5], np.float32))
    uploads = [ModelWeights(head=np.array(v, np.float32)) for v in ([2.0, 1.0, 0.1], [0.0, 1.2, 0.3])]
    stats = {"head": np.array([False, False, True])}
    new, eta = extrapolation_step(w, uploads, [10, 30], 0.001, stats)
    without, eta_without = extrapolation_step(_w(1.0, 1.0), [_w(2.0, 1.0), _w(0.0, 1.2)], [10, 30], epsilon=0.001)
    assert eta == pytest.approx(eta_without, rel=1e-9) and eta > 1
    np.testing.assert_allclose(new.head[:2], without.head, rtol=1e-6)
    assert new.head[2] == pytest.approx(0.25 * 0.1 + 0.75 * 0.3)  # the mean, not 0.5 - eta (0.5 - mean)


def test_fedexp_evaluates_the_mean_of_the_last_two_iterates(tmp_path):
    from algorithms.fedexp import ExPState

    ex = _executor(tmp_path, "fedexp")
    algo = ex.runtime.algo
    w0 = ex.server.state.weights
    run_round(ex, 1, [0, 1, 2])
    s1 = ex.server.state
    assert isinstance(s1, ExPState) and s1.eta_g >= 1.0 and s1.previous is None
    assert algo.evaluation(s1).payload.equals(s1.weights)  # round 1: the iterate itself
    assert algo.round_scalars(s1, 1) == {"fedexp_eta_g": s1.eta_g}
    assert not s1.weights.equals(w0)
    run_round(ex, 2, [1, 3])
    s2 = ex.server.state
    assert s2.previous.equals(s1.weights)
    for name, a in algo.evaluation(s2).payload.items():
        np.testing.assert_allclose(
            a, (s2.weights.part(name).astype(np.float64) + s1.weights.part(name)) / 2, rtol=1e-6
        )
    # what the clients receive is the iterate, not the evaluated mean
    (job,) = algo.plan(s2, 3, [0])
    assert job.payload.weights.equals(s2.weights)


def test_fedexp_with_one_client_is_fedavg():
    """One client: the spread is ||Delta||^2, so eta_g = max(1, 1/2 ...) = 1 and w^{t+1} is its upload."""
    from algorithms.fedexp import ExPState, FedExP, FedExPConfig

    algo = FedExP(tiny_config(clients=4), FedExPConfig())
    s = ExPState(_w(1.0, 2.0))
    up = _w(3.0, -1.0)
    new = algo.aggregate(s, 1, [JobResult(Job((0,), None), (ClientResult(0, 7, 0.0, up),))])
    assert new.eta_g == 1.0 and new.weights.equals(up)


# ---------------------------------------------------------------------------------------- both


@pytest.mark.parametrize("algo", ["fedntd", "fedexp"])
def test_learns_and_reports_its_metrics(tmp_path, algo):
    result = run_experiment(tiny_config(tmp_path, algo=algo, rounds=3, participation=0.75))
    assert result.final["gm_gtest"] is not None and result.final["gm_gtest"] > 0.5
    assert result.rows[-1]["train_loss"] > 0


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["fedntd", "fedexp"])
def test_serial_equals_ray(tmp_path, ray_local, algo):
    assert_serial_equals_ray(tmp_path, algo=algo, rounds=2, participation=0.75, **{"eval.every": 1})
