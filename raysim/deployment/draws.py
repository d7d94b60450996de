"""The random side of a deployment, every draw keyed by (seed, round, client, purpose)
(:mod:`raysim.rng`), so that it is the same on every executor and worker count.

- Availability: ``always``; ``bernoulli:p`` (each client each round, independently); ``diurnal``:
  client c, in time zone z_c of Z, is available at simulated time t (seconds since the run's start)
  with probability ``mean + amplitude * sin(2 pi (t / (period_h * 3600) + z_c / Z))`` (clipped to
  [0, 1]), the draw against it fresh each (round, client). The period is in simulated hours, and
  the phase is one per time zone, its clients' alike: so one zone's available share swings with the
  full ``amplitude``, and the federation's with ``amplitude * |sum_z share_z exp(2 pi i z / Z)|``:
  the full amplitude with one zone, none with equal shares over evenly spaced zones, which cancel
  out. Zones hold contiguous blocks of client ids in order (:func:`zone_ends`).
- Dropout: each sampled client, each round, with probability ``p``: its update never arrives.
- Devices: a client's seconds a sample and bandwidths are a base device's, each times a
  log-normal factor (median 1, log-std ``sigma``) drawn once per client.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from raysim import rng
from raysim.deployment.clock import Device


def zone_ends(shares: Sequence[float], clients: int) -> tuple[int, ...]:
    """Where each time zone's block of client ids ends (exclusive), zone by zone: zone z holds the
    ids from ``round(N S_z)`` up to ``round(N S_(z+1))``, ``S_z`` the sum of the shares before it
    and N the clients, the last zone up to N. So zone 0 holds the first ``round(share_0 N)``
    clients, each zone within one client of ``share_z N`` (the rounding's remainder falls to the
    zones after it), and every client is in exactly one zone; a zone may hold none."""
    ends, total = [], 0.0
    for share in shares[:-1]:
        total += share
        ends.append(min(clients, round(total * clients)))
    return (*ends, clients)


@dataclass(frozen=True)
class Diurnal:
    """The diurnal pattern: its mean and amplitude, its period in simulated hours, and its time
    zones, as where each zone's block of client ids ends (:func:`zone_ends`; ``()``: one zone)."""

    mean: float = 0.5
    amplitude: float = 0.4
    period_h: float = 24.0  # simulated hours
    ends: tuple[int, ...] = ()

    @property
    def zones(self) -> int:
        return max(1, len(self.ends))

    def zone(self, client: int) -> int:
        """``client``'s time zone (a client id past the last block: the last zone)."""
        return min(bisect.bisect_right(self.ends, client), self.zones - 1)

    def probability(self, client: int, now_s: float) -> float:
        """``client``'s chance of being available at ``now_s`` simulated seconds."""
        phase = now_s / (self.period_h * 3600.0) + self.zone(client) / self.zones
        return min(1.0, max(0.0, self.mean + self.amplitude * math.sin(2 * math.pi * phase)))


def available(seed: int, rnd: int, client: int, p: float | Diurnal, now_s: float = 0.0) -> bool:
    """Whether ``client`` can be sampled in round ``rnd``, which starts at ``now_s`` simulated
    seconds: Bernoulli(``p``), or the diurnal pattern's probability at ``now_s``."""
    if isinstance(p, Diurnal):
        p = p.probability(client, now_s)
    return bool(rng.generator(seed, "availability", rnd, client).random() < p)


def dropped(seed: int, rnd: int, client: int, p: float) -> bool:
    """Whether ``client``'s update of round ``rnd`` is lost (probability ``p``)."""
    return p > 0 and bool(rng.generator(seed, "dropout", rnd, client).random() < p)


def device(seed: int, client: int, base: Device, sigma: float) -> Device:
    """``base`` with its compute time and bandwidths each scaled by a log-normal factor of median 1
    and log-std ``sigma``, drawn once per client (``sigma`` 0: ``base`` itself)."""
    if sigma == 0:
        return base
    slow, down, up = rng.generator(seed, "device", 0, client).lognormal(0.0, sigma, 3)
    return Device(
        float(base.seconds_per_sample * slow), float(base.down_bps / down), float(base.up_bps / up), base.latency_s
    )


__all__ = ["Diurnal", "available", "device", "dropped", "zone_ends"]
