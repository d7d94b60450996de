"""FedDyn ("Federated Learning Based on Dynamic Regularization", Acar et al., ICLR 2021, Algorithm 1),
a baseline of Fed3+2p's Table 1.

- Client k keeps the gradient term g_k on its home worker (``ctx.store``; zero before its first
  round). From theta^{t-1} it trains the whole model for E epochs on its dynamic regularised risk
  L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2, then updates
  g_k <- g_k - alpha (theta_k^t - theta^{t-1}) and uploads theta_k^t.
- Server, with h^0 = 0: h^t = h^{t-1} - alpha (1/N) sum_{k in P_t} (theta_k^t - theta^{t-1});
  theta^t = (1/|P_t|) sum_{k in P_t} theta_k^t - h^t / alpha (the uniform mean over the round's
  clients, as Algorithm 1 writes it; N the number of clients that train, the newcomers held out by
  ``eval.new_clients`` left out).
- The regulariser is the paper's squared norm (PFLlib's ``clientdyn`` uses the norm itself). The
  terms act on the trainable parameters; buffers (batch-norm statistics) are averaged as FedAvg's.
- Under client-level DP (docs/usage.md, "Privacy"; :meth:`FedDyn.private_aggregate`) a client's
  private upload is its change theta_k^t - theta^{t-1}, clipped to C; the noised sum S serves both of
  the server's steps: h^t = h^{t-1} - alpha S / N and theta^t = theta^{t-1} + S / m - h^t / alpha,
  m the expected cohort (the mean of the uploads is theta^{t-1} plus their mean change).
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
from raysim.toolkit.aggregate import apply_updates, subtract, weighted_mean
from raysim.weights import GLOBAL_PARTS, ModelWeights, map_parts
from raysim.wire import ClientResult, Job, JobResult, ServerContext, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.privacy.client_level import Release
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class FedDynConfig:
    alpha: float = setting(0.01, above=0)


@dataclass(frozen=True)
class DynState:
    weights: ModelWeights  # theta
    h: ModelWeights  # the server's state h


@register("feddyn")
class FedDyn(Algorithm[DynState]):
    family = "global"
    example_privacy: ClassVar[str | None] = None  # raysim.privacy.dp_sgd
    batching = Batching(
        why_not="its loss has each client's own linear term, kept on its home worker."
    )
    Config = FedDynConfig
    finetune = FineTune()  # "-FT" with algo.ft_epochs
    private_release = PrivateRelease(clipped="each client's change theta_k - theta, whose noised sum makes both server steps")

    def init(self, ctx: ServerContext) -> DynState:
        theta = ctx.init_weights.select(GLOBAL_PARTS)
        return DynState(theta, map_parts(np.zeros_like, theta))

    def plan(self, state: DynState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = WeightsPayload(state.weights, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]  # g_k lives on k's home worker

    def aggregate(self, state: DynState, rnd: int, results: Sequence[JobResult]) -> DynState:
        uploads = [jr.final.weights for jr in results if jr.final.weights is not None]
        alpha, n = self.params.alpha, len(self.cfg.training_clients)
        deltas = [subtract(w, state.weights) for w in uploads]  # theta_k - theta^{t-1}
        h = apply_updates(state.h, deltas, [alpha / n] * len(deltas))  # h - alpha/N sum delta
        mean = weighted_mean(uploads, [1.0] * len(uploads))
        return DynState(apply_updates(mean, [h], [1.0 / alpha]), h)

    def private_aggregate(self, state: DynState, rnd: int, results: Sequence[JobResult], release: Release) -> DynState:
        """The round under client-level DP: each client's change one unit; from their noised sum S,
        h <- h - alpha S / N and theta <- theta + S / m - h / alpha (m the expected cohort)."""
        uploads = [jr.final.weights for jr in results if jr.final.weights is not None]
        (s,) = release.noised_sums(0, [(subtract(w, state.weights),) for w in uploads], (state.weights,))
        alpha, n = self.params.alpha, len(self.cfg.training_clients)
        h = apply_updates(state.h, [s], [alpha / n])
        mean = apply_updates(state.weights, [s], [-1.0 / release.expected(len(self.cfg.training_clients))])
        return DynState(apply_updates(mean, [h], [1.0 / alpha]), h)

    def evaluation(self, state: DynState) -> Evaluation:
        return Evaluation(state.weights)

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        import torch

        from raysim.models import flat_from_parameters, parameter_views, parameters_of
        from raysim.toolkit.train import cross_entropy, proximal_anchor, proximal_term

        alpha = self.params.alpha
        ctx.load(payload.weights)
        anchor = proximal_anchor(ctx.model, GLOBAL_PARTS)  # theta^{t-1}
        g: ModelWeights | None = ctx.stored("gradient")
        linear = parameter_views(ctx.model, g, ctx.device) if g is not None else None

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = cross_entropy(model, x, y) + alpha / 2 * proximal_term(model, anchor, GLOBAL_PARTS)
            if linear is not None:
                params = parameters_of(model, GLOBAL_PARTS)
                out = out - torch.stack([(p * q).sum() for p, q in zip(params, linear, strict=True)]).sum()
            return out

        stats = ctx.train(GLOBAL_PARTS, payload.lr, loss_fn=loss)
        params = parameters_of(ctx.model, GLOBAL_PARTS)
        old = linear if linear is not None else [torch.zeros_like(p) for p in params]
        new = [o - alpha * (p.detach() - a) for o, p, a in zip(old, params, anchor, strict=True)]
        ctx.store("gradient", flat_from_parameters(ctx.model, GLOBAL_PARTS, new))
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))


__all__ = ["FedDyn", "FedDynConfig"]
