"""The capabilities are declared, not implied: the engine finds one by its type among the class's
attributes; the base class declares none (``Kind.of`` gives the kind's null object, ``declared``
False); a registered algorithm defines a capability's own hooks exactly when it declares the
capability."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import algorithms  # noqa: F401  (registers every algorithm)
from algorithms.base import Algorithm
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import NO_BATCHING, Batching
from raysim.capabilities.declared import Capability
from raysim.capabilities.extra_rounds import NO_EXTRA_ROUNDS, ExtraRounds
from raysim.capabilities.finetune import FineTune
from raysim.capabilities.presum import Presum
from raysim.capabilities.private_release import PrivateRelease
from raysim.capabilities.regularizers import Regularizable
from raysim.capabilities.round_log import RoundLog
from raysim.capabilities.validation import Validation
from raysim.registry import ALGORITHMS

KINDS = (Batching, ExtraRounds, FineTune, PrivateRelease, Regularizable, RoundLog, Validation)
HOOKS: dict[type[Capability], tuple[str, ...]] = {
    PrivateRelease: PrivateRelease.HOOKS,
    RoundLog: RoundLog.HOOKS,
    Validation: Validation.HOOKS,
}


def test_the_base_declares_no_capability() -> None:
    assert not [v for v in vars(Algorithm).values() if isinstance(v, Capability)]
    assert Batching.of(Algorithm) is NO_BATCHING and ExtraRounds.of(Algorithm) is NO_EXTRA_ROUNDS
    for kind in (*KINDS, Asynchronous, Presum):
        absent = kind.of(Algorithm)
        assert type(absent) is kind and not absent.declared, kind
        assert kind.of(Algorithm) is absent  # one null object per class and kind, read once


def test_a_null_capability_does_what_the_engine_does_without_it(tmp_path) -> None:
    from tests.conftest import tiny_config

    cfg = tiny_config(tmp_path, algo="fedavg")
    assert not FineTune.absent().on(cfg) and not Batching.absent().possible
    assert not ExtraRounds.absent().prologue and not ExtraRounds.absent().epilogue
    assert RoundLog.absent().scalars(object(), None, 1) == () and not Validation.absent().wanted(object(), None, 1)

    def loss(model, x, y):
        return x

    assert Regularizable.absent().wrap(cfg, None, None, (), loss) is loss
    assert not Presum.applies(Algorithm, cfg)


def test_a_capability_is_found_by_its_type_under_any_name_and_inherited() -> None:
    @dataclass(frozen=True)
    class Probe(Capability):
        level: int = 0

    class A(Algorithm[None]):
        my_own_name = Probe(1)

    class B(A):
        pass

    class C(A):
        other = Probe(2)

    assert Probe.of(A) == Probe(1) and Probe.of(B) == Probe(1)
    class D(A):
        my_own_name = None  # taken back

    assert Probe.of(C) == Probe(2)  # the nearest declaration wins
    assert not Probe.of(D).declared and Probe.of(D) == Probe(declared=False)
    assert not Probe.of(Algorithm).declared


@pytest.mark.parametrize("kind", sorted(HOOKS, key=lambda k: k.__name__), ids=lambda k: k.__name__)
def test_a_class_defines_a_capabilitys_hooks_exactly_when_it_declares_it(kind: type[Capability]) -> None:
    hooks = HOOKS[kind]
    assert not any(hasattr(Algorithm, h) for h in hooks), "the base must not define them"
    declared, defines = set(), set()
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        if kind.of(cls).declared:
            declared.add(name)
        if any(hasattr(cls, h) for h in hooks):
            defines.add(name)
        if kind in (Validation, PrivateRelease) and name in declared:
            assert all(hasattr(cls, h) for h in hooks), f"{name} declares validation but lacks a hook"
    assert declared == defines
    assert "fed3p2" in declared


def test_each_algorithm_declares_what_it_uses() -> None:
    def having(kind: type[Capability]) -> set[str]:
        return {n for n in ALGORITHMS.names() if kind.of(ALGORITHMS.get(n)).declared}

    prologue = {n for n in ALGORITHMS.names() if ExtraRounds.of(ALGORITHMS.get(n)).prologue}
    epilogue = {n for n in ALGORITHMS.names() if ExtraRounds.of(ALGORITHMS.get(n)).epilogue}
    assert {"fedfcd", "pacfl", "fedclust"} <= prologue
    assert "spherefed" in epilogue and "fedavg" not in prologue | epilogue
    assert {"fedbabu", "feddrplus"} <= having(FineTune) and "fed3p2" not in having(FineTune)
    assert {"fedavg", "fedprox"} <= having(Regularizable) and "fedpac" not in having(Regularizable)
    assert Batching.of(ALGORITHMS.get("fed3p2")).pinned and Batching.of(ALGORITHMS.get("fedavg")).possible
    assert not any(kind.of(ALGORITHMS.get("ditto")).declared for kind in (FineTune, RoundLog, Validation))
