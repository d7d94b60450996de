"""The capabilities are declared, not implied: a registered algorithm defines a capability's own
hooks exactly when it declares the capability, and the base class defines none of them."""

from __future__ import annotations

import pytest

import algorithms  # noqa: F401  (registers every algorithm)
from algorithms.base import Algorithm
from raysim.capabilities.round_log import RoundLog
from raysim.capabilities.validation import Validation
from raysim.registry import ALGORITHMS

CAPABILITIES = {"round_log": RoundLog.HOOKS, "validation": Validation.HOOKS}


@pytest.mark.parametrize("capability", sorted(CAPABILITIES))
def test_a_class_defines_a_capabilitys_hooks_exactly_when_it_declares_it(capability: str) -> None:
    hooks = CAPABILITIES[capability]
    assert not any(hasattr(Algorithm, h) for h in hooks), "the base must not define them"
    declared, defines = set(), set()
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        if getattr(cls, capability) is not None:
            declared.add(name)
        if any(hasattr(cls, h) for h in hooks):
            defines.add(name)
        if capability == "validation" and name in declared:
            assert all(hasattr(cls, h) for h in hooks), f"{name} declares validation but lacks a hook"
    assert declared == defines
    assert declared  # some algorithm uses it (fed3p2 for both)
    assert "fed3p2" in declared


def test_extra_rounds_are_declared_by_the_algorithms_that_have_them() -> None:
    prologue = {n for n in ALGORITHMS.names() if ALGORITHMS.get(n).extra_rounds.prologue}
    epilogue = {n for n in ALGORITHMS.names() if ALGORITHMS.get(n).extra_rounds.epilogue}
    assert {"fedfcd", "pacfl", "fedclust"} <= prologue
    assert "spherefed" in epilogue and "fedavg" not in prologue | epilogue
