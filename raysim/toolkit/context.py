"""What a client sees during one job: :class:`ClientContext`, the helpers an algorithm's client side
uses, and the :class:`ClientWorkspace` of the worker that hosts the client.

docs/design.md, "Algorithm hooks": what a client keeps between rounds (a personal head, a control variate,
a personal model) is read and written through helpers on the client context, never by reaching into
the worker. The helpers:

- data: :meth:`ClientContext.train_tensors`, :attr:`~ClientContext.num_samples`;
- weights: :meth:`~ClientContext.load` into the context's model, :meth:`~ClientContext.weights` out
  of it, :meth:`~ClientContext.fresh` (a part freshly initialised from a seeded purpose, the same on
  every worker), :meth:`~ClientContext.scratch_model` (a second model, e.g. a frozen teacher);
- what the client keeps: :meth:`~ClientContext.kept` ("my kept parts, or the initial model's"),
  :meth:`~ClientContext.keep`, and :meth:`~ClientContext.stored` / :meth:`~ClientContext.store` for
  anything that is not model weights (SCAFFOLD's control variate);
- training: :meth:`~ClientContext.train`, the shared loop on this client's shuffled batches. Each
  call draws the next epochs of a named random stream (``stream``), so an algorithm that trains in
  several passes (FedRep's head then body, Ditto's two models, FedDr+'s fine-tuning) never numbers
  epochs by hand;
- uploads: :meth:`~ClientContext.class_means`, :meth:`~ClientContext.result`.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from raysim import rng
from raysim.config import ExperimentConfig
from raysim.data import ArrayDataset, FederatedData
from raysim.deployment.model import Deployment
from raysim.models import (
    SplitModel,
    WeightsLoader,
    build_model,
    flat_from_parameters,
    get_weights,
    parameter_views,
    set_weights,
)
from raysim.toolkit.features import class_means, extract_features
from raysim.toolkit.prototypes import ClassMeans
from raysim.toolkit.train import (
    Batch,
    LossFn,
    SGDConfig,
    TrainStats,
    batches_per_epoch,
    cross_entropy,
    iterate_batches,
    local_train,
)
from raysim.weights import PARTS, ModelWeights, payload_nbytes
from raysim.wire import ClientResult

if TYPE_CHECKING:
    from raysim.privacy.dp_sgd import DPSGD

#: The shuffle streams of the built-in algorithms, keyed as they were before streams had names (so
#: their numbers did not move): the local update's passes are "shuffle/<epoch>", the fine-tuning
#: after the last round's "shuffle/<10000 + epoch>". Any other stream is "shuffle/<name>/<epoch>".
_STREAM_KEYS = {"local": 0, "finetune": 10_000}


def shuffle_purpose(stream: str, epoch: int) -> str:
    if stream in _STREAM_KEYS:
        return f"shuffle/{_STREAM_KEYS[stream] + epoch}"
    return f"shuffle/{stream}/{epoch}"


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


@dataclass(frozen=True)
class ClientMemory:
    """What one client keeps on its home worker between rounds: model parts, and named values."""

    weights: ModelWeights = field(default_factory=ModelWeights)
    values: Mapping[str, Any] = field(default_factory=dict)


class ClientWorkspace:
    """What a worker holds for the clients it hosts: the federated data (read zero-copy from the
    object store), one model that every job loads its weights into, the seeded initial weights,
    and the clients' memories."""

    def __init__(
        self, cfg: ExperimentConfig, data: FederatedData, adapt: Callable[[SplitModel], SplitModel] | None = None
    ) -> None:
        self.cfg = cfg
        self.data = data
        self.device = pick_device(cfg)
        #: the algorithm's ``adapt_model``, applied to every model this worker builds
        self.adapt = adapt
        self.model: SplitModel = build_model(
            cfg.model,
            data.train.input_shape,
            data.num_classes,
            rng.int_seed(cfg.seed, "init"),
            adapt,
            cfg.train.channels_last,
        ).to(self.device)
        self.initial_weights = get_weights(self.model, PARTS)
        self.memory: dict[int, ClientMemory] = {}
        #: the run's simulated deployment: how much of its work a client does (deployment.completeness)
        self.deployment = Deployment(cfg)
        #: the model as a local update first loaded it (its received global model), kept while
        #: ``capture_received`` (the analyses' feature drift, raysim.results.analysis)
        self.capture_received = False
        self.received: dict[str, torch.Tensor] | None = None
        self._fresh: dict[tuple[str, str], np.ndarray] = {}
        self._scratch: dict[str, SplitModel] = {}
        #: loads the received weights into ``model``, laid out once per weights object (a round's
        #: clients on this worker start from the same payload)
        self.loader = WeightsLoader()

    def kept(self, client: int) -> ModelWeights:
        """The model parts ``client`` keeps (none before its first round)."""
        return self.memory.get(client, ClientMemory()).weights

    def stored(self, client: int, name: str) -> Any:
        return self.memory.get(client, ClientMemory()).values.get(name)

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
                self.adapt,
                self.cfg.train.channels_last,
            )
            self._fresh[key] = get_weights(model, (part,)).part(part)
        return self._fresh[key]

    def scratch_model(self, name: str) -> SplitModel:
        """A second model of the same architecture on the same device, kept for reuse; its weights
        are whatever was last loaded."""
        if name not in self._scratch:
            self._scratch[name] = copy.deepcopy(self.model)
        return self._scratch[name]

    def gather(self, ds: ArrayDataset, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(ds.features(idx)).to(self.device)
        y = torch.from_numpy(ds.y[idx]).to(self.device)
        return x, y


class ClientContext:
    """One client's view during one job (or one evaluation): its data, its model, what it keeps,
    its random streams. Handed to ``local_update`` and to an evaluation's ``personal_model``.

    Partial work (``deployment.completeness``) applies to training rounds only: a job's context
    gets the client's drawn :attr:`work_fraction`, while a context built for evaluation
    (``evaluating=True``: ``personal_model``'s fine-tuning or adaptation) always does all its work."""

    def __init__(self, workspace: ClientWorkspace, cid: int, rnd: int, *, evaluating: bool = False) -> None:
        self._ws = workspace
        self.cid = cid
        self.rnd = rnd
        self.cfg = workspace.cfg
        self.model = workspace.model
        self.device = workspace.device
        self._train: tuple[torch.Tensor, torch.Tensor] | None = None
        self._cursor: dict[str, int] = {}  # per stream: the next epoch to draw
        #: samples trained on in this job, every train() counted: its compute (an algorithm with a
        #: loop of its own adds what it trains)
        self.samples_trained = 0
        #: the share of each training pass's steps this client does this round (deployment.completeness;
        #: 1.0 when ``evaluating``: evaluation-time work is never cut)
        self.work_fraction = 1.0 if evaluating else workspace.deployment.work_fraction(rnd, cid)
        self._evaluating = evaluating
        #: DP-SGD (``privacy.example_clip``; raysim.privacy.dp_sgd), made at the job's first training
        #: pass, its keyed generators continuing across the job's passes; its ``steps`` are the
        #: job's DP-SGD steps, which :meth:`result` reports for the client's accounting
        self._dp: DPSGD | None = None

    # ---- data
    @property
    def num_samples(self) -> int:
        return int(self._ws.data.client_train[self.cid].size)

    def train_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's training set as tensors on the device (gathered once per job)."""
        if self._train is None:
            ws = self._ws
            self._train = ws.gather(ws.data.train, ws.data.client_train[self.cid])
        return self._train

    def val_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's validation part (``data.val_fraction``: held out of its training set) as
        tensors on the device; empty without one."""
        ws = self._ws
        return ws.gather(ws.data.train, ws.data.client_val[self.cid])

    def batches(self, epoch: int, stream: str = "local", *, drop_last: bool | None = None) -> Iterator[Batch]:
        """Shuffled mini-batches of epoch ``epoch`` of ``stream``, drawn from (seed, round, client,
        stream, epoch); the last, partial one left out with ``drop_last`` (default
        ``train.drop_last``)."""
        x, y = self.train_tensors()
        seed = rng.int_seed(self.cfg.seed, shuffle_purpose(stream, epoch), self.rnd, self.cid)
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed)).to(self.device)
        drop = self.cfg.train.drop_last if drop_last is None else drop_last
        batches = iterate_batches(x, y, order, self.cfg.train.batch_size, drop)
        if self.cfg.data.augment == "none":
            return batches
        return self._augmented(batches, f"augment/{shuffle_purpose(stream, epoch)}")

    def dp_sgd(self) -> DPSGD | None:
        """This job's DP-SGD (None without ``privacy.example_clip``)."""
        if self._dp is None and self.cfg.privacy.example_clip is not None:
            from raysim.privacy.dp_sgd import for_client

            self._dp = for_client(self.cfg, self.rnd, self.cid, self.num_samples, evaluating=self._evaluating)
        return self._dp

    def private_batches(self, dp: DPSGD, epoch: int, stream: str = "local") -> Iterator[Batch]:
        """DP-SGD's lots for epoch ``epoch`` of ``stream``: as many as :meth:`batches` has batches,
        each a Poisson sample of the client's examples (raysim.privacy.dp_sgd)."""
        x, y = self.train_tensors()
        t = self.cfg.train
        lots = dp.lot_batches(x, y, batches_per_epoch(int(x.shape[0]), t.batch_size, t.drop_last))
        if self.cfg.data.augment == "none":
            return lots
        return self._augmented(lots, f"augment/{shuffle_purpose(stream, epoch)}")

    def _augmented(self, batches: Iterator[Batch], purpose: str) -> Iterator[Batch]:
        """``batches`` through ``data.augment`` (:mod:`raysim.toolkit.augment`), drawn from (seed,
        round, client, ``purpose``)."""
        from raysim.toolkit.augment import crop_flip

        g = torch.Generator().manual_seed(rng.int_seed(self.cfg.seed, purpose, self.rnd, self.cid))
        for xb, yb in batches:
            yield crop_flip(xb, g), yb

    def epochs_of(self, epochs: int | None, steps: int | None) -> int:
        """The epochs of this client's batches a pass of ``steps`` SGD steps takes (the mini-batches
        of an epoch counted as :meth:`batches` gives them), else ``epochs`` (default E)."""
        t = self.cfg.train
        if steps is None:
            return t.local_epochs if epochs is None else epochs
        per_epoch = batches_per_epoch(self.num_samples, t.batch_size, t.drop_last)
        return -(-steps // per_epoch) if per_epoch else 0

    def steps_done(self, nominal: int) -> int:
        """Of a training pass's ``nominal`` steps, how many this client does this round: all, or
        under ``deployment.completeness`` its share of them (at least one). An algorithm with a
        loop of its own stops there too."""
        if self.work_fraction >= 1 or nominal == 0:
            return nominal
        return max(1, math.floor(self.work_fraction * nominal))

    def generator(self, purpose: str) -> np.random.Generator:
        return rng.generator(self.cfg.seed, purpose, self.rnd, self.cid)

    # ---- weights
    @property
    def initial_weights(self) -> ModelWeights:
        """Every part of the seeded initial model (the same on every worker and on the server)."""
        return self._ws.initial_weights

    def load(self, weights: ModelWeights) -> None:
        ws = self._ws
        ws.loader.load(self.model, weights)
        if ws.capture_received and ws.received is None:  # the update's start, for the analyses
            ws.received = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def weights(self, parts: Sequence[str]) -> ModelWeights:
        return get_weights(self.model, parts)

    def fresh(self, part: str, purpose: str) -> ModelWeights:
        """Part ``part`` freshly initialised from (seed, ``purpose``), the same on every worker."""
        return ModelWeights(**{part: self._ws.fresh_part(part, purpose)})

    def scratch_model(self, name: str) -> SplitModel:
        """A second model on this worker (e.g. a frozen teacher), reused from job to job."""
        return self._ws.scratch_model(name)

    def teacher(self, weights: ModelWeights) -> SplitModel:
        """``weights`` (e.g. the received global model) in the worker's "teacher" scratch model,
        frozen (:func:`raysim.toolkit.distill.as_teacher`: its BatchNorm layers normalise by the
        batch's statistics, as the student's do): what distillation terms compare with (FedDr+'s
        L_FD, FedNTD, the regularisers)."""
        from raysim.toolkit.distill import as_teacher

        t = self.scratch_model("teacher")
        set_weights(t, weights)
        return as_teacher(t)

    # ---- what the client keeps between rounds (on its home worker)
    def kept(self, parts: Sequence[str], *, fresh: str | None = None) -> ModelWeights:
        """The ``parts`` this client kept (:meth:`keep`); a part it has not kept yet is the
        initial model's, or with ``fresh`` a part freshly initialised from (seed,
        ``fresh/<client>``)."""
        own = self._ws.kept(self.cid)
        out = {}
        for part in parts:
            value = getattr(own, part)
            if value is None:
                value = (
                    self._ws.fresh_part(part, f"{fresh}/{self.cid}")
                    if fresh is not None
                    else self.initial_weights.part(part)
                )
            out[part] = value
        return ModelWeights(**out)

    def keep(self, weights: ModelWeights) -> None:
        """Keep these parts for this client's next rounds (other kept parts stay)."""
        mem = self._ws.memory.get(self.cid, ClientMemory())
        self._ws.memory[self.cid] = ClientMemory(mem.weights.merged(weights), mem.values)

    def stored(self, name: str, default: Any = None) -> Any:
        """A value this client stored (:meth:`store`), or ``default``."""
        value = self._ws.stored(self.cid, name)
        return default if value is None else value

    def store(self, name: str, value: Any) -> None:
        mem = self._ws.memory.get(self.cid, ClientMemory())
        self._ws.memory[self.cid] = ClientMemory(mem.weights, {**mem.values, name: value})

    # ---- training and uploads
    def train(
        self,
        parts: Sequence[str],
        lr: float,
        *,
        epochs: int | None = None,
        steps: int | None = None,
        loss_fn: LossFn = cross_entropy,
        after_backward: Callable[[], None] | None = None,
        stream: str = "local",
        advance: bool = True,
        momentum: ModelWeights | None = None,
        extra: Sequence[torch.nn.Parameter] = (),
        momentum_factor: float | None = None,
        weight_decay: float | None = None,
    ) -> TrainStats:
        """The shared loop (:func:`raysim.toolkit.train.local_train`) on this client's batches, for
        ``epochs`` (default E) epochs: the next ones of ``stream``; or for ``steps`` SGD steps
        (mini-batches, over as many epochs as they take). ``advance=False`` leaves the stream where
        it was, so that the next call trains on the same shuffles (FedFCD trains each local epoch in
        two steps). ``momentum``: the optimizer's momentum buffers to start from (laid out as the
        trained parts' weights, e.g. :meth:`momentum_of` another client's stats), else zero.
        ``extra``: parameters of the algorithm's own modules, trained with the parts.
        ``momentum_factor`` and ``weight_decay``: this pass's SGD settings where they are not the
        run's (``train.momentum``, ``train.weight_decay``), e.g. FedETF's plain-SGD ETF tuning."""
        t = self.cfg.train
        n = self.epochs_of(epochs, steps)
        if self.work_fraction < 1:  # partial work: the pass stops after its share of the steps
            per_epoch = batches_per_epoch(self.num_samples, t.batch_size, t.drop_last)
            steps = self.steps_done(steps if steps is not None else n * per_epoch)
            n = self.epochs_of(None, steps)
        first = self._cursor.get(stream, 0)
        dp = self.dp_sgd()
        stats = local_train(
            self.model,
            (lambda epoch: self.private_batches(dp, first + epoch, stream))
            if dp is not None
            else (lambda epoch: self.batches(first + epoch, stream)),
            epochs=n,
            parts=parts,
            sgd=SGDConfig(
                lr,
                t.momentum if momentum_factor is None else momentum_factor,
                t.weight_decay if weight_decay is None else weight_decay,
            ),
            loss_fn=loss_fn,
            after_backward=after_backward,
            max_steps=steps,
            momentum=parameter_views(self.model, momentum, self.device) if momentum is not None else None,
            extra=extra,
            dp=dp,
        )
        if advance:
            self._cursor[stream] = first + n
        self.samples_trained += stats.samples
        return stats

    @staticmethod
    def train_together(
        ctxs: Sequence[ClientContext],
        parts: Sequence[str],
        lr: float,
        *,
        loss_fn: LossFn = cross_entropy,
        epochs: int | None = None,
        steps: int | None = None,
        starts: Sequence[ModelWeights] | None = None,
        momenta: Sequence[ModelWeights | None] | None = None,
        frozen: Sequence[ModelWeights] | None = None,
        inputs: Sequence[tuple[torch.Tensor, ...]] | None = None,
        stream: str = "local",
    ) -> list[tuple[TrainStats, ModelWeights]]:
        """:meth:`train` for each of ``ctxs``' clients (one worker's), with the same loss, as one
        batched computation (:class:`raysim.toolkit.batched.BatchedTrainer`): each client's batches are
        the ones :meth:`train` would draw (``epochs``, or ``steps``). The clients start from the
        weights loaded in their shared model now, or from ``starts[k]`` (their trained ``parts``;
        the rest as loaded), and from fresh momentum or ``momenta[k]`` (as :meth:`train`'s
        ``momentum``). ``frozen[k]``: client k's own values of untrained parts that differ
        between the clients (e.g. each one's personal head while its body trains); untrained parts
        not in it are the loaded model's for every client. ``inputs[k]``: client k's further
        arguments of the loss (``loss_fn(model, x, y, *inputs[k])``). Returns each client's stats (with its
        momentum buffers) and trained ``parts``; the model is left holding the last client's."""
        from raysim.toolkit.batched import BatchedTrainer

        if not ctxs:
            return []
        model, t, device = ctxs[0].model, ctxs[0].cfg.train, ctxs[0].device
        counts = [ctx.epochs_of(epochs, steps) for ctx in ctxs]
        firsts = [ctx._cursor.get(stream, 0) for ctx in ctxs]

        def batches(ctx: ClientContext, first: int, n: int) -> Iterator[Batch]:
            taken = 0
            for e in range(n):
                for b in ctx.batches(first + e, stream):
                    if steps is not None and taken >= steps:
                        return
                    taken += 1
                    yield b

        sgd = SGDConfig(lr, t.momentum, t.weight_decay)
        trainer = BatchedTrainer(
            model,
            parts,
            len(ctxs),
            starts=[parameter_views(model, w.select([p for p in PARTS if p in parts]), device) for w in starts]
            if starts is not None
            else None,
            momenta=[parameter_views(model, m, device) if m is not None else None for m in momenta]
            if momenta is not None and sgd.momentum > 0
            else None,
            frozen_parts=frozen[0].part_names if frozen else (),
            frozen=[parameter_views(model, f, device) for f in frozen] if frozen else None,
        )
        sums = trainer.train(
            [batches(c, f, n) for c, f, n in zip(ctxs, firsts, counts, strict=True)], sgd, loss_fn, inputs
        )
        out = []
        for k, (ctx, first, n, (loss, done, samples)) in enumerate(zip(ctxs, firsts, counts, sums, strict=True)):
            ctx._cursor[stream] = first + n
            ctx.samples_trained += samples
            trainer.load(k)
            buffers = trainer.momentum(k) if sgd.momentum > 0 else None
            out.append((TrainStats(loss, done, samples, tuple(buffers) if buffers else ()), ctx.weights(parts)))
        return out

    def momentum_of(self, stats: TrainStats, parts: Sequence[str]) -> ModelWeights | None:
        """The momentum buffers a :meth:`train` of ``parts`` ended with, laid out as the parts'
        weights (None without momentum)."""
        if not stats.momentum:
            return None
        return flat_from_parameters(self.model, [p for p in PARTS if p in parts], stats.momentum)

    def class_means(self) -> ClassMeans:
        """The class means of z (``features.representation``) under the model now loaded, over
        the client's training set, with the class counts: the prototype family's upload."""
        x, y = self.train_tensors()
        return class_means(extract_features(self.model, x), y, self.model.num_classes)

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
            samples_trained=self.samples_trained,
            dp_steps=self._dp.steps if self._dp is not None else 0,
        )


__all__ = ["ClientContext", "ClientMemory", "ClientWorkspace", "pick_device", "shuffle_purpose"]
