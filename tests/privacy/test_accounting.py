"""The privacy accountant (raysim.privacy.accounting) against published figures of independent
implementations, the two accountants against each other, calibration, adaptive clipping's noise
split and the refusals of ``privacy.*`` settings."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from raysim.config import ExperimentConfig, PrivacyConfig, from_dict
from raysim.errors import ConfigError
from raysim.privacy.accounting import (
    Accountant,
    adaptive_noise,
    calibrate_noise,
    check_privacy,
    default_count_noise,
    default_delta,
    dp_sgd_epsilon,
    parse_clip,
    round_event,
)

ONE_SENTENCE = re.compile(r"\.\s+[A-Z]")


def one_sentence(err: pytest.ExceptionInfo[ConfigError]) -> str:
    msg = str(err.value)
    assert msg.endswith(".") and not ONE_SENTENCE.search(msg), msg
    return msg


# --------------------------------------------------------------------------------------------------
# published figures


def test_koskela_jalko_honkela_fft_accountant_figure():
    """Koskela, Jalko and Honkela, "Computing Tight Differential Privacy Guarantees Using FFT"
    (AISTATS 2020): their reference implementation (github.com/DPBayes/PLD-Accountant,
    tests/test_compute_delta.py, ``get_delta_R``, the add/remove relation) gives, for the
    Poisson-subsampled Gaussian with q = 0.01, sigma = 2 and 10^4 compositions,
    delta(epsilon = 1) = 0.010224911209191894. Our PLD accountant, asked for epsilon at that delta,
    answers epsilon = 1 to within 1e-3."""
    eps = dp_sgd_epsilon(2.0, 0.01, 10_000, 0.010224911209191894, "pld")
    assert eps == pytest.approx(1.0, abs=1e-3)
    # the same through the client-level accountant: q = 1000 / 100000, add/remove one client
    acc = Accountant(2.0, "poisson", 100_000, 1000, "pld", delta=0.010224911209191894)
    assert acc.epsilon(10_000) == pytest.approx(1.0, abs=1e-3)
    assert acc.describe()["neighbouring_relation"] == "add/remove one client"


def test_tensorflow_privacy_mnist_tutorial_figure():
    """TensorFlow Privacy's MNIST tutorial (tensorflow/privacy, tutorials/README.md, "Expected
    Output" and the first row of "Select Parameters"; tutorials/mnist_dpsgd_tutorial.py): noise
    multiplier 1.12, batch 256 of 60,000 examples (q = 256 / 60000), 60 epochs of 60000 // 256 = 234
    steps, delta = 1e-5: epsilon 2.92, from RDP at orders 1.1..10.9 and 12..63 with the classic
    conversion epsilon = min_a RDP(a) + log(1/delta) / (a - 1) (Mironov, CSF 2017, Prop. 3).

    Our RDP accountant converts with the tighter bound of Canonne, Kamath and Steinke (NeurIPS 2020,
    Prop. 12), so its epsilon must lie below 2.92, and the classic conversion of the same RDP curve
    must give 2.92 back; PLD lies below both."""
    import dp_accounting
    from dp_accounting import rdp

    q, sigma, steps, delta = 256 / 60000, 1.12, 60 * (60000 // 256), 1e-5
    event = dp_accounting.SelfComposedDpEvent(round_event(sigma, "poisson", 60000, 256), steps)
    classic = []
    for a in [1 + x / 10 for x in range(1, 100)] + list(range(12, 64)):
        one = rdp.RdpAccountant(orders=[a])
        one.compose(event)
        # one order: improved = r + log(1 - 1/a) - (log delta + log a) / (a - 1); classic = r - log delta / (a - 1)
        classic.append(one.get_epsilon(delta) - math.log1p(-1 / a) + math.log(a) / (a - 1))
    assert round(min(classic), 2) == 2.92
    eps_rdp = dp_sgd_epsilon(sigma, q, steps, delta, "rdp")
    eps_pld = dp_sgd_epsilon(sigma, q, steps, delta, "pld")
    assert eps_pld < eps_rdp < 2.92
    assert eps_rdp == pytest.approx(2.516, abs=0.01)
    assert eps_pld == pytest.approx(2.308, abs=0.01)


def test_abadi_et_al_moments_accountant_figure():
    """Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016, Sec. 3.1): for q = 0.01,
    sigma = 4, delta = 1e-5 and T = 10000 steps the moments accountant gives epsilon ~ 1.26 (strong
    composition: 9.34). The moments accountant is an upper bound (orders up to 32, the classic
    conversion), so today's RDP and PLD must lie below it, and not far: within 30 per cent."""
    eps_rdp = dp_sgd_epsilon(4.0, 0.01, 10_000, 1e-5, "rdp")
    eps_pld = dp_sgd_epsilon(4.0, 0.01, 10_000, 1e-5, "pld")
    assert 0.7 * 1.26 < eps_pld < eps_rdp < 1.26
    assert eps_rdp == pytest.approx(1.035, abs=0.005)
    assert eps_pld == pytest.approx(0.947, abs=0.005)


# --------------------------------------------------------------------------------------------------
# the accountants


@pytest.mark.parametrize(
    ("sigma", "n", "cohort", "rounds"),
    [(1.0, 1000, 10, 200), (2.0, 500, 50, 50), (0.8, 10_000, 100, 300)],
)
def test_rdp_is_above_pld_within_its_known_slack(sigma, n, cohort, rounds):
    """Poisson sampling, add/remove: RDP's epsilon is an upper bound looser than PLD's (tight up to
    its discretisation); at these settings the slack is under 60 per cent."""
    delta = default_delta(n)
    pld = Accountant(sigma, "poisson", n, cohort, "pld").epsilon(rounds, delta)
    rdp = Accountant(sigma, "poisson", n, cohort, "rdp").epsilon(rounds, delta)
    assert pld < rdp < 1.6 * pld


def test_fixed_cohort_is_rdp_under_replace_one_with_sensitivity_two():
    """A fixed cohort is accounted by RDP, replace one client, whatever accountant is asked; the
    event's Gaussian carries sigma / 2 (replace-one sensitivity 2). With the whole population as the
    cohort (q = 1) it is the plain Gaussian mechanism of sensitivity 2: RDP a / (2 (sigma/2)^2) per
    round, so T rounds at sigma are one round at sigma / sqrt(T)."""
    import dp_accounting

    event = round_event(3.0, "fixed", 100, 10)
    assert isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent)
    assert (event.source_dataset_size, event.sample_size, event.event.noise_multiplier) == (100, 10, 1.5)
    asked_pld = Accountant(3.0, "fixed", 100, 10, "pld", delta=1e-3)
    asked_rdp = Accountant(3.0, "fixed", 100, 10, "rdp", delta=1e-3)
    assert asked_pld.epsilon(20) == asked_rdp.epsilon(20)
    d = asked_pld.describe()
    assert (d["accountant"], d["requested_accountant"], d["neighbouring_relation"], d["cohort"]) == (
        "rdp",
        "pld",
        "replace one client",
        10,
    )
    full_t = Accountant(4.0, "fixed", 50, 50, "rdp", delta=1e-4).epsilon(16)
    full_1 = Accountant(1.0, "fixed", 50, 50, "rdp", delta=1e-4).epsilon(1)
    assert full_t == pytest.approx(full_1, rel=1e-6)


def test_epsilon_grows_is_cached_and_zero_before_any_round():
    acc = Accountant(1.0, "poisson", 1000, 20, "pld")
    assert acc.delta == pytest.approx(1000**-1.1)
    assert acc.epsilon(0) == 0.0
    e1, e5, e50 = acc.epsilon(1), acc.epsilon(5), acc.epsilon(50)
    assert 0 < e1 < e5 < e50
    assert acc._cache[(5, acc.delta)] == e5
    assert Accountant(1.0, "poisson", 1000, 20, "pld").epsilon(5) == e5
    assert Accountant(0.0, "poisson", 1000, 20, "pld").epsilon(3) == math.inf
    d = acc.describe()
    assert d["q"] == pytest.approx(0.02) and d["noise_multiplier"] == 1.0 and d["accountant"] == "pld"


def test_module_import_is_light():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, raysim.privacy.accounting; print('torch' in sys.modules, 'dp_accounting' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["False", "False"]


# --------------------------------------------------------------------------------------------------
# calibration


@pytest.mark.parametrize(
    ("target", "sampling", "accountant", "rounds"),
    [(2.0, "poisson", "rdp", 100), (4.0, "fixed", "rdp", 10), (1.5, "poisson", "pld", 5)],
)
def test_calibration_round_trips(target, sampling, accountant, rounds):
    n, cohort, delta = 1000, 50, 1e-5
    sigma = calibrate_noise(target, delta, rounds, sampling, n, cohort, accountant)
    spent = Accountant(sigma, sampling, n, cohort, accountant, delta=delta).epsilon(rounds)
    assert target * 0.99 < spent <= target
    less = Accountant(sigma * 0.997, sampling, n, cohort, accountant, delta=delta).epsilon(rounds)
    assert less > target


def test_calibration_refuses_what_no_noise_meets():
    with pytest.raises(ConfigError) as err:
        calibrate_noise(1e-3, 1e-6, 1000, "fixed", 50, 50, "rdp")
    assert "cannot be met" in one_sentence(err)


def test_accountant_of_settings_calibrates():
    privacy = PrivacyConfig(clip="1.0", target_epsilon=3.0, sampling="poisson", accountant="rdp", delta=1e-4)
    acc = Accountant.of(privacy, 1000, 40, 60)
    assert (
        acc.epsilon(60)
        <= 3.0
        < Accountant(acc.noise_multiplier * 0.997, "poisson", 1000, 40, "rdp", delta=1e-4).epsilon(60)
    )
    assert acc.describe()["calibrated_for_epsilon"] == 3.0


# --------------------------------------------------------------------------------------------------
# adaptive clipping


def test_adaptive_noise_hand_case():
    """z = 1, sigma_b = 1: sigma_Delta = (1 - 1/4)^(-1/2) = 2 / sqrt(3); z = 0.5, sigma_b = 5 / 20:
    (4 - 4)^(-1/2) does not exist and is refused."""
    assert adaptive_noise(1.0, 1.0) == pytest.approx(2 / math.sqrt(3), rel=1e-12)
    assert adaptive_noise(1.2, 6.0) == pytest.approx((1.2**-2 - 12.0**-2) ** -0.5, rel=1e-12)
    assert default_count_noise(100) == 5.0
    with pytest.raises(ConfigError) as err:
        adaptive_noise(0.5, default_count_noise(5))
    assert "count_noise_multiplier" in one_sentence(err)
    acc = Accountant(1.0, "fixed", 200, 20, "pld", clip=parse_clip("adaptive:0.5"))
    assert acc.count_noise_multiplier == 1.0
    assert acc.describe()["update_noise_multiplier"] == pytest.approx(2 / math.sqrt(3))


def test_default_delta():
    assert default_delta(100) == pytest.approx(100**-1.1)
    assert default_delta(100) < 1 / 100


# --------------------------------------------------------------------------------------------------
# refusals


def test_parse_clip():
    assert parse_clip("none").on is False
    assert parse_clip("0.5").norm == 0.5
    assert parse_clip("adaptive:0.5").quantile == 0.5
    for bad in ("1.0.0", "-2", "0", "adaptive:1.5", "adaptive0.5", "adaptive", "clip", "inf", "adaptive:0"):
        with pytest.raises(ConfigError) as err:
            parse_clip(bad)
        assert "privacy.clip" in one_sentence(err)


def cfg_of(**privacy) -> ExperimentConfig:
    return from_dict(
        ExperimentConfig, {"clients": 100, "participation": 0.1, "rounds": 10, "privacy": privacy}
    )


@pytest.mark.parametrize(
    ("privacy", "words"),
    [
        # noise_multiplier
        ({"clip": "1.0", "noise_multiplier": 1.0, "target_epsilon": 2.0}, "not both"),
        ({"clip": "1.0"}, "needs privacy.noise_multiplier"),
        ({"noise_multiplier": 1.0}, "needs privacy.clip"),
        # target_epsilon
        ({"target_epsilon": 2.0}, "needs privacy.clip"),
        ({"clip": "1.0", "target_epsilon": 1e-4, "delta": 1e-6}, "cannot be met"),
        ({"clip": "adaptive:0.5"}, "needs privacy.noise_multiplier"),
        # delta
        ({"clip": "1.0", "noise_multiplier": 1.0, "delta": 0.02}, "not below 1/N"),
        ({"clip": "1.0", "noise_multiplier": 1.0, "delta": 0.5}, "not below 1/N"),
        ({"delta": 1e-5}, "no differential privacy"),
        # sampling
        ({"sampling": "poisson"}, "sampling=poisson"),
        ({"sampling": "poisson", "delta": 1e-5}, "sampling=poisson"),
        ({"sampling": "poisson", "noise_multiplier": 1.0}, "needs privacy.clip"),
        # adaptive clipping's settings
        ({"clip": "1.0", "noise_multiplier": 1.0, "count_noise_multiplier": 2.0}, "adaptive"),
        ({"clip": "1.0", "noise_multiplier": 1.0, "clip_lr": 0.5}, "adaptive"),
        ({"clip_init": 1.0}, "adaptive"),
        (
            {"clip": "adaptive:0.5", "noise_multiplier": 2.0, "count_noise_multiplier": 0.5},
            "count_noise_multiplier",
        ),
        ({"clip": "adaptive:0.5", "noise_multiplier": 1.5}, "count_noise_multiplier"),
        (
            {"clip": "adaptive:0.5", "noise_multiplier": 3.0, "count_noise_multiplier": 1.5},
            "count_noise_multiplier",
        ),
        # DP-SGD's settings
        ({"example_noise_multiplier": 2.0}, "example_clip"),
        ({"per_example": "opacus"}, "example_clip"),
        ({"clip": "1.0", "noise_multiplier": 1.0, "example_noise_multiplier": 0.5}, "example_clip"),
        # clip
        ({"clip": "1.0.0", "noise_multiplier": 1.0}, "privacy.clip"),
        ({"clip": "adaptive:2", "noise_multiplier": 1.0}, "privacy.clip"),
        ({"clip": "-1", "noise_multiplier": 1.0}, "privacy.clip"),
    ],
)
def test_check_privacy_refuses(privacy, words):
    with pytest.raises(ConfigError) as err:
        check_privacy(cfg_of(**privacy))
    assert words in one_sentence(err)


@pytest.mark.parametrize(
    "privacy",
    [
        {"noise_multiplier": "abc"},
        {"noise_multiplier": -1},
        {"noise_multiplier": [1]},
        {"target_epsilon": 0},
        {"target_epsilon": -2},
        {"target_epsilon": "x"},
        {"delta": 0},
        {"delta": 1},
        {"delta": "small"},
        {"sampling": "uniform"},
        {"sampling": "Poisson"},
        {"sampling": 3},
        {"accountant": "gdp"},
        {"accountant": "moments"},
        {"accountant": "PLD"},
        {"count_noise_multiplier": 0},
        {"clip_lr": -0.1},
        {"clip_init": 0},
    ],
)
def test_single_values_are_refused_when_the_config_is_built(privacy):
    with pytest.raises(ConfigError) as err:
        cfg_of(**privacy)
    one_sentence(err)


def test_check_privacy_passes_good_settings():
    for privacy in (
        {},
        {"clip": "1.0", "noise_multiplier": 1.0},
        {"clip": "1.0", "noise_multiplier": 1.0, "sampling": "poisson", "accountant": "rdp"},
        {"clip": "adaptive:0.5", "noise_multiplier": 0.5, "clip_lr": 0.1},
        {"example_clip": 1.0, "sampling": "poisson", "delta": 1e-5},
    ):
        check_privacy(cfg_of(**privacy))
    assert Accountant.for_experiment(cfg_of(clip="1.0", noise_multiplier=1.0)).describe()["cohort"] == 10
