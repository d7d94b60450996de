"""FedPAC ("Personalized Federated Learning with Feature Alignment and Classifier Collaboration",
Xu, Tong and Huang, ICLR 2023; read through the FedPAC reproduction report, and details follow the authors'
released code): a shared extractor aligned to global class centroids, and personal heads combined
across clients by a quadratic program.

Model parts: the body (``extractor``, and ``filter`` if the model has one) is theta, shared and
averaged by training-set size; ``head`` is client i's personal classifier phi_i.

Client round, given the global theta, the global centroids c and its own phi_i:
1. Under the received model, before training: class priors p_i(c), H_i (row c = p_i(c) mu_i(c)) and
   V_i = (1/n_i) sum_c [p_i(c) mean_{z in c} ||z||^2 - p_i(c)^2 ||mu_i(c)||^2]
   (:func:`raysim.toolkit.features.pac_statistics`).
2. phi_i trained ``head_epochs`` (1) epochs at ``head_lr`` (0.1) with theta frozen; with
   ``head_prox_mu`` > 0 the loss gains mu/2 ||phi - phi^t||^2 (the report's addition, Eq. 6).
3. theta trained E epochs with phi_i frozen on CE + lambda (1/d) ||z - c_y||^2 (feature alignment, FA;
   classes without a centroid add nothing; ``lam`` = 0 turns FA off).
4. Class means of the trained body, with counts.
5. Upload theta_i, phi_i, the class means and counts, and (p_i, H_i, V_i).

Server: theta <- sum n_i theta_i / sum n_i; c_k = sum_i n_ik mu_ik / sum_i n_ik over the round's uploads;
for each sampled client i, alpha_i from :mod:`algorithms.collaboration` (classifier collaboration, CC;
``combine=false`` keeps alpha_i = e_i) and client i's new head sum_j alpha_ij phi_j, which is its head
from then on (evaluated at once, as the authors' code does, and sent with its next job).
LM = global theta + the client's head; there is no global model (``gm_*`` null). A newcomer
(``eval.new_clients``) takes theta with the initial head and trains the head as step 2 does.
With partial participation every client takes part in the last round (``all_in_last_round``, as
the report's 100-client setting does).
TensorBoard: the alpha matrix of the round as a heat map (a row per sampled client) on evaluated
rounds, and the mean weight clients keep on their own head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, Evaluation, lambda_setting, register
from algorithms.collaboration import combination_weights
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching
from raysim.capabilities.round_log import RoundLog
from raysim.config import setting
from raysim.registry import DatasetInfo
from raysim.setups import Choice, Source, Stated
from raysim.toolkit.aggregate import weighted_mean
from raysim.toolkit.prototypes import ClassMeans, weighted_means
from raysim.weights import BODY, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class FedPACConfig:
    #: lambda of the feature-alignment term (0: no FA) (``algo.lambda``)
    lam: float = lambda_setting(1.0, at_least=0)
    combine: bool = True  # classifier collaboration (False: every client keeps its own head)
    head_epochs: int = setting(1, at_least=0)
    head_lr: float = setting(0.1, above=0)
    head_prox_mu: float = setting(0.0, at_least=0)  # the report's proximal term on head training (0: off)
    all_in_last_round: bool = True  # every client takes part in the last round (the report's Sec. 5.2)


@dataclass(frozen=True)
class PACPayload:
    body: ModelWeights  # global theta
    head: ModelWeights | None  # the client's head (None: it has none yet, start from the initial one)
    centroids: np.ndarray  # (C, d) global class centroids
    centroid_mask: np.ndarray  # (C,) classes that have one
    lr: float


@dataclass(frozen=True)
class PACUpload:
    class_means: ClassMeans  # of the trained body
    priors: np.ndarray  # (C,) p_i(c) under the received model's data
    h: np.ndarray  # (C, d) H_i under the received model
    v: float  # V_i


@dataclass(frozen=True)
class PACState:
    rnd: int
    body: ModelWeights
    heads: tuple[ModelWeights | None, ...]  # per client: its latest (combined) head
    centroids: np.ndarray
    centroid_mask: np.ndarray
    alpha: np.ndarray  # (K, K) the last round's weights over its sampled clients
    sampled: tuple[int, ...]  # those clients, in the order of alpha's rows


@dataclass(frozen=True)
class PACEval:
    body: ModelWeights
    heads: tuple[ModelWeights | None, ...]


@register("fedpac")
class FedPAC(Algorithm[PACState]):
    family = "split"
    asynchronous = Asynchronous(
        why_not="each client's classifier is combined from the statistics of the round's other clients, solved anew "
        "for each round's cohort, so a stale client has no cohort to be combined with."
    )
    batching = Batching(
        why_not="its clients keep personal heads and align features to centroids of their own classes."
    )
    Config = FedPACConfig
    has_global_model = False
    has_personal_model = True
    round_log = RoundLog()

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer trains a head on the shared body (:meth:`PACEvaluation.newcomer_model`)."""
        return cfg.eval.new_clients > 0

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        """The report's Sec. 5.1 and the paper's setup: 20 clients all taking part (100 at 0.3 the
        other setting), 200 rounds, E = 5 (plus one head epoch at 0.1), B = 50, SGD lr 0.01,
        momentum 0.5, weight decay 5e-4, ``dominant:20`` with 600 training samples a client (1000 on
        EMNIST) and local test sets of the same distribution, ``cnn_pac`` (``cnn_pac_cifar`` on CIFAR
        and other colour images)."""
        return {
            "clients": 20,
            "participation": 1.0,
            "rounds": 200,
            "train.local_epochs": 5,
            "train.batch_size": 50,
            "train.lr": 0.01,
            "train.momentum": 0.5,
            "train.weight_decay": 5e-4,
            "data.partition": "dominant:20",
            "data.samples_per_client": 1000 if dataset.name == "emnist" else 600,
            "data.test_mode": "matched",
            "model": "cnn_pac_cifar" if dataset.channels == 3 else "cnn_pac",
        }

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        paper = Choice("not in the report: FedPAC's paper (Xu et al., ICLR 2023), which the report reproduces")
        return {
            "clients": Stated("report Sec. 5.2, Table 1: 20 clients (100 the other setting)"),
            "participation": Stated("report Sec. 5.2, Table 1: all of 20 take part"),
            "rounds": Stated("report Sec. 5.1, training setup"),
            "train.local_epochs": Stated("report Sec. 5.1, training setup"),
            **dict.fromkeys(("train.batch_size", "train.lr", "train.momentum", "train.weight_decay"), paper),
            "data.partition": Stated("report Sec. 5.1, data partition: s = 20% uniform, the rest dominant classes"),
            "data.samples_per_client": Stated("report Sec. 5.2: 600 a client, 1000 on EMNIST"),
            "data.test_mode": Stated("report Sec. 5.1: each client's test data follows its training data"),
            "model": Stated("report Sec. 5.1: a CNN for EMNIST and FMNIST, another for CIFAR-10 and CINIC-10"),
        }

    # ---------------------------------------------------------------------------------------- server
    def init(self, ctx: ServerContext) -> PACState:
        n, c = ctx.clients.label_counts.shape
        return PACState(
            rnd=0,
            body=ctx.init_weights.select(BODY),
            heads=(None,) * n,
            centroids=np.zeros((c, 0), np.float32),
            centroid_mask=np.zeros(c, bool),
            alpha=np.zeros((0, 0)),
            sampled=(),
        )

    def plan(self, state: PACState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        if self.params.all_in_last_round and rnd == self.cfg.rounds:
            sampled = self.cfg.training_clients  # so every client's final head is a combined one
        lr = self.lr(rnd)
        return [
            Job((c,), PACPayload(state.body, state.heads[c], state.centroids, state.centroid_mask, lr))
            for c in sampled
        ]

    def aggregate(self, state: PACState, rnd: int, results: Sequence[JobResult]) -> PACState:
        finals = [jr.final for jr in results]
        uploads: list[PACUpload] = [r.extra for r in finals]
        weights = [r.weights for r in finals if r.weights is not None]
        body = weighted_mean([w.select(BODY) for w in weights], [r.num_samples for r in finals])
        centroids, mask = weighted_means(ClassMeans.stack([u.class_means for u in uploads]))
        k = len(finals)
        if self.params.combine and k > 1:
            alpha = combination_weights(np.stack([u.h for u in uploads]), np.array([u.v for u in uploads]))
        else:
            alpha = np.eye(k)
        own_heads = [w.select(("head",)) for w in weights]
        heads = list(state.heads)
        for i, r in enumerate(finals):
            keep = alpha[i] > 0  # the new head: sum_j alpha_ij phi_j
            heads[r.client] = weighted_mean(
                [h for h, on in zip(own_heads, keep, strict=True) if on], alpha[i][keep].tolist()
            )
        return PACState(rnd, body, tuple(heads), centroids, mask, alpha, tuple(r.client for r in finals))

    def evaluation(self, state: PACState) -> Evaluation:
        return PACEvaluation(PACEval(state.body, state.heads))

    def round_scalars(self, state: PACState, rnd: int) -> dict[str, float]:
        if state.alpha.size == 0:
            return {}
        return {"alpha_self": float(np.mean(np.diag(state.alpha)))}

    def round_images(self, state: PACState, rnd: int) -> dict[str, np.ndarray]:
        from raysim.results.tensorboard import heat_map

        return {"alpha": heat_map(state.alpha)} if state.alpha.size else {}

    # ---------------------------------------------------------------------------------------- client
    def local_update(self, ctx: ClientContext, payload: PACPayload) -> ClientResult:
        import torch.nn.functional as F

        from raysim.toolkit.features import aligned_cross_entropy, extract_features, pac_statistics
        from raysim.toolkit.train import proximal_anchor, proximal_term

        p = self.params
        ctx.load(payload.body.merged(self._head(ctx, payload.head)))
        x, y = ctx.train_tensors()
        num_classes = ctx.model.num_classes
        stats = pac_statistics(extract_features(ctx.model, x), y, num_classes)  # 1. received model

        anchor = proximal_anchor(ctx.model, ("head",))

        def head_loss(model: SplitModel, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(model(xb), yb)
            if p.head_prox_mu > 0:  # the report's Eq. 6
                loss = loss + p.head_prox_mu / 2 * proximal_term(model, anchor, ("head",))
            return loss

        ctx.train(("head",), p.head_lr, epochs=p.head_epochs, loss_fn=head_loss)  # 2.

        body_loss = aligned_cross_entropy(p.lam, payload.centroids, payload.centroid_mask, ctx.device)
        train_stats = ctx.train(BODY, payload.lr, loss_fn=body_loss)  # 3. (the epochs after the head's)
        upload = PACUpload(ctx.class_means(), stats.priors, stats.h, stats.v)  # 4.
        return ctx.result(train_stats, weights=ctx.weights((*BODY, "head")), extra=upload)  # 5.

    @staticmethod
    def _head(ctx: ClientContext, head: ModelWeights | None) -> ModelWeights:
        """The client's head as the server keeps it; the initial one before it has one."""
        return head if head is not None else ctx.initial_weights.select(("head",))


class PACEvaluation(Evaluation):
    """A :class:`PACEval`; a client's personal model is the body with its head."""

    payload: PACEval

    def personal_model(self, algo: FedPAC, ctx: ClientContext) -> SplitModel:
        ctx.load(self.payload.body.merged(algo._head(ctx, self.payload.heads[ctx.cid])))
        return ctx.model

    def newcomer_model(self, algo: FedPAC, ctx: ClientContext) -> SplitModel:
        """A client held out of training: the shared body theta with the initial head, the head
        trained as a client's step 2 trains it (theta frozen, cross-entropy at ``head_lr``) for
        ``eval.new_client_epochs`` epochs on its own stream. No classifier collaboration: a newcomer
        is in no round's combination."""
        from raysim.engine.evaluation import adapt_newcomer

        ctx.load(self.payload.body.merged(ctx.initial_weights.select(("head",))))
        return adapt_newcomer(algo, ctx, ("head",), lr=algo.params.head_lr)


__all__ = ["FedPAC", "FedPACConfig"]
