"""The switch for the private internals of Ray and PyTorch that raysim uses.

raysim reaches into Ray and PyTorch where their public API has no way to do what it needs: to
start a local Ray in half a second and stop it at once, to ask a raylet for idle workers ahead of
a run, and to read a module's tensors without walking its tree for every client. Every such use
lives in one of two modules, each use with its reason, the version it was written against and
its public fallback:

- :mod:`raysim.engine.executors.ray_internals` (Ray, on the driver),
- :mod:`raysim.torch_internals` (PyTorch, wherever a model is trained: the client workers and
  the serial executor's process).

``RAYSIM_INTERNALS=0`` in the environment turns all of them off: every process then does what
Ray's and PyTorch's public API alone does. The numbers of a run are the same either way (only
how fast Ray starts and stops, and how a model's tensors are found, changes). A process reads the
switch from its own environment: a Ray that raysim starts here passes it to its workers (they
inherit the driver's environment), and a cluster raysim joins gets it through the job's runtime
environment (:func:`raysim.engine.executors.session.worker_runtime_env`); the workers of a Ray
someone else started see whatever that Ray's own processes were given.

Read without Ray or PyTorch, so that the driver checks it before any work.
"""

from __future__ import annotations

import os

from raysim.errors import ConfigError

__all__ = ["ENV", "internals_on"]

#: the environment variable of the switch: unset, empty, 1, on or true (any case) for on, the
#: default; 0, off or false for off
ENV = "RAYSIM_INTERNALS"
_ON = ("", "1", "on", "true")
_OFF = ("0", "off", "false")

_last: tuple[str | None, bool] = (None, True)  # the last value read and its meaning (read per client)


def internals_on() -> bool:
    """Whether this process may use Ray's and PyTorch's private internals (``RAYSIM_INTERNALS``).
    Raises :class:`ConfigError` for a value that is neither on nor off."""
    global _last
    raw = os.environ.get(ENV)
    if raw == _last[0]:
        return _last[1]
    value = (raw or "").strip().lower()
    if value in _ON:
        on = True
    elif value in _OFF:
        on = False
    else:
        raise ConfigError(
            f"{ENV}={raw!r} is not a switch: set it to 1 to use Ray's and PyTorch's internals "
            "(the default) or to 0 for their public behaviour only."
        )
    _last = (raw, on)
    return on
