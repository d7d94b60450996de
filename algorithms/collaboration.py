"""FedPAC's classifier collaboration (the FedPAC reproduction report, Eq. 4-5; details as the
authors' released code ``get_head_agg_weight`` does them): for client i, weights alpha_i over
the sampled clients' heads from

    min_alpha  alpha^T P alpha   s.t.  alpha >= 0,  sum(alpha) = 1,
    P[j, k] = sum_c (h_i[c] - h_j[c])^T (h_i[c] - h_k[c]) + delta_jk * V_j,

with h_j = H_j (rows p_j(c) mu_j(c)) and V_j the clients' statistics. A P that is not positive
semi-definite (round-off) is repaired by clipping its eigenvalues at zero; weights below 1e-3 are
zeroed and the rest renormalised; if the solver fails, client i keeps its own head (alpha = e_i).
Solved with cvxpy on the server.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

SMALL_WEIGHT = 1e-3


def collaboration_matrix(h: np.ndarray, v: np.ndarray, i: int) -> np.ndarray:
    """P for client ``i``: ``h`` (K, C, d) the sampled clients' H, ``v`` (K,) their V."""
    diff = (np.asarray(h, dtype=np.float64)[i][None] - np.asarray(h, dtype=np.float64)).reshape(len(h), -1)
    return diff @ diff.T + np.diag(np.asarray(v, dtype=np.float64))


def repair_psd(p: np.ndarray) -> np.ndarray:
    """The nearest (Frobenius) positive semi-definite matrix: symmetrise, clip eigenvalues at 0."""
    sym = (p + p.T) / 2
    w, q = np.linalg.eigh(sym)
    out: np.ndarray = (q * np.clip(w, 0.0, None)) @ q.T
    return out


def solve_weights(p: np.ndarray, i: int) -> np.ndarray:
    """alpha minimising alpha^T P alpha on the simplex, with small weights zeroed; e_i on failure."""
    import cvxpy as cp

    k = p.shape[0]
    fallback = np.zeros(k)
    fallback[i] = 1.0
    if not np.isfinite(p).all():
        log.warning("FedPAC: client position %d has non-finite statistics; own head kept", i)
        return fallback
    alpha = cp.Variable(k)
    try:
        sym = (p + p.T) / 2
        w, q = np.linalg.eigh(sym)
        if w.min() < 0:
            sym = repair_psd(sym)
            w, q = np.linalg.eigh(sym)
        root = q * np.sqrt(np.clip(w, 0.0, None))  # P = root @ root.T
        problem = cp.Problem(cp.Minimize(cp.sum_squares(root.T @ alpha)), [alpha >= 0, cp.sum(alpha) == 1])
        problem.solve(solver=cp.CLARABEL)
    except (cp.error.SolverError, np.linalg.LinAlgError) as e:
        log.warning("FedPAC: the weights of client position %d were not solved (%s); own head kept", i, e)
        return fallback
    if alpha.value is None or problem.status not in ("optimal", "optimal_inaccurate"):
        return fallback
    a = np.where(alpha.value > SMALL_WEIGHT, alpha.value, 0.0)
    if a.sum() <= 0:
        return fallback
    out: np.ndarray = a / a.sum()
    return out


def combination_weights(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The (K, K) matrix whose row i is client i's alpha over the K sampled clients."""
    return np.stack([solve_weights(collaboration_matrix(h, v, i), i) for i in range(len(v))])


__all__ = ["collaboration_matrix", "combination_weights", "repair_psd", "solve_weights"]
