"""What the engine asks of an algorithm: the hooks, as a typing protocol.

The base class that implements them with their defaults is ``algorithms.base.Algorithm`` (docs/design.md:
the engine never imports ``algorithms/``; it finds algorithm classes through
:data:`raysim.registry.ALGORITHMS` and calls them through this protocol).

server side (in the server actor)
    ``init(ctx) -> state``, ``plan(state, rnd, sampled) -> list[Job]``,
    ``aggregate(state, rnd, results) -> state``, ``eval_payload(state)``
client side (in a client worker)
    ``local_update(ctx, payload) -> ClientResult``, ``continue_chain(payload, prev)``,
    ``global_model(model, eval_payload)``, ``personal_model(ctx, eval_payload)``,
    ``personal_forward(model, eval_payload)``
both (a static method)
    ``adapt_model(model)``: the registered model as the algorithm uses it (a projection, normalised
    features), applied wherever the run builds its model

Optional features are capability objects on the class (``batching``, ``finetune``,
``regularizers``, ``extra_rounds``, ``round_log``, ``validation``), each with its own module; the
engine asks the capability, and the hooks only a capability calls (``round_scalars``,
``observe_validation``, ``ft_weights``, ...) are documented there, not here.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from raysim.config import ExperimentConfig, from_dict, setting
from raysim.executors.batching import Batching
from raysim.extra_rounds import ExtraRounds
from raysim.registry import DatasetInfo
from raysim.round_log import RoundLog
from raysim.validation import Validation
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    from raysim.context import ClientContext
    from raysim.models import SplitModel


#: the settings of "-FT" fine-tuning (``algo.ft_epochs``, ``algo.ft_lr``), which every algorithm
#: with the "-FT" capability (``finetune``) takes besides its own Config
FT_PARAMS = ("ft_epochs", "ft_lr")
#: the settings of the added regularisers (``algo.regularizers=[fd]``, their weight 1 - ``reg_beta``
#: and the distillation temperature ``reg_tau``), which every algorithm whose class is
#: has the ``regularizers`` capability takes besides its own Config; and the regularisers' names
#: (:data:`raysim.distill.REGULARIZERS`)
REG_PARAMS = ("regularizers", "reg_beta", "reg_tau")
RegName = Literal["prox", "kd", "ntd", "ld", "fd"]
REG_NAMES: tuple[str, ...] = typing.get_args(RegName)


@dataclass(frozen=True)
class EngineParams:
    """The engine's ``algo.*`` settings, typed as any Config's are (``--set algo.ft_epochs=1`` is an
    int, ``--set algo.regularizers=[kd,fd]`` a tuple)."""

    ft_epochs: int | None = setting(None, at_least=0)  # None: the capability's default_epochs
    ft_lr: float | None = setting(None, above=0)  # None: the initial learning rate
    regularizers: tuple[RegName, ...] = ()
    reg_beta: float = setting(0.9, at_least=0, below=1)  # the algorithm's own loss's weight
    reg_tau: float = setting(3.0, above=0)  # the distillation temperature


def engine_settings(algo_params: Any) -> EngineParams:
    """The engine's settings among an experiment's ``algo_params`` (the rest are the Config's)."""
    names = FT_PARAMS + REG_PARAMS
    return from_dict(EngineParams, {k: v for k, v in algo_params.items() if k in names}, where="algo")


def engine_params(cls: type) -> tuple[str, ...]:
    """The ``algo.*`` settings the engine's mechanisms take for the algorithm class ``cls``."""
    return (FT_PARAMS if getattr(cls, "finetune", None) is not None else ()) + (
        REG_PARAMS if getattr(cls, "regularizers", None) is not None else ()
    )


class AlgorithmHooks(Protocol):
    name: ClassVar[str]
    Config: ClassVar[type]
    has_global_model: ClassVar[bool]
    has_personal_model: ClassVar[bool]
    finetune: ClassVar[Any]  # raysim.finetune.FineTune, or None
    regularizers: ClassVar[Any]  # raysim.regularizers.Regularizable, or None
    batching: ClassVar[Batching]
    extra_rounds: ClassVar[ExtraRounds]
    round_log: ClassVar[RoundLog | None]
    validation: ClassVar[Validation | None]
    aliases: ClassVar[dict[str, str]]

    def __init__(self, cfg: ExperimentConfig, params: Any) -> None: ...

    @classmethod
    def evaluates_personal(cls, cfg: ExperimentConfig) -> bool: ...

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]: ...

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: Any) -> None: ...

    @staticmethod
    def adapt_model(model: SplitModel) -> SplitModel: ...

    # server side
    def init(self, ctx: ServerContext) -> Any: ...

    def plan(self, state: Any, rnd: int, sampled: Sequence[int]) -> list[Job]: ...

    def aggregate(self, state: Any, rnd: int, results: Sequence[JobResult]) -> Any: ...

    def eval_payload(self, state: Any) -> Any: ...

    # client side
    def local_update(self, ctx: ClientContext, payload: Any) -> ClientResult: ...

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[Any]) -> list[ClientResult]: ...

    def continue_chain(self, payload: Any, prev: ClientResult) -> Any: ...

    def global_model(self, model: SplitModel, eval_payload: Any) -> SplitModel | None: ...

    def personal_model(self, ctx: ClientContext, eval_payload: Any) -> SplitModel | None: ...

    def personal_forward(self, model: SplitModel, eval_payload: Any = None) -> Any: ...


__all__ = ["AlgorithmHooks"]
