"""FedDBE: the local objective (PRBM and MR) by hand, the initialisation period's global mean,
what is shared and what stays personal, the personalised prediction, its refusals, a short run
that learns and reports its metrics (newcomers and asynchronous rounds too), and serial = Ray."""

from __future__ import annotations

import numpy as np
import pytest

import algorithms.feddbe  # noqa: F401  (registers feddbe)
from algorithms.feddbe import BIAS, RunningMean, dbe_loss
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.toolkit.aggregate import weighted_mean
from raysim.weights import GLOBAL_PARTS
from tests.conftest import assert_serial_equals_ray, run_round, tiny_config

PLUGIN = {"plugins": ("algorithms.feddbe",)}


def _config(tmp_path, **changes):
    return tiny_config(tmp_path, algo="feddbe", **PLUGIN, **changes)


def _executor(tmp_path, **changes):
    cfg = _config(tmp_path, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _after_prologue(tmp_path, **changes):
    ex = _executor(tmp_path, **changes)
    prologue = run_round(ex, 0, list(ex.cfg.training_clients))
    return ex, prologue


def _ce_by_hand(logits, y):
    top = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float(np.mean(lse - logits[np.arange(len(y)), y]))


def test_local_objective_is_ce_of_the_biased_features_plus_kappa_times_mr_by_hand():
    """Two steps: z_bar = mu mean(z_1), then (1 - mu) z_bar + mu mean(z_2); the loss is
    CE(g(z + b), y) + kappa (1/K) sum (1/2) (z_bar - z_bar^g)^2; MR does not move the PRBM."""
    import torch

    from raysim.models import build_model
    from raysim.toolkit.features import representation

    model = build_model("mlp_fcd", (1, 4, 4), 3, seed=1).double()
    g = torch.Generator().manual_seed(0)
    k = model.filter_dim
    glob = torch.randn(k, generator=g, dtype=torch.float64)
    bias = torch.nn.Parameter(torch.randn(k, generator=g, dtype=torch.float64))
    batches = [
        (torch.randn(5, 1, 4, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (5,), generator=g))
        for _ in range(2)
    ]
    kappa, mu = 2.0, 0.3
    tracker = RunningMean(mu, k, torch.device("cpu"))
    loss = dbe_loss(tracker, kappa, glob, bias)
    w, b = (t.detach().numpy() for t in (model.head.weight, model.head.bias))
    running = np.zeros(k)
    for x, y in batches:
        got = float(loss(model, x, y).detach())
        with torch.no_grad():
            z = representation(model, x).numpy()
        running = (1 - mu) * running + mu * z.mean(axis=0)
        mr = float(np.mean(0.5 * (running - glob.numpy()) ** 2))
        want = _ce_by_hand((z + bias.detach().numpy()) @ w.T + b, y.numpy()) + kappa * mr
        assert mr > 0.1  # a term far from zero
        assert got == pytest.approx(want, rel=1e-12)
        np.testing.assert_allclose(tracker.value.numpy(), running, rtol=1e-12)
        assert not tracker.value.requires_grad  # the next step's history is detached

    # the PRBM's gradient is the cross-entropy's alone: MR reads z before the bias is added
    x, y = batches[0]
    grads = []
    for kap in (kappa, 0.0):
        bias.grad = None
        dbe_loss(RunningMean(mu, k, torch.device("cpu")), kap, glob, bias)(model, x, y).backward()
        grads.append(bias.grad.clone())
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-15)


def test_initialisation_period_fixes_the_size_weighted_global_mean_and_moves_no_weight(tmp_path):
    ex, prologue = _after_prologue(tmp_path)
    state = ex.server.state
    training = list(ex.cfg.training_clients)
    assert sorted(r.client for r in prologue) == training  # every training client, once
    assert all(r.weights is None for r in prologue)  # only the running means go up
    assert state.weights.equals(ex.runtime.initial_weights.select(GLOBAL_PARTS))
    sizes = np.array([r.num_samples for r in prologue], np.float64)
    means = np.stack([np.asarray(r.extra, np.float64) for r in prologue])
    assert means.shape == (len(training), ex.runtime.model.filter_dim)
    assert np.abs(means - means.mean(axis=0)).max() > 1e-3  # the clients' means differ
    np.testing.assert_allclose(state.global_mean, (sizes / sizes.sum()) @ means, rtol=1e-6, atol=1e-7)
    assert all(ex.runtime.stored(c, BIAS) is None for c in training)  # no PRBM trained yet

    fixed = state.global_mean.copy()
    run_round(ex, 1, [3, 1])
    np.testing.assert_array_equal(ex.server.state.global_mean, fixed)  # fixed for the whole run


def test_the_model_is_shared_and_averaged_and_the_prbm_stays_on_its_client(tmp_path):
    ex, _ = _after_prologue(tmp_path)
    got = run_round(ex, 1, [3, 1])
    assert [r.client for r in got] == [3, 1]
    assert all(r.weights.part_names == GLOBAL_PARTS and r.extra is None for r in got)
    want = weighted_mean([r.weights for r in got], [r.num_samples for r in got])
    assert ex.server.state.weights.equals(want)
    dim = ex.runtime.model.filter_dim
    first = {c: ex.runtime.stored(c, BIAS) for c in (3, 1)}
    assert all(b.shape == (dim,) and np.abs(b).sum() > 0 for b in first.values())  # trained from zero
    assert not np.array_equal(first[3], first[1])
    assert ex.runtime.stored(5, BIAS) is None

    # round 2 starts client 3 from the PRBM it kept: forgetting it trains another model
    forgot, _ = _after_prologue(tmp_path / "forgot")
    run_round(forgot, 1, [3, 1])
    del forgot.runtime.memory[3]
    (kept,) = run_round(ex, 2, [3])
    (fresh,) = run_round(forgot, 2, [3])
    assert not kept.weights.equals(fresh.weights)
    assert not np.array_equal(ex.runtime.stored(3, BIAS), first[3])


def test_personal_model_adds_its_prbm_to_the_features_and_the_global_model_adds_none(tmp_path):
    import torch

    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.features import representation

    ex, _ = _after_prologue(tmp_path)
    run_round(ex, 1, [3, 1])
    algo = ex.runtime.algo
    evaluation = ex.server.algo.evaluation(ex.server.state)
    ctx = ClientContext(ex.runtime, 3, 1, evaluating=True)
    x = ctx.train_tensors()[0][:10]
    glob = evaluation.global_model(algo, ex.runtime.scratch_model("check/global"))
    model = evaluation.personal_model(algo, ctx)
    with torch.no_grad():
        personal = evaluation.forward(algo, model)(x).numpy()
        z = representation(model, x).numpy()
        plain = glob(x).numpy()
    w, b = (t.detach().numpy() for t in (model.head.weight, model.head.bias))
    np.testing.assert_allclose(personal, (z + ex.runtime.stored(3, BIAS)) @ w.T + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain, z @ w.T + b, rtol=1e-5, atol=1e-5)  # GM: the same weights, no bias
    assert np.abs(personal - plain).max() > 1e-4

    untrained = ClientContext(ex.runtime, 5, 1, evaluating=True)  # its PRBM is still zero: LM = GM
    with torch.no_grad():
        lm = evaluation.forward(algo, evaluation.personal_model(algo, untrained))(x).numpy()
    np.testing.assert_allclose(lm, plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"algo.kappa": -1.0}, "algo.kappa must be at least 0, not -1.0."),
        ({"algo.kappa": "big"}, "algo.kappa must be a number, not 'big'."),
        ({"algo.mean_momentum": 0.0}, "algo.mean_momentum must be above 0, not 0.0."),
        ({"algo.mean_momentum": 1.5}, "algo.mean_momentum must be at most 1, not 1.5."),
        ({"train.batch_clients": 2}, "running mean"),
        ({"privacy.example_clip": 1.0, "privacy.example_noise_multiplier": 1.0}, "mean representation"),
        ({"privacy.clip": "1.0", "privacy.noise_multiplier": 1.0}, "does more with the clients' uploads"),
    ],
)
def test_refusals_are_one_sentence(tmp_path, changes, says):
    with pytest.raises(ConfigError) as refused:
        validate(_config(tmp_path, **changes))
    sentence = str(refused.value)
    assert says in sentence and sentence.endswith(".") and "\n" not in sentence


def test_learns_and_reports_its_metrics_with_newcomers(tmp_path):
    result = run_experiment(_config(tmp_path, rounds=4, participation=0.75, **{"eval.new_clients": 0.25}))
    final = result.final
    assert final["lm_ptest"] > 0.3 and final["gm_gtest"] > 0.3  # ten classes: chance is 0.1
    assert final["new_lm_ptest"] is not None and final["new_lm_ptest"] > 0.2
    losses = [row["train_loss"] for row in result.rows if row.get("train_loss") is not None]
    assert losses[-1] < losses[0]


def test_runs_asynchronously(tmp_path):
    result = run_experiment(
        _config(tmp_path, rounds=3, **{"deployment.mode": "async", "deployment.devices": "lognormal:1"})
    )
    assert [row["round"] for row in result.rows] == [1, 2, 3]
    assert result.final["lm_ptest"] > 0.1 and result.final["gm_gtest"] is not None


@pytest.mark.ray
def test_serial_equals_ray(tmp_path, ray_local):
    rows = assert_serial_equals_ray(tmp_path, algo="feddbe", rounds=2, participation=0.75, **PLUGIN)
    assert rows[-1]["lm_ptest"] is not None
