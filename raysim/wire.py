"""The typed objects that travel between the driver, the server actor and the client workers.

Jobs go from the server's ``plan`` to the workers; client results come back to the server's
``aggregate``; the server context is what an algorithm's ``init`` sees. Plain frozen dataclasses of
NumPy arrays and :class:`~raysim.weights.ModelWeights`: no PyTorch, no string-keyed dicts
(docs/design.md, "House style"). An algorithm's own payloads and uploads are its own frozen dataclasses,
carried in ``Job.payload`` and ``ClientResult.extra``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.config import ExperimentConfig
from raysim.weights import ModelWeights

if TYPE_CHECKING:
    from raysim.models import SplitModel


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
    #: samples it trained on in this update, over every epoch and pass: its compute (a client-epoch
    #: is num_samples of them)
    samples_trained: int = 0
    #: DP-SGD steps it took in this update (privacy.example_clip; raysim.privacy.dp_sgd): what the
    #: server composes, per client, for its sample-level epsilon
    dp_steps: int = 0
    #: ``eval.analyses``: the local model's ``local_*`` values (raysim.results.analysis), at evaluated rounds
    analysis: dict[str, float | None] | None = None
    #: ``eval.updated_lm``: the updated local model's correct predictions on the client's P-Test
    lm_correct: int | None = None
    #: async mode: the client's memory as this update left it (its memory on the worker is left as
    #: it was), written when the update arrives (raysim.engine.buffered); None: unchanged
    memory: Any = None


@dataclass(frozen=True)
class JobResult:
    """The results of one job's clients, in chain order."""

    job: Job
    results: tuple[ClientResult, ...]
    #: the float64 sum of its block's uploads, computed where they were trained, on the first job of
    #: each block of a round summed on the workers (raysim.capabilities.presum); those jobs' results
    #: then carry no weights
    presum: ModelWeights | None = None
    #: async mode, for an algorithm that weighs stale uploads itself (``Asynchronous(rebase=False)``):
    #: the server steps since the update's client started
    staleness: int = 0

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
    """What an algorithm's ``init`` sees on the server."""

    cfg: ExperimentConfig
    clients: ClientStats
    init_weights: ModelWeights  # every part of the seeded initial model
    #: the algorithm's ``adapt_model`` (the model as it uses it; None: as registered)
    adapt: Callable[[SplitModel], SplitModel] | None = None
    #: under client-level DP, the only way an algorithm's init may read a statistic of every client
    #: (each row one client's, released with noise and accounted: ``ClientLevel.noised_rows``,
    #: called with a purpose and the rows); None without client-level DP
    private_rows: Callable[[str, np.ndarray], np.ndarray] | None = None

    def build_model(self) -> SplitModel:
        """The model, with the clients' seeded initial weights, for algorithms that train a part on
        the server (FedFCD's and FedGH's global head) or need its layers (FedDr+'s ETF). Imports
        PyTorch, which the server otherwise does without."""
        from raysim import rng
        from raysim.models import build_model, set_weights

        model = build_model(
            self.cfg.model,
            self.clients.input_shape,
            self.clients.num_classes,
            rng.int_seed(self.cfg.seed, "init"),
            self.adapt,
            self.cfg.train.channels_last,
        )
        set_weights(model, self.init_weights)
        return model

    def fresh_part(self, part: str, purpose: str) -> ModelWeights:
        """Part ``part`` of a model freshly initialised from (seed, ``purpose``): the values a client
        worker's ``ClientContext.fresh`` gives (a Type-B group's new filter), for a server that must
        know what its clients start from. Imports PyTorch."""
        from raysim import rng
        from raysim.models import build_model, get_weights

        model = build_model(
            self.cfg.model,
            self.clients.input_shape,
            self.clients.num_classes,
            rng.int_seed(self.cfg.seed, purpose),
            self.adapt,
            self.cfg.train.channels_last,
        )
        return get_weights(model, (part,))


@dataclass(frozen=True)
class NoConfig:
    """The config of an algorithm without parameters."""


__all__ = ["ClientResult", "ClientStats", "Job", "JobResult", "NoConfig", "ServerContext", "WeightsPayload"]
