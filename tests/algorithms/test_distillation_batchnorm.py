"""Distillation under BatchNorm: the frozen teacher normalises by the batch's statistics, as the
student does while it trains, so every term (KD, NTD, LD, FD, FedDr+'s L_FD through ``fd``) is
zero when the local weights equal the global ones, on every model with BatchNorm layers."""

from __future__ import annotations

import copy

import pytest
import torch

from raysim.capabilities.regularizers import term as term_of
from raysim.models import build_model
from raysim.registry import MODELS
from raysim.toolkit.distill import RegContext, as_teacher, regularized
from raysim.toolkit.train import proximal_anchor
from raysim.weights import GLOBAL_PARTS


def batchnorm_models() -> list[str]:
    out = []
    for name in MODELS.names():
        model = build_model(name, (3, 32, 32), 10, seed=0)
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            out.append(name)
    return out


def term_between_equal_weights(name: str, term: str, teacher_of) -> float:
    torch.manual_seed(0)
    model = build_model(name, (3, 32, 32), 10, seed=1)
    x = torch.randn(16, 3, 32, 32) * 2.0 + 0.5  # batch statistics far from the running ones (0, 1)
    y = torch.randint(0, 10, (16,))
    teacher = teacher_of(copy.deepcopy(model))
    model.train()
    rc = RegContext(teacher, proximal_anchor(model, GLOBAL_PARTS), GLOBAL_PARTS, 2.0)
    loss = regularized(lambda m, xb, yb: torch.zeros(()), [term_of(term)], 0.0, rc)
    with torch.no_grad():
        return float(loss(model, x, y))


def test_the_models_with_batchnorm_are_the_ones_expected():
    assert set(batchnorm_models()) == {"mobilenet", "resnet18", "cnn_pac_bn", "cnn3p2_fmnist_bn"}
    assert set(batchnorm_models()) == {n for n in MODELS.names() if MODELS.get(n).batch_norm}  # the registry says so


@pytest.mark.parametrize("name", ["mobilenet", "resnet18"])
@pytest.mark.parametrize("term", ["kd", "ntd", "ld", "fd"])
def test_a_distillation_term_is_zero_between_equal_weights(name, term):
    value = term_between_equal_weights(name, term, as_teacher)
    if term in ("ld", "fd"):  # the teacher's logits and features are the student's, bit for bit
        assert value == 0.0
    else:  # a KL divergence of equal distributions: zero up to its float32 rounding
        assert abs(value) < 1e-6


@pytest.mark.parametrize("name", ["mobilenet", "resnet18"])
def test_a_teacher_normalising_by_running_statistics_would_not_be(name):
    """The reading this replaces: the teacher in eval mode, its BatchNorm on running statistics."""

    def eval_mode(model):
        return model.eval()

    assert term_between_equal_weights(name, "fd", eval_mode) > 1e-3


def test_the_teacher_keeps_dropout_off():
    model = as_teacher(build_model("vgg11", (3, 32, 32), 10, seed=0))
    assert not any(m.training for m in model.modules() if isinstance(m, torch.nn.Dropout))
