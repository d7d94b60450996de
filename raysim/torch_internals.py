"""Every use raysim makes of PyTorch's private internals (and its process-wide hooks), behind one door.

Written against PyTorch 2.14.1 (:data:`CHECKED_ON`; ``tests/engine/test_internals.py`` fails on
another version until these are checked on it). They serve :func:`raysim.models.layout`: a part's
module tree read once rather than walked for every client, and a payload loaded into a model in
one call. Each use below says why public PyTorch is not enough, and what happens without it: where
``RAYSIM_INTERNALS=0`` (:mod:`raysim.internals`) turns them off, or PyTorch lacks the attribute,
a model's tensors are read through ``state_dict`` every time and copied one by one: the same
tensors in the same order, the same values (a copy is exact), only slower.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from raysim.internals import internals_on

__all__ = [
    "CHECKED_ON",
    "USES",
    "Held",
    "foreach_add",
    "foreach_add_",
    "foreach_copy_",
    "foreach_mul_",
    "is_batch_norm",
    "plain_state",
    "registrations",
    "still_held",
]

#: the PyTorch version these internals were written against and checked on
CHECKED_ON = "2.14.1"

#: what to check again on another PyTorch version: each private name (or global hook) used here
USES = (
    "torch.nn.modules.module.register_module_{module,parameter,buffer}_registration_hook: called on every "
    "registration, also by Module.__setattr__ (registrations)",
    "Module._parameters, _buffers, _non_persistent_buffers_set, _state_dict_hooks, _save_to_state_dict: "
    "state_dict's order and contents (plain_state)",
    "Module._apply replacing tensors in those dicts without a registration (still_held)",
    "torch._foreach_copy_(dst, src) (foreach_copy_)",
    "torch._foreach_add, _foreach_add_, _foreach_mul_: SGD's step on an accelerator (foreach_add, "
    "foreach_add_, foreach_mul_)",
    "torch.nn.modules.batchnorm._BatchNorm, the base of every batch-norm layer (is_batch_norm)",
)

#: a tensor as its module holds it: (the module's dict of parameters or buffers, its name, the tensor)
Held = tuple[dict[str, torch.Tensor | None], str, torch.Tensor]

_registrations = [0]  # registrations of modules, parameters and buffers since the hooks were added
_hooked = False
_hooking = threading.Lock()


def _registered(*_: object) -> None:
    _registrations[0] += 1


def registrations() -> int | None:
    """How many modules, parameters and buffers have been registered anywhere in this process since
    it began counting (at its first call with the switch on), or None where it does not count
    (off). PyTorch's global registration hooks
    (``torch.nn.modules.module.register_module_{module,parameter,buffer}_registration_hook``) count
    them: a layout read before the count last changed may be stale. They are added once, here, and
    stay (every ``register_*`` and attribute assignment of a module in the process then calls one
    function that adds 1); off, none is added."""
    global _hooked
    if not internals_on():
        return None
    if not _hooked:
        with _hooking:
            if not _hooked:
                hooks = torch.nn.modules.module
                hooks.register_module_module_registration_hook(_registered)
                hooks.register_module_parameter_registration_hook(_registered)
                hooks.register_module_buffer_registration_hook(_registered)
                _hooked = True
    return _registrations[0]


def plain_state(module: torch.nn.Module) -> tuple[tuple[torch.Tensor, ...], tuple[Held, ...]] | None:
    """``module``'s floating-point state tensors in ``state_dict``'s order (each module's
    parameters, then its persistent buffers, then its children's, depth first; a module shared
    twice, twice), with where each is held, read from each module's own dicts (``_parameters``,
    ``_buffers``, ``_non_persistent_buffers_set``) rather than by building a state dict: a state
    dict's names and ordered dicts for every part of every client were a tenth of a one-step
    client's time. None where that is not ``state_dict``'s answer or cannot be known: a module whose
    state dict is its own (a ``_save_to_state_dict`` of its own, or ``_state_dict_hooks``), a
    PyTorch without these attributes, or off; the caller then reads ``state_dict`` itself."""
    if not internals_on():
        return None
    floats: list[torch.Tensor] = []
    held: list[Held] = []
    base = getattr(torch.nn.Module, "_save_to_state_dict", None)
    try:
        for _, m in module.named_modules(remove_duplicate=False):  # a shared module twice, as state_dict has it
            if base is None or type(m)._save_to_state_dict is not base or m._state_dict_hooks:
                return None
            for name, t in m._parameters.items():
                if t is not None and t.is_floating_point():
                    floats.append(t)
                    held.append((m._parameters, name, t))
            for name, t in m._buffers.items():
                if t is not None and name not in m._non_persistent_buffers_set and t.is_floating_point():
                    floats.append(t)
                    held.append((m._buffers, name, t))
    except AttributeError:  # a PyTorch whose modules keep their state otherwise
        return None
    return tuple(floats), tuple(held)


def still_held(held: Sequence[Held]) -> bool:
    """Whether each tensor is still the one its module holds under its name: ``Module._apply``
    (``.to()``, ``.float()``, ...) puts new tensors in place without registering them, which
    :func:`registrations` does not see."""
    return all(owner.get(name) is t for owner, name, t in held)


def foreach_copy_(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every i, in one call: ``torch._foreach_copy_``, a single dispatch
    for a whole model's tensors where a client's payload is loaded tensor by tensor otherwise.
    Off, or without it: one ``copy_`` per tensor (the same values)."""
    copy = getattr(torch, "_foreach_copy_", None) if internals_on() else None
    if copy is not None:
        copy(dst, src)
        return
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)


def _foreach(name: str) -> object | None:
    return getattr(torch, name, None) if internals_on() else None


def foreach_add(xs: list[torch.Tensor], ys: list[torch.Tensor], alpha: float) -> list[torch.Tensor]:
    """``[x + alpha * y]`` for every pair, in one call: ``torch._foreach_add``, a few kernel launches
    for a whole model on an accelerator (as ``torch.optim.SGD`` does there). Off, or without it: one
    ``add`` per tensor (the same operation on the same values)."""
    f = _foreach("_foreach_add")
    if callable(f):
        return list(f(xs, ys, alpha=alpha))
    return [x.add(y, alpha=alpha) for x, y in zip(xs, ys, strict=True)]


def foreach_add_(xs: list[torch.Tensor], ys: list[torch.Tensor], alpha: float) -> None:
    """``x += alpha * y`` in place for every pair: ``torch._foreach_add_``; off, one ``add_`` each."""
    f = _foreach("_foreach_add_")
    if callable(f):
        f(xs, ys, alpha=alpha)
        return
    for x, y in zip(xs, ys, strict=True):
        x.add_(y, alpha=alpha)


def foreach_mul_(xs: list[torch.Tensor], scalar: float) -> None:
    """``x *= scalar`` in place for every tensor: ``torch._foreach_mul_``; off, one ``mul_`` each."""
    f = _foreach("_foreach_mul_")
    if callable(f):
        f(xs, scalar)
        return
    for x in xs:
        x.mul_(scalar)


#: the batch-norm layers public PyTorch names, for :func:`is_batch_norm` without the internals
_BATCH_NORMS = tuple(
    getattr(torch.nn, name)
    for name in (
        "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "SyncBatchNorm"
    )  # fmt: skip
    if hasattr(torch.nn, name)
)


def is_batch_norm(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a batch-norm layer (running statistics, a per-batch normalisation):
    an instance of ``torch.nn.modules.batchnorm._BatchNorm``, the base class PyTorch keeps private,
    which also covers a user's own subclass of it. Off, or without it: an instance of one of the
    public classes (``BatchNorm1d/2d/3d``, their lazy forms, ``SyncBatchNorm``)."""
    base = getattr(torch.nn.modules.batchnorm, "_BatchNorm", None) if internals_on() else None
    return isinstance(module, base if isinstance(base, type) else _BATCH_NORMS)
