"""The capability of making one's own client-level DP release (:class:`PrivateRelease`), declared on
an algorithm's class whose server does more with the uploads than average them, but whose every use
of them can be bounded one client at a time: Fed3+2p (its coordinators' chains, its Type-B groups'
filters, and the label distributions its groupings read).

An algorithm whose ``aggregate`` is the size-weighted mean of the uploads needs nothing: the server
releases their noised mean and the algorithm aggregates that (``raysim.privacy.client_level``,
DP-FedAvg). One that declares ``private_release = PrivateRelease(...)`` defines a hook the others
never see:

- ``private_aggregate(state, rnd, results, release) -> state``: the round's aggregate under
  client-level DP, which reads the uploads only through ``release``
  (:class:`raysim.privacy.client_level.Release`): it hands the release each *unit* of uploads that
  one client's data reaches at most one of, with the unit's denominator (its expected size, fixed)
  and sensitivity, and takes the unit's noised mean back;

and may read per-client statistics before round 1 only through ``ServerContext.private_rows``
(:meth:`raysim.privacy.client_level.ClientLevel.noised_rows`), ``statistics(cfg, params)`` such
releases in all, each accounted as one more Gaussian mechanism before the rounds.

``tests/algorithms/test_capabilities.py`` checks that a class defines the hook exactly when it
declares the capability.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raysim.capabilities.declared import Capability
from raysim.config import ExperimentConfig


def _none(cfg: ExperimentConfig, params: Any) -> int:
    return 0


@dataclass(frozen=True)
class PrivateRelease(Capability):
    """``private_release = PrivateRelease(clipped=..., statistics=...)`` on an algorithm's class."""

    #: the hooks an algorithm with the capability defines
    HOOKS = ("private_aggregate",)

    #: what is clipped and noised, in words (summary.json's ``privacy.clipped``)
    clipped: str = ""
    #: how many releases of per-client statistics the algorithm's init makes under these settings
    statistics: Callable[[ExperimentConfig, Any], int] = _none
    #: why adaptive clipping (privacy.clip=adaptive:Q) cannot apply, or None where it can
    not_adaptive: str | None = None

    def released_statistics(self, cfg: ExperimentConfig, params: Any) -> int:
        """The statistics the algorithm releases before round 1 (0 without the capability)."""
        return int(self.statistics(cfg, params)) if self.declared else 0


__all__ = ["PrivateRelease"]
