"""What a client worker holds and does: the client side of every algorithm.

A :class:`ClientRuntime` hosts many virtual clients. It holds the federated dataset (read zero-copy from
the Ray object store), one model it loads weights into for each job, the algorithm's client side and
the personal state of the clients that live here. The serial executor uses one runtime for every
client; the Ray executor wraps one in each client-worker actor. Both call the same methods, so they
give the same numbers.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from algorithms.base import Algorithm, ClientResult, make_algorithm
from raysim import rng
from raysim.config import ExperimentConfig
from raysim.data import ArrayDataset, FederatedData
from raysim.models import SplitModel, build_model
from raysim.records import EvalPart, EvalTarget
from raysim.train import (
    Batch,
    LossFn,
    SGDConfig,
    TrainStats,
    cross_entropy,
    iterate_batches,
    local_train,
    predict,
)
from raysim.weights import PARTS, ModelWeights, get_weights, payload_nbytes, set_weights

log = logging.getLogger(__name__)


def pick_device(cfg: ExperimentConfig) -> torch.device:
    """CUDA when the worker was given a share of a GPU (``ray.gpus_per_worker`` > 0; Ray sets
    ``CUDA_VISIBLE_DEVICES`` to its GPU), else the CPU. On CUDA, cuDNN and cuBLAS are made
    deterministic, so serial and Ray runs on the GPU give the same numbers as each other."""
    if cfg.ray.gpus_per_worker > 0 and torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        return torch.device("cuda")
    return torch.device("cpu")


class ClientContext:
    """One client's view during one job: its data, its model, its personal state, its random
    streams. Handed to ``Algorithm.local_update`` and ``Algorithm.personal_model``."""

    def __init__(self, runtime: ClientRuntime, cid: int, rnd: int) -> None:
        self.runtime = runtime
        self.cid = cid
        self.rnd = rnd
        self.cfg = runtime.cfg
        self.model = runtime.model
        self.device = runtime.device
        self._train: tuple[torch.Tensor, torch.Tensor] | None = None

    # ---- data
    @property
    def train_indices(self) -> np.ndarray:
        return self.runtime.data.client_train[self.cid]

    @property
    def num_samples(self) -> int:
        return int(self.train_indices.size)

    def train_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's training set as tensors on the device (gathered once per job)."""
        if self._train is None:
            self._train = self.runtime.gather(self.runtime.data.train, self.train_indices)
        return self._train

    def batches(self, epoch: int) -> Iterator[Batch]:
        """Shuffled mini-batches for ``epoch``, drawn from (seed, round, client, epoch)."""
        x, y = self.train_tensors()
        g = torch.Generator().manual_seed(rng.int_seed(self.cfg.seed, f"shuffle/{epoch}", self.rnd, self.cid))
        order = torch.randperm(x.shape[0], generator=g).to(self.device)
        return iterate_batches(x, y, order, self.cfg.train.batch_size)

    def generator(self, purpose: str) -> np.random.Generator:
        return rng.generator(self.cfg.seed, purpose, self.rnd, self.cid)

    # ---- personal state (lives on this client's home worker)
    @property
    def state(self) -> Any:
        return self.runtime.states.get(self.cid)

    def set_state(self, value: Any) -> None:
        self.runtime.states[self.cid] = value

    # ---- weights and training
    @property
    def initial_weights(self) -> ModelWeights:
        """Every part of the seeded initial model (the same on every worker and on the server)."""
        return self.runtime.initial_weights

    def load(self, weights: ModelWeights) -> None:
        set_weights(self.model, weights)

    def weights(self, parts: Sequence[str]) -> ModelWeights:
        return get_weights(self.model, parts)

    def train(
        self,
        parts: Sequence[str],
        lr: float,
        *,
        epochs: int | None = None,
        first_epoch: int = 0,
        loss_fn: LossFn = cross_entropy,
        after_backward: Callable[[], None] | None = None,
    ) -> TrainStats:
        """The shared loop (:func:`raysim.train.local_train`) on this client's batches.
        ``first_epoch`` numbers the epochs' shuffles when one local epoch is trained in several
        calls (FedFCD's alternating updates), so each epoch still gets its own order."""
        t = self.cfg.train
        return local_train(
            self.model,
            lambda epoch: self.batches(first_epoch + epoch),
            epochs=t.local_epochs if epochs is None else epochs,
            parts=parts,
            sgd=SGDConfig(lr, t.momentum, t.weight_decay),
            loss_fn=loss_fn,
            after_backward=after_backward,
        )

    def result(
        self, stats: TrainStats, weights: ModelWeights | None = None, extra: Any = None
    ) -> ClientResult:
        return ClientResult(
            client=self.cid,
            num_samples=self.num_samples,
            train_loss=stats.loss,
            weights=weights,
            extra=extra,
            bytes_up=payload_nbytes(weights) + payload_nbytes(extra),
        )


class ClientRuntime:
    """The client side of one worker (or of the whole serial run)."""

    def __init__(
        self, cfg: ExperimentConfig, data: FederatedData, algorithm: Algorithm[Any] | None = None
    ) -> None:
        self.cfg = cfg
        self.data = data
        self.algo = algorithm if algorithm is not None else make_algorithm(cfg)
        self.device = pick_device(cfg)
        self.model: SplitModel = build_model(
            cfg.model, data.train.input_shape, data.num_classes, rng.int_seed(cfg.seed, "init")
        ).to(self.device)
        self.initial_weights = get_weights(self.model, PARTS)
        self.states: dict[int, Any] = {}
        self._fresh: dict[tuple[str, str], np.ndarray] = {}
        self._scratch: dict[str, SplitModel] = {}

    def scratch_model(self, name: str) -> SplitModel:
        """A second model of the same architecture on the same device, kept for reuse (e.g. a
        frozen teacher for feature distillation); its weights are whatever was last loaded."""
        if name not in self._scratch:
            self._scratch[name] = copy.deepcopy(self.model)
        return self._scratch[name]

    def fresh_part(self, part: str, purpose: str) -> np.ndarray:
        """Part ``part`` of a model freshly initialised from (seed, ``purpose``): the same on every
        worker (e.g. a Type-B group's new filter, a client's new personal head)."""
        key = (part, purpose)
        if key not in self._fresh:
            model = build_model(
                self.cfg.model,
                self.data.train.input_shape,
                self.data.num_classes,
                rng.int_seed(self.cfg.seed, purpose),
            )
            self._fresh[key] = get_weights(model, (part,)).part(part)
        return self._fresh[key]

    def warm_up(self) -> None:
        """One throwaway SGD step and one evaluation batch on a copy of the model, with the job
        thread count, so that first-call costs (kernel selection, allocator growth, lazy imports)
        fall in start-up rather than in round 1. Touches no state and no random stream."""
        torch.set_num_threads(self.cfg.train_threads)
        model = copy.deepcopy(self.model)
        shape = self.data.train.input_shape
        x = torch.zeros(self.cfg.train.batch_size, *shape, device=self.device)
        y = torch.zeros(self.cfg.train.batch_size, dtype=torch.long, device=self.device)
        t = self.cfg.train
        local_train(
            model,
            lambda epoch: [(x, y)],
            epochs=1,
            parts=PARTS,
            sgd=SGDConfig(t.lr, t.momentum, t.weight_decay),
        )
        model.eval()
        predict(
            model,
            torch.zeros(min(self.cfg.eval.batch_size, 64), *shape, device=self.device),
            self.cfg.eval.batch_size,
        )

    def export_states(self, clients: Sequence[int]) -> dict[int, Any]:
        """The personal states of those of ``clients`` that have one (for checkpoints and for
        restoring a replaced worker)."""
        return {c: self.states[c] for c in clients if c in self.states}

    def import_states(self, states: dict[int, Any]) -> None:
        self.states.update(states)

    def gather(self, ds: ArrayDataset, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(ds.features(idx)).to(self.device)
        y = torch.from_numpy(ds.y[idx]).to(self.device)
        return x, y

    def run_chain(
        self, rnd: int, clients: Sequence[int], payload: Any, prev: ClientResult | None
    ) -> list[ClientResult]:
        """Train ``clients`` one after another; the first starts from ``payload`` (or, when this is a
        later segment of a chain, from ``prev``, the last result of the segment before)."""
        torch.set_num_threads(self.cfg.train_threads)
        results: list[ClientResult] = []
        for cid in clients:
            link_payload = payload if prev is None else self.algo.continue_chain(payload, prev)
            ctx = ClientContext(self, cid, rnd)
            res = self.algo.local_update(ctx, link_payload)
            res = dataclasses.replace(res, bytes_down=payload_nbytes(link_payload))
            results.append(res)
            prev = res
        return results

    def evaluate(
        self, rnd: int, eval_payload: Any, targets: Sequence[EvalTarget], clients: Sequence[int]
    ) -> EvalPart:
        """The global model's correctness on ``targets`` (each test sample is predicted once, by
        one worker) and the personalised models' correct counts on ``clients``' P-Tests."""
        torch.set_num_threads(self.cfg.train_threads)
        bs = self.cfg.eval.batch_size
        global_correct: list[np.ndarray] = []
        gm = self.algo.global_model(self.model, eval_payload) if targets else None
        if gm is not None:
            gm.eval()
            for t in targets:
                global_correct.append(self._correct_on(gm, getattr(self.data, t.pool), t.indices, bs))
        personal: list[tuple[int, int | None]] = []
        for c in clients:
            pm = self.algo.personal_model(ClientContext(self, c, rnd), eval_payload)
            if pm is None:
                personal.append((c, None))
                continue
            pm.eval()
            forward = self.algo.personal_forward(pm, eval_payload)
            personal.append(
                (c, int(self._correct_on(forward, self.data.ptest, self.data.client_test[c], bs).sum()))
            )
        return EvalPart(tuple(global_correct), tuple(personal))

    def _correct_on(self, forward: Any, ds: ArrayDataset, idx: np.ndarray, batch_size: int) -> np.ndarray:
        if idx.size == 0:
            return np.zeros(0, dtype=bool)
        x, y = self.gather(ds, idx)
        pred = predict(forward, x, batch_size)
        out: np.ndarray = (pred == y).cpu().numpy()
        return out
