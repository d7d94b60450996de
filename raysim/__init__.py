"""raysim: a Ray-based parallel simulator for personalised federated learning.

``raysim.run(...)``, ``raysim.sweep(...)`` and ``raysim.load(run_dir)`` are the Python API
(:mod:`raysim.api`); ``raysim.ExperimentConfig`` is a run's settings; the registries
(``raysim.ALGORITHMS``, ``DATASETS``, ``PARTITIONS``, ``TEST_MODES``, ``MODELS``) take a user's own
entries (an algorithm registers itself with ``@algorithms.base.register("name")``). They load on
first use, so ``import raysim`` stays light (the Ray workers import raysim's modules too).
"""

from __future__ import annotations

import time
from typing import Any

__version__ = "0.1.0"

#: when this process first imported raysim: where a process's first run counts its start-up from
#: (the interpreter's own start before it is tens of milliseconds; the process's creation time would
#: count whatever ran before an ``exec`` of Python, e.g. scripts/setup.sh's installs)
IMPORTED_AT = time.time()

_EXPORTS = {
    "run": "raysim.api",
    "sweep": "raysim.api",
    "load": "raysim.api",
    "make_config": "raysim.api",
    "Result": "raysim.api",
    "SuiteResult": "raysim.api",
    "ExperimentConfig": "raysim.config",
    "BaseCallback": "raysim.results.output",
    "Reply": "raysim.results.output",
    "register_callback": "raysim.plugins",
    "ALGORITHMS": "raysim.registry",
    "DATASETS": "raysim.registry",
    "PARTITIONS": "raysim.registry",
    "TEST_MODES": "raysim.registry",
    "MODELS": "raysim.registry",
    "DatasetEntry": "raysim.registry",
    "PartitionEntry": "raysim.registry",
    "ModelEntry": "raysim.registry",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'raysim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["__version__", *_EXPORTS]
