"""FedAMP ("Personalized Cross-Silo Federated Learning on Non-IID Data", Huang et al., AAAI 2021,
Algorithm 1), a baseline of FedFCD's Table 1: attentive message passing between personalised models.

- Every client i has a personalised model w_i (on its home worker; the server keeps the latest one
  each client uploaded). For a sampled client the server builds its cloud model
  u_i = xi_ii w_i + sum_{j != i} xi_ij w_j over the clients with a model (Eq. 7), with
  xi_ij = alpha_k A'(||w_i - w_j||^2) for j != i and xi_ii = 1 - sum_{j != i} xi_ij, where
  A(x) = 1 - exp(-x / sigma) and so A'(x) = exp(-x / sigma) / sigma (Sec. 4's attention-inducing
  function): the nearer w_j is to w_i, the more weight it gets. Where alpha_k sum_j A' exceeds 1,
  the weights are scaled to sum to 1 (xi_ii = 0), so that xi_i is always a distribution (the paper
  asks alpha_k small enough for it).
- Client i trains w_i for E epochs on CE + lambda / (2 alpha_k) ||w_i - u_i||^2 (Eq. 8) and uploads it.
- A client not yet sampled has the initial model. LM = w_i; no global model (``gm_*`` null). As
  PFLlib's ``serveramp`` does, with the paper's squared norm.
- A newcomer (``eval.new_clients``) is a client that has uploaded no model: its attention row is
  empty and its cloud model its own initial model (as :meth:`FedAMP.plan` gives a client's first
  round), so it trains the initial model on Eq. 8 with u_i = w_i = that model, for
  ``eval.new_client_epochs`` epochs: nothing reaches it from the federation before it uploads.
- TensorBoard: the round's attention matrix (a row per sampled client) as a heat map.

At the defaults (alpha_k 1e3, sigma 1e5, lambda 1) the attention is close to flat and the pull
weak: each neighbour's xi_ij = alpha_k exp(-x / sigma) / sigma is at most alpha_k / sigma = 0.01,
nearly the same for every neighbour until the squared distances reach the order of sigma,
and the proximal coefficient lambda / (2 alpha_k) = 5e-4 moves w_i about 1e-5 of the way to u_i a
step at rate 0.01; a client trains close to alone. PFLlib's defaults are 1, 1 and 1 with the
norm itself rather than its square. Tune them (``algo.alpha_k``, ``algo.sigma``, ``algo.lambda``)
for a model and rate; the attention heat map shows how far apart they tell the clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, Evaluation, lambda_setting, register
from raysim.capabilities.round_log import RoundLog
from raysim.config import setting
from raysim.toolkit.aggregate import weighted_mean
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class FedAMPConfig:
    #: alpha_k, sigma and lambda: choices of the paper's order (it tunes them per dataset); sigma is
    #: on the scale of the squared distances between models, which grow with the model's size
    alpha_k: float = setting(1e3, above=0)
    sigma: float = setting(1e5, above=0)
    lam: float = lambda_setting(1.0, at_least=0)  # lambda (``algo.lambda``)


@dataclass(frozen=True)
class AMPPayload:
    cloud: ModelWeights  # u_i
    lr: float


@dataclass(frozen=True)
class AMPState:
    models: tuple[ModelWeights | None, ...]  # each client's latest w_j (None: none yet)
    attention: np.ndarray  # (K, N): the last round's xi rows of its sampled clients
    sampled: tuple[int, ...]


def attention(models: Sequence[ModelWeights | None], i: int, alpha_k: float, sigma: float) -> np.ndarray:
    """xi_i over all clients (zero for those without a model): alpha_k A'(||w_i - w_j||^2) for the
    others, the rest on i; a distribution."""
    flat = [np.concatenate([a.astype(np.float64) for _, a in m.items()]) if m is not None else None for m in models]
    wi = flat[i]
    xi = np.zeros(len(models))
    if wi is None:
        return xi
    for j, wj in enumerate(flat):
        if j != i and wj is not None:
            d = float(np.sum((wi - wj) ** 2))
            xi[j] = alpha_k * np.exp(-d / sigma) / sigma
    total = xi.sum()
    if total > 1.0:
        xi /= total
    xi[i] = 1.0 - xi.sum()
    return xi


@register("fedamp")
class FedAMP(Algorithm[AMPState]):
    family = "personal"
    Config = FedAMPConfig
    has_global_model = False
    has_personal_model = True
    round_log = RoundLog()

    def init(self, ctx: ServerContext) -> AMPState:
        self._init = ctx.init_weights.select(GLOBAL_PARTS)
        return AMPState((None,) * self.cfg.clients, np.zeros((0, self.cfg.clients)), ())

    def plan(self, state: AMPState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        models = [m if m is not None else self._init for m in state.models]
        jobs = []
        for i in sampled:
            xi = attention(state.models, i, self.params.alpha_k, self.params.sigma)
            cloud = models[i] if xi.sum() == 0 else weighted_mean([models[j] for j in np.flatnonzero(xi)], xi[xi > 0].tolist())
            jobs.append(Job((i,), AMPPayload(cloud, self.lr(rnd)), pinned=True))
        return jobs

    def aggregate(self, state: AMPState, rnd: int, results: Sequence[JobResult]) -> AMPState:
        rows = np.stack([attention(state.models, jr.final.client, self.params.alpha_k, self.params.sigma) for jr in results])
        models = list(state.models)
        for jr in results:
            models[jr.final.client] = jr.final.weights
        return AMPState(tuple(models), rows, tuple(jr.final.client for jr in results))

    def round_images(self, state: AMPState, rnd: int) -> dict[str, np.ndarray]:
        from raysim.results.tensorboard import heat_map

        return {"attention": heat_map(state.attention)} if state.attention.size else {}

    def local_update(self, ctx: ClientContext, payload: AMPPayload) -> ClientResult:
        ctx.load(payload.cloud)
        loss = self.objective(ctx)
        ctx.load(ctx.kept(GLOBAL_PARTS))  # w_i goes on from itself
        stats = ctx.train(GLOBAL_PARTS, payload.lr, loss_fn=loss)
        ctx.keep(ctx.weights(GLOBAL_PARTS))
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))

    def objective(self, ctx: ClientContext) -> Any:
        """Eq. 8's loss, CE + lambda / (2 alpha_k) ||w - u_i||^2, u_i the model loaded now."""
        from raysim.toolkit.train import cross_entropy, proximal_anchor, proximal_term

        anchor = proximal_anchor(ctx.model, GLOBAL_PARTS)  # u_i
        coef = self.params.lam / (2 * self.params.alpha_k)

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return cross_entropy(model, x, y) + coef * proximal_term(model, anchor, GLOBAL_PARTS)

        return loss

    def evaluation(self, state: AMPState) -> Evaluation:
        return AMPEvaluation()

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer trains its initial model on Eq. 8 alone (:meth:`AMPEvaluation.newcomer_model`)."""
        return cfg.eval.new_clients > 0


class AMPEvaluation(Evaluation):
    """No payload (there is no global model); a client's personal model is the one it keeps."""

    def personal_model(self, algo: FedAMP, ctx: ClientContext) -> SplitModel:
        ctx.load(ctx.kept(GLOBAL_PARTS))
        return ctx.model

    def newcomer_model(self, algo: FedAMP, ctx: ClientContext) -> SplitModel:
        """A client held out of training, which has uploaded no model: u_i and w_i its initial model
        (no attention reaches a client without one), w_i trained on Eq. 8 for ``eval.new_client_epochs``."""
        from raysim.engine.evaluation import adapt_newcomer

        self.personal_model(algo, ctx)  # never trained: the initial model, its u_i too
        return adapt_newcomer(algo, ctx, GLOBAL_PARTS, algo.objective(ctx))


__all__ = ["FedAMP", "FedAMPConfig", "attention"]
