"""q-FFL, trained by q-FedAvg ("Fair Resource Allocation in Federated Learning", Li, Sanjabi, Beirami
and Smith, ICLR 2020, Eq. 2 and Algorithm 2): the objective sum_k p_k F_k^(q+1)(w) / (q + 1), which
for q > 0 weighs a client by its loss to the power q, so the global model trades some mean accuracy
for the clients it serves worst (read them in ``gm_ptest_p10``, the mean over the worst 10%, and in
``gm_ptest_std``).

Each sampled client k reports its training loss at the received model, F_k(w^t) (the mean
cross-entropy over its training data, before it trains), trains E epochs as FedAvg's clients do to
w_k, and uploads w_k. The server, with L = 1/eta (the paper's estimate of the local Lipschitz
constant from the client rate eta of the round), forms

    Delta w_k = L (w^t - w_k),
    Delta_k = F_k^q Delta w_k,
    h_k = q F_k^(q-1) ||Delta w_k||^2 + L F_k^q,
    w^(t+1) = w^t - sum_k Delta_k / sum_k h_k

over the round's clients (Algorithm 2, lines 6-10; a loss below 1e-10 counts as 1e-10, so that
F^(q-1) stays finite). At q = 0 every h_k is L and the step is the uniform mean of the uploads:
FedAvg's weighted mean where the clients hold equal data (Algorithm 2 samples clients by their data
share and then averages uniformly; raysim samples uniformly, as it does for every algorithm).

L = 1/eta is the Lipschitz estimate of plain SGD's step (Algorithm 2's local updates; the authors'
code, litian96/fair_flearn, trains with ``GradientDescentOptimizer``), so the paper setup trains
without momentum: with momentum beta, w^t - w_k sums up to 1/(1 - beta) times the gradients L
assumes (10 times at raysim's default 0.9), and h_k's q F_k^(q-1) ||Delta w_k||^2 grows with its
square. A run that sets momentum (or ``paper_setup: false`` with the default) is q-FedAvg's step
on those larger Delta w_k. Many local steps do the same without momentum: over S steps
||Delta w_k||^2 grows as S^2 while Delta_k grows as S, so the server's step is about
1 / (1 + q L ||w^t - w_k||^2 / F_k) of the uploads' mean change; with a hundred steps a round at
q = 1 that is a small fraction, and the global model trains that much slower (the
pfl_benchmark_tries results page measures it against q). q defaults to 1; the authors' code
defaults to 0 (FedAvg) and the paper tunes q per dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from algorithms.base import register
from algorithms.fedavg import FedAvg, GlobalState
from algorithms.ifca import cluster_losses
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching
from raysim.config import setting
from raysim.registry import DatasetInfo
from raysim.setups import Source, Stated
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, JobResult, WeightsPayload

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientContext

#: the smallest loss the server raises to q - 1
MIN_LOSS = 1e-10


@dataclass(frozen=True)
class QFFLConfig:
    q: float = setting(1.0, at_least=0)  # the fairness exponent (0: FedAvg's uniform mean)


@register("qffl")
class QFFL(FedAvg):
    """FedAvg's clients, each also reporting its loss at the received model; q-FedAvg's server step."""
    family = "global"

    Config = QFFLConfig
    batching = Batching(why_not="each client first evaluates its own loss at the received model.")
    asynchronous = Asynchronous(why_not="its server step divides by the round's clients' h_k together.")

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, float]:
        return {"train.momentum": 0.0}

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        return {"train.momentum": Stated("Algorithm 2: local SGD, whose step L = 1/eta estimates")}

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        from raysim.toolkit.train import cross_entropy

        x, y = ctx.train_tensors()
        (loss,) = cluster_losses(ctx.model, x, y, [payload.weights], self.cfg.train.batch_size)
        ctx.load(payload.weights)
        stats = ctx.train(GLOBAL_PARTS, payload.lr, loss_fn=cross_entropy)
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS), extra=float(loss))

    def aggregate(self, state: GlobalState, rnd: int, results: Sequence[JobResult]) -> GlobalState:
        finals = [jr.final for jr in results if jr.final.weights is not None]
        if not finals:
            return state
        q, lipschitz = self.params.q, 1.0 / self.lr(rnd)
        names = state.weights.part_names
        x = {n: state.weights.part(n).astype(np.float64) for n in names}
        step = {n: np.zeros_like(x[n]) for n in names}
        h_total = 0.0
        for r in finals:
            assert r.weights is not None
            f = max(float(r.extra), MIN_LOSS)
            dw = {n: lipschitz * (x[n] - r.weights.part(n).astype(np.float64)) for n in names}
            norm2 = sum(float(np.einsum("i,i->", d, d)) for d in dw.values())
            for n in names:
                step[n] += f**q * dw[n]
            h_total += q * f ** (q - 1) * norm2 + lipschitz * f**q
        return GlobalState(ModelWeights(**{n: (x[n] - step[n] / h_total).astype(np.float32) for n in names}))


__all__ = ["QFFL", "QFFLConfig"]
