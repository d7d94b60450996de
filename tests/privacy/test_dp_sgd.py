"""DP-SGD in the shared local-training loop (raysim.privacy.dp_sgd; Abadi et al., CCS 2016,
Algorithm 1): per-example clipping on a hand case, the noise's standard deviation, the two ways of
computing per-example gradients agreeing, the loop unchanged without DP, the refusals, keyed noise."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim.config import ExperimentConfig, PrivacyConfig, TrainConfig
from raysim.errors import ConfigError
from raysim.models import SplitModel, build_model
from raysim.privacy.dp_sgd import DPSGD, check, clip_and_sum, for_client, poisson_batches, sampling_rate
from raysim.toolkit.sgd import SGD
from raysim.toolkit.train import SGDConfig, local_train, set_trainable


def linear_model() -> SplitModel:
    """w in R^2 (the head, no bias), everything else the identity: model(x) = w . x."""
    head = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        head.weight.zero_()
    return SplitModel(nn.Identity(), nn.Identity(), head, feature_dim=2, num_classes=1)


def half_square(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """mean over the batch of 0.5 (w . x_i - y_i)^2: example i's gradient is (w . x_i - y_i) x_i."""
    return (0.5 * (model(x).squeeze(1) - y) ** 2).mean()


def ce(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


# w = 0, so g_i = -y_i x_i: g_1 = (-3, -4) (norm 5), g_2 = (0.6, 0.8) (norm 1)
X = torch.tensor([[3.0, 4.0], [0.6, 0.8]])
Y = torch.tensor([1.0, -1.0])


@pytest.mark.parametrize("way", ["torch_func", "opacus"])
def test_clipping_on_a_hand_case(way: str) -> None:
    model = linear_model()
    params = set_trainable(model, ("head",))
    dp = DPSGD(clip=2.0, noise_multiplier=0.0, expected_batch=2.0, per_example=way)
    with dp.attach(model, params) as steps:
        per, loss = steps.per_example(half_square, X, Y)
    assert torch.allclose(per[0].reshape(2, 2), torch.tensor([[-3.0, -4.0], [0.6, 0.8]]))
    assert float(loss) == pytest.approx((0.5 * 1 + 0.5 * 1) / 2)
    sums, norms = clip_and_sum(per, 2.0)
    assert norms.tolist() == pytest.approx([5.0, 1.0])
    # g_1 clipped to norm 2: (-1.2, -1.6); g_2 (norm 1 <= 2) unchanged; their sum (-0.6, -0.8)
    assert sums[0].reshape(2).tolist() == pytest.approx([-0.6, -0.8], abs=1e-6)
    for i in range(2):
        one, _ = clip_and_sum([g[i : i + 1] for g in per], 2.0)
        assert float(one[0].norm()) <= 2.0 + 1e-6
    # one step of the loop, lr 1, no noise: w = -(sum / L) = (0.3, 0.4)
    stats = local_train(
        model, lambda e: [(X, Y)], epochs=1, parts=("head",), sgd=SGDConfig(1.0), loss_fn=half_square, dp=dp
    )
    assert model.head.weight.reshape(2).tolist() == pytest.approx([0.3, 0.4], abs=1e-6)
    assert stats.steps == 1 and stats.samples == 2 and dp.steps == 1


def test_every_clipped_gradient_of_a_cnn_is_within_the_clip() -> None:
    torch.manual_seed(0)
    model = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 0)
    params = set_trainable(model, ("extractor", "filter", "head"))
    x, y = torch.randn(6, 1, 28, 28) * 3, torch.randint(0, 10, (6,))
    dp = DPSGD(clip=0.05, noise_multiplier=0.0, expected_batch=6.0)
    with dp.attach(model, params) as steps:
        per, _ = steps.per_example(ce, x, y)
    _, norms = clip_and_sum(per, 0.05)
    assert (norms > 0.05).all()  # every one is clipped here
    for i in range(6):
        one, _ = clip_and_sum([g[i : i + 1] for g in per], 0.05)
        total = torch.stack([t.pow(2).sum() for t in one]).sum().sqrt()
        assert float(total) == pytest.approx(0.05, rel=1e-5)


def test_the_noise_has_standard_deviation_sigma_times_clip() -> None:
    model = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 0)
    params = set_trainable(model, ("extractor", "filter", "head"))
    dp = DPSGD(clip=2.0, noise_multiplier=1.5, expected_batch=1.0, noise=torch.Generator().manual_seed(7))
    draws = []
    empty = (torch.zeros(0, 1, 28, 28), torch.zeros(0, dtype=torch.long))
    with dp.attach(model, params) as steps:
        for _ in range(3):
            assert steps.step(ce, *empty) is None  # an empty lot: noise alone
            draws.append(torch.cat([p.grad.flatten() for p in params]))
    z = torch.cat(draws).double()
    assert z.numel() > 300_000
    # sigma C = 3; the sample std of n normals is within 4 / sqrt(2n) of it (relative) with overwhelming odds
    assert float(z.std()) == pytest.approx(3.0, rel=4 / (2 * z.numel()) ** 0.5)
    assert abs(float(z.mean())) < 4 * 3.0 / z.numel() ** 0.5


def prox_cross_entropy(anchor: list[torch.Tensor], mu: float):
    def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        prox = torch.stack(
            [(p - a).pow(2).sum() for p, a in zip(model.head.parameters(), anchor, strict=True)]
        ).sum()
        return F.cross_entropy(model(x), y) + 0.5 * mu * prox

    return loss


@pytest.mark.parametrize("with_prox", [False, True])
def test_torch_func_and_opacus_give_the_same_clipped_sums(with_prox: bool) -> None:
    torch.manual_seed(1)
    model = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 3)
    params = set_trainable(model, ("extractor", "filter", "head"))
    if with_prox:  # a term of the parameters alone (FedProx's), in every example's gradient
        anchor = [p.detach() + 0.1 * torch.randn_like(p) for p in model.head.parameters()]
        loss_fn = prox_cross_entropy(anchor, 0.5)
    else:
        loss_fn = ce
    x, y = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))
    got = {}
    for way in ("opacus", "torch_func"):
        dp = DPSGD(clip=0.5, noise_multiplier=0.0, expected_batch=12.0, per_example=way)
        with dp.attach(model, params) as steps:
            per, loss = steps.per_example(loss_fn, x, y)
        got[way] = (clip_and_sum(per, 0.5), float(loss))
    # torch_func against the definition: one backward pass per example
    with dp.attach(model, params) as steps:
        per, _ = steps.per_example(loss_fn, x, y)
    for i in (0, 7):
        ref = torch.autograd.grad(loss_fn(model, x[i : i + 1], y[i : i + 1]), params)
        for g, r in zip(per, ref, strict=True):
            assert torch.allclose(g[i], r, rtol=1e-4, atol=1e-6)
    (s_f, n_f), l_f = got["torch_func"]
    (s_o, n_o), l_o = got["opacus"]
    assert l_f == pytest.approx(l_o, rel=1e-5)
    assert torch.allclose(n_f, n_o, rtol=1e-4, atol=1e-6)
    assert (n_f > 0.5).any()  # clipping is at work
    for a, b in zip(s_f, s_o, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    # the opacus hooks leave the model as it was: plain training afterwards works
    assert all(getattr(p, "grad_sample", None) is None for p in params)


def test_a_whole_pass_is_the_same_either_way() -> None:
    x, y = torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,))
    weights = {}
    for way in ("torch_func", "opacus"):
        model = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 5)
        dp = DPSGD(clip=1.0, noise_multiplier=1.0, expected_batch=10.0, per_example=way,
                   noise=torch.Generator().manual_seed(3), lots=torch.Generator().manual_seed(4))  # fmt: skip
        local_train(model, lambda e, dp=dp: dp.lot_batches(x, y, 4), epochs=2, parts=("extractor", "filter", "head"),
                    sgd=SGDConfig(0.05, momentum=0.9, weight_decay=1e-4), dp=dp)  # fmt: skip
        weights[way] = torch.cat([p.detach().flatten() for p in model.parameters()])
        assert dp.steps == 8
    assert torch.allclose(weights["torch_func"], weights["opacus"], rtol=1e-4, atol=1e-5)


def test_without_dp_the_loop_is_plain_sgd_to_the_bit() -> None:
    torch.manual_seed(2)
    x, y = torch.randn(30, 1, 28, 28), torch.randint(0, 10, (30,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 30, 8)]
    model = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 9)
    ref = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 9)
    stats = local_train(model, lambda e: batches, epochs=2, parts=("extractor", "filter", "head"),
                        sgd=SGDConfig(0.1, 0.9, 1e-4))  # fmt: skip
    params = set_trainable(ref, ("extractor", "filter", "head"))
    opt = SGD(params, 0.1, 0.9, 1e-4)
    total = None
    for _ in range(2):
        for xb, yb in batches:
            opt.zero_grad()
            loss = F.cross_entropy(ref(xb), yb)
            loss.backward()
            opt.step()
            total = loss.detach().double() if total is None else total + loss.detach().double()
    assert stats.loss == float(total) / 8 and stats.steps == 8 and stats.samples == 60
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


def dp_config(**changes: object) -> ExperimentConfig:
    cfg = ExperimentConfig(privacy=PrivacyConfig(example_clip=1.0, example_noise_multiplier=1.1))
    return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]


def test_batch_norm_and_batched_clients_are_refused_in_one_sentence() -> None:
    check(dp_config())  # the default model has no BatchNorm
    with pytest.raises(
        ConfigError,
        match=r"^privacy.example_clip \(DP-SGD\).*BatchNorm layers, which normalise by the whole batch\.$",
    ):
        check(dp_config(model="cnn3p2_fmnist_bn"))
    with pytest.raises(ConfigError, match=r"set train.batch_clients to 1\.$"):
        check(dp_config(train=TrainConfig(batch_clients=4)))
    check(
        dataclasses.replace(dp_config(model="cnn3p2_fmnist_bn"), privacy=PrivacyConfig())
    )  # DP off: no refusal
    bn = build_model("cnn3p2_fmnist_bn", (1, 28, 28), 10, 0)
    with pytest.raises(ValueError, match="BatchNorm"):
        DPSGD(clip=1.0, noise_multiplier=1.0, expected_batch=4.0).attach(bn, list(bn.parameters()))


def test_the_same_seed_draws_the_same_noise_and_lots() -> None:
    cfg = dp_config()
    x, y = torch.randn(50, 1, 28, 28), torch.randint(0, 10, (50,))

    def run(rnd: int, client: int) -> torch.Tensor:
        model = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 0)
        dp = for_client(cfg, rnd, client, 50)
        assert dp is not None and dp.expected_batch == pytest.approx(min(cfg.train.batch_size, 50))
        local_train(
            model, lambda e: dp.lot_batches(x, y, 2), epochs=1, parts=("head",), sgd=SGDConfig(0.1), dp=dp
        )
        return model.head.weight.detach().clone()

    assert torch.equal(run(1, 3), run(1, 3))
    assert not torch.equal(run(1, 3), run(1, 4))
    assert not torch.equal(run(1, 3), run(2, 3))
    assert for_client(ExperimentConfig(), 1, 3, 50) is None  # DP off


def test_poisson_lots_have_the_expected_size() -> None:
    assert sampling_rate(32, 640) == 0.05 and sampling_rate(32, 20) == 1.0 and sampling_rate(32, 0) == 0.0
    x = torch.arange(400).float().unsqueeze(1)
    sizes = [
        int(b[0].shape[0])
        for b in poisson_batches(x, x[:, 0].long(), 0.1, 2000, torch.Generator().manual_seed(0))
    ]
    mean = sum(sizes) / len(sizes)
    # Binomial(400, 0.1): mean 40, variance 36; the mean of 2000 lots within 4 standard errors
    assert abs(mean - 40) < 4 * (36 / 2000) ** 0.5
    assert len(set(sizes)) > 10  # the lots' sizes vary, as Poisson sampling's do
