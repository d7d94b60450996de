"""How the engine finds a capability: by its type, among the class attributes of an algorithm's
class and its bases (``finetune = FineTune(...)``; the attribute's name is the algorithm's to
choose). So the base class declares nothing for a capability, and a new capability is its own
module and the engine's one call that asks it."""

from __future__ import annotations

from typing import Any, Self


class Capability:
    """The base of every capability object: ``Kind.of(algorithm)`` is the ``Kind`` the algorithm's
    class declares (the nearest in its bases' order), or None; a subclass takes one back by
    setting its attribute to None."""

    @classmethod
    def of(cls, algorithm: Any) -> Self | None:
        """``algorithm``: an algorithm object or class."""
        found: Self | None = _declared(algorithm if isinstance(algorithm, type) else type(algorithm), cls)
        return found


_FOUND: dict[tuple[type, type], Any] = {}


def _declared(klass: type, kind: type) -> Any:
    key = (klass, kind)
    if key not in _FOUND:  # read once per class: the server asks every round
        _FOUND[key] = _nearest(klass, kind)
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
