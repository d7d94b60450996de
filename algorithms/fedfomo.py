"""FedFomo (Zhang, Sapra, Fidler, Yeung and Alvarez, "Personalized Federated Learning with First
Order Model Optimization", ICLR 2021, Eq. 3-6 and Algorithm 1): each client combines the models of
the clients that help it, weighted by how much each lowers its validation loss per unit of distance.

- The server keeps every client's latest uploaded model (the model store) and an affinity matrix P
  (N x N). Before a client's first upload the store holds the initial model for it, as PFLlib's
  ``serverfomo.py`` does (its ``client_models`` start as copies of the initial global model); the
  authors' code (NVlabs/FedFomo ``server.py``) offers only the models uploaded in the round before,
  and has every client train alone in its round 0.
- Download (Sec. 3.3): each sampled client i gets M = ``m`` (default 5, PFLlib's ``-M``; the
  authors' config downloads 8, ``NUM_UPDATE_CLIENTS``) of the other clients' stored models,
  chosen one by one, epsilon-greedily as the authors' ``Client.get_federating_clients``: with
  probability epsilon_t a random one not yet chosen, else the one of highest affinity P[i, n]
  (ties broken at random), with epsilon_t = max(``epsilon`` - (t - 1) ``epsilon_decay``, 0) in round
  t (the authors' 0.3 and 0.05 a round). Every draw is from (seed, round, client). The client's own
  model is never downloaded: it has it (the authors' list of federating clients starts with the
  client itself), nor is that of a client held out of training (``eval.new_clients``), which has
  none. ``m`` above the other training clients' count is refused.
- Cost: each sampled client downloads M models a round, M times the model's bytes (raysim counts
  them: the payload's arrays), against FedAvg's one; the upload is one model and M + 1 weights. The
  server holds N models.
- Weights: on its validation part (``data.val_fraction``: the paper's setup sets 0.2 of a
  client's data, as the authors' ``CLIENT.VAL_SPLIT``), client i computes
  w_n = (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i|| for each candidate theta_n, with
  theta_i its baseline, L_i the mean cross-entropy (the model in evaluation mode) and the norm the
  Euclidean one over the model's whole flat state (parameters and BatchNorm statistics, what the
  authors' update combines); a model at distance 0 gets 0. The candidates are the client's own
  model as its last training left it and the M downloaded ones; the baseline is its model before
  that training, the update it trained from (the authors' ``--baseline_model first_model``, which
  their README runs, with the client itself first among its federating clients, ``clients =
  [self]``; PFLlib's ``old_model``, with the client's own stored model among those it gets back).
  So the client's own training is weighed like any other model's: kept as far as it lowered the
  validation loss, and not thrown away when another model lowers it too.
- Update: theta_i <- theta_i + sum_n w_n (theta_n - theta_i) (in float64) with the weights
  max(w_n, 0) normalised to sum 1 (the baseline itself where no weight is positive), then E epochs
  of cross-entropy; the client keeps the update as its next baseline, and uploads its trained model
  and the signed weights it computed.
- Affinity (Sec. 3.3): P[i, n] += w_n / |sum_n w_n|, the sum over every candidate (the client's own
  included), with the signed weights (not clipped), as the authors'
  ``Federation.update_client_weights`` normalises them. P starts at 0 (the authors'
  ``client_weights``; the self-weight P[i, i] is never read, since a client never downloads its
  own model).
- LM = theta_i (kept on the client's home worker; the initial model before it first trains). No
  global model (``gm_*`` null): neither the paper nor PFLlib evaluates one.
- A run without validation parts (``data.val_fraction`` 0, as ``paper_setup: false`` leaves it) is
  refused.

Read: NVlabs/FedFomo (commit fae2375: ``server.py``, ``client.py``, ``federation.py`` and
``federated/configs.py``: epsilon 0.3 decayed by 0.05 a round, the validation split, the update
over every entry of the state dict, the affinity update, the baseline and candidates in
``client.py``'s ``get_federating_clients`` and ``federation.py``'s ``compute_fomo_weights``, read
again at fe04f66) and PFLlib's ``serverfomo.py`` (commit 0950923: the store starting from the
initial model, the top-M download) and ``clientfomo.py`` (commit 20524d4). Where the two differ,
the store and the choice among every other client are PFLlib's, the exploration and the affinity
update the authors'. The authors' distance defaults to the L1 norm over the parameters
(``--model_delta_norm l1``); the Euclidean one here is the paper's ||.|| and PFLlib's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Algorithm, Evaluation, register
from raysim import rng
from raysim.config import ExperimentConfig, setting
from raysim.engine.evaluation import adapt_newcomer
from raysim.errors import ConfigError
from raysim.registry import DatasetInfo
from raysim.setups import Choice, Source
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class FedFomoConfig:
    m: int = setting(5, at_least=1)  # M: the models each sampled client downloads (PFLlib's default)
    epsilon: float = setting(0.3, at_least=0, at_most=1)  # the exploration probability of round 1
    epsilon_decay: float = setting(0.05, at_least=0)  # taken off epsilon every round


#: the client's stored baseline: the update its last training started from
BASELINE = "fedfomo/baseline"


@dataclass(frozen=True)
class FomoPayload:
    models: tuple[ModelWeights, ...]  # the M downloaded theta_n
    ids: tuple[int, ...]  # whose they are
    lr: float


@dataclass(frozen=True)
class FomoUpload:
    ids: tuple[int, ...]  # the candidates: the client itself, then the downloaded models' owners
    weights: np.ndarray  # the signed w_n (before clipping), float64


@dataclass(frozen=True)
class FomoState:
    models: tuple[ModelWeights, ...]  # the model store: each client's latest upload
    affinity: np.ndarray  # P, (N, N)


def fomo_weights(own_loss: float, losses: Sequence[float], distances: Sequence[float]) -> np.ndarray:
    """The first-order weights: w_n = (L(theta_i) - L(theta_n)) / ||theta_n - theta_i||, 0 where the distance is 0."""
    drop = own_loss - np.asarray(losses, dtype=np.float64)
    dist = np.asarray(distances, dtype=np.float64)
    return np.where(dist > 0, drop / np.where(dist > 0, dist, 1.0), 0.0)


def fomo_update(own: ModelWeights, models: Sequence[ModelWeights], weights: np.ndarray) -> ModelWeights:
    """The update with the weights clipped at 0 and normalised: theta_i + sum_n w_n (theta_n - theta_i);
    theta_i itself when no weight is positive."""
    w = np.maximum(weights, 0.0)
    if w.sum() <= 0:
        return own
    w = w / w.sum()

    def part(name: str) -> np.ndarray:
        base = own.part(name).astype(np.float64)
        step = sum(wn * (m.part(name).astype(np.float64) - base) for wn, m in zip(w, models, strict=True))
        out: np.ndarray = (base + step).astype(np.float32)
        return out

    return ModelWeights(**{name: part(name) for name in own.part_names})


def distance(a: ModelWeights, b: ModelWeights) -> float:
    """||a - b|| over every part both carry, in float64."""
    return float(np.sqrt(sum(np.sum((x.astype(np.float64) - b.part(n)) ** 2) for n, x in a.items())))


def choose_models(
    affinity_row: np.ndarray, others: Sequence[int], m: int, epsilon: float, g: np.random.Generator
) -> list[int]:
    """M of ``others`` for a client whose affinities are ``affinity_row``, one by one: with
    probability ``epsilon`` a random one not yet chosen, else the one of highest affinity not yet
    chosen (ties broken at random)."""
    others = list(others)
    tie = g.random(len(others))
    ranked = [others[k] for k in np.lexsort((tie, -affinity_row[others]))]  # highest first
    shuffled = [others[k] for k in g.permutation(len(others))]
    chosen: list[int] = []
    for _ in range(min(m, len(others))):
        pool = shuffled if g.random() < epsilon else ranked
        chosen.append(next(n for n in pool if n not in chosen))
    return chosen


def mean_loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> float:
    """The mean cross-entropy of ``model`` (in evaluation mode) over ``x``, ``y``."""
    import torch
    import torch.nn.functional as F

    model.eval()
    total = 0.0
    with torch.no_grad():
        for a in range(0, int(y.shape[0]), chunk):
            total += float(F.cross_entropy(model(x[a : a + chunk]), y[a : a + chunk], reduction="sum"))
    return total / max(int(y.shape[0]), 1)


@register("fedfomo")
class FedFomo(Algorithm[FomoState]):
    """A model store and an affinity matrix on the server; each client's first-order combination of
    the M models it downloads, then E epochs, on its home worker."""
    family = "personal"

    Config = FedFomoConfig
    has_global_model = False
    has_personal_model = True

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        """A validation part of each client's data, which the weights are computed on."""
        return {"data.val_fraction": 0.2}

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        return {
            "data.val_fraction": Choice("the authors' code: CLIENT.VAL_SPLIT 0.2 of a client's local data")
        }

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: FedFomoConfig) -> None:
        if cfg.data.val_fraction <= 0:
            raise ConfigError(
                "FedFomo weighs the downloaded models on each client's validation part: set "
                "data.val_fraction (its paper setup sets 0.2)."
            )
        others = len(cfg.training_clients) - 1
        if params.m > others:
            raise ConfigError(
                f"FedFomo's algo.m ({params.m}) must be at most the other training clients ({others}): "
                "a client downloads other clients' models."
            )

    # ---------------------------------------------------------------------------------------- server
    def init(self, ctx: ServerContext) -> FomoState:
        start = ctx.init_weights.select(GLOBAL_PARTS)
        n = self.cfg.clients
        return FomoState((start,) * n, np.zeros((n, n)))

    def plan(self, state: FomoState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        p = self.params
        eps = max(p.epsilon - (rnd - 1) * p.epsilon_decay, 0.0)
        jobs = []
        training = self.cfg.training_clients  # a client held out (eval.new_clients) has no model to offer
        for i in sampled:
            g = rng.generator(self.cfg.seed, "fedfomo/download", rnd, i)
            ids = choose_models(state.affinity[i], [n for n in training if n != i], p.m, eps, g)
            payload = FomoPayload(tuple(state.models[n] for n in ids), tuple(ids), self.lr(rnd))
            jobs.append(Job((i,), payload, pinned=True))
        return jobs

    def aggregate(self, state: FomoState, rnd: int, results: Sequence[JobResult]) -> FomoState:
        models = list(state.models)
        affinity = state.affinity.copy()
        for jr in results:
            res = jr.final
            assert res.weights is not None, "a FedFomo client uploads its model"
            models[res.client] = res.weights
            up: FomoUpload = res.extra
            scale = abs(float(up.weights.sum()))
            if scale < 1e-9:  # (the authors' guard)
                scale += 1e-9
            affinity[res.client, list(up.ids)] += up.weights / scale
        return FomoState(tuple(models), affinity)

    def evaluation(self, state: FomoState) -> Evaluation:
        """No global model; for each client held out of training (``eval.new_clients``), the M
        stored models it would download on joining: its affinity row is all zeros, so the choice is
        a seeded draw among the training clients, the same at every evaluation."""
        training = self.cfg.training_clients
        offers = {}
        for c in self.cfg.new_clients:
            g = rng.generator(self.cfg.seed, "fedfomo/newcomer", 0, c)
            ids = choose_models(state.affinity[c], list(training), self.params.m, 0.0, g)
            offers[c] = tuple(state.models[n] for n in ids)
        return FomoEvaluation(offers)

    @classmethod
    def evaluates_newcomers(cls, cfg: ExperimentConfig) -> bool:
        """A newcomer combines the M models it downloads (FomoEvaluation.newcomer_model)."""
        return bool(cfg.eval.new_clients > 0)

    # ---------------------------------------------------------------------------------------- client
    def weigh(self, ctx: ClientContext, own: ModelWeights, models: Sequence[ModelWeights]) -> np.ndarray:
        """The weight w_n of each of ``models`` against ``own`` on the client's validation part."""
        x, y = ctx.val_tensors()

        def loss(weights: ModelWeights) -> float:
            ctx.load(weights)
            return mean_loss(ctx.model, x, y)

        return fomo_weights(loss(own), [loss(m) for m in models], [distance(m, own) for m in models])

    def local_update(self, ctx: ClientContext, payload: FomoPayload) -> ClientResult:
        own = ctx.kept(GLOBAL_PARTS)  # as its last training left it (the initial model before)
        baseline: ModelWeights = ctx.stored(BASELINE, own)  # what that training started from
        candidates = (own, *payload.models)
        weights = self.weigh(ctx, baseline, candidates)
        update = fomo_update(baseline, candidates, weights)
        ctx.store(BASELINE, update)
        ctx.load(update)
        stats = ctx.train(GLOBAL_PARTS, payload.lr)
        trained = ctx.weights(GLOBAL_PARTS)
        ctx.keep(trained)
        return ctx.result(stats, weights=trained, extra=FomoUpload((ctx.cid, *payload.ids), weights))


class FomoEvaluation(Evaluation):
    """No global model; a client's personal model is the one it keeps. The payload: for each
    newcomer (``eval.new_clients``), the M stored models it downloads. A newcomer starts as a client
    joining does: its own model is the initial one, it weighs the M models against it on its
    validation part, takes the first-order update and trains it for ``eval.new_client_epochs``."""

    def personal_model(self, algo: FedFomo, ctx: ClientContext) -> SplitModel:
        ctx.load(ctx.kept(GLOBAL_PARTS))
        return ctx.model

    def newcomer_model(self, algo: FedFomo, ctx: ClientContext) -> SplitModel:
        own = ctx.initial_weights.select(GLOBAL_PARTS)
        models = self.payload[ctx.cid]
        ctx.load(fomo_update(own, models, algo.weigh(ctx, own, models)))
        return adapt_newcomer(algo, ctx, GLOBAL_PARTS)


__all__ = [
    "FedFomo",
    "FedFomoConfig",
    "FomoPayload",
    "FomoState",
    "FomoUpload",
    "choose_models",
    "distance",
    "fomo_update",
    "fomo_weights",
]
