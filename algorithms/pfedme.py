"""pFedMe ("Personalized Federated Learning with Moreau Envelopes", Dinh, Tran and Nguyen, NeurIPS
2020, Algorithm 1), a baseline of Fed3+2p's Table 1.

Client i's personalised model theta_i is the Moreau envelope's minimiser
theta_i(w_i) = argmin_theta f_i(theta) + lambda/2 ||theta - w_i||^2 (Eq. 3), its local copy w_i of the
global model is pulled towards it. A sampled client starts with w_i = theta_i = w^t (the received
global model) and, for each mini-batch D of its E epochs (a local round of the paper's R):

- K steps of theta <- theta - eta_p (grad f(theta; D) + lambda (theta - w_i)) solve the inner
  problem approximately (``k_steps``, ``personal_lr``, ``lambda``);
- w_i <- w_i - eta lambda (w_i - theta) (Eq. 8; eta the round's learning rate).

It uploads w_i and keeps theta_i on its home worker (its personalised model, the LM; the initial
model before it is first sampled). Server: w^{t+1} = (1 - beta) w^t + beta (1/|S|) sum_{i in S} w_i
(Eq. 9's mixing, ``beta``; 1 is FedAvg's averaging). GM = w. The steps are plain gradient steps
(the paper's), as PFLlib's ``clientpFedMe`` runs them.

Every local step solves on a full mini-batch: Algorithm 1 samples a batch D of size |D| at each
step, and the authors' code and PFLlib leave out each epoch's last, partial batch. So pFedMe always
drops it (whatever ``train.drop_last`` says); otherwise theta_i, which is what K inner steps on the
epoch's last batch leave, would be fitted to the one or two samples a remainder can hold. A client
with fewer samples than a batch solves on all of them, as one batch.

Where the codes differ from the paper (CharlieDinh/pFedMe at caf24b1, PFLlib, FL-bench): their inner
solver adds an L2 term mu theta (mu = 0.001) that Eq. 3 does not have, and their server weighs the
uploads by training-set size where Eq. 9 takes the uniform mean; both follow the paper here. Their
personalised accuracy is not theta_i's: the authors' client stores the optimiser's own parameter
list, which after the w_i update holds w_i, and has every client train every round; PFLlib's, the
same list read after the server sends the new global model, holds w. A client's LM here is the
paper's theta_i as its last sampled round left it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from algorithms.base import Evaluation, lambda_setting, register
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.config import setting
from raysim.toolkit.aggregate import weighted_mean
from raysim.weights import GLOBAL_PARTS
from raysim.wire import ClientResult, JobResult, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class PFedMeConfig:
    lam: float = lambda_setting(15.0, above=0)  # lambda (``algo.lambda``)
    k_steps: int = setting(5, at_least=1)  # K
    personal_lr: float = setting(0.01, above=0)  # eta_p, the inner steps' rate
    beta: float = setting(1.0, above=0)  # the server's mixing


def solve_inner(
    model: SplitModel,
    params: Sequence[torch.Tensor],
    batch: tuple[torch.Tensor, torch.Tensor],
    local: Sequence[torch.Tensor],
    lam: float,
    lr: float,
    steps: int,
) -> float:
    """``steps`` gradient steps on f(theta; batch) + lambda/2 ||theta - local||^2 over ``params``
    (theta, in place). Returns the last f(theta; batch)."""
    import torch
    import torch.nn.functional as F

    x, y = batch
    loss = torch.zeros(())
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g, w in zip(params, grads, local, strict=True):
                p.sub_(lr * (g + lam * (p - w)))
    return float(loss.detach())


@register("pfedme")
class PFedMe(AveragedWeights):
    family = "personal"
    example_privacy = (
        'it solves its inner problem with its own gradient steps, outside the loop DP-SGD runs'
    )
    Config = PFedMeConfig
    has_personal_model = True
    pinned = True  # theta_i lives on i's home worker

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> GlobalState:
        uploads = [jr.final.weights for jr in results if jr.final.weights is not None]
        mean = weighted_mean(uploads, [1.0] * len(uploads))
        b = self.params.beta
        return GlobalState(weighted_mean([state.weights, mean], [1.0 - b, b]))

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        import torch

        from raysim.toolkit.train import TrainStats, batches_per_epoch, set_trainable

        p = self.params
        ctx.load(payload.weights)
        theta = set_trainable(ctx.model, GLOBAL_PARTS)
        local = [q.detach().clone() for q in theta]  # w_i
        losses: list[float] = []
        samples = 0
        drop = ctx.num_samples >= self.cfg.train.batch_size
        limit = None  # deployment.completeness: the client's share of its steps
        if ctx.work_fraction < 1:
            train = self.cfg.train
            limit = ctx.steps_done(
                train.local_epochs * batches_per_epoch(ctx.num_samples, train.batch_size, drop)
            )
        for epoch in range(self.cfg.train.local_epochs):
            for batch in ctx.batches(epoch, drop_last=drop):
                if limit is not None and len(losses) >= limit:
                    break
                losses.append(solve_inner(ctx.model, theta, batch, local, p.lam, p.personal_lr, p.k_steps))
                with torch.no_grad():
                    for w, t in zip(local, theta, strict=True):
                        w.sub_(payload.lr * p.lam * (w - t))
                samples += p.k_steps * int(batch[1].shape[0])
        ctx.samples_trained += samples
        ctx.keep(ctx.weights(GLOBAL_PARTS))  # theta_i, the personalised model
        with torch.no_grad():  # the upload: w_i (with the model's buffers, e.g. batch-norm statistics)
            for t, w in zip(theta, local, strict=True):
                t.copy_(w)
        stats = TrainStats(sum(losses) / len(losses) if losses else 0.0, len(losses), samples)
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))

    def evaluation(self, state: GlobalState) -> Evaluation:
        return PFedMeEvaluation(state.weights)


class PFedMeEvaluation(Evaluation):
    """The global weights; a client's personal model is the one it keeps (theta_i)."""

    def personal_model(self, algo: PFedMe, ctx: ClientContext) -> SplitModel:
        ctx.load(ctx.kept(GLOBAL_PARTS))
        return ctx.model


__all__ = ["PFedMe", "PFedMeConfig", "solve_inner"]
