"""Clustering clients on the server: agglomerative (hierarchical) clustering of a distance matrix,
and the two-way split of clustered FL. NumPy only; the server runs it inside its actor.

``agglomerative`` merges, step by step, the two nearest clusters, until the nearest two are farther
apart than ``threshold`` or ``num_clusters`` remain. The distance of a merged cluster to the others
follows the Lance-Williams update of the chosen linkage:

- ``single``: the nearest pair of members; ``complete``: the farthest pair;
- ``average`` (UPGMA): the mean over all pairs of members;
- ``weighted`` (WPGMA): the mean of the two merged clusters' distances, whatever their sizes; this
  is what PACFL's public code calls "average".

Ties go to the pair that comes first in row-major order, so a clustering is a function of the
matrix alone (the same on every executor).
"""

from __future__ import annotations

import typing
from collections.abc import Collection, Sequence
from typing import Any, Literal

import numpy as np

from raysim.errors import ConfigError

#: how clusters merge (scipy's names)
Linkage = Literal["single", "complete", "average", "weighted"]
LINKAGES: tuple[str, ...] = typing.get_args(Linkage)

Clusters = tuple[tuple[int, ...], ...]


def agglomerative(
    dist: np.ndarray,
    *,
    threshold: float | None = None,
    num_clusters: int | None = None,
    linkage: str = "average",
) -> Clusters:
    """Clusters of the indices 0..n-1 of the symmetric distance matrix ``dist``: merge while the
    nearest two clusters are at most ``threshold`` apart (when given) and more than
    ``num_clusters`` remain (when given). Each cluster sorted; clusters ordered by their smallest
    member."""
    if linkage not in LINKAGES:
        raise ConfigError(f"Unknown linkage '{linkage}'; use one of {', '.join(LINKAGES)}.")
    d = np.array(dist, dtype=np.float64)
    n = d.shape[0]
    if d.shape != (n, n):
        raise ValueError(f"a distance matrix must be square, not {d.shape}")
    d = (d + d.T) / 2
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    active = list(range(n))
    floor = max(num_clusters or 1, 1)
    while len(active) > floor:
        sub = d[np.ix_(active, active)]
        np.fill_diagonal(sub, np.inf)
        flat = int(np.argmin(sub))
        a, b = active[flat // len(active)], active[flat % len(active)]
        if threshold is not None and d[a, b] > threshold:
            break
        a, b = min(a, b), max(a, b)
        na, nb = len(members[a]), len(members[b])
        for k in active:
            if k in (a, b):
                continue
            if linkage == "single":
                v = min(d[a, k], d[b, k])
            elif linkage == "complete":
                v = max(d[a, k], d[b, k])
            elif linkage == "average":
                v = (na * d[a, k] + nb * d[b, k]) / (na + nb)
            else:  # weighted
                v = (d[a, k] + d[b, k]) / 2
            d[a, k] = d[k, a] = v
        members[a] += members.pop(b)
        active.remove(b)
    return tuple(sorted(tuple(sorted(m)) for m in members.values()))


def bipartition(similarity: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """CFL's split (Sattler et al. 2020, Algorithm 1: c1, c2 = argmin max_{i in c1, j in c2}
    alpha_ij): the two groups that minimise the largest similarity across them, found as
    complete-linkage clustering of -similarity into two."""
    if similarity.shape[0] < 2:
        raise ValueError("a bipartition needs at least two members")
    first, second = agglomerative(-similarity, num_clusters=2, linkage="complete")
    return first, second


def cosine_similarity(rows: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of the rows of ``rows`` (a zero row is orthogonal to all)."""
    x = np.asarray(rows, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1)
    unit = x / np.where(norm > 0, norm, 1.0)[:, None]
    return unit @ unit.T


def nearest_cluster(dist: np.ndarray, clusters: Sequence[Sequence[int]], linkage: Linkage) -> int:
    """The cluster a newcomer joins: ``dist[j]`` its distance to client ``j``, a cluster's distance
    the linkage's own over its members (single: the nearest member, complete: the farthest,
    average: the mean; weighted, whose merged rows depend on the order of the merges, the mean as
    well). The nearest cluster, the first of equals."""
    d = np.asarray(dist, dtype=np.float64)
    agg = {"single": np.min, "complete": np.max}.get(linkage, np.mean)
    scores = [float(agg(d[list(members)])) for members in clusters]
    return int(np.argmin(scores))


def assignment(clusters: Sequence[Sequence[int]], n: int, absent: Collection[int] = ()) -> np.ndarray:
    """The cluster index of each of ``n`` clients; -1 for a client of ``absent`` (held out of
    training, ``eval.new_clients``) in no cluster."""
    out = np.full(n, -1, dtype=np.int64)
    for k, members in enumerate(clusters):
        out[list(members)] = k
    missing = [c for c in np.flatnonzero(out < 0).tolist() if c not in absent]
    if missing:
        raise ValueError(f"clients {missing} are in no cluster")
    return out


def describe(clusters: Sequence[Sequence[int]]) -> str:
    """Markdown for TensorBoard: the sizes, then each cluster's members."""
    sizes = [len(c) for c in clusters]
    lines = [f"{len(clusters)} clusters, sizes {sizes}", ""]
    lines += [f"- cluster {k} ({len(c)}): {', '.join(map(str, c))}" for k, c in enumerate(clusters)]
    return "\n".join(lines)


__all__ = [
    "LINKAGES",
    "Clusters",
    "agglomerative",
    "assignment",
    "bipartition",
    "cosine_similarity",
    "describe",
    "nearest_cluster",
    "purity",
]


def purity(cfg: Any, clusters: Sequence[Sequence[int]]) -> dict[str, float]:
    """``{"cluster_purity": ...}`` under ``data.feature_shift`` (the share of clustered training
    clients in their cluster's most common domain, :func:`raysim.data.feature_shift.cluster_purity`),
    else nothing: a clustered algorithm's round log."""
    from raysim.data.feature_shift import cluster_purity

    value = cluster_purity(cfg, clusters)
    return {} if value is None else {"cluster_purity": value}

