"""The base class of every algorithm, with the hooks' defaults, and its registration.

An algorithm is one registered class (``@register("fedavg")``) with a frozen ``Config`` dataclass and
hooks on both sides (docs/design.md, "Algorithm hooks"; the engine's view of them is
:class:`raysim.engine.hooks.AlgorithmHooks`):

server side (run inside the server actor)
    ``init(ctx) -> state``, ``plan(state, rnd, sampled) -> list[Job]``,
    ``aggregate(state, rnd, results) -> state``, ``evaluation(state) -> Evaluation``
client side (run inside a client worker)
    ``local_update(ctx, payload) -> ClientResult``, ``continue_chain(payload, prev)``,
    ``batch_update(ctxs, payloads)``

Evaluation is the one hook ``evaluation(state)``: it returns an
:class:`raysim.engine.evaluation.Evaluation`, a frozen object that travels to the workers with what
they need (its ``payload``) and whose methods build the models there: ``global_model(algo, model)``,
``personal_model(algo, ctx)`` and ``forward(algo, model)`` (the forward pass that scores a personal
model), ``algo`` the worker's own algorithm. An algorithm that evaluates otherwise than the defaults
defines its own subclass in its module.

Everything optional is a frozen capability object declared on the class under a name of its own
choosing, each with its own module in :mod:`raysim.capabilities`: ``Batching``, ``FineTune``,
``Regularizable``, ``ExtraRounds``, ``RoundLog``, ``Validation``. The engine finds one by its type
(``FineTune.of(algorithm)``, the kind's null object where none is declared: ``declared`` False);
the hooks only a capability calls are documented in its module; an algorithm that does not use a
feature says nothing about it, and this class declares none, so a new capability is a new module
and the engine's call that asks it.

A Config's number settings declare their ranges with :func:`raysim.config.setting` (``lam``, set as
``algo.lambda``: :func:`lambda_setting`); ``check`` keeps what relates several settings.

The runner owns the only loop over rounds and clients; an algorithm never writes one. What travels
(``Job``, ``ClientResult``, ``WeightsPayload``, ...) is in :mod:`raysim.wire`; what a client keeps is
read and written through its :class:`raysim.toolkit.context.ClientContext`.

Algorithm modules import PyTorch inside their client-side code, not at module level: the driver
imports the registry to read an algorithm's config and flags, and stays free of PyTorch (which
costs each process about 0.3 GB and 1.5 s). ``tests/engine/test_thin_driver.py`` checks this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from raysim.capabilities.finetune import FineTune
from raysim.config import ExperimentConfig, setting
from raysim.engine.evaluation import Evaluation
from raysim.registry import ALGORITHMS, DatasetInfo
from raysim.setups import Source
from raysim.wire import ClientResult, Job, JobResult, NoConfig, ServerContext

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext

StateT = TypeVar("StateT")


def lambda_setting(default: float, **bounds: float) -> Any:
    """A Config's ``lam`` field with its range, as :func:`raysim.config.setting` declares any other:
    ``lam: float = lambda_setting(1.0, at_least=0)``. The user sets it as ``algo.lambda`` (``lambda``
    is a Python keyword), which a refusal names."""
    return setting(default, hint="set as algo.lambda", **bounds)


class Algorithm(Generic[StateT]):
    """Base class of every algorithm; see the module docstring for the hooks."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    #: which metrics apply (the others are reported as null)
    has_global_model: ClassVar[bool] = True
    has_personal_model: ClassVar[bool] = False
    #: the family its curves are coloured by on the results pages (raysim.results.curves.FAMILIES):
    #: global, fixed_head, split, prototypes, personal, clustered, local, or other
    family: ClassVar[str] = "other"
    #: other names of Config fields (``--set algo.NAME=...``); ``algo.lambda`` always sets ``lam``
    aliases: ClassVar[dict[str, str]] = {}
    #: sample-level DP (``privacy.example_clip``, raysim.privacy.dp_sgd): None where DP-SGD covers
    #: every step the algorithm's clients take on their data (the shared training loop, a loss that
    #: is a mean of per-example terms, nothing else read from the data), else why not, in words that
    #: end the refusal's sentence
    example_privacy: ClassVar[str | None] = "its local training has not been shown to run every step through DP-SGD"

    def __init__(self, cfg: ExperimentConfig, params: Any) -> None:
        self.cfg = cfg
        self.params = params

    # ---- shared helpers
    def lr(self, rnd: int) -> float:
        """The round's learning rate (:meth:`raysim.config.TrainConfig.rate`)."""
        return self.cfg.train.rate(rnd, self.cfg.rounds)

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        """Dotted settings that reproduce the algorithm's paper on ``dataset`` (e.g.
        ``{"participation": 0.2, "train.lr": 0.01}``), chosen by what the dataset is (its shape and
        class count), so a new dataset gets the setup of the paper's dataset most like it; put
        beneath the user's settings unless ``paper_setup`` is false."""
        return {}

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        """Where each key of ``paper_setup(dataset)`` comes from: :class:`raysim.setups.Stated`
        (the paper's section or table) or :class:`raysim.setups.Choice` (whose value, where the
        paper is silent); the same keys as the setup (``docs/algorithms.md``'s generated table)."""
        return {}

    @staticmethod
    def adapt_model(model: SplitModel) -> SplitModel:
        """The model as this algorithm uses it, built from the run's registered model: e.g.
        SphereFed's features normalised onto the hypersphere, FedETF's projection layer. Called
        wherever the run builds its model (every worker, the server, fresh parts), inside the
        seeded generator of that build, so new layers are initialised the same everywhere; it may
        change the parts' modules but not their names. Default: the model as registered."""
        return model

    @classmethod
    def evaluates_global(cls, cfg: ExperimentConfig) -> bool:
        """Whether the run has a global model to evaluate (``gm_gtest``, ``gm_ptest``): the
        class's ``has_global_model``, unless a setting gives it one (FedPer's global head)."""
        return cls.has_global_model

    @classmethod
    def evaluates_personal(cls, cfg: ExperimentConfig) -> bool:
        """Whether the clients' personalised models are evaluated (``lm_ptest``): the algorithm's
        own, or its fine-tuned global model."""
        return cls.has_personal_model or FineTune.of(cls).on(cfg)

    @classmethod
    def evaluates_newcomers(cls, cfg: ExperimentConfig) -> bool:
        """Whether the clients held out of training (``eval.new_clients``) get a model of their own
        (``new_lm_ptest``), from their evaluation's ``newcomer_model``: by default where the run
        has a global model to adapt. An algorithm whose newcomers start otherwise (a shared body
        with a fresh head, a cluster chosen by loss) says so here and in its evaluation."""
        return cfg.eval.new_clients > 0 and cls.evaluates_global(cfg)

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: Any) -> None:
        """Raise ConfigError for settings this algorithm cannot run with (e.g. more coordinators
        than clients). Called in the driver before any work."""

    # ---- server side
    def init(self, ctx: ServerContext) -> StateT:
        raise NotImplementedError

    def plan(self, state: StateT, rnd: int, sampled: Sequence[int]) -> list[Job]:
        raise NotImplementedError

    def aggregate(self, state: StateT, rnd: int, results: Sequence[JobResult]) -> StateT:
        raise NotImplementedError

    def evaluation(self, state: StateT) -> Evaluation:
        """What the workers evaluate with: the payload they need (the global weights, usually) and,
        in an algorithm's own :class:`Evaluation` subclass, how they build the global model, a
        client's personal model and its forward pass. Default: nothing to send, the defaults."""
        return Evaluation()

    # ---- client side
    def local_update(self, ctx: ClientContext, payload: Any) -> ClientResult:
        raise NotImplementedError

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[Any]) -> list[ClientResult]:
        """The local updates of ``ctxs``' clients, client k's from ``payloads[k]``, trained together
        (an algorithm with ``batching``'s, with :meth:`raysim.toolkit.context.ClientContext.train_together`).
        The payloads are one object for a round's single-client jobs; in chains, the k-th
        clients' payloads follow from their chains' previous clients (:meth:`continue_chain`)."""
        raise NotImplementedError(f"{self.name} does not train clients batched")

    def continue_chain(self, payload: Any, prev: ClientResult) -> Any:
        """The payload of the next client in a chain: by default, the first payload with the
        weights replaced by the previous client's upload."""
        if prev.weights is None or not hasattr(payload, "weights"):
            raise NotImplementedError(f"{self.name} does not support chain jobs")
        return dataclasses.replace(payload, weights=payload.weights.merged(prev.weights))


def register(name: str) -> Any:
    """``@register("fedavg")``: the class becomes the algorithm ``name`` in
    :data:`raysim.registry.ALGORITHMS`."""

    def deco(cls: type[Algorithm[Any]]) -> type[Algorithm[Any]]:
        cls.name = name
        ALGORITHMS.register(name, cls)
        return cls

    return deco


__all__ = ["Algorithm", "Evaluation", "register"]
