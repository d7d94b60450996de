"""FedDBE: FedAvg with the Domain Bias Eliminator (Zhang, Hua, Cao, Wang, Song, Xue, Ma and Guan,
"Eliminating Domain Bias for Federated Learning in Representation Space", NeurIPS 2023, Sec. 4:
the personalised representation bias memory, PRBM, and the mean regularisation, MR).

The model is split as the paper splits it: the feature extractor f (raysim's ``extractor`` and
``filter``; z_i^g = filter(extractor(x)), the head's input) and the classifier g (``head``). ``phead``
is not used.

- PRBM: client i keeps a trainable vector z_bar_i^p of z's size (``filter_dim``), zero before it
  first trains, and the classifier reads z_i = z_i^g + z_bar_i^p: the client's representation bias
  is memorised in its own vector instead of in the shared extractor. The vector never leaves the
  client (it lives in the client's memory on its home worker: jobs are pinned).
- MR: a client's local objective is CE(g(z_i^g + z_bar_i^p), y) + kappa * R(z_bar_i^g, z_bar^g),
  with R(a, b) = (1/K) sum_k (1/2) (a_k - b_k)^2 over the K entries of z, z_bar^g the global mean
  representation and z_bar_i^g the client's mean representation, tracked over the local update's
  steps as a running mean of the batches' means of z_i^g (before the bias is added):
  z_bar_i^g <- (1 - mu) z_bar_i^g + mu * mean_batch(z_i^g), from zero at the start of each local
  update, its value before the step detached (the gradient of R flows through this batch's mean
  only). The extractor, the classifier and the PRBM train together on it for E epochs, with the run's
  SGD (one optimizer for the three: its momentum and weight decay are the run's, each local update
  from zero momentum); the extractor and classifier are uploaded and averaged by training-set
  size (FedAvg; and ``algo.server_opt`` as every algorithm on FedAvg's server).
- The global mean z_bar^g (the initialisation period): before round 1 every training client
  trains the initial model for E epochs with cross-entropy alone (no PRBM, no MR), tracking its
  running mean as above, and uploads that mean (its weights are not uploaded: every client's
  round 1 starts from the initial model, as the authors' clients, whose parameters the first round
  overwrites). The server's z_bar^g = sum_i n_i / n * z_bar_i^g over every training client, summed
  in float64 in client order, is fixed for the whole run and sent with the weights every round
  (round 0 of the ``ExtraRounds(prologue=True)`` capability, at round 1's learning rate).
- GM: the averaged extractor and classifier, predicting g(z^g) with no bias (a choice: the authors'
  code evaluates the personalised models only). LM of client i: the same weights with its own
  PRBM, g(z_i^g + z_bar_i^p). A client held out of training (``eval.new_clients``) starts a PRBM at
  zero and trains it with the model on its data under the local objective above (the global mean
  received) for ``eval.new_client_epochs``, as its first local update would, and predicts as an LM.

Where the paper is silent this follows the authors' code, read in TsingZ0/PFLlib's
``system/flcore/clients/clientdbe.py`` and ``system/flcore/servers/serverdbe.py`` (commit d832e76)
and TsingZ0/DBE's ``system/flcore/clients/clientDBE.py``, ``serverDBE.py`` and ``run_me.sh``
(commit 193f435): the running mean's momentum and its reset and zero start every local update (no
bias correction of the zero start), R's mean of halved squares, the initialisation period's
cross-entropy training and its size-weighted global mean, fixed afterwards, and the defaults
kappa = 50 and mu = 1 (the authors' ``run_me.sh``: ``-klw 50 -mo 1``; PFLlib's argument defaults,
0 and 0.1, switch MR off). The authors train the PRBM with an optimizer of its own (plain SGD at the
same rate, its state kept across rounds, as is theirs for the model); with their plain SGD (no
momentum, no weight decay) the one optimizer here gives the same steps. kappa = 50 goes with the
authors' rate (0.005, plain SGD, batches of 10) and their models' representations: R is a mean over
the K entries of z, so kappa pulls each entry with kappa / K, and PFLlib's FedAvgCNN, whose
extractor is ``cnn3p2_fmnist``'s convolutions, has K = 512 where ``cnn3p2_fmnist`` has K = 50: at the
same kappa ten times the pull. On ``cnn3p2_fmnist`` kappa = 50 diverges at raysim's default rate and
momentum (0.05 and 0.9: its loss grows past 1e6 in round 1) and at plain SGD 0.01 (the training
loss is NaN in round 1 on Dir(0.1)); kappa = 5 (50 x 50 / 512) and kappa = 1 train at 0.01, kappa = 50
at the authors' 0.005 (a loss of 8 in round 1).

Not batchable (its loss carries the running mean from step to step, which one vmapped loss over
several clients cannot), not under DP-SGD (MR reads the batch's mean representation, not a mean of
per-example terms) and not under client-level DP (the server also reads every client's mean
representation, which no clip bounds); it runs asynchronously (every client starts from the global
weights and its aggregate is their size-weighted mean; the initialisation period is synchronous).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from algorithms.base import Evaluation, register
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.capabilities.batching import Batching
from raysim.capabilities.extra_rounds import ExtraRounds
from raysim.config import setting
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn

#: the name under which a client stores its PRBM z_bar_i^p (a float32 vector of ``filter_dim``)
BIAS = "feddbe/prbm"


@dataclass(frozen=True)
class FedDBEConfig:
    kappa: float = setting(50.0, at_least=0)  # kappa: MR's weight (the authors' run_me.sh, -klw 50)
    #: mu: the running mean's momentum, (1 - mu) z_bar + mu mean_batch(z) (the authors' run_me.sh, -mo 1)
    mean_momentum: float = setting(1.0, above=0, at_most=1)


@dataclass(frozen=True)
class DBEState(GlobalState):
    """FedAvg's state and the global mean representation z_bar^g (None before the initialisation period)."""

    global_mean: np.ndarray | None = None


@dataclass(frozen=True)
class DBEPayload:
    """The shared weights, the round's rate and z_bar^g (None: the initialisation period)."""

    weights: ModelWeights
    lr: float
    global_mean: np.ndarray | None


class RunningMean:
    """z_bar_i^g over one local update's steps: zero at the start, then per batch
    (1 - mu) z_bar + mu * mean_batch(z), the previous value detached."""

    def __init__(self, momentum: float, size: int, device: torch.device) -> None:
        import torch

        self.momentum = momentum
        self.value = torch.zeros(size, device=device)

    def update(self, z: torch.Tensor) -> torch.Tensor:
        """The running mean after batch ``z`` (attached to z's graph); kept detached for the next."""
        running = (1 - self.momentum) * self.value + self.momentum * z.mean(dim=0)
        self.value = running.detach()
        return running

    def array(self) -> np.ndarray:
        out: np.ndarray = self.value.cpu().numpy().astype(np.float32)
        return out


def mean_regulariser(running: torch.Tensor, global_mean: torch.Tensor) -> torch.Tensor:
    """R(z_bar_i^g, z_bar^g) = (1/K) sum_k (1/2) (z_bar_i,k^g - z_bar_k^g)^2."""
    out: torch.Tensor = (0.5 * (running - global_mean) ** 2).mean()
    return out


def dbe_loss(
    tracker: RunningMean, kappa: float, global_mean: torch.Tensor | None, bias: torch.Tensor | None
) -> LossFn:
    """The loss of a batch: CE(g(z + z_bar^p), y) + kappa R(z_bar_i^g, z_bar^g), the running mean
    updated by the batch's z; without a global mean (the initialisation period) CE(g(z), y), the
    running mean tracked all the same."""
    import torch.nn.functional as F

    from raysim.toolkit.features import representation

    def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = representation(model, x)
        running = tracker.update(z)
        if global_mean is None or bias is None:
            out: torch.Tensor = F.cross_entropy(model.head(z), y)
            return out
        return F.cross_entropy(model.head(z + bias), y) + kappa * mean_regulariser(running, global_mean)

    return loss


def biased_forward(model: SplitModel, bias: torch.Tensor) -> Any:
    """x -> g(z^g + z_bar^p): a personalised model's prediction."""
    from raysim.toolkit.features import representation

    return lambda x: model.head(representation(model, x) + bias)


@register("feddbe")
class FedDBE(AveragedWeights):
    """FedAvg's server with a fixed global mean from the initialisation period; each client's PRBM
    and MR on its home worker."""
    family = "split"

    Config = FedDBEConfig
    has_global_model = True
    has_personal_model = True
    pinned = True  # the PRBM lives on the client's home worker
    extra_rounds = ExtraRounds(prologue=True)  # the initialisation period: z_bar^g
    batching = Batching(
        why_not="its loss carries each client's running mean representation from step to step, which one "
        "vmapped loss over several clients cannot hold."
    )
    example_privacy: ClassVar[str | None] = (
        "its mean regularisation reads the batch's mean representation, not a mean of per-example terms"
    )
    #: the PRBM a personal model predicts with, set by :meth:`DBEEvaluation.personal_model` (or
    #: ``newcomer_model``) for the :meth:`DBEEvaluation.forward` that follows it for the same client
    _bias: torch.Tensor

    # ---------------------------------------------------------------------------------------- server
    def init(self, ctx: ServerContext) -> DBEState:
        self.note_statistics(ctx)
        return DBEState(ctx.init_weights.select(self.shared_parts))

    def plan(self, state: GlobalState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        mean = state.global_mean if isinstance(state, DBEState) else None
        payload = DBEPayload(state.weights, self.lr(max(rnd, 1)), mean)
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> DBEState:
        assert isinstance(state, DBEState)
        if rnd == 0:  # the initialisation period: z_bar^g = sum_i n_i / n z_bar_i^g
            return DBEState(state.weights, state.opt, global_mean(results))
        averaged = super().aggregate(state, rnd, results)
        return DBEState(averaged.weights, averaged.opt, state.global_mean)

    def evaluation(self, state: GlobalState) -> Evaluation:
        assert isinstance(state, DBEState)
        return DBEEvaluation(DBEEval(state.weights, state.global_mean))

    # ---------------------------------------------------------------------------------------- client
    def prbm(self, ctx: ClientContext, value: np.ndarray | None = None) -> torch.nn.Parameter:
        """Client ``ctx``'s PRBM as a trainable vector on its device: ``value``, else the one it
        stored, else zero."""
        import torch

        if value is None:
            value = ctx.stored(BIAS)
        if value is None:
            value = np.zeros(ctx.model.filter_dim, np.float32)
        return torch.nn.Parameter(torch.tensor(np.asarray(value, dtype=np.float32), device=ctx.device))

    def train_with_prbm(
        self, ctx: ClientContext, lr: float, global_mean: np.ndarray, bias: torch.nn.Parameter, **train: Any
    ) -> Any:
        """The extractor, the classifier and ``bias`` trained on the local objective (PRBM and MR)."""
        import torch

        tracker = RunningMean(self.params.mean_momentum, ctx.model.filter_dim, ctx.device)
        target = torch.tensor(np.asarray(global_mean, dtype=np.float32), device=ctx.device)
        loss = dbe_loss(tracker, self.params.kappa, target, bias)
        return ctx.train(GLOBAL_PARTS, lr, loss_fn=loss, extra=[bias], **train)

    def local_update(self, ctx: ClientContext, payload: DBEPayload) -> ClientResult:
        ctx.load(payload.weights)
        if payload.global_mean is None:  # the initialisation period: CE alone, the running mean uploaded
            tracker = RunningMean(self.params.mean_momentum, ctx.model.filter_dim, ctx.device)
            stats = ctx.train(
                GLOBAL_PARTS, payload.lr, loss_fn=dbe_loss(tracker, self.params.kappa, None, None)
            )
            return ctx.result(stats, extra=tracker.array())
        bias = self.prbm(ctx)
        stats = self.train_with_prbm(ctx, payload.lr, payload.global_mean, bias)
        ctx.store(BIAS, bias.detach().cpu().numpy().astype(np.float32))
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))


def global_mean(results: Sequence[JobResult]) -> np.ndarray:
    """sum_i n_i / n z_bar_i^g over the clients' uploaded running means, in float64 in client order."""
    finals = sorted((r for jr in results for r in jr.results), key=lambda r: r.client)
    total = sum(r.num_samples for r in finals)
    acc = np.zeros(np.asarray(finals[0].extra).shape, np.float64)
    for r in finals:
        acc += (r.num_samples / total) * np.asarray(r.extra, dtype=np.float64)
    return acc.astype(np.float32)


@dataclass(frozen=True)
class DBEEval:
    """What FedDBE's evaluation carries to the workers: the shared weights and z_bar^g."""

    weights: ModelWeights
    global_mean: np.ndarray | None = None


class DBEEvaluation(Evaluation):
    """The shared weights (the GM, no bias) and z_bar^g (a :class:`DBEEval`); a client's personal
    model is the shared weights predicting with its own PRBM, g(z^g + z_bar^p)."""

    def global_model(self, algo: FedDBE, model: SplitModel) -> SplitModel | None:
        from raysim.models import set_weights

        set_weights(model, self.payload.weights)
        return model

    def personal_model(self, algo: FedDBE, ctx: ClientContext) -> SplitModel:
        ctx.load(self.payload.weights)
        algo._bias = algo.prbm(ctx).detach()
        return ctx.model

    def forward(self, algo: FedDBE, model: SplitModel) -> Any:
        return biased_forward(model, algo._bias)

    def newcomer_model(self, algo: FedDBE, ctx: ClientContext) -> SplitModel:
        """The shared weights and a zero PRBM, trained on the local objective for
        ``eval.new_client_epochs`` on the newcomer's own stream; nothing is kept."""
        from raysim.engine.evaluation import newcomer_epochs

        ctx.load(self.payload.weights)
        bias = algo.prbm(ctx, np.zeros(ctx.model.filter_dim, np.float32))
        epochs = newcomer_epochs(algo.cfg)
        if epochs > 0 and self.payload.global_mean is not None:
            algo.train_with_prbm(
                ctx, algo.lr(ctx.rnd), self.payload.global_mean, bias, epochs=epochs, stream="newcomer"
            )
        algo._bias = bias.detach()
        return ctx.model

    def newcomer_forward(self, algo: FedDBE, model: SplitModel) -> Any:
        return self.forward(algo, model)


__all__ = [
    "BIAS",
    "DBEEval",
    "DBEEvaluation",
    "DBEPayload",
    "DBEState",
    "FedDBE",
    "FedDBEConfig",
    "RunningMean",
    "biased_forward",
    "dbe_loss",
    "global_mean",
    "mean_regulariser",
]
