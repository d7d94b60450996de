"""The capability of logging more than the engine's metrics each round (:class:`RoundLog`),
declared on an algorithm's class.

An algorithm with ``round_log = RoundLog()`` defines one or more of three hooks, which the others
never see (the engine asks the capability, never the class):

- ``round_scalars(state, rnd) -> dict[str, float]``: scalars after round ``rnd``, for TensorBoard
  and metrics.parquet (a phase, an objective, a step size);
- ``round_texts(state, rnd) -> dict[str, str]``: text for TensorBoard (a grouping, when it is made);
- ``round_images(state, rnd) -> dict[str, np.ndarray]``: pictures for TensorBoard after an
  evaluated round (uint8, (H, W) or (H, W, 3)), e.g. FedPAC's combination weights.

``tests/algorithms/test_capabilities.py`` checks that a class defines these hooks exactly when it
declares the capability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from raysim.capabilities.declared import Capability

Pairs = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class RoundLog(Capability):
    """``round_log = RoundLog()`` on an algorithm's class."""

    #: the hooks an algorithm with the capability may define
    HOOKS = ("round_scalars", "round_texts", "round_images")

    def _ask(self, algo: Any, hook: str, state: Any, rnd: int) -> Pairs:
        fn = getattr(algo, hook, None) if self.declared else None
        return tuple(sorted(fn(state, rnd).items())) if fn is not None else ()

    def scalars(self, algo: Any, state: Any, rnd: int) -> tuple[tuple[str, float], ...]:
        return self._ask(algo, "round_scalars", state, rnd)

    def texts(self, algo: Any, state: Any, rnd: int) -> tuple[tuple[str, str], ...]:
        return self._ask(algo, "round_texts", state, rnd)

    def images(self, algo: Any, state: Any, rnd: int) -> tuple[tuple[str, np.ndarray], ...]:
        return self._ask(algo, "round_images", state, rnd)


__all__ = ["RoundLog"]
