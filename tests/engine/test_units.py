"""Small units of the engine: weights on the wire, aggregation, placement, learning-rate schedule."""

from __future__ import annotations

import numpy as np
import pytest

from raysim import rng
from raysim.engine.executors.evaluation import split_targets
from raysim.engine.executors.placement import lpt_assign
from raysim.errors import ConfigError
from raysim.models import build_model, get_weights, set_weights
from raysim.records import EvalTarget
from raysim.registry import MODELS
from raysim.toolkit.aggregate import apply_updates, subtract, weighted_mean
from raysim.weights import PARTS, ModelWeights
from tests.conftest import tiny_config


def test_weights_round_trip_every_model():
    shapes = {
        "cnn3p2_fmnist": (1, 28, 28),
        "cnn3p2_cifar": (3, 32, 32),
        "mlp_fcd": (1, 28, 28),
        "cnn_fcd": (3, 32, 32),
        "cnn_pac": (1, 28, 28),
        "cnn_pac_bn": (1, 28, 28),
        "cnn3p2_fmnist_bn": (1, 28, 28),
        "cnn_pac_cifar": (3, 32, 32),
        "vgg11": (3, 32, 32),
        "mobilenet": (3, 32, 32),
        "resnet18": (3, 32, 32),
    }
    assert set(shapes) == set(MODELS.names())
    for name, shape in shapes.items():
        a, b = build_model(name, shape, 10, seed=1), build_model(name, shape, 10, seed=2)
        wa = get_weights(a, PARTS)
        assert not wa.equals(get_weights(b, PARTS))
        set_weights(b, wa)
        assert wa.equals(get_weights(b, PARTS))
        assert all(arr.dtype == np.float32 and arr.flags.c_contiguous for _, arr in wa.items())
        assert get_weights(build_model(name, shape, 10, seed=1), PARTS).equals(wa)  # seeded


def test_a_parts_layout_is_read_again_when_its_module_tree_changes():
    """The flat layout a part is loaded and read through (``raysim.models.layout``) is kept between
    calls, and read again when a parameter is replaced, a buffer is put in place without being
    registered (``Module._apply``) or a module is added: the flat arrays always follow the model."""
    import torch
    from torch import nn

    from raysim.models import float_tensors, layout

    model = build_model("cnn3p2_fmnist", (1, 16, 16), 10, seed=0)
    head = model.part("head")
    assert layout(head) is layout(head)  # kept while nothing changed
    weights = get_weights(model, PARTS)
    head.weight = nn.Parameter(torch.zeros_like(head.weight))  # registered: the layout is read again
    assert float_tensors(head)[0] is head.weight
    set_weights(model, weights)  # into the new parameter
    assert np.array_equal(head.weight.detach().numpy().reshape(-1), weights.head[: head.weight.numel()])
    norm = nn.BatchNorm1d(head.in_features)
    model.filter = nn.Sequential(model.filter, norm)  # a new module with buffers: a longer filter part
    assert sum(t.numel() for t in float_tensors(model.part("filter"))) == weights.filter.size + 4 * head.in_features
    norm._buffers["running_mean"] = torch.full((head.in_features,), 3.0)  # not registered, as _apply does
    n = head.in_features  # the norm's weight, bias, running mean and running variance end the part
    assert get_weights(model, ("filter",)).filter[-2 * n : -n].tolist() == [3.0] * n


def test_a_weights_loader_loads_what_set_weights_loads():
    """``WeightsLoader`` (a worker's clients loading one payload again and again) puts the same
    values in the same tensors as ``set_weights``: for the same weights after training moved the
    model, for other weights, and after the model's tree changed."""
    import torch
    from torch import nn

    from raysim.models import WeightsLoader

    model = build_model("cnn3p2_fmnist", (1, 16, 16), 10, seed=0)
    loader = WeightsLoader()
    first = get_weights(build_model("cnn3p2_fmnist", (1, 16, 16), 10, seed=1), PARTS)
    for arr in (first.extractor, first.head):
        arr.setflags(write=False)  # as the object store's arrays are
    second = get_weights(build_model("cnn3p2_fmnist", (1, 16, 16), 10, seed=2), ("head",))
    for weights in (first, first, second, first):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # what a client's training does between two loads
        loader.load(model, weights)
        assert get_weights(model, weights.part_names).equals(weights)
    model.head = nn.Linear(model.head.in_features, model.head.out_features)  # a new head module
    loader.load(model, first)
    assert get_weights(model, PARTS).equals(first)


def test_fedpacs_models_are_the_authors():
    """cnn_pac and cnn_pac_cifar as JianXu95/FedPAC's CNN_FMNIST and CifarCNN: the second conv
    (and the CIFAR one's third) padded by 1, every conv max-pooled, so FC 128 reads 32 x 5 x 5 and
    64 x 3 x 3 values."""
    from torch import nn

    for name, shape, fc_in, convs in (
        ("cnn_pac", (1, 28, 28), 800, [(16, 0), (32, 1)]),
        ("cnn_pac_cifar", (3, 32, 32), 576, [(16, 0), (32, 1), (64, 1)]),
    ):
        model = build_model(name, shape, 10, seed=0)
        layers = list(model.extractor)
        assert [(m.out_channels, m.padding[0]) for m in layers if isinstance(m, nn.Conv2d)] == convs
        assert sum(isinstance(m, nn.MaxPool2d) for m in layers) == len(convs)
        fc = [m for m in layers if isinstance(m, nn.Linear)]
        assert [(m.in_features, m.out_features) for m in fc] == [(fc_in, 128)]


def test_pooling_before_the_activation_gives_the_papers_numbers_to_the_bit():
    """The conv stacks pool first and apply ReLU after (a quarter of the values to activate); the
    papers' nets activate first. The same weights, both orders: the same outputs and the same
    gradients to the bit, over steps of training and in train mode (BatchNorm's batch statistics),
    on inputs shifted so that many pooling windows hold no positive value."""
    import torch
    from torch import nn

    from raysim.models import activation_before_pool
    from raysim.toolkit.train import cross_entropy

    for name, shape in (("cnn3p2_fmnist", (1, 28, 28)), ("cnn3p2_fmnist_bn", (1, 28, 28)),
                        ("cnn3p2_cifar", (3, 32, 32)), ("cnn_fcd", (1, 28, 28))):  # fmt: skip
        ours = build_model(name, shape, 10, seed=2)
        layers = list(ours.extractor)
        pools = [i for i, m in enumerate(layers) if isinstance(m, nn.MaxPool2d)]
        assert pools and all(isinstance(layers[i + 1], nn.ReLU) for i in pools)
        theirs = activation_before_pool(ours)
        assert all(isinstance(theirs.extractor[i], nn.ReLU) and isinstance(theirs.extractor[i + 1], nn.MaxPool2d)
                   for i in pools)  # fmt: skip
        gen = torch.Generator().manual_seed(3)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
        for _ in range(3):
            x = torch.randn(12, *shape, generator=gen) - 0.5
            y = torch.randint(0, 10, (12,), generator=gen)
            outs = []
            for m, opt in zip((ours, theirs), opts, strict=True):
                opt.zero_grad()
                out = m(x)
                cross_entropy(m, x, y).backward()
                outs.append(out.detach())
                grads = [(n, q.grad.clone()) for n, q in m.named_parameters() if q.grad is not None]
                opt.step()
                outs.append(grads)
            assert torch.equal(outs[0], outs[2])
            assert [n for n, _ in outs[1]] == [n for n, _ in outs[3]] and len(outs[1]) > 4
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(outs[1], outs[3], strict=True))
        assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="no max-pool followed by an activation"):
        activation_before_pool(build_model("mlp_fcd", (1, 28, 28), 10, seed=0))


def test_channels_last_changes_the_layout_only():
    """``train.channels_last``: the same parameters and flat arrays as NCHW, the kernels in the
    channels-last format; one step's gradients agree to float rounding."""
    import torch

    for name, shape in (("cnn3p2_fmnist", (1, 28, 28)), ("cnn_pac_cifar", (3, 32, 32)), ("resnet18", (3, 32, 32))):
        cl, nchw = (build_model(name, shape, 10, seed=1, channels_last=c) for c in (True, False))
        assert get_weights(cl, PARTS).equals(get_weights(nchw, PARTS))
        kernels = [p for p in cl.parameters() if p.dim() == 4]
        assert kernels and all(p.is_contiguous(memory_format=torch.channels_last) for p in kernels)
        assert all(p.is_contiguous() for p in nchw.parameters())
        set_weights(nchw, get_weights(cl, PARTS))  # a flat array loads into either layout alike
        assert get_weights(nchw, PARTS).equals(get_weights(cl, PARTS))
        x, y = torch.randn(8, *shape, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 10
        for m in (cl, nchw):
            m.eval()  # batch-norm statistics untouched
            torch.nn.functional.cross_entropy(m(x), y).backward()
        for a, b in zip(cl.parameters(), nchw.parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None)  # the personal head takes no part
            # measured across seven kernel choices on a 2-core AMD EPYC (Zen 4): ATEN_CPU_CAPABILITY
            # default, avx2 and avx512, oneDNN on and off (ONEDNN_MAX_CPU_ISA=AVX2 too), MKL_CBWR
            # AVX2 and COMPATIBLE: at most 1.3e-6 apart on the small CNNs (as each layout is from
            # float64's), bound 1e-5; ResNet-18's 3x3 convolutions at most 9.7e-4 (oneDNN's AVX2
            # kernels; 6.4e-5 without oneDNN, 1.7e-6 with its AVX-512 ones), bound 1e-2
            tol = 1e-2 if name == "resnet18" else 1e-5
            if b.grad is not None:
                assert float((a.grad - b.grad).norm()) <= tol * float(b.grad.norm())


def test_cifar_backbones_split_into_extractor_and_head():
    import torch

    for name, d in (("vgg11", 512), ("mobilenet", 1024), ("resnet18", 512)):
        model = build_model(name, (3, 32, 32), 100, seed=0)
        model.eval()
        x = torch.randn(2, 3, 32, 32)
        z = model.extractor(x)
        assert z.shape == (2, d) == (2, model.feature_dim) and model.filter_dim == d
        assert model(x).shape == (2, 100)
        torch.testing.assert_close(model(x), model.head(z))
        assert get_weights(model, ("head",)).part("head").size == 100 * d + 100
    with pytest.raises(ConfigError, match="needs images of at least 32x32"):  # five max-pools
        build_model("vgg11", (1, 28, 28), 10, seed=0)


@pytest.mark.parametrize("name", MODELS.names())
def test_each_model_entry_says_what_it_needs_of_the_input(name):
    """The registry's feature size is the built model's, and its smallest input is the smallest
    the layers take: one pixel less does not fit (the entry is what the driver checks a config
    against, without building anything)."""
    import torch

    from raysim.models import SplitModel

    entry = MODELS.get(name)
    channels = entry.channels or 3
    s = entry.min_size
    model = entry.build((channels, s, s), 10)
    assert isinstance(model, SplitModel) and model.filter_dim == entry.feature_dim
    model.eval()
    with torch.no_grad():
        assert model(torch.zeros(2, channels, s, s)).shape == (2, 10)
    if s > 1:
        with pytest.raises(RuntimeError):
            with torch.no_grad():
                entry.build((channels, s - 1, s - 1), 10)(torch.zeros(2, channels, s - 1, s - 1))
        with pytest.raises(ConfigError, match=f"at least {s}x{s}"):
            entry.check_input(name, (channels, s - 1, s - 1))


def test_weighted_mean_and_updates():
    w = [
        ModelWeights(head=np.array([1.0, 2.0], np.float32)),
        ModelWeights(head=np.array([3.0, 6.0], np.float32)),
    ]
    np.testing.assert_allclose(weighted_mean(w, [1, 3]).head, [2.5, 5.0])
    delta = subtract(w[1], w[0])
    np.testing.assert_allclose(delta.head, [2.0, 4.0])
    np.testing.assert_allclose(apply_updates(w[1], [delta], [0.5]).head, [2.0, 4.0])


def test_lpt_balances_and_is_deterministic():
    costs = [10.0, 9.0, 8.0, 1.0, 1.0, 1.0]
    bins = lpt_assign(costs, 2)
    loads = [sum(c for c, b in zip(costs, bins, strict=True) if b == k) for k in range(2)]
    assert max(loads) <= 4 / 3 * sum(costs) / 2 and bins == lpt_assign(costs, 2)  # Graham's LPT bound
    chunks = split_targets([EvalTarget("ptest", np.arange(10)), EvalTarget("gtest", np.arange(4))], 3)
    assert [[t.indices.tolist() for t in w] for w in chunks] == [
        [[0, 1, 2, 3], [0, 1]],
        [[4, 5, 6], [2]],
        [[7, 8, 9], [3]],
    ]


def test_client_sampling_is_seeded_per_round():
    a = rng.sample_clients(0, 1, 100, 10)
    assert a == rng.sample_clients(0, 1, 100, 10) and len(set(a)) == 10 and a == sorted(a)
    assert a != rng.sample_clients(0, 2, 100, 10) and a != rng.sample_clients(1, 1, 100, 10)
    assert rng.sample_clients(0, 1, 5, 10) == [0, 1, 2, 3, 4]


def test_learning_rate_schedules():
    from raysim.engine.experiment import make_algorithm

    algo = make_algorithm(tiny_config(rounds=100, **{"train.lr": 0.01, "train.lr_decay": 0.99}))
    assert algo.lr(1) == 0.01 and abs(algo.lr(3) - 0.01 * 0.99**2) < 1e-15
    step = make_algorithm(
        tiny_config(
            rounds=320, **{"train.lr": 1.0, "train.lr_decay": 1.0, "train.lr_milestones": (0.5, 0.75)}
        )
    )
    assert [step.lr(r) for r in (160, 161, 240, 241)] == [1.0, 0.1, 0.1, 1.0 * 0.1 * 0.1]
