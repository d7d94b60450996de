"""Partial work (``deployment.completeness``) belongs to a deployment's training rounds: evaluation-time
work (the "-FT" fine-tuning, an evaluation-time adaptation) always runs whole, for every client;
and the FedProx straggler form ``stragglers:P:F`` (Li et al. 2020, Sec. 5.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysim.config import replace
from raysim.deployment.model import Deployment
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare
from raysim.models import get_weights
from raysim.toolkit.context import ClientContext
from raysim.weights import PARTS
from tests.conftest import tiny_config

#: algorithms whose personal model is made at evaluation time by training: FedBABU-FT and FedDr+-FT
#: fine-tune the global model, Per-FedAvg adapts it with a step of its own loop
EVALUATION_WORK = {
    "fedbabu": {"algo.ft_epochs": 2},
    "feddrplus": {"algo.ft_epochs": 2, "train.lr": 0.3},
    "perfedavg": {"train.local_epochs": 2},
}


def _config(tmp_path, algo: str, completeness: str):
    return tiny_config(
        tmp_path,
        algo=algo,
        rounds=2,
        participation=0.5,
        **{**EVALUATION_WORK[algo], "deployment.completeness": completeness},
    )


@pytest.mark.parametrize("algo", list(EVALUATION_WORK))
def test_evaluation_time_work_is_whole_under_partial_work_and_training_stays_cut(tmp_path, algo):
    """The personal models at the last round, from the same global model, are the same to the bit
    under ``uniform:0.2`` as with every client's work whole (FedBABU-FT's were cut: 228 of 422 P-Test
    samples right instead of 297); a training job's context still gets its cut share, and trains
    less."""
    full_cfg = _config(tmp_path / "full", algo, "full")
    cut_cfg = _config(tmp_path / "cut", algo, "uniform:0.2")
    full, cut = SerialExecutor(full_cfg, prepare(full_cfg)), SerialExecutor(cut_cfg, prepare(cut_cfg))
    payload = full.server.plan(1, [0])[0].payload
    trained = [
        {r.client: r.samples_trained for r in ex.runtime.run_chain(1, [0, 1, 2, 3], payload, None)}
        for ex in (full, cut)
    ]
    assert all(trained[1][c] <= trained[0][c] for c in range(4))
    assert sum(trained[1].values()) < sum(trained[0].values())
    full.train_round(1, [0, 1, 2, 3])
    evaluation = full.server.evaluation()  # one global model, evaluated by both runtimes
    last = cut_cfg.rounds
    for c in range(cut_cfg.clients):
        got = []
        for ex in (full, cut):
            part = ex.runtime.evaluate(last, evaluation, [], [c])
            tuned = get_weights(ex.runtime.model, PARTS)  # the personal model the evaluation left
            got.append((part.personal_correct, tuned))
        (full_counts, full_w), (cut_counts, cut_w) = got
        assert cut_counts == full_counts, c
        assert cut_w.equals(full_w), c
    d = Deployment(cut_cfg)
    for c in range(cut_cfg.clients):
        assert ClientContext(cut.runtime, c, last).work_fraction == d.work_fraction(last, c) < 1  # training
        assert ClientContext(cut.runtime, c, last, evaluating=True).work_fraction == 1.0


def stragglers(spec: str) -> Deployment:
    cfg = tiny_config(clients=60, participation=0.2, rounds=1000)
    return Deployment(replace(cfg, **{"deployment.completeness": spec}))


@pytest.mark.parametrize(("p", "f"), [(0.3, 0.2), (0.9, 0.5), (1.0, 0.1)])
def test_stragglers_are_a_share_p_of_clients_doing_a_share_from_u_f_1(p, f):
    d = stragglers(f"stragglers:{p}:{f}")
    draws = np.array([[d.work_fraction(r, c) for c in range(60)] for r in range(1, 201)])  # 12,000
    slow = draws < 1
    n = draws.size
    assert slow.mean() == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / n) + 1e-9)  # binomial noise
    late = draws[slow]
    assert late.min() >= f and late.max() < 1
    assert late.mean() == pytest.approx((1 + f) / 2, abs=4 * (1 - f) / np.sqrt(12 * late.size))
    assert np.all(draws[~slow] == 1.0)  # the others do all their work
    again = stragglers(f"stragglers:{p}:{f}")  # the same draws from another Deployment of the config
    assert np.array_equal(draws, [[again.work_fraction(r, c) for c in range(60)] for r in range(1, 201)])
    assert d.work_fraction(0, 5) == d.work_fraction(1001, 5) == 1.0  # training rounds only


def test_stragglers_draw_differs_by_seed_and_leaves_uniform_alone():
    d = stragglers("stragglers:0.5:0.3")
    other = Deployment(replace(d.cfg, seed=d.cfg.seed + 1))
    a = [d.work_fraction(1, c) < 1 for c in range(60)]
    assert a != [other.work_fraction(1, c) < 1 for c in range(60)]
    u = stragglers("uniform:0.3")  # uniform:F cuts every client, as before
    assert all(u.work_fraction(1, c) < 1 for c in range(60))
    every = stragglers("stragglers:1:0.3")  # every client a straggler: uniform:F's own draws
    assert [every.work_fraction(r, c) for r in (1, 2) for c in range(60)] == [
        u.work_fraction(r, c) for r in (1, 2) for c in range(60)
    ]


def test_a_round_of_stragglers_trains_their_drawn_share_and_the_others_all_of_it(tmp_path):
    cfg = tiny_config(
        tmp_path, clients=8, participation=1.0, **{"deployment.completeness": "stragglers:0.5:0.2"}
    )
    ex = SerialExecutor(cfg, prepare(cfg))
    got = ex.runtime.run_chain(1, list(range(8)), ex.server.plan(1, [0])[0].payload, None)
    d = Deployment(cfg)
    shares = [d.work_fraction(1, r.client) for r in got]
    assert 0 < sum(s < 1 for s in shares) < 8  # some stragglers, some not
    for r, share in zip(got, shares, strict=True):
        steps = math.ceil(r.num_samples / 20)  # one epoch of batches of 20
        done = steps if share == 1 else max(1, math.floor(share * steps))
        assert r.samples_trained == min(done * 20, r.num_samples)


BASE = {"data.dataset": "synthetic", "model": "mlp_fcd", "clients": 8, "ray.executor": "serial"}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (
            "stragglers",
            "The stragglers completeness needs its straggler share P and least share F, e.g. stragglers:0.5:0.25.",
        ),
        (
            "stragglers:0.5",
            "The stragglers completeness needs its least share F after its straggler share P, e.g. stragglers:0.5:0.25.",
        ),
        (
            "stragglers:0.5:",
            "The stragglers completeness needs its least share F after its straggler share P",
        ),
        (
            "stragglers::0.5",
            "The stragglers completeness needs its straggler share P before its least share F",
        ),
        ("stragglers:0:0.5", "The stragglers completeness's straggler share P must be in (0, 1], not 0."),
        ("stragglers:1.5:0.5", "straggler share P must be in (0, 1], not 1.5."),
        ("stragglers:0.5:0", "The stragglers completeness's least share F must be in (0, 1], not 0."),
        ("stragglers:0.5:2", "least share F must be in (0, 1], not 2."),
        ("stragglers:half:0.5", "The completeness parameter in 'stragglers:half:0.5' is not a number."),
        (
            "stragglers:0.5:0.2:1",
            "The stragglers completeness takes two parameters (straggler share P and least share F), not 3",
        ),
        ("full:1", "The full completeness takes no parameter."),
    ],
)
def test_bad_straggler_settings_are_refused_with_one_sentence(spec, needle):
    from raysim.api import checked_experiment
    from raysim.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={**BASE, "deployment.completeness": spec})
    assert needle in str(e.value)


def test_the_completeness_kinds_are_written_as_their_usage():
    from raysim.registry import COMPLETENESS, KindSpec, parse_kind, usages

    assert usages(COMPLETENESS) == "full, stragglers:P:F, uniform[:F]"
    spec = parse_kind("stragglers:0.25:0.5", COMPLETENESS)
    assert spec == KindSpec("stragglers", (0.25, 0.5)) and str(spec) == "stragglers:0.25:0.5"
