"""The ``algo.*`` settings the capabilities take besides an algorithm's own Config: "-FT"
fine-tuning's (``ft_epochs``, ``ft_lr``; :mod:`raysim.capabilities.finetune`), the added
regularisers' (``regularizers``, ``reg_beta``, ``reg_tau``; :mod:`raysim.capabilities.regularizers`)
and the server optimisers' (``server_opt``, ``server_lr``, ``server_momentum``, ``beta1``, ``beta2``,
``tau``; :mod:`raysim.capabilities.server_opt`), typed and range-checked like any Config
(``--set algo.regularizers=[kd,fd]`` is a tuple)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from raysim.config import from_dict, setting

#: the settings of "-FT" fine-tuning (``algo.ft_epochs``, ``algo.ft_lr``), which every algorithm
#: with the "-FT" capability (``finetune``) takes besides its own Config
FT_PARAMS = ("ft_epochs", "ft_lr")
#: the settings of the added regularisers (``algo.regularizers=[fd]``, their weight 1 - ``reg_beta``
#: and the distillation temperature ``reg_tau``), which every algorithm whose class
#: has the ``regularizers`` capability takes besides its own Config
REG_PARAMS = ("regularizers", "reg_beta", "reg_tau")
#: the server optimiser's settings, which every algorithm whose server averages the uploads takes
#: (its class declares ``ServerOptimizer``; None: the declaration's default)
OPT_PARAMS = ("server_opt", "server_lr", "server_momentum", "beta1", "beta2", "tau", "server_tau")
#: the regularisers' names: the one list of them (each one's term:
#: :func:`raysim.capabilities.regularizers.term`, which mypy checks covers them all)
RegName = Literal["prox", "kd", "ntd", "ld", "fd"]
REG_NAMES: tuple[RegName, ...] = typing.get_args(RegName)


@dataclass(frozen=True)
class EngineParams:
    """The engine's ``algo.*`` settings, typed as any Config's are (``--set algo.ft_epochs=1`` is an
    int, ``--set algo.regularizers=[kd,fd]`` a tuple)."""

    ft_epochs: int | None = setting(None, at_least=0)  # None: the capability's default_epochs
    ft_lr: float | None = setting(None, above=0)  # None: the last round's learning rate
    regularizers: tuple[RegName, ...] = ()
    reg_beta: float = setting(0.9, at_least=0, below=1)  # the algorithm's own loss's weight
    reg_tau: float = setting(3.0, above=0)  # the distillation temperature
    server_opt: Literal["sgd", "sgdm", "adam", "yogi", "adagrad"] | None = None  # None: the algorithm's
    server_lr: float | None = setting(None, above=0)  # eta
    server_momentum: float | None = setting(None, at_least=0, below=1)  # sgdm's beta
    beta1: float | None = setting(None, at_least=0, below=1)  # the adaptive optimisers' first moment
    beta2: float | None = setting(None, at_least=0, below=1)  # ... and second
    tau: float | None = setting(None, above=0)  # the adaptivity
    #: the adaptivity under another name, for an algorithm whose own Config has a ``tau`` (MOON's and
    #: FedNTD's temperatures): there ``algo.tau`` is the algorithm's
    server_tau: float | None = setting(None, above=0)


def config_fields(algorithm: Any) -> set[str]:
    """The names of ``algorithm``'s (class or object) own Config fields: an engine setting of the
    same name stays the algorithm's (MOON's and FedNTD's ``tau``)."""
    import dataclasses

    config = getattr(algorithm, "Config", None)
    return {f.name for f in dataclasses.fields(config)} if isinstance(config, type) and dataclasses.is_dataclass(config) else set()


def engine_settings(algo_params: Any) -> EngineParams:
    """The engine's settings among an experiment's ``algo_params`` (the rest are the Config's)."""
    names = FT_PARAMS + REG_PARAMS + OPT_PARAMS
    return from_dict(EngineParams, {k: v for k, v in algo_params.items() if k in names}, where="algo")


__all__ = [
    "FT_PARAMS",
    "OPT_PARAMS",
    "REG_NAMES",
    "REG_PARAMS",
    "EngineParams",
    "RegName",
    "config_fields",
    "engine_settings",
]
