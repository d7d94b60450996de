"""Diurnal availability on the simulated clock: a swing with its period in simulated hours, a phase
per time zone (the clients of a zone alike), the federation's share swinging by
``amplitude * |sum_z share_z exp(2 pi i z / Z)|``, zones placed by their shares, and the
settings' refusals."""

from __future__ import annotations

import cmath
import dataclasses
import math

import numpy as np
import pytest

from raysim.config import ExperimentConfig
from raysim.deployment.draws import zone_ends
from raysim.deployment.model import Deployment

N = 1000
PERIOD_H = 6.0  # not the default 24, so that the test tells hours from the default
PERIOD_S = PERIOD_H * 3600
MEAN, AMPLITUDE = 0.5, 0.4  # diurnal's default mean, and its amplitude 0.8 min(M, 1 - M)
K = 96  # simulated times over two periods, each in a round of its own (fresh draws)
TIMES = np.arange(K) * (2 * PERIOD_S / K)


def deployment(clients: int = N, **settings) -> Deployment:
    cfg = ExperimentConfig()
    settings = {"availability": "diurnal", "devices": "fixed", "diurnal_period_h": PERIOD_H, **settings}
    d = dataclasses.replace(cfg.deployment, **settings)
    return Deployment(dataclasses.replace(cfg, clients=clients, deployment=d))


def online(d: Deployment, rnd: int, t: float) -> np.ndarray:
    return np.array([d.availability.online(d.cfg.seed, rnd, c, t) for c in range(d.cfg.clients)])


def sweep(d: Deployment) -> np.ndarray:
    """Who is online (K x N) at each of TIMES, round k + 1 at the k-th."""
    return np.array([online(d, k + 1, t) for k, t in enumerate(TIMES)])


def fit(share: np.ndarray) -> tuple[float, float, float]:
    """Least squares of ``share`` on ``a + b sin(w t) + c cos(w t)`` over TIMES, w = 2 pi / period:
    (a, the amplitude hypot(b, c), the phase atan2(c, b))."""
    w = 2 * math.pi / PERIOD_S
    x = np.column_stack([np.ones(K), np.sin(w * TIMES), np.cos(w * TIMES)])
    (a, b, c), *_ = np.linalg.lstsq(x, share, rcond=None)
    return float(a), float(math.hypot(b, c)), float(math.atan2(c, b))


def test_one_zone_swings_the_whole_federation_with_the_full_amplitude_and_a_period_in_hours():
    d = deployment()
    share = sweep(d).mean(axis=1)
    mean, amplitude, phase = fit(share)
    # the share of 1,000 clients has a binomial std of at most 0.016; a fit over 96 times, 0.0023
    assert mean == pytest.approx(MEAN, abs=0.01)
    assert amplitude == pytest.approx(AMPLITUDE, abs=0.01)
    assert phase == pytest.approx(0.0, abs=0.03)  # sin(2 pi t / period): the peak a quarter in
    assert share.max() - share.min() == pytest.approx(2 * AMPLITUDE, abs=0.06)  # extremes: plus noise
    peak = np.mean([online(d, r, PERIOD_S / 4).mean() for r in range(1, 21)])  # 20,000 draws
    trough = np.mean([online(d, r, 3 * PERIOD_S / 4).mean() for r in range(1, 21)])
    assert peak == pytest.approx(MEAN + AMPLITUDE, abs=0.01)
    assert trough == pytest.approx(MEAN - AMPLITUDE, abs=0.01)
    # the period is in simulated hours: a period later, the same round's draws give the same clients
    for t in (0.0, 1234.5, PERIOD_S / 4, 0.9 * PERIOD_S):
        assert np.array_equal(online(d, 7, t), online(d, 7, t + PERIOD_S))
        assert np.array_equal(online(d, 7, t), online(d, 7, t + 3 * PERIOD_S))
    # and the round number moves nothing: at the peak time, round 1 and round 5,000 alike
    late = np.mean([online(d, 5000 + r, PERIOD_S / 4).mean() for r in range(20)])
    assert late == pytest.approx(MEAN + AMPLITUDE, abs=0.01)
    longer = deployment(diurnal_period_h=2 * PERIOD_H)  # twice the hours: at t = P/4 not yet at its peak
    assert np.mean([online(longer, r, PERIOD_S / 4).mean() for r in range(1, 21)]) == pytest.approx(
        MEAN + AMPLITUDE * math.sin(math.pi / 4), abs=0.01
    )


def federation_amplitude(shares: tuple[float, ...]) -> float:
    z = len(shares)
    return AMPLITUDE * abs(sum(s * cmath.exp(2j * math.pi * i / z) for i, s in enumerate(shares)))


def test_uneven_zones_swing_the_federation_by_the_documented_amplitude():
    shares = (0.4, 0.3, 0.2, 0.1)
    d = deployment(time_zones=4, zone_shares=shares)
    who = sweep(d)
    expected = federation_amplitude(shares)
    assert expected == pytest.approx(0.4 * math.hypot(0.2, 0.2))  # 0.113: (0.4 - 0.2) + (0.3 - 0.1) i
    mean, amplitude, _ = fit(who.mean(axis=1))
    assert mean == pytest.approx(MEAN, abs=0.01) and amplitude == pytest.approx(expected, abs=0.01)
    blocks = ((0, 400), (400, 700), (700, 900), (900, 1000))
    for z, (lo, hi) in enumerate(blocks):  # each zone: the full swing
        _, zone_amplitude, zone_phase = fit(who[:, lo:hi].mean(axis=1))
        assert zone_amplitude == pytest.approx(AMPLITUDE, abs=0.03)  # 100 clients at the least: std 0.007
        assert cmath.phase(cmath.exp(1j * (zone_phase - 2 * math.pi * z / 4))) == pytest.approx(0.0, abs=0.1)


def test_equal_zones_cancel_out_but_each_zone_swings_fully():
    d = deployment(time_zones=4)
    who = sweep(d)
    share = who.mean(axis=1)
    assert federation_amplitude((0.25,) * 4) == pytest.approx(0.0, abs=1e-12)
    mean, amplitude, _ = fit(share)
    assert mean == pytest.approx(MEAN, abs=0.01) and amplitude < 0.01  # flat: the fit's noise is 0.0023
    assert share.std() < 0.025  # binomial noise only (0.016); one zone's swing has std 0.28
    for z in range(4):  # zone z peaks z/4 of a period before zone 0
        _, zone_amplitude, zone_phase = fit(who[:, 250 * z : 250 * (z + 1)].mean(axis=1))
        assert zone_amplitude == pytest.approx(AMPLITUDE, abs=0.02)
        assert cmath.phase(cmath.exp(1j * (zone_phase - 2 * math.pi * z / 4))) == pytest.approx(0.0, abs=0.06)


def test_zones_are_contiguous_blocks_of_client_ids_by_their_shares():
    assert zone_ends((0.4, 0.3, 0.2, 0.1), 1000) == (400, 700, 900, 1000)
    assert zone_ends((1 / 3,) * 3, 10) == (3, 7, 10)  # the rounding's remainder to the later zones
    assert zone_ends((0.5, 0.0, 0.5), 10) == (5, 5, 10)  # a zone of share 0 holds no client
    assert zone_ends((1.0,), 7) == (7,)
    pattern = deployment(time_zones=4, zone_shares=(0.4, 0.3, 0.2, 0.1)).availability.pattern
    zones = [pattern.zone(c) for c in range(N)]
    assert [zones.count(z) for z in range(4)] == [400, 300, 200, 100] and zones == sorted(zones)
    three = deployment(clients=10, time_zones=3).availability.pattern  # None: equal shares
    assert [three.zone(c) for c in range(10)] == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    empty = deployment(clients=10, time_zones=3, zone_shares=(0.5, 0.0, 0.5)).availability.pattern
    assert [empty.zone(c) for c in range(10)] == [0] * 5 + [2] * 5
    one = deployment(clients=10).availability.pattern
    assert one.zones == 1 and {one.zone(c) for c in range(10)} == {0}
    few = deployment(clients=3, time_zones=4).availability.pattern  # more zones than clients
    assert [few.zone(c) for c in range(3)] == [0, 1, 3]  # ends (1, 2, 2, 3): zone 2 holds none


BASE = {
    "data.dataset": "synthetic",
    "model": "mlp_fcd",
    "clients": 8,
    "ray.executor": "serial",
    "deployment.availability": "diurnal",
    "deployment.devices": "fixed",
}


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"deployment.time_zones": "0"}, "deployment.time_zones must be at least 1, not 0."),
        ({"deployment.time_zones": "two"}, "deployment.time_zones must be an integer, not 'two'."),
        ({"deployment.time_zones": "1.5"}, "deployment.time_zones must be an integer, not '1.5'."),
        ({"deployment.diurnal_period_h": "0"}, "deployment.diurnal_period_h must be above 0, not 0.0."),
        (
            {"deployment.diurnal_period_h": "a day"},
            "deployment.diurnal_period_h must be a number, not 'a day'.",
        ),
        (
            {"deployment.diurnal_period_h": "inf"},
            "deployment.diurnal_period_h must be a finite number of hours",
        ),
        (
            {"deployment.time_zones": "2", "deployment.zone_shares": "[0.5]"},
            "deployment.zone_shares gives 1 share but deployment.time_zones is 2: one share a zone.",
        ),
        (
            {"deployment.zone_shares": "[0.5, 0.5]"},
            "deployment.zone_shares gives 2 shares but deployment.time_zones is 1: one share a zone.",
        ),
        (
            {"deployment.time_zones": "2", "deployment.zone_shares": "[1.5, -0.5]"},
            "Each of deployment.zone_shares must be a share at least 0, not -0.5.",
        ),
        (
            {"deployment.time_zones": "2", "deployment.zone_shares": "[nan, 0.5]"},
            "Each of deployment.zone_shares must be a share at least 0, not nan.",
        ),
        (
            {"deployment.time_zones": "2", "deployment.zone_shares": "[0.6, 0.6]"},
            "deployment.zone_shares must sum to 1, not 1.2.",
        ),
        ({"deployment.zone_shares": "[half]"}, "deployment.zone_shares must be a number, not 'half'."),
        (
            {"deployment.availability": "always", "deployment.time_zones": "3"},
            "deployment.time_zones is read only with deployment.availability=diurnal, not always.",
        ),
        (
            {"deployment.availability": "bernoulli:0.5", "deployment.diurnal_period_h": "12"},
            "deployment.diurnal_period_h is read only with deployment.availability=diurnal, not bernoulli:0.5.",
        ),
        (
            {
                "deployment.availability": "always",
                "deployment.time_zones": "2",
                "deployment.zone_shares": "[0.5,0.5]",
            },
            "deployment.time_zones and deployment.zone_shares are read only with deployment.availability=diurnal",
        ),
        (
            {"deployment.devices": "ideal"},
            "deployment.availability=diurnal needs devices that take time (deployment.devices=fixed, lognormal or "
            "trace): on ideal devices the simulated clock never moves, so availability would never swing.",
        ),
    ],
)
def test_bad_diurnal_settings_are_refused_with_one_sentence(settings, needle):
    from raysim.api import checked_experiment
    from raysim.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={**BASE, **settings})
    message = str(e.value)
    assert needle in message
    assert "\n" not in message and message.endswith(".") and message.count(". ") == 0  # one sentence


def test_good_diurnal_settings_pass_and_train():
    from raysim.api import checked_experiment
    from raysim.engine.runner import run_experiment

    checked = checked_experiment(
        None,
        set={
            **BASE,
            "rounds": "2",
            "deployment.time_zones": "2",
            "deployment.zone_shares": "[0.75, 0.25]",
            "deployment.diurnal_period_h": "0.5",
        },
    )
    d = checked.cfg.deployment
    assert (d.diurnal_period_h, d.time_zones, d.zone_shares) == (0.5, 2, (0.75, 0.25))
    assert Deployment(checked.cfg).availability.pattern.ends == (6, 8)
    run = run_experiment(checked)
    assert run.rows[-1]["sim_time_s"] > 0
