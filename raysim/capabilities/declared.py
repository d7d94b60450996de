"""How the engine finds a capability: by its type, among the class attributes of an algorithm's
class and its bases (``finetune = FineTune(...)``; the attribute's name is the algorithm's to
choose). So the base class declares nothing for a capability, and a new capability is its own
module and the engine's one call that asks it.

``Kind.of(algorithm)`` always gives a ``Kind``: the declared one, or, for an algorithm that declares
none, the kind's null object (:meth:`Capability.absent`, ``declared`` False), whose methods do what
the engine does without the capability (no fine-tuning, no added regulariser, nothing logged, ...).
So a caller asks it without a None check, and only a caller that needs to know whether it was
declared reads ``declared``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self


@dataclass(frozen=True)
class Capability:
    """The base of every capability object: ``Kind.of(algorithm)`` is the ``Kind`` the algorithm's
    class declares (the nearest in its bases' order), else ``Kind.absent()``; a subclass takes
    one back by setting its attribute to None."""

    #: False only in the null object ``of`` gives an algorithm that declares none
    declared: bool = field(default=True, kw_only=True, repr=False)

    @classmethod
    def of(cls, algorithm: Any) -> Self:
        """``algorithm``: an algorithm object or class."""
        found: Self = _declared(algorithm if isinstance(algorithm, type) else type(algorithm), cls)
        return found

    @classmethod
    def absent(cls) -> Self:
        """What an algorithm that declares no ``cls`` has: ``cls(declared=False)``; a kind whose
        null object says more (why not) gives its own."""
        return cls(declared=False)


_FOUND: dict[tuple[type, type], Any] = {}


def _declared(klass: type, kind: type[Capability]) -> Any:
    key = (klass, kind)
    if key not in _FOUND:  # read once per class: the server asks every round
        found = _nearest(klass, kind)
        _FOUND[key] = found if found is not None else kind.absent()
    return _FOUND[key]


def _nearest(klass: type, kind: type) -> Any:
    """The nearest declaration in ``klass``'s bases' order; a subclass that sets that attribute's
    name to None (``finetune = None``) has none."""
    masked: set[str] = set()
    for k in klass.__mro__:
        for name, value in vars(k).items():
            if isinstance(value, kind):
                return None if name in masked else value
            if value is None:
                masked.add(name)
    return None


__all__ = ["Capability"]
