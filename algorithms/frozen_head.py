"""The frozen-head family's shared pieces: a head fixed for the whole federated training (a simplex
ETF, FedDr+'s Eq. 3, or FedBABU's random head) and a body averaged by training-set size
(:class:`FrozenHead`, the server and client sides of FedDr+, dot-regression, FedBABU and SphereFed),
with the ETF itself (:func:`etf_classifier`), dot-regression's loss (:func:`dr_loss`, FedDr+'s Eq.
2 and 4) and FedDr+'s paper setup by dataset (:func:`drplus_setup`, which FedETF and SphereFed
follow too). Local and FedETF use the ETF and the loss as well. See :mod:`algorithms.feddrplus` for
the paper and its equations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, Evaluation
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching, train_received
from raysim.capabilities.finetune import FineTune
from raysim.capabilities.regularizers import Regularizable
from raysim.errors import ConfigError
from raysim.registry import DatasetInfo
from raysim.setups import Choice, Source, Stated
from raysim.toolkit.aggregate import average_uploads
from raysim.weights import BODY, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class GlobalEval:
    weights: ModelWeights  # body and head


def check_etf_fits(d: int, num_classes: int) -> None:
    if d < num_classes:
        raise ConfigError(
            f"A simplex ETF classifier needs a feature size of at least the class count; the model "
            f"gives {d} features for {num_classes} classes."
        )


def etf_classifier(d: int, num_classes: int, seed: int) -> np.ndarray:
    """The (C, d) rows v_c of a simplex ETF: unit norm, pairwise cosine -1/(C-1) (Eq. 3)."""
    check_etf_fits(d, num_classes)
    g = np.random.default_rng(seed)
    u, _ = np.linalg.qr(g.standard_normal((d, num_classes)))  # orthonormal columns
    c = num_classes
    v = math.sqrt(c / (c - 1)) * u @ (np.eye(c) - np.ones((c, c)) / c)
    out: np.ndarray = v.T.astype(np.float32)
    return out


def dr_loss(beta: float, teacher: SplitModel | None) -> LossFn:
    """beta L_DR + (1 - beta) L_FD (FedDr+ Eq. 4); ``teacher`` computes f(x; theta_g)."""
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.features import representation

    def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = representation(model, x)
        v = model.head.weight.index_select(0, y)  # the frozen ETF rows v_y
        out = beta * (0.5 * (F.cosine_similarity(z, v, dim=1) - 1.0) ** 2).mean()
        if beta < 1.0 and teacher is not None:
            with torch.no_grad():
                zg = representation(teacher, x)
            out = out + (1.0 - beta) * ((z - zg) ** 2).mean()  # (1/d)||.||^2, batch mean
        return out

    return loss


def drplus_setup(dataset: DatasetInfo, *, cifar10_lr: float, cifar100_lr: float, grey_lr: float) -> dict[str, Any]:
    """FedDr+'s experimental setup (Sec. 4, Appendix C, Table 5), shared by the methods it
    compares with their own learning rates (Tables 6-7): 100 clients, participation 0.1, 320
    rounds, lr x0.1 at 50% and 75% of the rounds, momentum 0.9, weight decay 1e-5, batch 50, test
    sets matched to the training classes; CIFAR-10: ``vgg11``, E = 10, ``shard:2``; CIFAR-100:
    ``mobilenet``, E = 3, ``shard:10``; Fashion-MNIST (not in the paper): ``cnn_pac``, E = 5,
    ``shard:2`` (choices). Other datasets: colour images with 100 classes or more take CIFAR-100's
    setup, other colour images CIFAR-10's, grey ones Fashion-MNIST's; the shards a client are a
    tenth of the classes (at least 2). Colour images train augmented (``data.augment=crop_flip``), as
    FedDr+'s base code for personalisation (FedBABU's) does; the base of its global-model table,
    FedNTD's code, also applies Cutout of 16 pixels, which raysim does not have. Fashion-MNIST
    trains unaugmented."""
    common: dict[str, Any] = {
        "clients": 100,
        "participation": 0.1,
        "rounds": 320,
        "train.lr_milestones": (0.5, 0.75),
        "train.lr_gamma": 0.1,
        "train.lr_decay": 1.0,
        "train.momentum": 0.9,
        "train.weight_decay": 1e-5,
        "train.batch_size": 50,
        "data.test_mode": "matched",
    }
    common["data.partition"] = f"shard:{max(2, dataset.num_classes // 10)}"
    # colour images train with random crop (padding 4) and horizontal flip, as FedDr+'s base code
    # does (FedBABU's utils/train_utils.py, read in the junhyeog/FedBABU fork at 5175e57: its CIFAR-10
    # and CIFAR-100 training transforms); the paper is silent
    colour = {**common, "data.augment": "crop_flip"}
    if dataset.channels == 3 and dataset.num_classes >= 100:
        return {**colour, "model": "mobilenet", "train.lr": cifar100_lr, "train.local_epochs": 3}
    if dataset.channels == 3:
        return {**colour, "model": "vgg11", "train.lr": cifar10_lr, "train.local_epochs": 10}
    return {**common, "model": "cnn_pac", "train.lr": grey_lr, "train.local_epochs": 5}


def drplus_sources(dataset: DatasetInfo, *, rates: str) -> dict[str, Source]:
    """Where each setting of :func:`drplus_setup` comes from; ``rates`` names the tables of the
    method's rates (e.g. "Tables 6-7, FedDr+'s row")."""
    colour = dataset.channels == 3
    grey = Choice("no Fashion-MNIST in the paper: a stand-in setup")
    sources: dict[str, Source] = {
        "clients": Stated("Sec. 4, Dataset and models; Table 5"),
        "participation": Stated("Sec. 4, Implementation details; Table 5"),
        "rounds": Stated("Sec. 4, Implementation details; Table 5"),
        "train.lr_milestones": Stated("Sec. 4: decayed at rounds 160 and 240"),
        "train.lr_gamma": Stated("Sec. 4: by a factor of 0.1"),
        "train.lr_decay": Stated("Sec. 4: no decay besides the milestones"),
        "train.momentum": Stated("Table 5"),
        "train.weight_decay": Stated("Table 5"),
        "train.batch_size": Stated("Table 5"),
        "data.test_mode": Choice("FedBABU's code, the paper's base: each client's test data drawn from its training classes"),
        "data.partition": Stated("Table 2's most heterogeneous shards: s = 2 (CIFAR-10), 10 (CIFAR-100)") if colour else grey,
        "model": Stated("Sec. 4, Dataset and models") if colour else grey,
        "train.lr": Stated(rates) if colour else Choice("no Fashion-MNIST in the paper: the CIFAR-10 rate"),
        "train.local_epochs": Stated("Sec. 4 and Table 5: 3 (CIFAR-100), 10 (CIFAR-10)") if colour else grey,
    }
    if colour:
        sources["data.augment"] = Choice(
            "FedBABU's code, the paper's base: random crop (padding 4) and horizontal flip on CIFAR "
            "(FedNTD's code, the base of its global-model table, adds Cutout of 16 pixels, not here)"
        )
    return sources


class FrozenHead(Algorithm[GlobalEval]):
    """A head fixed for the whole federated training and a body averaged by training-set size
    (FedDr+, dotreg, FedBABU); personalised models are the global model fine-tuned after the last
    round ("-FT", the engine's, on by default: ``algo.ft_epochs`` defaults to E)."""

    has_global_model = True
    has_personal_model = True
    finetune = FineTune(parts=BODY, default_epochs=None)  # on by default, for E epochs
    regularizers = Regularizable()  # FedDr+'s Table 1: dot-regression (or FedBABU) with added regularisers
    batching = Batching()  # every client's loss is the payload's
    asynchronous = Asynchronous()  # every client starts from the global body, averaged back

    def started_from(self, state: GlobalEval) -> ModelWeights:
        """The weights a client starting now downloads (an async update is rebased from them)."""
        return state.weights

    def plan(self, state: GlobalEval, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = WeightsPayload(state.weights, self.lr(rnd))
        return [Job((c,), payload) for c in sampled]

    def aggregate(self, state: GlobalEval, rnd: int, results: Sequence[JobResult]) -> GlobalEval:
        body = average_uploads(results)  # the uploads carry the body only
        return GlobalEval(body.merged(state.weights.select(("head",))))

    def evaluation(self, state: GlobalEval) -> Evaluation:
        return FrozenHeadEvaluation(state)

    # ---------------------------------------------------------------------------------------- client
    def body_loss(self, ctx: ClientContext, payload: WeightsPayload) -> LossFn:
        """The body's local loss, made with the received weights loaded in ``ctx.model``."""
        raise NotImplementedError

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        ctx.load(payload.weights)
        loss = self.regularizers.wrap(self.cfg, ctx, payload.weights, BODY, self.body_loss(ctx, payload))
        stats = ctx.train(BODY, payload.lr, loss_fn=loss)  # the head stays frozen
        return ctx.result(stats, weights=ctx.weights(BODY))

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[WeightsPayload]) -> list[ClientResult]:
        """:meth:`local_update` for each of ``ctxs``, their bodies trained together."""
        return train_received(self, ctxs, payloads, BODY, self.body_loss)

    def ft_weights(self, payload: GlobalEval) -> ModelWeights:
        return payload.weights


class FrozenHeadEvaluation(Evaluation):
    """The server's :class:`GlobalEval`; the global model is its weights."""

    payload: GlobalEval

    def global_model(self, algo: FrozenHead, model: SplitModel) -> SplitModel | None:
        return Evaluation(self.payload.weights).global_model(algo, model)


__all__ = ["FrozenHead", "GlobalEval", "check_etf_fits", "dr_loss", "drplus_setup", "drplus_sources", "etf_classifier"]
