"""What a client worker does: the client side of every algorithm.

A :class:`ClientRuntime` is a :class:`~raysim.toolkit.context.ClientWorkspace` (the data, the model, the
clients' memories) with the algorithm's client side: it runs chains of local updates and evaluates.
The serial executor uses one runtime for every client; the Ray executor wraps one in each
client-worker actor. Both call the same methods, so they give the same numbers.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from raysim.capabilities.batching import Batching
from raysim.config import ExperimentConfig, evaluation_due
from raysim.data import ArrayDataset, FederatedData
from raysim.engine.evaluation import Evaluation
from raysim.engine.experiment import make_algorithm
from raysim.engine.hooks import AlgorithmHooks
from raysim.models import set_weights
from raysim.records import EvalPart, EvalTarget
from raysim.toolkit.allocator import keep_freed_memory
from raysim.toolkit.context import ClientContext, ClientMemory, ClientWorkspace
from raysim.toolkit.train import SGDConfig, cross_entropy, local_train, predict
from raysim.weights import PARTS, payload_nbytes
from raysim.wire import ClientResult

log = logging.getLogger(__name__)


class ClientRuntime(ClientWorkspace):
    """The client side of one worker (or of the whole serial run)."""

    def __init__(
        self, cfg: ExperimentConfig, data: FederatedData, algorithm: AlgorithmHooks | None = None
    ) -> None:
        keep_freed_memory()  # a process that trains keeps its freed buffers (raysim.toolkit.allocator)
        algo = algorithm if algorithm is not None else make_algorithm(cfg)
        super().__init__(cfg, data, adapt=algo.adapt_model)
        self.algo = algo
        self._gtest: tuple[torch.Tensor, torch.Tensor] | None = None  # G-Test on the device, for analyses
        self._feature_x: torch.Tensor | None = None  # eval.features' fixed G-Test sample, on the device

    def warm_up(self) -> None:
        """One throwaway SGD step and one evaluation batch on a copy of the model, with the job
        thread count, so that first-call costs (kernel selection, allocator growth, lazy imports)
        fall in start-up rather than in round 1; in batched mode (``train.batch_clients`` K > 1)
        one batched step of K clients too, whose gradient transform imports TorchDynamo on its
        first call (about 1.5 s here). Touches no state and no random stream."""
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
        if self.cfg.train.batch_clients > 1:
            from raysim.toolkit.batched import BatchedTrainer

            k = self.cfg.train.batch_clients  # a whole batch: its memory is claimed now, not in round 1
            trainer = BatchedTrainer(model, PARTS, k)
            trainer.train([[(x, y)]] * k, SGDConfig(t.lr, t.momentum, t.weight_decay), cross_entropy)
        model.eval()
        predict(
            model,
            torch.zeros(min(self.cfg.eval.batch_size, 64), *shape, device=self.device),
            self.cfg.eval.batch_size,
        )

    def export_states(self, clients: Sequence[int]) -> dict[int, ClientMemory]:
        """The memories of those of ``clients`` that have one (for checkpoints and for restoring a
        replaced worker)."""
        return {c: self.memory[c] for c in clients if c in self.memory}

    def import_states(self, states: dict[int, ClientMemory]) -> None:
        self.memory.update(states)

    def run_chain(
        self, rnd: int, clients: Sequence[int], payload: Any, prev: ClientResult | None
    ) -> list[ClientResult]:
        """Train ``clients`` one after another; the first starts from ``payload`` (or, when this is a
        later segment of a chain, from ``prev``, the last result of the segment before)."""
        torch.set_num_threads(self.cfg.train_threads)
        results: list[ClientResult] = []
        for cid in clients:
            link_payload = payload if prev is None else self.algo.continue_chain(payload, prev)
            self._capture_received(rnd)
            before = self.memory.get(cid)
            res = self.algo.local_update(ClientContext(self, cid, rnd), link_payload)
            res = dataclasses.replace(res, bytes_down=payload_nbytes(link_payload))
            res = self._deferred(rnd, before, self._after_update(rnd, res))
            results.append(res)
            prev = res
        return results

    def run_batch(self, rnd: int, chains: Sequence[Sequence[int]], payload: Any) -> list[list[ClientResult]]:
        """Several jobs from the same ``payload``, trained together (``train.batch_clients``; the
        algorithm's ``batch_update``): each job a chain of clients, the chains' k-th clients in
        one batched step each starting from its chain's payload (``continue_chain``). Returns each
        chain's results, as :meth:`run_chain` would."""
        torch.set_num_threads(self.cfg.train_threads)
        out: list[list[ClientResult]] = [[] for _ in chains]
        for pos in range(max((len(c) for c in chains), default=0)):
            active = [i for i, c in enumerate(chains) if pos < len(c)]
            payloads = [payload if pos == 0 else self.algo.continue_chain(payload, out[i][-1]) for i in active]
            ctxs = [ClientContext(self, chains[i][pos], rnd) for i in active]
            before = {ctx.cid: self.memory.get(ctx.cid) for ctx in ctxs}
            self._capture_received(rnd)
            updated = self.algo.batch_update(ctxs, payloads)
            if Batching.of(self.algo).pinned:  # each client started from parts of its own: no one start
                self.received = None
            for i, p, res in zip(active, payloads, updated, strict=True):
                res = dataclasses.replace(res, bytes_down=payload_nbytes(p))
                if self._local_model_read(rnd) and res.weights is not None:
                    set_weights(self.model, res.weights)  # the client's trained model, to read
                out[i].append(self._deferred(rnd, before[res.client], self._after_update(rnd, res)))
        return out

    def _deferred(self, rnd: int, before: ClientMemory | None, res: ClientResult) -> ClientResult:
        """In async mode (a training round), ``res`` carrying the memory its update left, and the
        client's memory here put back as it was: the update is in flight, and the server writes
        its memory when it arrives (raysim.engine.buffered). Otherwise ``res``."""
        if self.cfg.deployment.mode != "async" or not 1 <= rnd <= self.cfg.rounds:
            return res
        after = self.memory.get(res.client)
        if after is before:
            return res
        if before is None:
            del self.memory[res.client]
        else:
            self.memory[res.client] = before
        return dataclasses.replace(res, memory=after if after is not None else ClientMemory())

    def _capture_received(self, rnd: int) -> None:
        """Keep the model the next local update first loads (its received global model), for the
        analyses' feature drift (FedDr+'s Fig. 4), at an evaluated round."""
        self.received = None
        self.capture_received = self.cfg.eval.analyses and self._local_model_read(rnd)

    def _local_model_read(self, rnd: int) -> bool:
        """Whether the local models of training round ``rnd`` are read after their update: for
        ``eval.analyses`` or ``eval.updated_lm``, at an evaluated round."""
        e = self.cfg.eval
        return (e.analyses or e.updated_lm) and 1 <= rnd <= self.cfg.rounds and evaluation_due(self.cfg, rnd)

    def _after_update(self, rnd: int, res: ClientResult) -> ClientResult:
        """``res`` with what is read of the model its local update left in ``self.model``: its
        analysis (``eval.analyses``) and its correct count on the client's P-Test
        (``eval.updated_lm``), at an evaluated round."""
        if not self._local_model_read(rnd):
            return res
        if self.cfg.eval.analyses:
            res = dataclasses.replace(res, analysis=self._local_analysis(res.client))
        self.capture_received = False
        if self.cfg.eval.updated_lm:
            self.model.eval()
            idx = self.data.client_test[res.client]
            correct = self._correct_on(self.model, self.data.ptest, idx, self.cfg.eval.batch_size)
            res = dataclasses.replace(res, lm_correct=int(correct.sum()))
        return res

    def _local_analysis(self, cid: int) -> dict[str, float | None]:
        """The local model as ``cid``'s local update left it, on G-Test split by the classes
        ``cid`` observed (:mod:`raysim.results.analysis`), as ``local_*`` values."""
        from raysim.results.analysis import (
            DRIFT_KEYS,
            ClassStats,
            drift_split,
            feature_analysis,
            feature_drift,
        )
        from raysim.toolkit.features import extract_features

        data = self.data
        if self._gtest is None:
            self._gtest = self.gather(data.gtest, np.arange(len(data.gtest)))
        x, y = self._gtest
        bs = self.cfg.eval.batch_size
        local_f = extract_features(self.model, x, bs)  # one pass, for the values and the drift
        correct, align, norm = feature_analysis(self.model, local_f, y, bs)
        stats = ClassStats.of(data.gtest.y, correct, align, norm, data.num_classes)
        observed = np.bincount(data.train.y[data.client_train[cid]], minlength=data.num_classes) > 0
        out = {f"local_{k}": v for k, v in stats.split(observed).items()}
        drift: dict[str, float | None] = dict.fromkeys(DRIFT_KEYS)
        if self.received is not None:  # FedDr+'s Fig. 4: from the received model to the local one
            start = self.scratch_model("received")
            start.load_state_dict(self.received)
            start_f = extract_features(start, x, bs).cpu().numpy()
            drift = drift_split(data.gtest.y, feature_drift(local_f.cpu().numpy(), start_f), observed)
        return {**out, **{f"local_{k}": v for k, v in drift.items()}}

    def evaluate(
        self, rnd: int, evaluation: Evaluation, targets: Sequence[EvalTarget], clients: Sequence[int]
    ) -> EvalPart:
        """The global model's correctness on ``targets`` (each test sample is predicted once, by
        one worker) and the personalised models' correct counts on ``clients``' P-Tests, the models
        built by the server's ``evaluation`` (the algorithm's ``evaluation(state)``): a newcomer's
        (``eval.new_clients``) for a client held out of training, else the client's own."""
        torch.set_num_threads(self.cfg.train_threads)
        bs = self.cfg.eval.batch_size
        global_correct: list[np.ndarray] = []
        global_align: list[np.ndarray] = []
        global_norm: list[np.ndarray] = []
        gm = evaluation.global_model(self.algo, self.model) if targets else None
        if gm is not None:
            gm.eval()
            for t in targets:
                ds = getattr(self.data, t.pool)
                if self.cfg.eval.analyses and t.pool != "train":  # correctness, alignment and norm in one pass
                    from raysim.results.analysis import sample_analysis

                    correct, align, norm = sample_analysis(gm, *self.gather(ds, t.indices), bs)
                    global_correct.append(correct)
                    global_align.append(align)
                    global_norm.append(norm)
                else:
                    global_correct.append(self._correct_on(gm, ds, t.indices, bs))
        features: list[tuple[str, np.ndarray]] = []
        export = self.cfg.eval.features > 0 and rnd == self.cfg.rounds
        if export and gm is not None and any(t.leads for t in targets):
            features.append(("global", self._sample_features(gm)))
        personal: list[tuple[int, int | None]] = []
        newcomers = set(self.cfg.new_clients)
        for c in clients:
            ctx = ClientContext(self, c, rnd, evaluating=True)
            if c in newcomers:  # held out of training: adapted as a newcomer would (eval.new_clients)
                pm = evaluation.newcomer_model(self.algo, ctx)
                forward_of = evaluation.newcomer_forward
            else:
                pm = evaluation.personal_model(self.algo, ctx)
                forward_of = evaluation.forward
            if pm is None:
                personal.append((c, None))
                continue
            pm.eval()
            if export:
                features.append((f"client_{c}", self._sample_features(pm)))
            forward = forward_of(self.algo, pm)
            personal.append(
                (c, int(self._correct_on(forward, self.data.ptest, self.data.client_test[c], bs).sum()))
            )
        return EvalPart(
            tuple(global_correct), tuple(personal), tuple(global_align), tuple(global_norm), tuple(features)
        )

    def _sample_features(self, model: Any) -> np.ndarray:
        """The features f(x) (:func:`raysim.toolkit.features.representation`) of ``eval.features``'
        fixed G-Test sample (:func:`raysim.results.features.feature_sample`) under ``model``."""
        from raysim.toolkit.features import extract_features

        if self._feature_x is None:  # gathered once: the sample is the run's
            from raysim.results.features import feature_sample

            self._feature_x, _ = self.gather(self.data.gtest, feature_sample(self.cfg, len(self.data.gtest)))
        out: np.ndarray = extract_features(model, self._feature_x, self.cfg.eval.batch_size).cpu().numpy()
        return out

    def _correct_on(self, forward: Any, ds: ArrayDataset, idx: np.ndarray, batch_size: int) -> np.ndarray:
        if idx.size == 0:
            return np.zeros(0, dtype=bool)
        x, y = self.gather(ds, idx)
        pred = predict(forward, x, batch_size)
        out: np.ndarray = (pred == y).cpu().numpy()
        return out


__all__ = ["ClientRuntime"]
