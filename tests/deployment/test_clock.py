"""The simulated clock on hand cases, and its draws' rates over many rounds."""

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


def test_waiting_for_all_lasts_until_every_update_is_in_or_known_lost():
    got = close_round(ARRIVALS, "all")
    assert got.kept == (1, 4, 0, 2) and got.duration_s == 9.0  # arrival order, ties by client id
    # a dropout costs the time until the server knows it is lost (its update's due time)
    assert close_round([Arrival(0, 1.0, dropped=True)], "all").duration_s == 1.0
    lost_last = close_round([Arrival(0, 2.0), Arrival(1, 7.0, dropped=True)], "all")
    assert lost_last.kept == (0,) and lost_last.duration_s == 7.0


def test_a_deadline_closes_early_only_once_every_client_arrived_or_is_known_lost():
    known = close_round([Arrival(0, 1.0), Arrival(1, 3.0, dropped=True)], "deadline", deadline_s=6.0)
    assert known.kept == (0,) and known.duration_s == 3.0
    unknown = close_round([Arrival(0, 1.0), Arrival(1, 8.0, dropped=True)], "deadline", deadline_s=6.0)
    assert unknown.duration_s == 6.0
    few = close_round([Arrival(0, 1.0), Arrival(1, 4.0, dropped=True)], "overselect", want=2)
    assert few.kept == (0,) and few.duration_s == 4.0  # fewer than want arrived: until the loss is known


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


def test_diurnal_availability_follows_simulated_hours_with_a_phase_per_time_zone():
    hour = 3600.0
    one = Diurnal(mean=0.5, amplitude=0.4, period_h=24.0)  # one zone: every client alike
    assert [one.probability(c, 6 * hour) for c in (0, 11, 999)] == [pytest.approx(0.9)] * 3  # the peak
    assert one.probability(11, 18 * hour) == pytest.approx(0.1)
    assert one.probability(11, 0.0) == pytest.approx(0.5)
    assert one.probability(11, 30 * hour) == pytest.approx(0.9)  # a period (24 simulated hours) later
    four = Diurnal(mean=0.5, amplitude=0.4, period_h=8.0, ends=(10, 20, 30, 40))  # zone z: ids 10z to 10z + 9
    zones = [four.zone(c) for c in (0, 9, 10, 25, 39, 40)]
    assert zones == [0, 0, 1, 2, 3, 3]  # a client id past the last block: the last zone
    for z in range(4):  # zone z's phase z/4 ahead: it peaks z/4 of a period (2 h each) before zone 0
        assert four.probability(10 * z, (2.0 - 2 * z) % 8 * hour) == pytest.approx(0.9)
    assert Diurnal(mean=0.9, amplitude=0.4).probability(0, 6 * hour) == 1.0  # clipped to [0, 1]
    # the draw is one uniform a (round, client), the same at any time: higher chance, a superset
    for r in range(30):
        online = [available(1, r, c, one, 6 * hour) for c in range(40)]
        assert all(online[c] for c in range(40) if available(1, r, c, one, 18 * hour))
        assert online == [available(1, r, c, 0.9) for c in range(40)]  # Bernoulli(0.9) at the peak


def test_heterogeneous_devices_are_lognormal_around_the_base():
    base = Device(seconds_per_sample=0.01, down_bps=1e6, up_bps=1e6, latency_s=0.1)
    assert device(3, 0, base, 0.0) is base
    slow = np.array([device(3, c, base, 0.5).seconds_per_sample / 0.01 for c in range(3000)])
    assert np.median(slow) == pytest.approx(1.0, abs=0.05)
    assert np.std(np.log(slow)) == pytest.approx(0.5, abs=0.03)
    assert device(3, 9, base, 0.5) == device(3, 9, base, 0.5) and device(3, 9, base, 0.5).latency_s == 0.1
    assert math.isfinite(device(3, 9, base, 0.5).up_bps)
