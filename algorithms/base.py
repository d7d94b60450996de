"""The algorithm hooks and the typed objects that travel through Ray.

An algorithm is one registered class (``@register("fedavg")``) with a frozen ``Config`` dataclass and
hooks on both sides (DESIGN.md, "Algorithm hooks"):

server side (run inside the server actor)
    ``init(ctx) -> state``, ``plan(state, rnd, sampled) -> list[Job]``,
    ``aggregate(state, rnd, results) -> state``, ``eval_payload(state)``
client side (run inside a client worker)
    ``local_update(ctx, payload) -> ClientResult``, ``continue_chain(payload, prev)``,
    ``global_model(model, eval_payload)``, ``personal_model(ctx, eval_payload)``

The runner owns the only loop over rounds and clients; an algorithm never writes one.

Algorithm modules import PyTorch inside their client-side code, not at module level: the driver
imports the registry to read an algorithm's config and flags, and stays free of PyTorch (which
costs each process about 0.3 GB and 1.5 s). ``tests/engine/test_thin_driver.py`` checks this.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from raysim.config import ExperimentConfig, from_dict, merge, set_dotted
from raysim.errors import ConfigError
from raysim.weights import ModelWeights

if TYPE_CHECKING:
    from raysim.client import ClientContext
    from raysim.models import SplitModel


# --------------------------------------------------------------------------------------------------
# what travels


@dataclass(frozen=True)
class Job:
    """Clients trained one after another on one model (a chain); most jobs are chains of one.

    The first client starts from ``payload``; client k+1 starts from
    ``Algorithm.continue_chain(payload, result_k)``. ``payload`` is the algorithm's own frozen
    dataclass (an ObjectRef to it while it crosses Ray).
    """

    clients: tuple[int, ...]
    payload: Any
    #: run each client on its home worker (where its personal state lives); unpinned jobs run
    #: wherever the round's load is lightest
    pinned: bool = False


@dataclass(frozen=True)
class ClientResult:
    """What one client sends back after its local update."""

    client: int
    num_samples: int  # training samples the client holds
    train_loss: float
    weights: ModelWeights | None = None  # what it uploads (None: nothing)
    extra: Any = None  # the algorithm's own typed upload (prototypes, statistics, ...)
    bytes_down: int = 0  # payload bytes this client received
    bytes_up: int = 0  # bytes it sent


@dataclass(frozen=True)
class JobResult:
    """The results of one job's clients, in chain order."""

    job: Job
    results: tuple[ClientResult, ...]

    @property
    def final(self) -> ClientResult:
        return self.results[-1]

    @property
    def num_samples(self) -> int:
        return sum(r.num_samples for r in self.results)


@dataclass(frozen=True)
class WeightsPayload:
    """The payload of most algorithms: weights to start from and the round's learning rate."""

    weights: ModelWeights
    lr: float


@dataclass(frozen=True)
class ClientStats:
    """What the server knows of the clients before round 1 (for weighting and grouping)."""

    train_sizes: np.ndarray  # (N,) training samples per client
    label_counts: np.ndarray  # (N, C) training label counts per client
    input_shape: tuple[int, ...] = ()  # one sample's shape, e.g. (1, 28, 28): for a server-side model

    @classmethod
    def from_label_counts(cls, label_counts: np.ndarray, input_shape: tuple[int, ...] = ()) -> ClientStats:
        return cls(train_sizes=label_counts.sum(axis=1), label_counts=label_counts, input_shape=input_shape)

    @property
    def num_classes(self) -> int:
        return int(self.label_counts.shape[1])


@dataclass(frozen=True)
class ServerContext:
    cfg: ExperimentConfig
    clients: ClientStats
    init_weights: ModelWeights  # every part of the seeded initial model


@dataclass(frozen=True)
class NoConfig:
    """For algorithms without parameters."""


# --------------------------------------------------------------------------------------------------
# the hooks

StateT = TypeVar("StateT")


class Algorithm(Generic[StateT]):
    """Base class of every algorithm; see the module docstring for the hooks."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    #: which metrics apply (the others are reported as null)
    has_global_model: ClassVar[bool] = True
    has_personal_model: ClassVar[bool] = False
    #: run a round 0 over every client before round 1 (``plan`` and ``aggregate`` get ``rnd=0``),
    #: e.g. FedFCD's first upload of class prototypes; it is not a training round and is not logged
    prologue: ClassVar[bool] = False
    #: other names of Config fields, e.g. ``{"lambda": "lam"}`` so that ``--set algo.lambda=0`` works
    aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: ExperimentConfig, params: Any) -> None:
        self.cfg = cfg
        self.params = params

    # ---- shared helpers
    def lr(self, rnd: int) -> float:
        """The round's learning rate: lr * lr_decay^(rnd-1), times lr_gamma for each milestone
        (a fraction of the rounds) already passed."""
        t = self.cfg.train
        rate = t.lr * t.lr_decay ** (rnd - 1)
        for m in t.lr_milestones:
            if rnd > m * self.cfg.rounds:
                rate *= t.lr_gamma
        return rate

    def round_scalars(self, state: StateT, rnd: int) -> dict[str, float]:
        """Extra scalars after round ``rnd`` for TensorBoard and metrics.parquet (a phase, an
        objective)."""
        return {}

    def round_texts(self, state: StateT, rnd: int) -> dict[str, str]:
        """Text for TensorBoard after round ``rnd`` (a grouping, when it is made)."""
        return {}

    def round_images(self, state: StateT, rnd: int) -> dict[str, np.ndarray]:
        """Pictures for TensorBoard after an evaluated round ``rnd`` (uint8, (H, W) or (H, W, 3)),
        e.g. FedPAC's combination weights."""
        return {}

    def wants_validation(self, state: StateT, rnd: int) -> bool:
        """Whether, after round ``rnd``, the global model should be evaluated on the clients'
        validation parts (``data.val_fraction``); the accuracy comes back to
        :meth:`observe_validation`."""
        return False

    def observe_validation(self, state: StateT, rnd: int, accuracy: float) -> StateT:
        """The global model's accuracy on the validation parts after round ``rnd``."""
        return state

    @classmethod
    def paper_setup(cls, dataset: str) -> dict[str, Any]:
        """Dotted settings that reproduce the algorithm's paper on ``dataset`` (e.g.
        ``{"participation": 0.2, "train.lr": 0.01}``); put beneath the user's settings by
        :func:`resolve_config` unless ``paper_setup`` is false."""
        return {}

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: Any) -> None:
        """Raise ConfigError for settings this algorithm cannot run with (e.g. more coordinators
        than clients). Called before any work."""

    # ---- server side
    def init(self, ctx: ServerContext) -> StateT:
        raise NotImplementedError

    def plan(self, state: StateT, rnd: int, sampled: Sequence[int]) -> list[Job]:
        raise NotImplementedError

    def aggregate(self, state: StateT, rnd: int, results: Sequence[JobResult]) -> StateT:
        raise NotImplementedError

    def eval_payload(self, state: StateT) -> Any:
        """What the workers need to evaluate (the global weights, usually)."""
        return None

    # ---- client side
    def local_update(self, ctx: ClientContext, payload: Any) -> ClientResult:
        raise NotImplementedError

    def continue_chain(self, payload: Any, prev: ClientResult) -> Any:
        """The payload of the next client in a chain: by default, the first payload with the
        weights replaced by the previous client's upload."""
        if prev.weights is None or not hasattr(payload, "weights"):
            raise NotImplementedError(f"{self.name} does not support chain jobs")
        return dataclasses.replace(payload, weights=payload.weights.merged(prev.weights))

    def global_model(self, model: SplitModel, eval_payload: Any) -> SplitModel | None:
        """Load the global model into ``model`` (return it), or None when there is none."""
        return None

    def personal_model(self, ctx: ClientContext, eval_payload: Any) -> SplitModel | None:
        """Load client ``ctx.cid``'s personalised model into ``ctx.model`` (return it), or None."""
        return None

    def personal_forward(self, model: SplitModel, eval_payload: Any = None) -> Any:
        """The forward function (inputs to class scores) a personal model predicts with (default:
        the global path); e.g. fused logits, or distances to prototypes from ``eval_payload``."""
        return model


# --------------------------------------------------------------------------------------------------
# the registry

REGISTRY: dict[str, type[Algorithm[Any]]] = {}


def register(name: str) -> Any:
    def deco(cls: type[Algorithm[Any]]) -> type[Algorithm[Any]]:
        if name in REGISTRY:
            raise ValueError(f"algorithm {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return deco


def algorithm_class(name: str) -> type[Algorithm[Any]]:
    """The registered algorithm ``name``, or a user's own class named ``package.module:Class``
    (importable on every worker), so a new algorithm needs no change to raysim."""
    import algorithms  # noqa: F401  (registers the built-in algorithms)

    if ":" in name:
        module_name, _, cls_name = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"The algorithm {name!r} cannot be imported ({e}).") from None
        if not (isinstance(obj, type) and issubclass(obj, Algorithm)):
            raise ConfigError(f"{name!r} is not an Algorithm subclass.")
        return obj
    if name not in REGISTRY:
        raise ConfigError(f"Unknown algorithm {name!r} (known: {', '.join(sorted(REGISTRY))}).")
    return REGISTRY[name]


def algorithm_params(cfg: ExperimentConfig) -> Any:
    """The algorithm's typed, frozen config from ``cfg.algo_params`` (unknown keys rejected),
    checked against the rest of ``cfg``."""
    cls = algorithm_class(cfg.algo)
    raw = {cls.aliases.get(k, k): v for k, v in cfg.algo_params.items()}
    params = from_dict(cls.Config, raw, where="algo")
    cls.check(cfg, params)
    return params


def resolve_config(settings: Mapping[str, Any]) -> ExperimentConfig:
    """Nested settings (a config file merged with the command line) -> the experiment config, with
    the algorithm's paper setup beneath them unless they say ``paper_setup: false``."""
    given: ExperimentConfig = from_dict(ExperimentConfig, settings)
    if not given.paper_setup:
        return given
    base: dict[str, Any] = {}
    for key, value in algorithm_class(given.algo).paper_setup(given.data.dataset).items():
        set_dotted(base, key, value)
    resolved: ExperimentConfig = from_dict(ExperimentConfig, merge(base, settings))
    return resolved


def make_algorithm(cfg: ExperimentConfig) -> Algorithm[Any]:
    cls = algorithm_class(cfg.algo)
    return cls(cfg, algorithm_params(cfg))


__all__ = [
    "Algorithm",
    "ClientResult",
    "ClientStats",
    "Job",
    "JobResult",
    "NoConfig",
    "REGISTRY",
    "ServerContext",
    "WeightsPayload",
    "algorithm_class",
    "algorithm_params",
    "make_algorithm",
    "register",
    "resolve_config",
]


def average_uploads(results: Sequence[JobResult]) -> ModelWeights:
    """The uploaded weights of each job's final client, averaged by training-set size
    (FedAvg's w = sum_k n_k/n w_k, McMahan et al. 2017)."""
    from raysim.aggregate import weighted_mean

    finals = [jr.final for jr in results]
    uploads = [r.weights for r in finals if r.weights is not None]
    if len(uploads) != len(finals):
        raise ValueError("every client must upload weights to be averaged")
    return weighted_mean(uploads, [r.num_samples for r in finals])


def server_model(ctx: ServerContext) -> SplitModel:
    """The model, built on the server with the clients' seeded initial weights, for algorithms
    that train a part there (FedFCD's and FedGH's global head). Imports PyTorch."""
    from raysim import rng
    from raysim.models import build_model
    from raysim.weights import set_weights

    model = build_model(
        ctx.cfg.model, ctx.clients.input_shape, ctx.clients.num_classes, rng.int_seed(ctx.cfg.seed, "init")
    )
    set_weights(model, ctx.init_weights)
    return model
