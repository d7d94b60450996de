"""FedETF ("No Fear of Classifier Biases: Neural Collapse Inspired Federated Learning with Synthetic
and Fixed Classifier", Li, Shang, He, Lin and Wu, ICCV 2023), a baseline of FedDr+ (its
Tables 1-3).

Followed in the authors' code (``ZexiLee/ICCV-2023-FedETF``: ``models_dict/resnet.py``,
``proto_classifiers.py``, ``client_funct.py``, ``nodes.py``), where the paper leaves details open:
- Model (:meth:`FedETF.adapt_model`): the registered model's extractor and filter are the backbone;
  a projection layer ``Linear(filter_dim, C)`` with bias (their ``linear_proto``; the ETF's
  dimension d = C, as for their ResNets, MobileNet, DenseNet) is followed by L2 normalisation,
  z = h / ||h||. Here the projection and the normalisation are the ``filter`` part and the backbone
  the ``extractor``, so the projection can be fine-tuned on its own.
- Classifier: a simplex ETF M in R^{d x C}, M = sqrt(C/(C-1)) P (I - 11^T/C) with P orthonormal
  (seeded, the same everywhere), held as the bias-free ``head`` (its rows the class vectors m_c); it
  is never trained or averaged during federated training.
- Learnable temperature s (their ``scaling_train``), initial value ``temperature`` (1, as theirs for
  most models and as FedDr+'s re-implementation, "(beta, tau) = (1, 1)"); it trains with the body
  (weight decay included, as theirs) and the server averages it like the weights.
- Local loss, the balanced feature loss: cross-entropy of s z^T M + log n_c, n_c the client's count
  of class c in its training set with zeros replaced by 1 (Balanced Softmax); E epochs over the
  body (backbone and projection) and s. The server averages the body and s by training-set size.
- Prediction: argmax_c z^T m_c (the temperature left out, as in their evaluation).
- Personalisation, FedETF-FT (their ``Client_personalization``), the engine's "-FT" slot
  (``algo.ft_epochs`` > 0; off by default, as FedDr+ reports FedETF and FedETF-FT apart): from the
  final global model each client trains the body and s with the balanced loss for ``ft_epochs``
  at ``ft_lr``; then ``ft_alternations`` (20) times: ``ft_alt_epochs`` (3) epochs of the
  ETF alone (plain SGD, no momentum or weight decay, lr ``ft_etf_lr`` 0.1) and as many of the
  projection alone (the run's momentum and weight decay, lr ``ft_proj_lr`` 0.05), both with plain
  cross-entropy on s z^T M, s frozen. ``lm_ptest`` reports these models.

Departures, all from the house engine: an optimizer is fresh each round (theirs keeps one per client
across rounds), a frozen part's BatchNorm statistics stay put during the alternations (theirs keep
updating), and the learning rate follows the run's schedule (theirs is constant).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, Evaluation, register
from algorithms.frozen_head import drplus_setup, drplus_sources, etf_classifier
from raysim import rng
from raysim.capabilities.batching import Batching
from raysim.capabilities.finetune import FineTune
from raysim.capabilities.regularizers import Regularizable
from raysim.capabilities.round_log import RoundLog
from raysim.config import setting
from raysim.engine.evaluation import newcomer_epochs
from raysim.registry import DatasetInfo
from raysim.setups import Source
from raysim.toolkit.aggregate import average_uploads
from raysim.weights import BODY, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class FedETFConfig:
    temperature: float = setting(1.0, above=0)  # s's initial value
    ft_alternations: int = setting(20, at_least=0)
    ft_alt_epochs: int = setting(3, at_least=0)
    ft_etf_lr: float = setting(0.1, above=0)
    ft_proj_lr: float = setting(0.05, above=0)


@dataclass(frozen=True)
class ETFState:
    weights: ModelWeights  # body (backbone, projection) and the ETF head
    scale: float  # the temperature s


@dataclass(frozen=True)
class ETFPayload:
    weights: ModelWeights
    scale: float
    lr: float


def balanced_etf_loss(scale: torch.Tensor, counts: torch.Tensor | None) -> LossFn:
    """CE(s z^T M + log n, y) (``counts`` n, zeros already replaced by 1), or plain CE(s z^T M, y)
    without counts."""
    import torch
    import torch.nn.functional as F

    offset = None if counts is None else torch.log(counts.to(torch.float32))

    def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = scale * model(x)
        if offset is not None:
            logits = logits + offset
        return F.cross_entropy(logits, y)

    return loss


def class_counts(ctx: ClientContext) -> torch.Tensor:
    """The client's training-set count of each class, a zero replaced by 1 (their ``nodes.py``)."""
    import torch

    _, y = ctx.train_tensors()
    n = torch.bincount(y, minlength=ctx.model.num_classes)
    return torch.where(n > 0, n, torch.ones_like(n))


@register("fedetf")
class FedETF(Algorithm[ETFState]):
    family = "fixed_head"
    batching = Batching(
        why_not="its learnable temperature is a parameter outside the model, which one batched step does not stack per client."
    )
    Config = FedETFConfig
    has_global_model = True
    round_log = RoundLog()
    finetune = FineTune()  # FedETF-FT: algo.ft_epochs > 0 (its own steps: personal_model)
    regularizers = Regularizable()

    @staticmethod
    def adapt_model(model: SplitModel) -> SplitModel:
        """extractor = the registered extractor and filter; filter = the projection to C then L2
        normalisation; head = the ETF (C x C, no bias)."""
        from torch import nn

        from raysim.models import L2Normalize

        c, d = model.num_classes, model.filter_dim
        model.extractor = nn.Sequential(model.extractor, model.filter)
        model.filter = nn.Sequential(nn.Linear(d, c), L2Normalize())
        model.head = nn.Linear(c, c, bias=False)
        model.phead = nn.Linear(c, c)
        model.feature_dim, model.filter_dim = d, c
        return model

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        """FedDr+'s setup (:func:`algorithms.feddrplus.drplus_setup`) with FedETF's rates of its
        Tables 6-7: 0.05 on CIFAR-10, 0.5 on CIFAR-100; 0.05 on Fashion-MNIST (a choice)."""
        return drplus_setup(dataset, cifar10_lr=0.05, cifar100_lr=0.5, grey_lr=0.05)

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        return drplus_sources(dataset, rates="FedDr+'s Table 6 (CIFAR-10), Table 7 (CIFAR-100), FedETF's row")

    # ---------------------------------------------------------------------------------------- server
    def init(self, ctx: ServerContext) -> ETFState:
        c = ctx.clients.num_classes
        etf = etf_classifier(c, c, rng.int_seed(self.cfg.seed, "etf"))
        weights = ctx.init_weights.select(BODY).merged(ModelWeights(head=etf.reshape(-1)))
        return ETFState(weights, float(self.params.temperature))

    def plan(self, state: ETFState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = ETFPayload(state.weights, state.scale, self.lr(rnd))
        return [Job((c,), payload) for c in sampled]

    def aggregate(self, state: ETFState, rnd: int, results: Sequence[JobResult]) -> ETFState:
        body = average_uploads(results)
        finals = [jr.final for jr in results]
        n = np.array([r.num_samples for r in finals], dtype=np.float64)
        scale = float(np.dot(n / n.sum(), [float(r.extra[0]) for r in finals]))
        return ETFState(body.merged(state.weights.select(("head",))), scale)

    def round_scalars(self, state: ETFState, rnd: int) -> dict[str, float]:
        return {"fedetf_temperature": state.scale}

    def evaluation(self, state: ETFState) -> Evaluation:
        return ETFEvaluation(state)

    def ft_weights(self, payload: ETFState) -> ModelWeights:
        return payload.weights

    # ---------------------------------------------------------------------------------------- client
    def _scale(self, ctx: ClientContext, value: float) -> torch.nn.Parameter:
        import torch

        return torch.nn.Parameter(torch.tensor(value, dtype=torch.float32, device=ctx.device))

    def local_update(self, ctx: ClientContext, payload: ETFPayload) -> ClientResult:
        ctx.load(payload.weights)
        s = self._scale(ctx, payload.scale)
        loss = self.regularizers.wrap(self.cfg, ctx, payload.weights, BODY, balanced_etf_loss(s, class_counts(ctx)))
        stats = ctx.train(BODY, payload.lr, loss_fn=loss, extra=[s])  # the ETF stays fixed
        return ctx.result(stats, weights=ctx.weights(BODY), extra=np.array([s.item()], dtype=np.float32))


class ETFEvaluation(Evaluation):
    """The server's :class:`ETFState` (the weights and the scale s): the global model is its
    weights; FedETF-FT fine-tunes them into a client's personal model."""

    payload: ETFState

    def global_model(self, algo: FedETF, model: SplitModel) -> SplitModel | None:
        return Evaluation(self.payload.weights).global_model(algo, model)

    def personal_model(self, algo: FedETF, ctx: ClientContext) -> SplitModel | None:
        """FedETF-FT (their ``Client_personalization``): the body and s with the balanced loss,
        then the ETF and the projection in turn with cross-entropy, s frozen."""
        epochs, lr = FedETF.finetune.setting(algo.cfg)
        if epochs == 0 or ctx.rnd < algo.cfg.rounds:
            return None
        return self._fine_tuned(algo, ctx, epochs, lr, "finetune")

    def newcomer_model(self, algo: FedETF, ctx: ClientContext) -> SplitModel | None:
        """A newcomer (``eval.new_clients``): FedETF-FT's first pass from the global model, the body
        and s with the balanced loss, for ``eval.new_client_epochs`` at the evaluated round's rate,
        on its own stream; not the alternations after it (20 x (3 + 3) epochs by default), so a
        newcomer adapts for as many epochs as every other algorithm's does."""
        self._body_pass(algo, ctx, newcomer_epochs(algo.cfg), algo.lr(ctx.rnd), "newcomer")
        return ctx.model

    def _body_pass(self, algo: FedETF, ctx: ClientContext, epochs: int, lr: float, stream: str) -> torch.nn.Parameter:
        """FedETF-FT's first pass from the global model: the body and s with the balanced loss; s returned."""
        ctx.load(algo.ft_weights(self.payload))
        s = algo._scale(ctx, self.payload.scale)
        ctx.train(BODY, lr, epochs=epochs, loss_fn=balanced_etf_loss(s, class_counts(ctx)), extra=[s], stream=stream)
        return s

    def _fine_tuned(self, algo: FedETF, ctx: ClientContext, epochs: int, lr: float, stream: str) -> SplitModel:
        p = algo.params
        s = self._body_pass(algo, ctx, epochs, lr, stream)
        s.requires_grad_(False)
        ce = balanced_etf_loss(s, None)
        for _ in range(p.ft_alternations):
            ctx.train(
                ("head",), p.ft_etf_lr, epochs=p.ft_alt_epochs, loss_fn=ce, stream=stream,
                momentum_factor=0.0, weight_decay=0.0,
            )  # fmt: skip
            ctx.train(("filter",), p.ft_proj_lr, epochs=p.ft_alt_epochs, loss_fn=ce, stream=stream)
        return ctx.model


__all__ = ["ETFPayload", "ETFState", "FedETF", "FedETFConfig", "balanced_etf_loss", "class_counts"]
