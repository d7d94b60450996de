"""What the engine asks of an algorithm: the hooks, as a typing protocol.

The base class that implements them with their defaults is ``algorithms.base.Algorithm`` (docs/design.md:
the engine never imports ``algorithms/``; it finds algorithm classes through
:data:`raysim.registry.ALGORITHMS` and calls them through this protocol).

server side (in the server actor)
    ``init(ctx) -> state``, ``plan(state, rnd, sampled) -> list[Job]``,
    ``aggregate(state, rnd, results) -> state``, ``evaluation(state) -> Evaluation``
client side (in a client worker)
    ``local_update(ctx, payload) -> ClientResult``, ``continue_chain(payload, prev)``,
    ``batch_update(ctxs, payloads)``; the workers evaluate through the methods of the
    :class:`raysim.engine.evaluation.Evaluation` the server sends (``global_model(algo, model)``,
    ``personal_model(algo, ctx)``, ``forward(algo, model)``)
both (a static method)
    ``adapt_model(model)``: the registered model as the algorithm uses it (a projection, normalised
    features), applied wherever the run builds its model

Optional features are capability objects declared on the class (:mod:`raysim.capabilities`), each
with its own module; the engine finds one by its type (``FineTune.of(algorithm)``), and the hooks
only a capability calls (``round_scalars``, ``observe_validation``, ``ft_weights``, ...) are
documented there, not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from raysim.config import ExperimentConfig
from raysim.engine.evaluation import Evaluation
from raysim.registry import DatasetInfo
from raysim.setups import Source
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


class AlgorithmHooks(Protocol):
    name: ClassVar[str]
    Config: ClassVar[type]
    has_global_model: ClassVar[bool]
    has_personal_model: ClassVar[bool]
    aliases: ClassVar[dict[str, str]]

    def __init__(self, cfg: ExperimentConfig, params: Any) -> None: ...

    @classmethod
    def evaluates_global(cls, cfg: ExperimentConfig) -> bool: ...

    @classmethod
    def evaluates_personal(cls, cfg: ExperimentConfig) -> bool: ...

    @classmethod
    def evaluates_newcomers(cls, cfg: ExperimentConfig) -> bool: ...

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]: ...

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]: ...

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: Any) -> None: ...

    @staticmethod
    def adapt_model(model: SplitModel) -> SplitModel: ...

    # server side
    def init(self, ctx: ServerContext) -> Any: ...

    def plan(self, state: Any, rnd: int, sampled: Sequence[int]) -> list[Job]: ...

    def aggregate(self, state: Any, rnd: int, results: Sequence[JobResult]) -> Any: ...

    def evaluation(self, state: Any) -> Evaluation: ...

    # client side
    def local_update(self, ctx: ClientContext, payload: Any) -> ClientResult: ...

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[Any]) -> list[ClientResult]: ...

    def continue_chain(self, payload: Any, prev: ClientResult) -> Any: ...


__all__ = ["AlgorithmHooks"]
