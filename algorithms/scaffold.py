"""SCAFFOLD ("SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", Karimireddy et al.,
ICML 2020, Algorithm 1 with option II), a baseline of FedDr+.

- Server state: the global model x and the server control variate c (zero at the start).
- Client i keeps its control variate c_i on its home worker between rounds (``ctx.store``; zero
  before its first round). From y = x it takes K local SGD steps on g(y) - c_i + c (the correction is added to each
  gradient, ``after_backward``), then sets c_i+ to the mean of the K stochastic gradients g(y) it
  saw, and uploads Delta y = y - x and Delta c = c_i+ - c_i. With plain SGD this is exactly option
  II, c_i - c + (x - y) / (K eta) (the K steps sum to K eta (mean g - c_i + c)); unlike that formula it
  stays right when the local optimiser has momentum or weight decay, as the common setups here do.
- Server: x <- x + eta_g * mean(Delta y) over the sampled clients, c <- c + (1/N) sum(Delta c)
  (``server_lr`` eta_g = 1), N the clients that train: the newcomers ``eval.new_clients`` holds out
  never train, so c stays the mean of the N c_i, as the paper's c = (1/N) sum c_i. A round sends x and c down and Delta y and Delta c up (twice FedAvg's).
- Under client-level DP (docs/usage.md, "Privacy"; :meth:`Scaffold.private_aggregate`) a client's
  private upload is the pair (Delta y, Delta c), clipped to C as one vector; the two noised sums go
  through the server's two updates with fixed denominators: x <- x + eta_g S_y / m (m the expected
  cohort, for the mean over the sampled clients), c <- c + S_c / N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from algorithms.base import Algorithm, Evaluation, register
from raysim.capabilities.batching import Batching
from raysim.capabilities.finetune import FineTune
from raysim.capabilities.private_release import PrivateRelease
from raysim.config import setting
from raysim.toolkit.aggregate import apply_updates, subtract
from raysim.weights import GLOBAL_PARTS, ModelWeights, map_parts
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    from raysim.privacy.client_level import Release
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class ScaffoldConfig:
    server_lr: float = setting(1.0, above=0)  # eta_g


@dataclass(frozen=True)
class ScaffoldPayload:
    weights: ModelWeights  # x
    control: ModelWeights  # c
    lr: float


@dataclass(frozen=True)
class ScaffoldState:
    weights: ModelWeights
    control: ModelWeights


def zeros_like(w: ModelWeights) -> ModelWeights:
    return map_parts(np.zeros_like, w)


@register("scaffold")
class Scaffold(Algorithm[ScaffoldState]):
    family = "global"
    example_privacy: ClassVar[str | None] = None  # raysim.privacy.dp_sgd
    batching = Batching(
        why_not="each step is corrected by the client's own control variate, which differs from client to "
        "client."
    )
    Config = ScaffoldConfig
    finetune = FineTune()  # "-FT" with algo.ft_epochs
    private_release = PrivateRelease(clipped="each client's (Delta y, Delta c), clipped as one vector")

    def init(self, ctx: ServerContext) -> ScaffoldState:
        x = ctx.init_weights.select(GLOBAL_PARTS)
        return ScaffoldState(x, zeros_like(x))

    def plan(self, state: ScaffoldState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = ScaffoldPayload(state.weights, state.control, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: ScaffoldState, rnd: int, results: Sequence[JobResult]) -> ScaffoldState:
        finals = [jr.final for jr in results]
        k = len(finals)
        dys = [r.weights for r in finals if r.weights is not None]  # Delta y
        dcs = [r.extra for r in finals]  # Delta c
        # apply_updates(w, u, a) = w - sum a u: x + eta_g/|S| sum dy, c + 1/N sum dc, N the clients
        # that train (newcomers held out by eval.new_clients keep no c_i and never take part)
        x = apply_updates(state.weights, dys, [-self.params.server_lr / k] * k)
        c = apply_updates(state.control, dcs, [-1.0 / len(self.cfg.training_clients)] * k)
        return ScaffoldState(x, c)

    def private_aggregate(
        self, state: ScaffoldState, rnd: int, results: Sequence[JobResult], release: Release
    ) -> ScaffoldState:
        """The round under client-level DP: each client's (Delta y, Delta c) one unit, clipped as one
        vector; x <- x + eta_g S_y / m over the expected cohort m (fixed: the unbiased estimate of
        the mean over the sampled clients), c <- c + S_c / N."""
        finals = [jr.final for jr in results]
        ups = [(r.weights, r.extra) for r in finals if r.weights is not None]
        s_y, s_c = release.noised_sums(0, ups, (state.weights, state.control))
        m = release.expected(len(self.cfg.training_clients))
        x = apply_updates(state.weights, [s_y], [-self.params.server_lr / m])
        c = apply_updates(state.control, [s_c], [-1.0 / len(self.cfg.training_clients)])
        return ScaffoldState(x, c)

    def evaluation(self, state: ScaffoldState) -> Evaluation:
        return Evaluation(state.weights)

    def local_update(self, ctx: ClientContext, payload: ScaffoldPayload) -> ClientResult:
        import torch

        from raysim.models import flat_from_parameters, parameter_views, parameters_of

        c_i: ModelWeights = ctx.stored("control", zeros_like(payload.control))
        correction = map_parts(lambda c, ci: (c - ci).astype(np.float32), payload.control, c_i)
        params = parameters_of(ctx.model, GLOBAL_PARTS)
        corrections = parameter_views(ctx.model, correction, ctx.device)  # c - c_i, per parameter
        sums = [torch.zeros_like(corr) for corr in corrections]

        def corrected() -> None:  # keep g(y), then step on g(y) - c_i + c
            for param, corr, acc in zip(params, corrections, sums, strict=True):
                if param.grad is not None:
                    acc.add_(param.grad)
                    param.grad.add_(corr)

        ctx.load(payload.weights)
        stats = ctx.train(GLOBAL_PARTS, payload.lr, after_backward=corrected)
        dy = subtract(ctx.weights(GLOBAL_PARTS), payload.weights)  # y - x
        steps = max(stats.steps, 1)
        c_new = flat_from_parameters(ctx.model, GLOBAL_PARTS, [acc / steps for acc in sums])  # mean g(y)
        ctx.store("control", c_new)
        return ctx.result(stats, weights=dy, extra=subtract(c_new, c_i))


__all__ = ["Scaffold", "ScaffoldConfig"]
