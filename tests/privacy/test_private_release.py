"""An algorithm's own client-level DP release (raysim/capabilities/private_release.py): Fed3+2p's
chains clipped as units of sensitivity 2C over the coordinators, its Type-B filters over each
group's expected members, its P-heads untouched, its label distributions released once with noise
and accounted; SCAFFOLD's (Delta y, Delta c) clipped as one vector; FedDyn's two server steps from
one noised sum; the statistics' release against the Gaussian mechanism's exact privacy profile."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from raysim.config import ExperimentConfig, from_dict
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.privacy.accounting import Accountant
from raysim.privacy.client_level import ClientLevel, PrivateState
from raysim.weights import ModelWeights
from tests.conftest import tiny_config

SETUP = {
    "algo": "fed3p2",
    "clients": 12,
    "participation": 0.5,
    "algo.num_type_a": 3,
    "algo.num_type_b": 3,
    "data.partition": "dirichlet:0.3",
    "model": "cnn3p2_fmnist",
    "data.synthetic.shape": (1, 16, 16),
    "privacy.clip": "0.5",
    "privacy.noise_multiplier": 0.0,
}


def _executor(tmp_path, **changes):
    cfg = validate(tiny_config(tmp_path, **{**SETUP, **changes})).cfg
    return SerialExecutor(cfg, prepare(cfg))


def _recording(ex):
    """The results each private_aggregate reads, kept."""
    got = []
    inner = ex.server.algo.private_aggregate

    def private_aggregate(state, rnd, results, release):
        got.append(list(results))
        return inner(state, rnd, results, release)

    ex.server.algo.private_aggregate = private_aggregate
    return got


def _flat(w: ModelWeights) -> np.ndarray:
    return np.concatenate([w.part(n).astype(np.float64).ravel() for n in w.part_names])


def test_each_chain_is_one_unit_clipped_to_c_over_the_coordinators(tmp_path):
    """sigma = 0: W(t+1) = W(t) + sum_c clip_C(W^c - W(t)) / C_A, every chain weighing the same
    (not its data size), each chain's contribution at most C."""
    ex = _executor(tmp_path, rounds=4)
    got = _recording(ex)
    gm0 = ex.server.state.gm
    ex.train_round(1, list(range(12)))
    (results,) = got
    assert len(results) == 3 and all(len(jr.job.clients) >= 2 for jr in results)
    want = np.zeros_like(_flat(gm0))
    for jr in results:
        change = _flat(jr.final.weights) - _flat(gm0)
        clipped = change * min(1.0, 0.5 / np.linalg.norm(change))
        assert np.linalg.norm(clipped) <= 0.5 + 1e-9 and np.linalg.norm(change) > 0.5  # each chain clipped
        want += clipped
    np.testing.assert_allclose(_flat(ex.server.state.gm), _flat(gm0) + want / 3, atol=1e-6)


def test_a_chain_gets_twice_the_noise_of_one_client():
    """The unit's sensitivity scales the noise: sigma s C / denominator per coordinate, measured over
    200,000 draws (s = 2 for a chain, 1 for one client's upload)."""
    cfg = tiny_config(**{**SETUP, "privacy.noise_multiplier": 1.5})
    level = ClientLevel(cfg, 1.5)
    release = level.release(1, PrivateState(0.5))
    base = ModelWeights(filter=np.zeros(200_000, np.float32))
    chain = release.noised_mean(0, base, [], 5.0, sensitivity=2.0).part("filter")
    one = release.noised_mean(1, base, [], 5.0).part("filter")
    assert chain.std() == pytest.approx(1.5 * 2 * 0.5 / 5, rel=0.01)
    assert one.std() == pytest.approx(1.5 * 0.5 / 5, rel=0.01)
    assert release.expected(6) == pytest.approx(6 * 6 / 12)  # a fixed cohort of K = 6 of N = 12


def test_phase2_filters_are_noised_means_over_the_groups_expected_members_and_pheads_stay(tmp_path):
    """Phase 2 from round 1 (phase1_rounds = 0): each Type-B group's filter is its fresh filter
    plus the clipped changes of its sampled members over K |G| / N; each client's P-head is the one
    it trained, as without DP (both runs start from the same frozen parts and fresh filters)."""
    ex = _executor(tmp_path / "dp", rounds=2, **{"algo.phase1_rounds": 0})
    got = _recording(ex)
    fresh = ex.server.state.group_filters
    ex.train_round(1, [0, 1, 2, 3, 4, 5])
    (results,) = got
    groups = ex.server.state.type_b.groups
    for g, members in enumerate(groups):
        mine = [jr.final for jr in results if jr.final.client in members]
        want = np.zeros_like(_flat(fresh[g]))
        for r in mine:
            change = _flat(r.weights) - _flat(fresh[g])
            want += change * min(1.0, 0.5 / np.linalg.norm(change))
        expected = 6 * len(members) / 12
        np.testing.assert_allclose(_flat(ex.server.state.group_filters[g]), _flat(fresh[g]) + want / expected, atol=1e-6)
    plain_cfg = tiny_config(tmp_path / "plain", **{**SETUP, "privacy.clip": "none", "privacy.noise_multiplier": None,
                                                    "rounds": 2, "algo.phase1_rounds": 0})  # fmt: skip
    plain = SerialExecutor(plain_cfg, prepare(plain_cfg))
    plain.train_round(1, [0, 1, 2, 3, 4, 5])
    for c in range(6):
        np.testing.assert_array_equal(plain.runtime.kept(c).part("phead"), ex.runtime.kept(c).part("phead"))


def test_the_groupings_read_the_label_distributions_released_with_noise(tmp_path):
    """With sigma = 0 the released rows are the label distributions themselves (the groupings see
    each client as one weight); with noise the rows move, and the run's summary counts the release."""
    ex = _executor(tmp_path / "s0", rounds=2)
    counts = ex.server.algo._label_counts
    rows = ex.server.private.noised_rows("fed3p2/labels", counts / counts.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(rows.sum(axis=1), 1.0)
    noisy = _executor(tmp_path / "s1", rounds=2, **{"privacy.noise_multiplier": 2.0})
    moved = noisy.server.private.noised_rows("fed3p2/labels", rows)
    assert np.abs(moved - rows).std() > 1.0
    run = run_experiment(tiny_config(tmp_path / "run", **{**SETUP, "rounds": 2, "privacy.noise_multiplier": 1.0}))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy"]["statistics_releases"] == 1 and "chain" in summary["privacy"]["clipped"]
    plain = {k: v for k, v in SETUP.items() if not k.startswith("algo.")}
    fedavg = Accountant.for_experiment(validate(tiny_config(**{**plain, "algo": "fedavg", "privacy.noise_multiplier": 1.0})).cfg)
    assert run.rows[-1]["epsilon"] > fedavg.epsilon(2)  # the labels' release spends on top of the rounds


def _gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact epsilon of one Gaussian mechanism of sensitivity 1 and noise sigma at delta
    (Balle and Wang, "Improving the Gaussian Mechanism for Differential Privacy", ICML 2018,
    Theorem 8: delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)),
    by bisection: an implementation independent of dp-accounting's."""

    def delta_of(eps: float) -> float:
        return float(norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma))

    lo, hi = 0.0, 50.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0])
def test_one_statistics_release_costs_what_the_gaussian_mechanism_does(sigma):
    """No rounds, one release: PLD's epsilon is the analytic Gaussian mechanism's, to its
    discretisation; RDP's is an upper bound on it."""
    pld = Accountant(sigma, "poisson", 100, 10.0, "pld", 1e-5, statistics=1).epsilon(0)
    rdp = Accountant(sigma, "poisson", 100, 10.0, "rdp", 1e-5, statistics=1).epsilon(0)
    exact = _gaussian_epsilon(sigma, 1e-5)
    assert pld == pytest.approx(exact, rel=2e-3) and pld >= exact * (1 - 1e-6)
    assert rdp >= exact


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"algo": {"chain_sampling": "regroup"}}, "chain_sampling=global"),
        ({"algo": {"chain_sampling": "all"}}, "chain_sampling=global"),
        ({"algo": {"phase_switch": "auto"}, "data": {"val_fraction": 0.1}}, "use phase_switch=fixed"),
        ({"algo": {"server_denominator": "all"}}, "leave it round"),
        ({"privacy": {"clip": "adaptive:0.5", "noise_multiplier": 0.8, "count_noise_multiplier": 2.0}}, "cannot adapt its clip"),
    ],
)
def test_what_fed3p2_cannot_release_privately_is_refused_in_one_sentence(settings, words):
    data: dict = {"privacy": {"clip": "1.0", "noise_multiplier": 1.0}}
    for key, value in settings.items():
        if key != "algo":
            data[key] = {**data.get(key, {}), **value}
    algo_params = settings.get("algo", {})
    cfg = from_dict(ExperimentConfig, {**{k: v for k, v in data.items() if k != "algo"}, "algo": "fed3p2"})
    cfg = dataclasses.replace(cfg, algo_params=algo_params)
    with pytest.raises(ConfigError, match=words) as err:
        validate(cfg)
    assert str(err.value).count(". ") == 0


def _states(tmp_path, algo, **changes):
    """Round 1 of ``algo`` on clients 0-3 of 8 (a fixed cohort of K = 4), without DP and under
    client-level DP with sigma = 0 and the given clip: the two servers' states, the results the
    private one read and its state before the round."""
    base = {"algo": algo, "clients": 8, "participation": 0.5}
    plain_cfg = tiny_config(tmp_path / "plain", **base)
    plain = SerialExecutor(plain_cfg, prepare(plain_cfg))
    plain.train_round(1, [0, 1, 2, 3])
    dp = {k: v for k, v in SETUP.items() if not k.startswith("algo.") and k not in ("model", "data.synthetic.shape", "data.partition")}
    dp_cfg = validate(tiny_config(tmp_path / "dp", **{**dp, **base, **changes})).cfg
    ex = SerialExecutor(dp_cfg, prepare(dp_cfg))
    got = _recording(ex)
    initial = ex.server.state
    ex.train_round(1, [0, 1, 2, 3])
    return plain.server.state, ex.server.state, got[0], initial


def test_scaffold_clips_delta_y_and_delta_c_as_one_vector(tmp_path):
    """With a clip no upload reaches and sigma = 0, the private round is SCAFFOLD's own (x by the
    mean Delta y over K, c by the sum of Delta c over N); with a small clip each client's pair
    (Delta y, Delta c) is scaled by one factor, C over the pair's norm."""
    plain, private, _, _ = _states(tmp_path / "wide", "scaffold", **{"privacy.clip": "1e6"})
    np.testing.assert_allclose(_flat(private.weights), _flat(plain.weights), atol=1e-6)
    np.testing.assert_allclose(_flat(private.control), _flat(plain.control), atol=1e-6)
    _, private, results, initial = _states(tmp_path / "tight", "scaffold", **{"privacy.clip": "0.3"})
    sum_y, sum_c = 0.0, 0.0
    for jr in results:
        dy, dc = _flat(jr.final.weights), _flat(jr.final.extra)
        scale = min(1.0, 0.3 / math.sqrt(dy @ dy + dc @ dc))
        assert scale < 1.0
        sum_y, sum_c = sum_y + scale * dy, sum_c + scale * dc
    np.testing.assert_allclose(_flat(private.weights), _flat(initial.weights) + sum_y / 4, atol=1e-6)
    np.testing.assert_allclose(_flat(private.control), sum_c / 8, atol=1e-6)  # c starts at zero


def test_feddyn_under_dp_takes_both_server_steps_from_one_noised_sum(tmp_path):
    """sigma = 0 and a clip no change reaches: FedDyn's round, h and theta, as without DP."""
    plain, private, _, _ = _states(tmp_path, "feddyn", **{"privacy.clip": "1e6"})
    np.testing.assert_allclose(_flat(private.h), _flat(plain.h), atol=1e-7)
    np.testing.assert_allclose(_flat(private.weights), _flat(plain.weights), atol=1e-6)


@pytest.mark.ray
def test_fed3p2_under_dp_is_the_same_on_serial_and_ray(tmp_path, ray_local):
    """The server actor makes the groups' fresh filters and the noised label rows as the serial
    server does: phase 1 and phase 2, with noise."""
    from tests.conftest import assert_serial_equals_ray

    setup = {**SETUP, "privacy.noise_multiplier": 0.3, "rounds": 2, "eval.every": 1}
    assert_serial_equals_ray(tmp_path, **setup)
