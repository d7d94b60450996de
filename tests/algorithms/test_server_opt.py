"""Server optimisers (raysim/capabilities/server_opt.py): FedAvg's own step to the bit, FedAvgM,
FedAdam, FedYogi and FedAdagrad's first two steps against Reddi et al.'s Algorithm 2 written out by
hand on a two-client case, the optimiser's state through a checkpoint, and the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from raysim.config import ExperimentConfig, from_dict
from raysim.engine.experiment import make_algorithm, validate
from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import tiny_config, without_times


def test_sgd_at_rate_one_and_sgdm_without_momentum_are_fedavg_to_the_bit(tmp_path):
    fedavg = without_times(run_experiment(tiny_config(tmp_path / "a", rounds=2, **{"eval.every": 1})).rows)
    for name, opt in (("sgd", {"algo.server_opt": "sgd", "algo.server_lr": 1.0}),
                      ("sgdm", {"algo.server_opt": "sgdm", "algo.server_momentum": 0.0})):  # fmt: skip
        rows = without_times(run_experiment(tiny_config(tmp_path / name, rounds=2, **{"eval.every": 1}, **opt)).rows)
        assert rows == fedavg, name


def _uploads(uploads, sizes):
    """One job a client, each uploading its head ``u`` with its ``n`` training samples."""
    return [
        JobResult(Job((k,), None), (ClientResult(k, n, 0.0, ModelWeights(head=u.astype(np.float32))),))
        for k, (u, n) in enumerate(zip(uploads, sizes, strict=True))
    ]


def _round(algo, x, uploads, sizes, **settings):
    """The server state after one round of ``algo`` from ``x`` with these uploads, and the next
    after a second round with the same uploads."""
    cfg = validate(tiny_config(algo=algo, **{f"algo.{k}": v for k, v in settings.items()})).cfg
    server = make_algorithm(cfg)
    from algorithms.fedavg import GlobalState

    results = _uploads(uploads, sizes)
    one = server.aggregate(GlobalState(ModelWeights(head=x.astype(np.float32))), 1, results)
    two = server.aggregate(one, 2, results)
    return one, two


X = np.array([0.5, -1.0, 2.0, 0.0])
UPLOADS = [np.array([0.7, -1.5, 2.0, 0.3]), np.array([0.1, -0.5, 1.0, -0.1])]
SIZES = [30, 10]


def _by_hand(opt: str, eta: float, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3, beta: float = 0.9):
    """Reddi et al., Algorithm 2 (and FedAvgM's heavy ball), two steps with the same uploads."""
    f32 = np.float32
    x = X.astype(f32).astype(np.float64)
    avg = (30 * UPLOADS[0].astype(f32).astype(np.float64) + 10 * UPLOADS[1].astype(f32).astype(np.float64)) / 40
    avg = avg.astype(f32).astype(np.float64)  # the round's average, as the server stores it
    m, v = np.zeros(4), np.full(4, tau**2)
    out = []
    for _ in range(2):
        d = avg - x
        if opt == "sgdm":
            m = beta * m + d
            x = x + eta * m
        else:
            m = b1 * m + (1 - b1) * d
            if opt == "adam":
                v = b2 * v + (1 - b2) * d * d
            elif opt == "yogi":
                v = v - (1 - b2) * d * d * np.sign(v - d * d)
            else:
                v = v + d * d
            x = x + eta * m / (np.sqrt(v) + tau)
        x = x.astype(f32).astype(np.float64)
        m, v = m.astype(f32).astype(np.float64), v.astype(f32).astype(np.float64)
        out.append(x)
    return out


@pytest.mark.parametrize(
    ("algo", "opt", "eta", "tau"),
    [
        ("fedadam", "adam", 10**-2.5, 1e-4), ("fedyogi", "yogi", 10**-2.5, 1e-4), ("fedadagrad", "adagrad", 0.1, 1e-2),
        ("fedavgm", "sgdm", 1.0, 1e-3),
    ],
)  # fmt: skip
def test_the_registered_optimisers_take_the_papers_steps(algo, opt, eta, tau):
    """Each registered optimiser's two steps by hand, at its defaults: FedAdam's, FedYogi's and
    FedAdagrad's eta and tau are the authors' best for EMNIST character recognition."""
    one, two = _round(algo, X, UPLOADS, SIZES)
    want = _by_hand(opt, eta, tau=tau)
    np.testing.assert_allclose(one.weights.part("head"), want[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(two.weights.part("head"), want[1], rtol=1e-6, atol=1e-7)
    assert not np.allclose(want[0], want[1])  # the second step moved on (the state carried)


def test_a_setting_makes_any_averaging_algorithm_adaptive():
    """FedProx with server_opt=adam takes FedAdam's steps (its aggregate is FedAvg's)."""
    one, _ = _round("fedprox", X, UPLOADS, SIZES, server_opt="adam", server_lr=0.05, tau=0.01, beta2=0.9)
    np.testing.assert_allclose(one.weights.part("head"), _by_hand("adam", 0.05, tau=0.01, b2=0.9)[0], rtol=1e-6)


@pytest.mark.parametrize("opt", ["adam", "yogi", "adagrad", "sgdm"])
def test_an_optimiser_set_on_another_algorithm_takes_its_registered_defaults(opt):
    """``algo.server_opt=adam`` on FedProx steps as FedAdam does (its eta and tau, not FedAvg's
    rate 1, which moves every weight by about 1 in the first round); a given setting still wins."""
    registered = {"adam": "fedadam", "yogi": "fedyogi", "adagrad": "fedadagrad", "sgdm": "fedavgm"}[opt]
    set_here, _ = _round("fedprox", X, UPLOADS, SIZES, server_opt=opt)
    theirs, _ = _round(registered, X, UPLOADS, SIZES)
    np.testing.assert_array_equal(set_here.weights.part("head"), theirs.weights.part("head"))
    given, _ = _round("fedprox", X, UPLOADS, SIZES, server_opt=opt, server_lr=0.05)
    assert not np.array_equal(given.weights.part("head"), theirs.weights.part("head"))


def test_the_running_statistics_of_batch_norm_take_the_average_and_no_step():
    """On a model with BatchNorm, an optimiser steps the parameters only: the running mean and
    variance (estimates) take the round's average, so a variance is never stepped below zero."""
    import types

    from raysim.capabilities.server_opt import DEFAULTS, server_step, statistics_masks
    from raysim.models import build_model, get_part

    model = build_model("cnn3p2_fmnist_bn", (1, 28, 28), 10, seed=0)
    ctx = types.SimpleNamespace(cfg=types.SimpleNamespace(model="cnn3p2_fmnist_bn"), build_model=lambda: model)
    masks = statistics_masks(ctx, ("extractor", "filter", "head"))
    assert masks is not None and set(masks) == {"extractor", "filter"}
    for part, mask in masks.items():  # exactly the BatchNorm layers' running mean and variance
        stats = [b for m in model.part(part).modules() for n, b in m.named_buffers(recurse=False) if n.startswith("running")]
        assert mask.sum() == sum(b.numel() for b in stats) > 0
    x = ModelWeights(**{p: get_part(model, p) for p in masks})
    rng = np.random.default_rng(0)
    y = ModelWeights(**{p: (a + rng.normal(0, 0.5, a.shape)).astype(np.float32) for p, a in x.items()})
    s = DEFAULTS["adam"].settings(tiny_config(algo="fedadam"), None)
    stepped, _ = server_step(x, y, None, s, masks)
    plain, _ = server_step(x, y, None, s)
    for p, mask in masks.items():
        np.testing.assert_array_equal(stepped.part(p)[mask], y.part(p)[mask])
        np.testing.assert_array_equal(stepped.part(p)[~mask], plain.part(p)[~mask])
    assert statistics_masks(types.SimpleNamespace(cfg=types.SimpleNamespace(model="cnn3p2_fmnist")), ("head",)) is None


def test_the_optimisers_state_survives_a_checkpoint_exactly(tmp_path):
    from raysim import checkpoint
    from tests.engine.test_checkpoint import CtrlCAfter

    setup = {"algo": "fedyogi", "rounds": 4, "eval.every": 1}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    assert run_experiment(cfg, [CtrlCAfter(2)]).last_round == 2
    resumed = run_experiment(cfg, resume=checkpoint.load(tmp_path / "stopped"))
    assert without_times(resumed.rows) == without_times(full.rows)


@pytest.mark.parametrize(
    ("algo", "params", "words"),
    [
        ("fedavg", {"server_opt": "adamw"}, "server_opt"),
        ("fedavg", {"server_opt": "Adam"}, "server_opt"),
        ("fedavg", {"server_opt": 3}, "server_opt"),
        ("fedavg", {"server_lr": 0}, "server_lr"),
        ("fedavg", {"server_lr": -1.0}, "server_lr"),
        ("fedavg", {"server_lr": "fast"}, "server_lr"),
        ("fedadam", {"beta1": 1.0}, "beta1"),
        ("fedadam", {"beta2": -0.1}, "beta2"),
        ("fedadam", {"tau": 0}, "tau"),
        ("fedadam", {"server_momentum": 0.9}, "server_momentum is not a setting of the server optimiser adam"),
        ("fedavgm", {"beta1": 0.5}, "beta1 is not a setting of the server optimiser sgdm"),
        ("fedavg", {"tau": 0.1}, "tau is not a setting of the server optimiser sgd"),
        ("scaffold", {"server_opt": "adam"}, "Unknown setting algo.server_opt"),
        ("fedadam", {"tau": 0.01, "server_tau": 0.01}, "not both"),
        ("moon", {"server_opt": "sgdm", "server_tau": 0.01}, "server_tau is not a setting of the server optimiser sgdm"),
        ("fedexp", {"server_opt": "adam"}, "Unknown setting algo.server_opt"),
    ],
)
def test_a_wrong_server_optimiser_setting_is_refused_in_one_sentence(algo, params, words):
    cfg = dataclasses.replace(from_dict(ExperimentConfig, {"algo": algo}), algo_params=params)
    with pytest.raises(ConfigError, match=words) as err:
        validate(cfg)
    assert str(err.value).count(". ") == 0


def test_an_algorithms_own_tau_stays_its_own_and_server_tau_sets_the_adaptivity():
    """MOON's and FedNTD's ``tau`` is their temperature: under server_opt=adam it is not the
    optimiser's, whose adaptivity is then ``server_tau``."""
    cfg = validate(tiny_config(algo="moon", **{"algo.tau": 0.7, "algo.server_opt": "adam", "algo.server_tau": 0.02})).cfg
    algo = make_algorithm(cfg)
    assert algo.params.tau == 0.7
    from raysim.capabilities.server_opt import ServerOptimizer

    assert ServerOptimizer.of(algo).settings(cfg, algo).tau == 0.02
    plain = validate(tiny_config(algo="fedntd", **{"algo.tau": 2.0})).cfg
    assert make_algorithm(plain).params.tau == 2.0
    assert ServerOptimizer.of(make_algorithm(plain)).settings(plain, make_algorithm(plain)).plain


def test_fedbuff_with_adam_steps_from_its_buffers_uniform_mean():
    """FedBuff's server_opt=adam: Adam's step (Algorithm 2) from the buffer's uniform mean (FedBuff's
    1/K, not FedAvg's data shares), two steps by hand."""
    from algorithms.fedbuff import BuffState

    cfg = validate(tiny_config(algo="fedbuff", **{"deployment.mode": "async", "algo.server_opt": "adam",
                                                  "algo.server_lr": 0.1})).cfg  # fmt: skip
    server = make_algorithm(cfg)
    results = _uploads(UPLOADS, SIZES)
    one = server.aggregate(BuffState(ModelWeights(head=X.astype(np.float32))), 1, results)
    two = server.aggregate(one, 2, results)
    f32 = np.float32
    x = X.astype(f32).astype(np.float64)
    m, v, want = np.zeros(4), np.full(4, 1e-6), []
    for _ in range(2):
        avg = (x + sum(u.astype(f32).astype(np.float64) - x for u in UPLOADS) / 2).astype(f32).astype(np.float64)
        d = avg - x
        m = 0.9 * m + 0.1 * d
        v = 0.99 * v + 0.01 * d * d
        x = (x + 0.1 * m / (np.sqrt(v) + 1e-3)).astype(f32).astype(np.float64)
        m, v = m.astype(f32).astype(np.float64), v.astype(f32).astype(np.float64)
        want.append(x)
    np.testing.assert_allclose(one.weights.part("head"), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two.weights.part("head"), want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("params", [{"server_opt": "adam", "server_lr": 0.1}, {"server_lr": 2.0, "server_momentum": 0.5}])
def test_fedbuffs_step_leaves_marked_running_statistics_at_the_buffers_mean(params):
    """FedBuff with a step beyond the mean (Adam's, or sgd at another rate with momentum): the
    entries marked as BatchNorm running statistics take the buffer's uniform mean, the others the
    step as without the marks."""
    from algorithms.fedbuff import BuffState

    cfg = validate(tiny_config(algo="fedbuff", **{"deployment.mode": "async", **{f"algo.{k}": v for k, v in params.items()}})).cfg
    plain, marked = make_algorithm(cfg), make_algorithm(cfg)
    marked.statistics = {"head": np.array([False, True, False, True])}
    results = _uploads(UPLOADS, SIZES)
    start = BuffState(ModelWeights(head=X.astype(np.float32)))
    want = plain.aggregate(start, 1, results).weights.part("head")
    got = marked.aggregate(start, 1, results).weights.part("head")
    mean = np.mean([u.astype(np.float32) for u in UPLOADS], axis=0)
    np.testing.assert_allclose(got[[1, 3]], mean[[1, 3]], rtol=1e-6)
    np.testing.assert_array_equal(got[[0, 2]], want[[0, 2]])
    assert not np.allclose(want[[1, 3]], mean[[1, 3]])  # the step would have moved them
    # on a BatchNorm model its init marks them; with FedBuff's plain step there is nothing to mark
    import types

    from raysim.models import build_model, get_part

    model = build_model("cnn3p2_fmnist_bn", (1, 28, 28), 10, seed=0)
    for given, marks in ((params, True), ({}, False)):
        bn = dataclasses.replace(
            validate(tiny_config(algo="fedbuff", **{"deployment.mode": "async", **{f"algo.{k}": v for k, v in given.items()}})).cfg,
            model="cnn3p2_fmnist_bn",
        )
        algo = make_algorithm(bn)
        weights = ModelWeights(**{p: get_part(model, p) for p in ("extractor", "filter", "head")})
        algo.init(types.SimpleNamespace(cfg=bn, build_model=lambda: model, init_weights=weights))
        assert (algo.statistics is not None and set(algo.statistics) == {"extractor", "filter"}) == marks


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"beta1": 0.5}, "set algo.server_opt=adam"),
        ({"tau": 0.1}, "set algo.server_opt=adam"),
        ({"server_opt": "adam", "server_momentum": 0.9}, "keeps its own first moment"),
        ({"server_opt": "nadam"}, "server_opt"),
    ],
)
def test_fedbuffs_optimiser_settings_are_refused_in_one_sentence_where_they_do_not_apply(params, words):
    cfg = dataclasses.replace(from_dict(ExperimentConfig, {"algo": "fedbuff", "deployment": {"mode": "async"}}), algo_params=params)
    with pytest.raises(ConfigError, match=words) as err:
        validate(cfg)
    assert str(err.value).count(". ") == 0


def test_fedadam_on_a_batch_norm_model_leaves_the_running_statistics_at_the_average(tmp_path):
    """In a run: FedAdam's server keeps the clients' averaged running statistics and steps the
    parameters (which end elsewhere than the average)."""
    from raysim.engine.executors.serial import SerialExecutor
    from raysim.engine.runner import prepare
    from raysim.toolkit.aggregate import weighted_mean
    from tests.conftest import run_round

    cfg = tiny_config(
        tmp_path, algo="fedadam", model="cnn3p2_fmnist_bn", participation=1.0, clients=4,
        **{"data.synthetic.shape": [1, 28, 28], "data.synthetic.train_samples": 400, "train.drop_last": True},
    )  # fmt: skip
    ex = SerialExecutor(cfg, prepare(cfg))
    masks = ex.server.algo.statistics
    assert masks is not None and set(masks) == {"extractor", "filter"}
    got = run_round(ex, 1, list(range(4)))
    average = weighted_mean([r.weights for r in got], [r.num_samples for r in got])
    for part, mask in masks.items():
        np.testing.assert_allclose(ex.server.state.weights.part(part)[mask], average.part(part)[mask], rtol=1e-6)
        assert not np.allclose(ex.server.state.weights.part(part)[~mask], average.part(part)[~mask])
