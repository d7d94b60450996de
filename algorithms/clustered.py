"""The clustered-FL family's shared server side: the clients are split into clusters, each cluster
has a model of its own, and FedAvg runs inside every cluster. CFL (clusters split while training),
PACFL and FedClust (clusters formed once, before training) are this base with their own way of
forming the clusters.

- Round r: a sampled client receives its cluster's model, trains it for E epochs (FedAvg's local
  update) and uploads it; each cluster's model becomes the training-set-size weighted mean of its
  participants' uploads (a cluster without participants keeps its model).
- A client's personalised model (LM on its P-Test) is its cluster's model. No single global model
  (``gm_*`` null), as the Fed3+2p paper's Table 1 reports these methods.
- TensorBoard and metrics.parquet: ``clusters`` (how many), ``cluster_size_max`` and
  ``cluster_size_min`` every round; the membership and sizes as text at round 1 and at every round
  the clusters change (computed on the server actor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from algorithms.base import Algorithm, Evaluation
from algorithms.clustering import Clusters, agglomerative, assignment, describe, nearest_cluster, purity
from algorithms.fedavg import train_global_parts
from raysim.capabilities.batching import Batching
from raysim.capabilities.extra_rounds import ExtraRounds
from raysim.capabilities.round_log import RoundLog
from raysim.engine.evaluation import adapt_newcomer
from raysim.toolkit.aggregate import weighted_mean
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext, WeightsPayload

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class ClusterState:
    clusters: Clusters  # each cluster's clients, sorted; clusters ordered by their first client
    models: tuple[ModelWeights, ...]  # one per cluster
    formed: int = 0  # the round the clusters last changed (0: before round 1)
    #: the algorithm's own per-round scalars (CFL's update norms)
    scalars: tuple[tuple[str, float], ...] = ()
    #: the algorithm's own state (CFL's updates since the clusters formed)
    extra: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class ClusterEval:
    cluster_of: tuple[int, ...]  # each client's cluster (-1: a client held out of training)
    models: tuple[ModelWeights, ...]
    #: with eval.new_clients, what a newcomer joins by (OneShotClustered): the clusters, the
    #: request the clients answered before round 1, and their answers (``Joining``)
    joining: Any = None


@dataclass(frozen=True)
class Joining:
    """What a newcomer needs to pick its cluster as the clients were clustered: the clusters, the
    request the clients answered before round 1, and each clustered client's answer."""

    clusters: Clusters
    request: Any
    uploads: tuple[tuple[int, Any], ...]  # (client, its upload), in client order


class ClusteredFL(Algorithm[ClusterState]):
    """A model per cluster, FedAvg inside each; subclasses form the clusters."""

    example_privacy: ClassVar[str | None] = None  # raysim.privacy.dp_sgd
    batching = Batching(
        why_not="its clients start from their own cluster's model, so a round's clients do not share one "
        "payload."
    )

    has_global_model = False
    has_personal_model = True
    round_log = RoundLog()

    def init(self, ctx: ServerContext) -> ClusterState:
        self._init = ctx.init_weights.select(GLOBAL_PARTS)
        # one cluster of the clients that train: a newcomer (eval.new_clients) is in none
        return ClusterState((tuple(self.cfg.training_clients),), (self._init,))

    def cluster_index(self, clusters: Clusters) -> np.ndarray:
        """Each client's cluster; -1 for a client held out of training (``eval.new_clients``)."""
        return assignment(clusters, self.cfg.clients, self.cfg.new_clients)

    def initial_models(self, clusters: Clusters) -> tuple[ModelWeights, ...]:
        """Every cluster starting from the seeded initial model."""
        return (self._init,) * len(clusters)

    def plan(self, state: ClusterState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        of = self.cluster_index(state.clusters)
        lr = self.lr(rnd)
        return [Job((c,), WeightsPayload(state.models[of[c]], lr)) for c in sampled]

    def cluster_means(
        self, clusters: Clusters, models: Sequence[ModelWeights], results: Sequence[JobResult]
    ) -> tuple[ModelWeights, ...]:
        """Each cluster's model: the weighted mean of its participants' uploads, else unchanged."""
        of = self.cluster_index(clusters)
        uploads: dict[int, list[ClientResult]] = {}
        for jr in results:
            uploads.setdefault(int(of[jr.final.client]), []).append(jr.final)
        out = []
        for k, model in enumerate(models):
            mine = [r for r in uploads.get(k, []) if r.weights is not None]
            out.append(
                weighted_mean(
                    [r.weights for r in mine if r.weights is not None], [r.num_samples for r in mine]
                )
                if mine
                else model
            )
        return tuple(out)

    def aggregate(self, state: ClusterState, rnd: int, results: Sequence[JobResult]) -> ClusterState:
        return ClusterState(
            state.clusters,
            self.cluster_means(state.clusters, state.models, results),
            state.formed,
            (),
            state.extra,
        )

    def evaluation(self, state: ClusterState) -> Evaluation:
        of = self.cluster_index(state.clusters)
        return ClusterEvaluation(ClusterEval(tuple(int(k) for k in of), state.models))

    def round_scalars(self, state: ClusterState, rnd: int) -> dict[str, float]:
        sizes = [len(c) for c in state.clusters]
        return {
            "clusters": float(len(sizes)),
            "cluster_size_max": float(max(sizes)),
            "cluster_size_min": float(min(sizes)),
            **purity(self.cfg, state.clusters),
            **dict(state.scalars),
        }

    def round_texts(self, state: ClusterState, rnd: int) -> dict[str, str]:
        return {"clusters": describe(state.clusters)} if rnd == max(state.formed, 1) else {}

    def local_update(self, ctx: ClientContext, payload: Any) -> ClientResult:
        return train_global_parts(ctx, payload)


class ClusterEvaluation(Evaluation):
    """A :class:`ClusterEval`; a client's personal model is its cluster's."""

    payload: ClusterEval

    def personal_model(self, algo: ClusteredFL, ctx: ClientContext) -> SplitModel:
        ctx.load(self.payload.models[self.payload.cluster_of[ctx.cid]])
        return ctx.model


class OneShotClustered(ClusteredFL):
    """Clusters formed once, before round 1 (PACFL, FedClust): in the prologue (round 0) every
    client that trains (all but ``eval.new_clients``') answers :meth:`prologue_payload` with
    :meth:`prologue_update` (its upload in ``ClientResult.extra``); the server makes a distance
    matrix of the uploads (:meth:`distances`) and clusters it hierarchically with the config's
    ``linkage``, merging within ``threshold`` (or down to ``num_clusters`` when that is positive).
    Every cluster starts from the initial model. With clients held out, the state keeps what a
    newcomer joins by (:class:`Joining`; :class:`OneShotEvaluation`)."""

    extra_rounds = ExtraRounds(prologue=True)

    def prologue_payload(self, state: ClusterState) -> Any:
        raise NotImplementedError

    def prologue_update(self, ctx: ClientContext, payload: Any) -> ClientResult:
        raise NotImplementedError

    def distances(self, uploads: Sequence[Any]) -> np.ndarray:
        raise NotImplementedError

    def plan(self, state: ClusterState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        if rnd == 0:
            payload = self.prologue_payload(state)
            return [Job((c,), payload) for c in sampled]
        return super().plan(state, rnd, sampled)

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer (``eval.new_clients``) answers the request of before round 1 and joins the
        nearest cluster (:meth:`OneShotEvaluation.newcomer_model`)."""
        return cfg.eval.new_clients > 0

    def aggregate(self, state: ClusterState, rnd: int, results: Sequence[JobResult]) -> ClusterState:
        if rnd > 0:
            return super().aggregate(state, rnd, results)
        got = {jr.final.client: jr.final.extra for jr in results}
        members = self.cfg.training_clients  # the clients held out of training answer nothing
        missing = [c for c in members if got.get(c) is None]
        if missing:
            raise ValueError(f"clients {missing} sent nothing before round 1")
        p = self.params
        found = agglomerative(
            self.distances([got[c] for c in members]),
            threshold=None if p.num_clusters else p.threshold,
            num_clusters=p.num_clusters or None,
            linkage=p.linkage,
        )
        clusters = tuple(tuple(members[i] for i in cluster) for cluster in found)  # ids, still sorted
        joining = None
        if self.cfg.new_clients:
            joining = Joining(clusters, self.newcomer_request(), tuple((c, got[c]) for c in members))
        return ClusterState(clusters, self.initial_models(clusters), extra=joining)

    def newcomer_request(self) -> Any:
        """What a newcomer is asked before it joins: the request of before round 1 (its initial
        model, where it carries one)."""
        return self.prologue_payload(ClusterState((tuple(self.cfg.training_clients),), (self._init,)))

    def evaluation(self, state: ClusterState) -> Evaluation:
        of = self.cluster_index(state.clusters)
        return OneShotEvaluation(ClusterEval(tuple(int(k) for k in of), state.models, state.extra))

    def local_update(self, ctx: ClientContext, payload: Any) -> ClientResult:
        if ctx.rnd == 0:
            return self.prologue_update(ctx, payload)
        return super().local_update(ctx, payload)


class OneShotEvaluation(ClusterEvaluation):
    """A :class:`ClusterEval` whose ``joining`` lets a newcomer pick its cluster."""

    def newcomer_model(self, algo: OneShotClustered, ctx: ClientContext) -> SplitModel | None:
        """A client held out of training joins as the clients were clustered: it answers the
        request of before round 1 on its own data (PACFL's subspaces, FedClust's warmed-up
        classifier), its distances to the clustered clients' answers are the algorithm's own
        (:meth:`OneShotClustered.distances`), and it joins the nearest cluster by the linkage's
        distance (:func:`algorithms.clustering.nearest_cluster`); that cluster's model is then
        adapted on its data for ``eval.new_client_epochs`` epochs, as a newcomer to a global model
        is (:func:`raysim.engine.evaluation.adapt_newcomer`)."""
        joining: Joining | None = self.payload.joining
        if joining is None:
            return None
        mine = algo.prologue_update(ctx, joining.request).extra
        ids = [c for c, _ in joining.uploads]
        dist = algo.distances([u for _, u in joining.uploads] + [mine])[-1, :-1]
        pos = {c: i for i, c in enumerate(ids)}
        k = nearest_cluster(dist, [[pos[c] for c in cluster] for cluster in joining.clusters], algo.params.linkage)
        ctx.load(self.payload.models[k])
        return adapt_newcomer(algo, ctx, GLOBAL_PARTS)


__all__ = ["ClusterEval", "ClusterEvaluation", "ClusterState", "ClusteredFL", "Joining", "OneShotClustered", "OneShotEvaluation"]
