"""Per-FedAvg ("Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach", Fallah, Mokhtari and Ozdaglar, NeurIPS 2020), a baseline of Fed3+2p and
FedFCD.

The global model is trained for the MAML objective F(w) = mean_k f_k(w - alpha grad f_k(w)) (Eq. 3):
each sampled client runs local steps on three independent mini-batches D, D', D'' of its data
(Algorithm 1):

- the inner step w' = w - alpha grad f(w; D);
- ``variant="fo"`` (Per-FedAvg FO): w <- w - beta grad f(w'; D') (the Hessian term dropped);
- ``variant="hf"`` (Per-FedAvg HF, Sec. 5): w <- w - beta (I - alpha H d) with d = grad f(w'; D') and
  the Hessian-vector product H d of f(.; D'') at w by the finite difference
  [grad f(w + delta d; D'') - grad f(w - delta d; D'')] / (2 delta).

Local work: E epochs over the client's shuffled batches, each step taking the next two (FO) or three
(HF) of them. beta is the round's learning rate, alpha ``algo.alpha``, delta ``algo.delta``; plain
gradient steps (no momentum or weight decay: the paper's updates). The server averages the uploads
by training-set size, as FedAvg and PFLlib do (a choice: the objective, Eq. 3, weights the clients
equally, and a uniform mean of the sampled clients' models would follow it; not measured against
it yet). GM = w; the personalised model of client k is w after one step of
gradient descent with step alpha on a mini-batch of k's training data (the paper's evaluation: the
meta-model adapted once), drawn from its own random stream. A newcomer (``eval.new_clients``) is
personalised the same way, one alpha step on a batch of its own data (the paper's new user, who
adapts the meta-model by one step), not the generic fine-tuning of ``eval.new_client_epochs``.

beta defaults to the round's learning rate and alpha to 0.01, as PFLlib's client has both (the
learning rate); FL-bench's beta is 0.001, the pFedMe authors' runs of Per-FedAvg take alpha 0.005
and beta 0.001.

The meta-model w is not itself trained to classify: in Fed3+2p's Table 1 setup at alpha = beta =
0.01 its GM predicts one class on G-Test, faithfully: Algorithm 1 restores w before the outer step,
and so does PFLlib's client (``system/flcore/clients/clientperavg.py``, read at commit 487a29e,
with alpha = beta = the learning rate). The cause is the inner step against the loss's curvature:
there alpha times the largest Hessian eigenvalue of a client's batch loss is 1.2-1.5 (median over
clients), a step past the sharpest direction's minimum, so each client's one step installs its own
class prior and nothing holds w's; at alpha = 0.001 (0.41) w predicts every class
(``docs/results/perfedavg_alpha``, measured with ``scripts/sharpness.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from algorithms.base import Evaluation, register
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.config import setting
from raysim.weights import GLOBAL_PARTS
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext

Batch = tuple["torch.Tensor", "torch.Tensor"]


@dataclass(frozen=True)
class PerFedAvgConfig:
    alpha: float = setting(0.01, above=0)  # the inner (adaptation) step
    variant: Literal["fo", "hf"] = "fo"
    delta: float = setting(0.001, above=0)  # hf: the finite difference's step


def gradient(model: SplitModel, params: Sequence[torch.Tensor], batch: Batch) -> tuple[float, list[torch.Tensor]]:
    """The cross-entropy of ``batch`` at the model's current parameters ``params``, and its gradient."""
    import torch
    import torch.nn.functional as F

    x, y = batch
    loss = F.cross_entropy(model(x), y)
    return float(loss.detach()), list(torch.autograd.grad(loss, params))


def maml_step(
    model: SplitModel,
    params: Sequence[torch.Tensor],
    batches: Sequence[Batch],
    alpha: float,
    beta: float,
    variant: str,
    delta: float,
) -> float:
    """One local step of Per-FedAvg on ``params`` (in place): FO with batches (D, D'), HF with
    (D, D', D''). Returns the meta-loss f(w'; D')."""
    import torch

    with torch.no_grad():
        w = [p.detach().clone() for p in params]
    _, g = gradient(model, params, batches[0])
    with torch.no_grad():  # w' = w - alpha grad f(w; D)
        for p, gi in zip(params, g, strict=True):
            p.sub_(alpha * gi)
    meta_loss, d = gradient(model, params, batches[1])  # grad f(w'; D')
    step = d
    if variant == "hf":  # (I - alpha H(w; D'')) d, H d by a central difference
        with torch.no_grad():
            for p, wi, di in zip(params, w, d, strict=True):
                p.copy_(wi + delta * di)
        _, plus = gradient(model, params, batches[2])
        with torch.no_grad():
            for p, wi, di in zip(params, w, d, strict=True):
                p.copy_(wi - delta * di)
        _, minus = gradient(model, params, batches[2])
        step = [di - alpha * (a - b) / (2 * delta) for di, a, b in zip(d, plus, minus, strict=True)]
    with torch.no_grad():  # w <- w - beta step
        for p, wi, si in zip(params, w, step, strict=True):
            p.copy_(wi - beta * si)
    return meta_loss


@register("perfedavg")
class PerFedAvg(AveragedWeights):
    family = "personal"
    example_privacy = (
        'it takes its own gradient steps (the MAML steps), outside the loop DP-SGD runs'
    )
    Config = PerFedAvgConfig
    has_personal_model = True

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        from raysim.toolkit.train import TrainStats, batches_per_epoch, set_trainable

        p = self.params
        ctx.load(payload.weights)
        params = set_trainable(ctx.model, GLOBAL_PARTS)
        per_step = 3 if p.variant == "hf" else 2
        losses: list[float] = []
        samples = 0
        limit = None  # deployment.completeness: the client's share of its MAML steps
        if ctx.work_fraction < 1:
            t = self.cfg.train
            per_epoch = batches_per_epoch(ctx.num_samples, t.batch_size, t.drop_last) // per_step
            limit = ctx.steps_done(t.local_epochs * per_epoch)
        for epoch in range(self.cfg.train.local_epochs):
            batches = list(ctx.batches(epoch))
            for i in range(0, len(batches) - per_step + 1, per_step):
                if limit is not None and len(losses) >= limit:
                    break
                step = batches[i : i + per_step]
                losses.append(maml_step(ctx.model, params, step, p.alpha, payload.lr, p.variant, p.delta))
                samples += sum(int(b[1].shape[0]) for b in step)
        ctx.samples_trained += samples  # this loop's compute, beside ctx.train's
        stats = TrainStats(sum(losses) / len(losses) if losses else 0.0, len(losses), samples)
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))

    def evaluation(self, state: GlobalState) -> Evaluation:
        return PerFedAvgEvaluation(state.weights)


class PerFedAvgEvaluation(Evaluation):
    """The global weights; a client's personal model, and a newcomer's, is adapted from them by one
    step."""

    def newcomer_model(self, algo: PerFedAvg, ctx: ClientContext) -> SplitModel:
        """A new user's model: the meta-model after one alpha step on a batch of its own data."""
        return self.personal_model(algo, ctx)

    def personal_model(self, algo: PerFedAvg, ctx: ClientContext) -> SplitModel:
        """The global model after one gradient step of size alpha on a batch of the client's data."""
        from raysim.toolkit.train import set_trainable

        ctx.load(self.payload)
        params = set_trainable(ctx.model, GLOBAL_PARTS)
        import torch

        batch: Iterator[Batch] = ctx.batches(0, stream="adapt")
        _, g = gradient(ctx.model, params, next(batch))
        with torch.no_grad():
            for q, gi in zip(params, g, strict=True):
                q.sub_(algo.params.alpha * gi)
        return ctx.model


__all__ = ["PerFedAvg", "PerFedAvgConfig", "maml_step"]
