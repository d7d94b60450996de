"""Issue 28's simulated clock on hand cases, and its draws' rates over many rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysim.deployment.clock import Arrival, Device, close_round, default_deadline
from raysim.deployment.draws import Diurnal, available, device, dropped


def test_a_clients_time_is_download_compute_and_upload():
    phone = Device(seconds_per_sample=0.002, down_bps=1e6, up_bps=2.5e5, latency_s=0.05)
    # 0.05 + 2 MB / 1 MB/s  +  3000 samples x 2 ms  +  0.05 + 0.5 MB / 0.25 MB/s
    assert phone.round_time(3000, 2_000_000, 500_000) == pytest.approx(0.05 + 2.0 + 6.0 + 0.05 + 2.0)
    assert Device().round_time(3000, 2_000_000, 500_000) == 0.0  # the ideal device


ARRIVALS = [Arrival(0, 5.0), Arrival(1, 2.0), Arrival(2, 9.0), Arrival(3, 3.0, dropped=True), Arrival(4, 2.0)]


def test_waiting_for_all_lasts_until_the_last_client_that_did_not_drop_out():
    got = close_round(ARRIVALS, "all")
    assert got.kept == (1, 4, 0, 2) and got.duration_s == 9.0  # arrival order, ties by client id
    assert close_round([Arrival(0, 1.0, dropped=True)], "all") == close_round([], "all")


def test_a_deadline_discards_late_updates_and_lasts_until_it():
    got = close_round(ARRIVALS, "deadline", deadline_s=6.0)
    assert got.kept == (1, 4, 0) and got.duration_s == 6.0  # client 2 late, client 3 dropped
    early = close_round([Arrival(0, 1.0), Arrival(1, 4.0)], "deadline", deadline_s=6.0)
    assert early.kept == (0, 1) and early.duration_s == 4.0  # everyone back before it: no wait
    with pytest.raises(ValueError, match="needs a deadline"):
        close_round(ARRIVALS, "deadline")


def test_over_selection_keeps_the_first_to_arrive():
    got = close_round(ARRIVALS, "overselect", want=3)
    assert got.kept == (1, 4, 0) and got.duration_s == 5.0
    few = close_round(ARRIVALS, "overselect", want=5)  # only four returned: all of them, at the last
    assert few.kept == (1, 4, 0, 2) and few.duration_s == 9.0


def test_the_default_deadline_is_half_again_the_median_nominal_time():
    assert default_deadline([1.0, 2.0, 10.0]) == 3.0
    assert default_deadline([]) == 0.0


def test_availability_and_dropout_rates_over_many_rounds():
    n = 4000
    bern = np.mean([available(7, r, c, 0.3) for r in range(n // 40) for c in range(40)])
    assert bern == pytest.approx(0.3, abs=0.03)
    drop = np.mean([dropped(7, r, c, 0.3) for r in range(n // 40) for c in range(40)])
    assert drop == pytest.approx(0.3, abs=0.03)
    assert not any(dropped(7, r, 0, 0.0) for r in range(100))
    assert available(7, 3, 5, 0.3) == available(7, 3, 5, 0.3)  # keyed, not stateful


def test_diurnal_availability_rises_and_falls_with_its_period():
    pattern = Diurnal(mean=0.5, amplitude=0.4, period=24.0)
    share = [np.mean([available(1, r, c, pattern) for c in range(600)]) for r in range(48)]
    assert np.mean(share) == pytest.approx(0.5, abs=0.05)
    # clients' phases differ, so the federation's share varies little around the mean; one client's
    # own availability follows its sine: its mean over a period is the pattern's mean
    one = np.mean([available(1, r, 11, pattern) for r in range(24 * 200)])
    assert one == pytest.approx(0.5, abs=0.04)


def test_heterogeneous_devices_are_lognormal_around_the_base():
    base = Device(seconds_per_sample=0.01, down_bps=1e6, up_bps=1e6, latency_s=0.1)
    assert device(3, 0, base, 0.0) is base
    slow = np.array([device(3, c, base, 0.5).seconds_per_sample / 0.01 for c in range(3000)])
    assert np.median(slow) == pytest.approx(1.0, abs=0.05)
    assert np.std(np.log(slow)) == pytest.approx(0.5, abs=0.03)
    assert device(3, 9, base, 0.5) == device(3, 9, base, 0.5) and device(3, 9, base, 0.5).latency_s == 0.1
    assert math.isfinite(device(3, 9, base, 0.5).up_bps)
