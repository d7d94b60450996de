"""The capability of reading the global model's validation accuracy during a run
(:class:`Validation`), declared on an algorithm's class: Fed3+2p's automatic switch from phase 1 to
phase 2.

An algorithm with ``validation = Validation()`` defines two hooks, which the others never see:

- ``wants_validation(state, rnd) -> bool``: whether, after round ``rnd``, the global model is
  evaluated on the clients' validation parts (``data.val_fraction``);
- ``observe_validation(state, rnd, accuracy) -> state``: the server state, given that accuracy.

The runner evaluates (``val_gm`` in the round's row) and the server passes the accuracy back
(``ServerHost.observe_validation``); an algorithm without the capability is never validated.
``tests/algorithms/test_capabilities.py`` checks that a class defines both hooks exactly when it
declares the capability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raysim.capabilities.declared import Capability


@dataclass(frozen=True)
class Validation(Capability):
    """``validation = Validation()`` on an algorithm's class."""

    #: the hooks an algorithm with the capability defines
    HOOKS = ("wants_validation", "observe_validation")

    def wanted(self, algo: Any, state: Any, rnd: int) -> bool:
        """Whether the run validates the global model after round ``rnd`` (never without the
        capability)."""
        return self.declared and bool(algo.wants_validation(state, rnd))

    def observe(self, algo: Any, state: Any, rnd: int, accuracy: float) -> Any:
        """The server state, given the accuracy it asked for (only an algorithm with the
        capability asks)."""
        if not self.declared:
            raise RuntimeError(f"{type(algo).__name__} declares no Validation, so it asked for none")
        return algo.observe_validation(state, rnd, accuracy)


__all__ = ["Validation"]
