"""CFL ("Clustered Federated Learning: Model-Agnostic Distributed Multitask Optimization Under
Privacy Constraints", Sattler, Müller and Samek, IEEE TNNLS 2020, Algorithm 1): clusters split in
two, recursively, by the cosine similarity of the clients' updates, once a cluster's model is near a
stationary point of its members' joint objective but some members are not.

- Every cluster c has a model theta_c (all clients in one cluster at first). A sampled client i of
  cluster c trains theta_c for E epochs; its update is Delta_i = w_i - theta_c. The cluster's model
  moves by the size-weighted mean of its participants' updates, theta_c += sum_i |D_i|/|D_c| Delta_i
  (the paper's aggregation; the clustered base's weighted mean of uploads).
- The split test of a cluster after round r (Algorithm 1, with Sec. V's stopping criteria): the
  norm of the weighted mean update ||sum_i |D_i|/|D_c| Delta_i|| < eps1 (the cluster's model is
  near stationary) and the largest client update max_i ||Delta_i|| > eps2 (some client is not), for
  a cluster of more than ``min_cluster_size`` clients, from round ``start_round`` on.
- The split: alpha_ij = <Delta_i, Delta_j> / (||Delta_i|| ||Delta_j||), and the bipartition
  c1, c2 = argmin max_{i in c1, j in c2} alpha_ij (complete-linkage clustering of -alpha into two,
  :func:`algorithms.clustering.bipartition`). Each child starts from theta_c, moved by its own
  participants' mean update of the round. gamma_max = sqrt((1 - max cross alpha) / 2), the paper's
  measure of how well a split separates the two sides, is logged as ``cfl_gamma_max``.
- Scalars every round: ``cfl_mean_norm`` and ``cfl_max_norm``, the largest over the clusters that
  had participants (to compare with eps1 and eps2).
- LM = the client's cluster model; no global model (``gm_*`` null).

Partial participation (the paper has every client train every round): the norm criteria use the
round's participants of the cluster, as FL-bench's ``cfl`` does; the similarities use each member's
latest update since its cluster was formed, and a cluster splits only once every member has sent
one, so that no member is placed by guess (FL-bench instead counts a member that did not train this
round as orthogonal to all). Defaults eps1 = 0.4, eps2 = 1.6, min_cluster_size = 2 and
start_round = 20 are those of the authors' code (felisat/clustered-federated-learning) and
FL-bench; the norms scale with the model, the learning rate and E, so set them for your setup (the
per-round ``cfl_mean_norm`` and ``cfl_max_norm`` scalars show where they fall). The first split
test here is after round ``start_round`` (rounds count from 1); the authors' notebook tests from its
round 21 (``c_round > 20``) and FL-bench from its 21st, one round later. A cluster's model moves by
its participants' updates weighted by training-set size, as the paper's averaging; both codes take
the uniform mean. Newcomers held out of training (``eval.new_clients``) are in no cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from algorithms.base import register
from algorithms.clustered import ClusteredFL, ClusterState
from algorithms.clustering import bipartition, cosine_similarity
from raysim.config import setting
from raysim.weights import ModelWeights
from raysim.wire import JobResult


@dataclass(frozen=True)
class CFLConfig:
    eps1: float = setting(0.4, at_least=0)  # split only when the cluster's mean update norm is below this
    eps2: float = setting(1.6, at_least=0)  # ... and some client's update norm is above this
    min_cluster_size: int = setting(2, at_least=1)  # split clusters of more clients than this
    start_round: int = setting(20, at_least=1)  # split from this round on


def flat(w: ModelWeights) -> np.ndarray:
    return np.concatenate([a.astype(np.float64).ravel() for _, a in w.items()])


@register("cfl")
class CFL(ClusteredFL):
    family = "clustered"
    Config = CFLConfig

    def aggregate(self, state: ClusterState, rnd: int, results: Sequence[JobResult]) -> ClusterState:
        p = self.params
        n = self.cfg.clients
        of = self.cluster_index(state.clusters)
        # each member's latest update since its cluster formed (None: none yet)
        latest: list[np.ndarray | None] = list(state.extra) if state.extra is not None else [None] * n
        by_cluster: dict[int, list[tuple[int, int, np.ndarray]]] = {}
        for jr in results:
            r = jr.final
            if r.weights is None:
                raise ValueError("CFL's clients upload their models")
            k = int(of[r.client])
            delta = flat(r.weights) - flat(state.models[k])
            latest[r.client] = delta.astype(np.float32)
            by_cluster.setdefault(k, []).append((r.client, r.num_samples, delta))
        clusters: list[tuple[int, ...]] = []
        parents: list[ModelWeights] = []
        mean_norms, max_norms, gammas = [], [], []
        for k, members in enumerate(state.clusters):
            round_updates = by_cluster.get(k, [])
            mean_norm = max_norm = 0.0
            if round_updates:
                sizes = np.array([s for _, s, _ in round_updates], dtype=np.float64)
                mean = sum((s / sizes.sum()) * d for s, (_, _, d) in zip(sizes, round_updates, strict=True))
                mean_norm = float(np.linalg.norm(mean))
                max_norm = max(float(np.linalg.norm(d)) for _, _, d in round_updates)
                mean_norms.append(mean_norm)
                max_norms.append(max_norm)
            split = (
                round_updates
                and rnd >= p.start_round
                and len(members) > p.min_cluster_size
                and mean_norm < p.eps1
                and max_norm > p.eps2
                and all(latest[i] is not None for i in members)
            )
            if split:
                sim = cosine_similarity(np.stack([latest[i] for i in members]))  # type: ignore[misc]
                first, second = bipartition(sim)
                cross = float(sim[np.ix_(first, second)].max())
                gammas.append(float(np.sqrt(max(0.0, (1.0 - cross) / 2))))
                for half in (first, second):
                    clusters.append(tuple(sorted(members[j] for j in half)))
                    parents.append(state.models[k])
                for i in members:
                    latest[i] = None
            else:
                clusters.append(tuple(members))
                parents.append(state.models[k])
        order = sorted(range(len(clusters)), key=lambda j: clusters[j])
        clusters = [clusters[j] for j in order]
        parents = [parents[j] for j in order]
        models = self.cluster_means(tuple(clusters), parents, results)
        scalars = {}
        if mean_norms:
            scalars = {"cfl_mean_norm": max(mean_norms), "cfl_max_norm": max(max_norms)}
        if gammas:
            scalars["cfl_gamma_max"] = min(gammas)
        changed = tuple(clusters) != state.clusters
        return ClusterState(
            tuple(clusters),
            models,
            rnd if changed else state.formed,
            tuple(sorted(scalars.items())),
            tuple(latest),
        )


__all__ = ["CFL", "CFLConfig"]
