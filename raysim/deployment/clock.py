"""The simulated clock of a deployment: how long a client's work takes on its device, and
when a synchronous round can aggregate under each round policy. Pure arithmetic on numbers, the
same on every executor; nothing here waits.

- A client's time for a round is its download (latency + bytes down / down bandwidth), its compute
  (samples trained x seconds a sample) and its upload (latency + bytes up / up bandwidth).
- A sampled client that drops out is known to the server as lost when its update was due (its
  nominal time: E epochs of its data, the model down and up, on its device; FedScale finds an
  offline client at its completion time too); one that goes offline before its upload (an
  availability trace) is known lost at that moment.
- ``all``: the server waits for every sampled client's update, or to learn it is lost; the round
  lasts until the last of these.
- ``deadline``: updates that arrive after ``deadline_s`` are discarded; the round lasts until the
  deadline, or less if every sampled client had arrived or was known lost before it.
- ``overselect``: K(1 + x) clients were sampled; the first ``want`` to arrive are kept (ties by
  client id); the round lasts until the last kept one arrives (if fewer than ``want`` arrive, until
  every sampled client has arrived or is known lost).

The server applies it to each round's results (:meth:`raysim.deployment.model.Deployment.close`);
the runner adds the rounds' durations into the run's ``sim_time_s``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["all", "deadline", "overselect"]


@dataclass(frozen=True)
class Device:
    """A client's device: seconds to train on one sample, bandwidths in bytes a second, and the
    latency of each transfer. The default is the ideal device: no time at all."""

    seconds_per_sample: float = 0.0
    down_bps: float = math.inf
    up_bps: float = math.inf
    latency_s: float = 0.0

    def round_time(self, samples: int, bytes_down: int, bytes_up: int) -> float:
        """Download, compute and upload of one round's work, in simulated seconds."""
        down = self.latency_s + bytes_down / self.down_bps
        up = self.latency_s + bytes_up / self.up_bps
        return down + samples * self.seconds_per_sample + up


@dataclass(frozen=True)
class Arrival:
    """A sampled client's update: when it arrives (seconds from the round's start), or, if it
    ``dropped`` (it never arrives), when the server knows it is lost."""

    client: int
    time_s: float
    dropped: bool = False


@dataclass(frozen=True)
class RoundClose:
    """The clients whose updates the server aggregates (in arrival order) and the round's duration."""

    kept: tuple[int, ...]
    duration_s: float


def close_round(
    arrivals: Sequence[Arrival], policy: Policy, *, deadline_s: float | None = None, want: int | None = None
) -> RoundClose:
    """When a synchronous round can aggregate, and with whose updates (see the module docstring)."""
    alive = sorted((a for a in arrivals if not a.dropped), key=lambda a: (a.time_s, a.client))
    last = max((a.time_s for a in arrivals), default=0.0)  # every update in, or known lost
    if policy == "all":
        return RoundClose(tuple(a.client for a in alive), last)
    if policy == "deadline":
        if deadline_s is None:
            raise ValueError("the deadline policy needs a deadline")
        kept = tuple(a.client for a in alive if a.time_s <= deadline_s)
        return RoundClose(kept, min(last, deadline_s))
    if want is None:
        raise ValueError("over-selection needs the number of updates to keep")
    chosen = alive[:want]
    return RoundClose(tuple(a.client for a in chosen), chosen[-1].time_s if len(chosen) == want else last)


def default_deadline(nominal_times: Sequence[float], factor: float = 1.5) -> float:
    """A deadline when none is given: ``factor`` times the median of the clients' times for their
    nominal work (E epochs of their data on their devices), so that about half the clients have
    room to spare and the slow tail is cut."""
    return factor * statistics.median(nominal_times) if nominal_times else 0.0


__all__ = ["Arrival", "Device", "Policy", "RoundClose", "close_round", "default_deadline"]
