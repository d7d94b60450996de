"""FedCP: the policy's split of each feature and the two heads' sum, the MMD term by hand, what a
client shares, keeps and leaves frozen, the server's averages, a short run that learns, serial
against Ray, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

import algorithms.fedcp  # noqa: F401  (registers "fedcp")
from algorithms.fedcp import (
    FedCP,
    build_cpn,
    conditional_input,
    fedcp_output,
    flatten_cpn,
    load_cpn,
    mmd,
    policy,
)
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import BODY
from tests.conftest import assert_serial_equals_ray, run_round, tiny_config

PLUGIN = {"plugins": ("algorithms.fedcp",)}


def _config(tmp_path, **changes):
    return tiny_config(tmp_path, algo="fedcp", **PLUGIN, **changes)


def _executor(tmp_path, **changes):
    cfg = _config(tmp_path, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _tiny_model(seed=1):
    from raysim.models import build_model

    return build_model("mlp_fcd", (1, 4, 4), 3, seed=seed, adapt=FedCP.adapt_model).double()


def _batch(n=6, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 4, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def test_the_personal_head_starts_as_the_global_head():
    import torch

    model = _tiny_model()
    assert torch.equal(model.phead.weight, model.head.weight) and torch.equal(
        model.phead.bias, model.head.bias
    )


def test_the_conditional_input_is_the_personal_heads_rows_summed_and_normalised():
    model = _tiny_model()
    w = model.phead.weight.detach().numpy()
    want = w.sum(axis=0) / np.linalg.norm(w.sum(axis=0))
    np.testing.assert_allclose(conditional_input(model.phead.weight).numpy(), want, rtol=1e-12)


def test_a_zero_cpn_splits_every_feature_in_halves_between_the_two_heads():
    """With every CPN parameter 0 (LayerNorm's scale too) the logits are 0: the noise-free policy
    is r = s = 1/2, and the output is W^hp(h/2) + W^hg(h/2), computed here by hand."""
    import torch

    model = _tiny_model()
    with torch.no_grad():  # a personal head unlike the global one
        model.phead.weight.mul_(-2.0)
        model.phead.bias.add_(1.0)
    cpn = build_cpn(model.filter_dim, 0).double()
    load_cpn(cpn, np.zeros_like(flatten_cpn(cpn)))
    x, _ = _batch()
    v = conditional_input(model.phead.weight)
    with torch.no_grad():
        out, h = fedcp_output(model, cpn, v, x, tau=1.0)
        hn = h.numpy()
        wp, bp = model.phead.weight.numpy(), model.phead.bias.numpy()
        wg, bg = model.head.weight.numpy(), model.head.bias.numpy()
    want = (hn / 2) @ wp.T + bp + (hn / 2) @ wg.T + bg
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)


def test_the_policy_is_a_gumbel_softmax_over_each_pair_and_its_draws_are_keyed():
    import torch

    model = _tiny_model()
    cpn = build_cpn(model.filter_dim, 5).double()
    x, _ = _batch(8)
    v = conditional_input(model.phead.weight)
    with torch.no_grad():
        h = model.filter(model.extractor(x))
        logits = cpn(h * v).numpy()
        r, s = policy(cpn, h, v, tau=0.5)
        noisy_r, noisy_s = policy(cpn, h, v, tau=0.5, noise=torch.Generator().manual_seed(7))
        again_r, _ = policy(cpn, h, v, tau=0.5, noise=torch.Generator().manual_seed(7))
        g = (
            -torch.empty(logits.shape, dtype=torch.float64)
            .exponential_(generator=torch.Generator().manual_seed(7))
            .log()
            .numpy()
        )
    # noise-free: softmax(logits / tau) over (personal, global), feature by feature
    want_r = 1 / (1 + np.exp((logits[:, 1, :] - logits[:, 0, :]) / 0.5))
    np.testing.assert_allclose(r.numpy(), want_r, rtol=1e-12)
    np.testing.assert_allclose((r + s).numpy(), 1.0, rtol=1e-12)
    # with noise: the same softmax of the logits plus standard Gumbel draws from the generator
    z = logits + g
    np.testing.assert_allclose(noisy_r.numpy(), 1 / (1 + np.exp((z[:, 1, :] - z[:, 0, :]) / 0.5)), rtol=1e-10)
    np.testing.assert_allclose((noisy_r + noisy_s).numpy(), 1.0, rtol=1e-12)
    assert torch.equal(noisy_r, again_r) and not torch.allclose(noisy_r, r)


def _mmd_by_hand(a, b, bandwidths=(10.0, 15.0, 20.0, 50.0)):
    def k(u, w):
        return sum(math.exp(-float(np.sum((u - w) ** 2)) / (2 * sigma)) for sigma in bandwidths)

    n = len(a)
    total = sum(k(a[i], a[j]) + k(b[i], b[j]) - 2 * k(a[i], b[j]) for i in range(n) for j in range(n))
    return total / n**2


def test_mmd_is_the_mean_of_the_rbf_kernel_sums_by_hand():
    import torch

    a = np.array([[0.0, 0.0], [3.0, 4.0], [1.0, -1.0]])
    b = np.array([[1.0, 0.0], [0.0, 2.0], [-2.0, 1.0]])
    got = float(mmd(torch.from_numpy(a), torch.from_numpy(b)))
    assert got == pytest.approx(_mmd_by_hand(a, b), rel=1e-12)
    assert got > 0.1
    assert float(mmd(torch.from_numpy(a), torch.from_numpy(a))) == pytest.approx(0.0, abs=1e-12)


def test_a_round_shares_body_cpn_and_mixed_head_keeps_the_personal_head(tmp_path):
    ex = _executor(tmp_path)
    algo, start = ex.runtime.algo, ex.server.state
    initial = ex.runtime.initial_weights
    got = run_round(ex, 1, [3, 1])
    assert [r.client for r in got] == [3, 1]
    for r in got:
        kept = ex.runtime.kept(r.client)
        # personal: the personal head stays on the client, trained, and is not uploaded
        assert kept.part_names == ("phead",) and not np.array_equal(kept.part("phead"), initial.part("phead"))
        assert r.weights.part_names == ("extractor", "filter", "head")
        # shared: the trained body, the trained CPN, and half the personal head plus half the received head
        assert not np.array_equal(r.weights.part("extractor"), start.weights.part("extractor"))
        assert not np.array_equal(r.extra, start.cpn)
        want = 0.5 * kept.part("phead") + 0.5 * start.weights.part("head")
        np.testing.assert_allclose(r.weights.part("head"), want, rtol=0, atol=1e-7)
    assert ex.runtime.kept(2).part_names == ()  # a client that did not train keeps nothing
    # the server: every upload averaged by training-set size
    sizes = np.array([r.num_samples for r in got], dtype=np.float64)
    share = sizes / sizes.sum()
    for part in ("extractor", "filter", "head"):
        want = sum(c * r.weights.part(part).astype(np.float64) for c, r in zip(share, got, strict=True))
        np.testing.assert_allclose(ex.server.state.weights.part(part), want, rtol=1e-6, atol=1e-7)
    want_cpn = sum(c * r.extra.astype(np.float64) for c, r in zip(share, got, strict=True))
    np.testing.assert_allclose(ex.server.state.cpn, want_cpn, rtol=1e-6, atol=1e-7)
    assert algo.params.head_mix == 0.5


def test_the_global_head_is_frozen_during_the_local_update(tmp_path):
    """With head_mix 0 the uploaded head is the received one to the bit: the local update never moved it."""
    ex = _executor(tmp_path, **{"algo.head_mix": 0.0})
    start = ex.server.state.weights.part("head").copy()
    (r,) = run_round(ex, 1, [3])
    np.testing.assert_array_equal(r.weights.part("head"), start)
    # ... while the personal head it reads beside it trained
    assert not np.array_equal(ex.runtime.kept(3).part("phead"), start)


def test_the_loss_is_the_split_outputs_cross_entropy_plus_lambda_mmd_to_the_received_body(tmp_path):
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.context import ClientContext

    ex = _executor(tmp_path, **{"algo.lambda": 3.0})
    algo = ex.runtime.algo
    run_round(ex, 1, [3])  # client 3 keeps a trained personal head
    payload = ex.server.plan(2, [3])[0].payload
    ctx = ClientContext(ex.runtime, 3, 2)
    ctx.load(payload.weights.merged(ctx.kept(("phead",))))
    cpn = algo.worker_cpn(ctx, payload.cpn)
    loss = algo.objective(ctx, payload, cpn, torch.Generator().manual_seed(11))
    x, y = (t[:20] for t in ctx.train_tensors())
    with torch.no_grad():  # the body moved away from the received one, so the MMD term is not 0
        for p in ctx.model.extractor.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
        got = float(loss(ctx.model, x, y))
        v = conditional_input(ctx.model.phead.weight)
        out, h = fedcp_output(ctx.model, cpn, v, x, 1.0, torch.Generator().manual_seed(11))
        ce = float(F.cross_entropy(out, y))
        received = ctx.scratch_model("check/received")
        from raysim.models import set_weights

        set_weights(received, payload.weights.select(BODY))
        h_global = received.filter(received.extractor(x))
        term = _mmd_by_hand(h.double().numpy(), h_global.double().numpy())
    assert term > 1e-3
    assert got == pytest.approx(ce + 3.0 * term, rel=1e-4)


def test_learns_and_reports_only_personal_metrics(tmp_path):
    result = run_experiment(_config(tmp_path, rounds=3, participation=0.75))
    assert result.final["gm_gtest"] is None
    assert result.final["lm_ptest"] > 0.4  # 10 classes: well above chance after 3 rounds
    losses = [row["train_loss"] for row in result.rows]
    assert 0 < losses[-1] < losses[0]


@pytest.mark.ray
def test_serial_equals_ray(tmp_path, ray_local):
    assert_serial_equals_ray(
        tmp_path, algo="fedcp", rounds=2, participation=0.75, **PLUGIN, **{"eval.every": 1}
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("lambda", -1), ("tau", 0), ("tau", -1.0), ("tau", "warm"), ("head_mix", 1.5), ("head_mix", -0.1)],
)
def test_a_mistyped_setting_is_refused_in_one_sentence(tmp_path, name, value):
    with pytest.raises(ConfigError) as refused:
        validate(_config(tmp_path, **{f"algo.{name}": value}))
    sentence = str(refused.value)
    assert f"algo.{name}" in sentence and sentence.endswith(".") and "\n" not in sentence


@pytest.mark.parametrize(
    ("changes", "why"),
    [({"train.batch_clients": 2}, "Gumbel noise"), ({"deployment.mode": "async"}, "rebasing")],
)
def test_batched_and_asynchronous_runs_are_refused_with_the_reason(tmp_path, changes, why):
    with pytest.raises(ConfigError, match=why):
        validate(_config(tmp_path, **changes))
