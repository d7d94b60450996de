"""Grouping clients by their label distributions (Fed3+2p's coordinators, Sec. 4).

- :func:`type_a_grouping`: Eq. 5, min sum_c KL(P_{D^c} || P_D) over C coordinators, P_{D^c} the label
  distribution of the union of coordinator c's clients and P_D the global one. Counts are balanced
  (sizes differ by at most 1; without a balance constraint one coordinator holding everyone is
  optimal, docs/algorithms.md marks this as a choice). Greedy (clients by decreasing size, each to the open
  coordinator that keeps the objective lowest), then improving swaps until none helps.
- :func:`type_b_grouping`: Eq. 10, min sum_c sum_{i<j in S_c} JS(P_i || P_j) over M non-empty groups
  (each unordered pair once; Eq. 10's ordered double sum is twice this). Greedy from farthest-point
  seeds (each remaining client to the group it adds the least pairwise JS to), then improving moves.

Plain NumPy functions: the server actor runs them once, the tests check them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_EPS = 1e-12


@dataclass(frozen=True)
class Grouping:
    groups: tuple[tuple[int, ...], ...]  # client ids of each group, sorted
    objective: float

    @property
    def assignment(self) -> np.ndarray:
        """The group of each client."""
        n = sum(len(g) for g in self.groups)
        out = np.full(n, -1, dtype=np.int64)
        for k, g in enumerate(self.groups):
            out[list(g)] = k
        return out


def _distributions(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=-1, keepdims=True)
    return counts / np.maximum(totals, _EPS)


def kl_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(p || q) in nats along the last axis, with 0 log 0 = 0."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(np.maximum(p, _EPS)) - np.log(np.maximum(q, _EPS))), 0.0)
    out: np.ndarray = terms.sum(axis=-1)
    return out


def js_divergence_matrix(counts: np.ndarray) -> np.ndarray:
    """Pairwise JS(P_i || P_j) (nats) between the rows' label distributions."""
    p = _distributions(counts)
    m = 0.5 * (p[:, None, :] + p[None, :, :])
    js = 0.5 * kl_divergence(p[:, None, :], m) + 0.5 * kl_divergence(p[None, :, :], m)
    out: np.ndarray = np.maximum(js, 0.0)
    np.fill_diagonal(out, 0.0)
    return out


# --------------------------------------------------------------------------------------------------
# Type A: balanced KL partition


def group_kl(
    label_counts: np.ndarray, groups: Sequence[Sequence[int]], reference: np.ndarray | None = None
) -> np.ndarray:
    """KL(P_{D^c} || P_D) of each group c: the label distribution of the union of its clients'
    data against ``reference``'s (class counts; default the union of every row of ``label_counts``)."""
    counts = np.asarray(label_counts, dtype=np.float64)
    q = _distributions(counts.sum(axis=0) if reference is None else np.asarray(reference, np.float64))
    group_counts = np.stack([counts[list(g)].sum(axis=0) for g in groups])
    out: np.ndarray = kl_divergence(_distributions(group_counts), q)
    return out


def type_a_objective(label_counts: np.ndarray, groups: Sequence[Sequence[int]]) -> float:
    """sum_c KL(P_{D^c} || P_D) (Eq. 5)."""
    return float(group_kl(label_counts, groups).sum())


def type_a_grouping(label_counts: np.ndarray, num_groups: int, max_passes: int = 100) -> Grouping:
    """Balanced KL partition of the clients into ``num_groups`` coordinators (Eq. 5)."""
    counts = np.asarray(label_counts, dtype=np.float64)
    n = counts.shape[0]
    if not 1 <= num_groups <= n:
        raise ValueError(f"cannot split {n} clients into {num_groups} coordinators")
    q = _distributions(counts.sum(axis=0))
    base, extra = divmod(n, num_groups)  # `extra` groups hold base + 1 clients
    members: list[list[int]] = [[] for _ in range(num_groups)]
    totals = np.zeros((num_groups, counts.shape[1]))

    def kl_of(c: np.ndarray) -> np.ndarray:
        return np.where(c.sum(axis=-1) > 0, kl_divergence(_distributions(c), q), 0.0)

    for i in sorted(range(n), key=lambda i: (-counts[i].sum(), i)):
        full = sum(len(m) == base + 1 for m in members)
        open_groups = [
            g
            for g in range(num_groups)
            if len(members[g]) < base or (len(members[g]) == base and full < extra)
        ]
        cand = np.array(open_groups)
        delta = kl_of(totals[cand] + counts[i]) - kl_of(totals[cand])
        g = int(cand[int(np.argmin(delta))])
        members[g].append(i)
        totals[g] += counts[i]

    # improving swaps (best improvement per pass over every pair of groups)
    for _ in range(max_passes):
        best: tuple[float, tuple[int, int, int, int] | None] = (-1e-12, None)
        current = kl_of(totals)
        for a in range(num_groups):
            for b in range(a + 1, num_groups):
                ia, ib = np.array(members[a]), np.array(members[b])
                diff = counts[ib][None, :, :] - counts[ia][:, None, :]  # moving j in, i out of a
                new_a = kl_of(totals[a] + diff)
                new_b = kl_of(totals[b] - diff)
                gain = new_a + new_b - current[a] - current[b]
                k = np.unravel_index(int(np.argmin(gain)), gain.shape)
                if gain[k] < best[0]:
                    best = (float(gain[k]), (a, b, int(ia[k[0]]), int(ib[k[1]])))
        if best[1] is None:
            break
        a, b, i, j = best[1]
        members[a][members[a].index(i)] = j
        members[b][members[b].index(j)] = i
        totals[a] += counts[j] - counts[i]
        totals[b] += counts[i] - counts[j]
    groups = tuple(tuple(sorted(m)) for m in members)
    return Grouping(groups, type_a_objective(counts, groups))


# --------------------------------------------------------------------------------------------------
# Type B: JS grouping


def type_b_objective(js: np.ndarray, groups: tuple[tuple[int, ...], ...] | list[list[int]]) -> float:
    """sum_c sum_{i<j in S_c} JS(P_i || P_j) (Eq. 10, each pair once)."""
    return float(sum(js[np.ix_(list(g), list(g))].sum() / 2 for g in groups))


def type_b_grouping(label_counts: np.ndarray, num_groups: int, max_passes: int = 1000) -> Grouping:
    """Non-empty groups of clients with similar label distributions (Eq. 10)."""
    counts = np.asarray(label_counts, dtype=np.float64)
    n = counts.shape[0]
    if not 1 <= num_groups <= n:
        raise ValueError(f"cannot split {n} clients into {num_groups} groups")
    js = js_divergence_matrix(counts)
    # farthest-point seeds: the most atypical client first, then the client farthest from every seed
    seeds = [int(np.argmax(js.sum(axis=1)))]
    while len(seeds) < num_groups:
        nearest = js[:, seeds].min(axis=1)
        nearest[seeds] = -1.0
        seeds.append(int(np.argmax(nearest)))
    members: list[list[int]] = [[s] for s in seeds]
    rest = [i for i in range(n) if i not in set(seeds)]
    # clients closest to a seed first: the clear cases settle the groups before the ambiguous ones
    rest.sort(key=lambda i: (float(js[i, seeds].min()), i))
    for i in rest:
        added = [js[i, m].sum() for m in members]
        members[int(np.argmin(added))].append(i)

    # improving moves: one client to another group, keeping every group non-empty
    for _ in range(max_passes):
        cost = np.stack([js[:, m].sum(axis=1) for m in members], axis=1)  # (n, groups): JS to each group
        group_of = np.empty(n, dtype=np.int64)
        for g, m in enumerate(members):
            group_of[m] = g
        own = cost[np.arange(n), group_of]
        gain = cost - own[:, None]  # change of the objective when i moves to g
        gain[np.arange(n), group_of] = np.inf
        sizes = np.array([len(m) for m in members])
        gain[sizes[group_of] == 1, :] = np.inf
        flat = np.unravel_index(int(np.argmin(gain)), gain.shape)
        i, g = int(flat[0]), int(flat[1])
        if not gain[i, g] < -1e-12:
            break
        members[int(group_of[i])].remove(i)
        members[g].append(i)
    groups = tuple(tuple(sorted(m)) for m in members)
    return Grouping(groups, type_b_objective(js, groups))
