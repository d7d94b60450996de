"""FedDr+: the simplex ETF, the frozen classifier, the two losses, FT after the rounds."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.frozen_head import dr_loss, etf_classifier
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate as check_config
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import BODY
from tests.conftest import tiny_config

SETUP = {"algo": "feddrplus", "participation": 0.5, "rounds": 2, "train.lr": 0.5}


def _executor(tmp_path, **changes):
    cfg = tiny_config(tmp_path, **{**SETUP, **changes})
    return SerialExecutor(cfg, prepare(cfg))


@pytest.mark.parametrize(("d", "c"), [(100, 10), (10, 10), (512, 100)])
def test_etf_has_unit_vectors_with_equal_negative_cosines(d, c):
    v = etf_classifier(d, c, seed=1).astype(np.float64)
    assert v.shape == (c, d)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    cos = v @ v.T / np.outer(np.linalg.norm(v, axis=1), np.linalg.norm(v, axis=1))
    off = cos[~np.eye(c, dtype=bool)]
    np.testing.assert_allclose(off, -1.0 / (c - 1), atol=1e-5)


def test_a_feature_size_below_the_class_count_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="feature size of at least the class count"):
        etf_classifier(5, 10, seed=0)
    # mlp_fcd's 100 features on 120 classes: refused when the run is set up, in one sentence
    cfg = tiny_config(
        tmp_path, **{**SETUP, "data.synthetic.num_classes": 120, "data.synthetic.train_samples": 2400}
    )
    with pytest.raises(ConfigError, match="feature size"):
        run_experiment(cfg)


def test_the_classifier_is_the_etf_and_bit_identical_after_training(tmp_path):
    ex = _executor(tmp_path)
    head0 = ex.server.state.weights.select(("head",))
    c = ex.data.num_classes
    w = head0.part("head")
    d = ex.runtime.model.filter_dim
    np.testing.assert_array_equal(w[c * d :], 0.0)  # zero bias
    for rnd in (1, 2):
        ex.train_round(rnd, [0, 1, 2, 3])
    assert ex.server.state.weights.select(("head",)).equals(head0)
    # a client's upload carries the body only, and its trained model kept the head exactly
    job = ex.server.plan(3, [0])[0]
    res = ex.runtime.run_chain(3, job.clients, job.payload, None)[0]
    assert set(res.weights.part_names) == set(BODY)
    np.testing.assert_array_equal(ex.runtime.model.head.weight.detach().numpy().ravel(), w[: c * d])


def test_the_head_rows_are_the_seeded_etf(tmp_path):
    from raysim import rng

    ex = _executor(tmp_path)
    c, d = ex.data.num_classes, ex.runtime.model.filter_dim
    expected = etf_classifier(d, c, rng.int_seed(ex.cfg.seed, "etf"))
    np.testing.assert_array_equal(ex.server.state.weights.part("head")[: c * d].reshape(c, d), expected)


def test_feature_distillation_vanishes_when_local_equals_global_and_dotreg_has_none(tmp_path):
    import copy

    import torch

    ex = _executor(tmp_path)
    model = ex.runtime.model
    from raysim.models import set_weights

    set_weights(model, ex.server.state.weights)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 4, (16,))
    teacher = copy.deepcopy(model)
    dr_only = dr_loss(1.0, None)(model, x, y)
    full = dr_loss(0.9, teacher)(model, x, y)
    torch.testing.assert_close(full, 0.9 * dr_only)  # L_FD = 0 when theta = theta_g
    with torch.no_grad():  # move the local extractor: now L_FD > 0
        for p in model.extractor.parameters():
            p.add_(0.05)
    assert dr_loss(0.9, teacher)(model, x, y) > 0.9 * dr_loss(1.0, None)(model, x, y)
    # dotreg: beta = 1, no teacher is even built, and another beta is refused
    dot = _executor(tmp_path / "dot", algo="dotreg")
    assert dot.server.algo.params.beta == 1.0
    with pytest.raises(ConfigError, match="beta = 1"):
        check_config(tiny_config(tmp_path, **{**SETUP, "algo": "dotreg", "algo.beta": 0.5}))


def test_prediction_by_cosine_equals_the_heads_argmax(tmp_path):
    import torch

    from raysim.models import set_weights
    from raysim.toolkit.features import representation

    ex = _executor(tmp_path)
    model = ex.runtime.model
    set_weights(model, ex.server.state.weights)
    x = torch.randn(64, 1, 8, 8)
    z = representation(model, x)
    v = model.head.weight
    cos = torch.nn.functional.cosine_similarity(z[:, None, :], v[None, :, :], dim=2)
    assert torch.equal(cos.argmax(1), model(x).argmax(1))


def test_ft_fine_tunes_the_global_model_on_each_clients_own_data_after_the_rounds(tmp_path):
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import SGDConfig, local_train

    ex = _executor(tmp_path, **{"algo.ft_epochs": 2})
    ex.train_round(1, [0, 1, 2, 3])
    report = ex.evaluate(1)  # not the last round: no personalised models yet
    assert all(c.lm_correct is None for c in report.clients)
    ex.train_round(2, [0, 1, 2, 3])
    global_before = ex.server.state.weights
    evaluation = ex.server.evaluation()
    # client 3's FT model, by the algorithm
    ctx = ClientContext(ex.runtime, 3, 2)
    ft = evaluation.personal_model(ex.runtime.algo, ctx)
    got = {p: t.detach().clone() for p, t in ft.state_dict().items()}
    # ... and by hand: the same loss, the same epochs of the fine-tuning stream, only client 3's samples
    ctx2 = ClientContext(ex.runtime, 3, 2)
    ctx2.load(evaluation.payload.weights)
    local_train(
        ctx2.model,
        lambda e: ctx2.batches(e, "finetune"),
        epochs=2,
        parts=BODY,
        sgd=SGDConfig(ex.cfg.train.lr, ex.cfg.train.momentum, ex.cfg.train.weight_decay),
        loss_fn=dr_loss(1.0, None),
    )
    for p, t in ctx2.model.state_dict().items():
        assert torch_equal(got[p], t), p
    assert ex.server.state.weights.equals(global_before)  # FT leaves the global model alone
    # FT used client 3's data alone: another client's FT from the same global model differs
    other = evaluation.personal_model(ex.runtime.algo, ClientContext(ex.runtime, 0, 2))
    assert not torch_equal(other.extractor[1].weight, got["extractor.1.weight"])


def torch_equal(a, b):
    import torch

    return torch.equal(a, b)


def test_feddrplus_reports_ft_accuracy_at_the_last_round_only(tmp_path):
    result = run_experiment(tiny_config(tmp_path, **{**SETUP, "rounds": 3, "eval.every": 1}))
    assert [r["lm_ptest"] is None for r in result.rows] == [True, True, False]
    assert result.rows[-1]["lm_ptest_std"] is not None
    assert result.final["gm_gtest"] > 0.5


def test_dotregs_drplus_fine_tune_distils_with_feddrplus_beta(tmp_path):
    """Table 8's "Dot-Regression FT (L_Dr+)": dotreg trains with beta = 1 (no L_FD), and its L_Dr+
    fine-tune distils with beta 0.9; so it differs from its L_DR fine-tune, the global model not."""
    runs = {
        loss: run_experiment(tiny_config(tmp_path / loss, **{**SETUP, "algo": "dotreg", "algo.ft_loss": loss, "algo.ft_epochs": 2}))
        for loss in ("dr", "drplus")
    }
    assert runs["dr"].final["gm_gtest"] == runs["drplus"].final["gm_gtest"]
    assert runs["dr"].final["lm_ptest"] != runs["drplus"].final["lm_ptest"]
    same = run_experiment(
        tiny_config(tmp_path / "b1", **{**SETUP, "algo": "dotreg", "algo.ft_loss": "drplus", "algo.ft_epochs": 2, "algo.ft_beta": None})
    )
    assert same.final["lm_ptest"] == runs["dr"].final["lm_ptest"]  # ft_beta None: the run's beta, 1: L_DR


# ------------------------------------------------------------------ Table 3's local-only variants


@pytest.mark.parametrize("loss", ["ce_etf", "dr"])
def test_local_variants_train_the_body_under_the_frozen_etf(tmp_path, loss):
    """``local`` with ``algo.loss=ce_etf|dr``: FedDr+'s seeded ETF head on every client, bit for bit,
    before and after training; only the body trains, with cross-entropy or dot-regression."""
    from raysim.toolkit.context import ClientContext

    fedavg_like = _executor(tmp_path / "drplus")  # FedDr+'s server builds the same ETF head
    etf = fedavg_like.server.state.weights.select(("head",))
    cfg = tiny_config(
        tmp_path / loss, algo="local", participation=0.5, **{"algo.loss": loss, "train.lr": 0.5}
    )
    ex = SerialExecutor(cfg, prepare(cfg))
    ex.train_round(1, [1, 2])
    initial = ex.runtime.initial_weights
    for c in (1, 2):
        kept = ex.runtime.kept(c)
        assert kept.select(("head",)).equals(etf)
        assert not np.array_equal(kept.extractor, initial.extractor)
    model = ex.server.evaluation().personal_model(ex.runtime.algo, ClientContext(ex.runtime, 5, 1))
    from raysim.models import get_weights

    assert get_weights(model, ("head",)).equals(etf)  # an untrained client: the ETF head too
    assert get_weights(model, ("extractor",)).equals(initial.select(("extractor",)))


def test_local_variants_differ_by_their_loss_and_ce_is_the_plain_one(tmp_path):
    runs = {
        loss: run_experiment(
            tiny_config(tmp_path / loss, algo="local", rounds=2, **{"algo.loss": loss, "train.lr": 0.5})
        )
        for loss in ("ce", "ce_etf", "dr")
    }
    finals = {loss: r.final["lm_ptest"] for loss, r in runs.items()}
    assert len({round(v, 6) for v in finals.values()}) == 3 and min(finals.values()) > 0.3
    plain = run_experiment(tiny_config(tmp_path / "plain", algo="local", rounds=2, **{"train.lr": 0.5}))
    assert plain.final == runs["ce"].final
    with pytest.raises(ConfigError, match="loss"):
        check_config(tiny_config(tmp_path, algo="local", **{"algo.loss": "mse"}))
