"""Client-level DP on the server (raysim/privacy/client_level.py): each upload's change clipped to C,
Gaussian noise of standard deviation sigma C on the sum, the mean over the expected cohort; the
sampling the accountant models; personal parts untouched; the same numbers on every executor and
after a resume; the refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from raysim.config import ExperimentConfig, from_dict
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.privacy.client_level import ClientLevel, PrivateState, expected_cohort
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import run_round, tiny_config, without_times

DP = {"privacy.clip": "1.0", "privacy.noise_multiplier": 0.8}


def _upload(client: int, head: np.ndarray, extractor: np.ndarray) -> JobResult:
    w = ModelWeights(extractor=extractor.astype(np.float32), head=head.astype(np.float32))
    return JobResult(Job((client,), None), (ClientResult(client, 10 * (client + 1), 0.0, w),))


def _level(**changes) -> ClientLevel:
    cfg = tiny_config(**{**DP, **changes})
    return ClientLevel(cfg, cfg.privacy.noise_multiplier)


def test_each_change_is_clipped_to_c_and_the_mean_is_over_the_expected_cohort():
    """sigma = 0: the release is the base plus the sum of the clipped changes over K (here 4 of 8
    clients), whatever the sizes (DP-FedAvg weighs every client alike); a change inside the ball is
    kept whole."""
    level = _level(**{"privacy.noise_multiplier": 0.0, "privacy.clip": "2.0"})
    assert level.cohort == 4
    base = ModelWeights(extractor=np.zeros(3, np.float32), head=np.ones(2, np.float32))
    ups = [
        _upload(0, np.array([1.0, 1.0]), np.array([3.0, 0.0, 4.0])),  # change norm 5: scaled to 2
        _upload(1, np.array([1.0, 2.0]), np.array([0.0, 0.5, 0.0])),  # norm sqrt(1.25): kept
    ]
    out = level.private_round(1, base, ups, PrivateState(2.0))
    (jr,) = out.results
    got = jr.final.weights
    first = np.array([3.0, 0.0, 4.0, 0.0, 0.0]) * 2 / 5
    second = np.array([0.0, 0.5, 0.0, 0.0, 1.0])
    want = (first + second) / 4
    np.testing.assert_allclose(got.part("extractor"), want[:3], rtol=1e-6)
    np.testing.assert_allclose(got.part("head"), 1.0 + want[3:], rtol=1e-6)
    assert dict(out.scalars)["privacy_unclipped"] == 0.5
    for contribution in (first, second):
        assert np.linalg.norm(contribution) <= 2.0 + 1e-9


def test_no_clients_contribution_exceeds_c_in_a_real_round(tmp_path):
    """Uploads of a real FedAvg round, released with sigma = 0: the release times K less the
    base is the sum of the clipped changes, each of norm at most C (checked one by one)."""
    cfg = tiny_config(tmp_path, **{**DP, "privacy.noise_multiplier": 0.0, "privacy.clip": "0.05"})
    ex = SerialExecutor(cfg, prepare(cfg))
    base = ex.server.state.weights
    level = ClientLevel(cfg, 0.0)
    ups = [JobResult(Job((r.client,), None), (r,)) for r in run_round(ex, 1, [0, 2, 5, 7])]
    norms = []
    total = 0.0
    for jr in ups:
        d = np.concatenate([jr.final.weights.part(n).astype(np.float64) - base.part(n) for n in base.part_names])
        norms.append(np.linalg.norm(d))
        total = total + d * min(1.0, 0.05 / np.linalg.norm(d))
    assert min(norms) > 0.05  # every client moved further than C: all clipped
    got = level.private_round(1, base, ups, PrivateState(0.05)).results[0].final.weights
    released = np.concatenate([got.part(n).astype(np.float64) - base.part(n) for n in base.part_names])
    np.testing.assert_allclose(released * level.cohort, total, rtol=1e-4, atol=1e-6)


def test_the_noise_has_standard_deviation_sigma_c_over_the_cohort():
    """No change at all: the release less the base is the noise over m; over 200,000 coordinates
    its standard deviation is sigma C / m within 1%, its mean 0; another round draws other noise,
    the same round the same."""
    level = _level(**{"privacy.noise_multiplier": 1.5, "privacy.clip": "0.4"})
    base = ModelWeights(head=np.zeros(200_000, np.float32))
    same = [JobResult(Job((0,), None), (ClientResult(0, 5, 0.0, base),))]
    noise = level.private_round(3, base, same, PrivateState(0.4)).results[0].final.weights.part("head")
    sd = float(np.std(noise.astype(np.float64) * level.cohort))
    assert sd == pytest.approx(1.5 * 0.4, rel=0.01) and abs(float(np.mean(noise))) < 1e-3
    again = level.private_round(3, base, same, PrivateState(0.4)).results[0].final.weights.part("head")
    other = level.private_round(4, base, same, PrivateState(0.4)).results[0].final.weights.part("head")
    assert np.array_equal(noise, again) and not np.array_equal(noise, other)


def test_adaptive_clipping_moves_the_clip_geometrically_toward_the_quantile():
    """Andrew et al.'s update without the count's noise (sigma_b tiny): C <- C exp(-eta (b - gamma))
    with b the share of updates inside the clip."""
    level = _level(**{"privacy.clip": "adaptive:0.5", "privacy.clip_init": 1.0, "privacy.noise_multiplier": 0.0,
                      "privacy.count_noise_multiplier": 1e-9, "privacy.clip_lr": 0.2})  # fmt: skip
    base = ModelWeights(head=np.zeros(2, np.float32))
    ups = [_upload(c, np.array([v, 0.0]), np.zeros(3)) for c, v in enumerate([0.5, 0.6, 0.7, 3.0])]
    ups = [JobResult(j.job, (ClientResult(j.final.client, 1, 0.0, j.final.weights.select(("head",))),)) for j in ups]
    out = level.private_round(1, base, ups, PrivateState(1.0))
    b = 3 / level.cohort  # three of four inside C = 1, over m = 4
    assert out.state.clip == pytest.approx(math.exp(-0.2 * (b - 0.5)), rel=1e-6)


def test_poisson_sampling_takes_each_client_with_probability_q(tmp_path):
    cfg = tiny_config(tmp_path, clients=40, participation=0.25, **DP, **{"privacy.sampling": "poisson"})
    assert expected_cohort(cfg) == 10.0
    ex = SerialExecutor(cfg, prepare(cfg))
    sizes = []
    from raysim import rng

    for rnd in range(1, 41):
        got = ex.server.deployment.sample(rnd, 0.0)
        u = rng.generator(cfg.seed, "sample", rnd).random(40)
        assert got == [c for c in range(40) if u[c] < 0.25]
        sizes.append(len(got))
    assert len(set(sizes)) > 3 and 8 < np.mean(sizes) < 12  # a cohort of random size, about q N


def test_personal_parts_are_never_clipped_or_noised(tmp_path):
    """FedPer under client-level DP: the body goes through the release, each client's head is the
    one it trained (the same as without DP in round 1, where both start from the same body)."""
    plain = tiny_config(tmp_path / "p", algo="fedper")
    dp = tiny_config(tmp_path / "d", algo="fedper", **DP)
    heads = {}
    for name, cfg in (("plain", plain), ("dp", dp)):
        ex = SerialExecutor(cfg, prepare(cfg))
        run_round(ex, 1, [1, 4])
        heads[name] = {c: ex.runtime.kept(c).part("head") for c in (1, 4)}
        assert ex.server.state.weights.part_names == ("extractor", "filter")
    for c in (1, 4):
        np.testing.assert_array_equal(heads["plain"][c], heads["dp"][c])


def test_epsilon_is_in_every_row_and_the_summary(tmp_path):
    run = run_experiment(tiny_config(tmp_path, rounds=3, **DP, **{"eval.every": 1}))
    eps = [r["epsilon"] for r in run.rows]
    assert eps[0] > 0 and eps[0] < eps[1] < eps[2]  # it grows with every round
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epsilon"] == pytest.approx(eps[-1])
    # a fixed-size cohort is accounted as sampling without replacement, which RDP accounts
    assert summary["noise_multiplier"] == 0.8 and summary["accountant"] == "rdp"
    assert summary["privacy"]["neighbouring_relation"] and summary["sampling"] == "fixed"
    assert summary["delta"] == pytest.approx(1 / 8**1.1)  # the default 1 / N^1.1
    local = run_experiment(tiny_config(tmp_path / "l", algo="local", rounds=1, **DP))
    assert local.rows[-1]["epsilon"] == 0.0  # nothing uploaded, nothing spent


@pytest.mark.ray
def test_serial_equals_ray_under_dp(tmp_path, ray_local):
    setup = {
        "rounds": 2, "eval.every": 1, **DP, "privacy.clip": "adaptive:0.5", "privacy.count_noise_multiplier": 2.0,
        "privacy.sampling": "poisson", "privacy.accountant": "rdp",
    }  # fmt: skip
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)


def test_resume_equals_uninterrupted_under_adaptive_clipping(tmp_path):
    """The adaptive clip is in the checkpoint: a run stopped after round 2 and resumed gives the
    rows (clip, epsilon and accuracies) of the run that was not stopped."""
    from raysim import checkpoint
    from tests.engine.test_checkpoint import CtrlCAfter

    setup = {"rounds": 4, "eval.every": 1, **DP, "privacy.clip": "adaptive:0.5", "privacy.count_noise_multiplier": 2.0}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    assert run_experiment(cfg, [CtrlCAfter(2)]).last_round == 2
    resumed = run_experiment(cfg, resume=checkpoint.load(tmp_path / "stopped"))
    assert without_times(resumed.rows) == without_times(full.rows)
    assert len({r["privacy_clip"] for r in full.rows}) == 4  # the clip moved every round


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"algo": "fedproto"}, "fedproto cannot run under client-level DP"),
        ({"deployment": {"mode": "async"}}, "deployment.mode=async has none"),
        ({"deployment": {"availability": "bernoulli:0.5"}}, "assumes every client can be sampled"),
        ({"deployment": {"policy": "overselect", "overselect": 0.3, "devices": "fixed"}}, "Over-selection"),
    ],
)
def test_what_client_level_dp_cannot_account_is_refused_in_one_sentence(settings, words):
    data = {"privacy": {"clip": "1.0", "noise_multiplier": 1.0}, **settings}
    with pytest.raises(ConfigError, match=words) as err:
        validate(from_dict(ExperimentConfig, data))
    assert str(err.value).count(". ") == 0


def test_the_calibrated_sigma_spends_the_target_as_the_run_accounts_it():
    """Poisson sampling with an expected cohort that is no whole number (q N = 6.6): sigma is
    calibrated on the cohort the accountant then reads, so the run spends its target, not less."""
    from raysim.privacy.accounting import Accountant

    exp = validate(
        tiny_config(clients=20, participation=0.33, rounds=5, **{"privacy.clip": "1.0", "privacy.target_epsilon": 3.0,
                    "privacy.sampling": "poisson", "privacy.accountant": "rdp"})  # fmt: skip
    )
    spent = Accountant.for_experiment(exp.cfg).epsilon(5)
    assert spent <= 3.0 and spent == pytest.approx(3.0, rel=0.01)
    assert expected_cohort(exp.cfg) == pytest.approx(6.6)


def test_a_checked_configs_calibrated_sigma_and_target_are_accepted_together():
    """A run's config.yaml carries the target epsilon and the sigma calibrated for it: checked again
    (a rerun of that file), the pair is accepted; a sigma that is not the calibrated one is refused."""
    import dataclasses

    setup = {"privacy.clip": "1.0", "privacy.target_epsilon": 3.0, "privacy.sampling": "poisson", "privacy.accountant": "rdp", "rounds": 5}
    cfg = validate(tiny_config(clients=20, participation=0.3, **setup)).cfg
    assert cfg.privacy.noise_multiplier is not None and cfg.privacy.target_epsilon == 3.0
    assert validate(cfg).cfg.privacy == cfg.privacy
    other = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, noise_multiplier=cfg.privacy.noise_multiplier * 1.01))
    with pytest.raises(ConfigError, match="not both"):
        validate(other)
