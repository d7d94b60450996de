"""Server-side prototype arithmetic (NumPy; PyTorch only inside :func:`train_head_on_prototypes`).

- FedFCD's global feature representation (GFR, seed 003 Eq. 5) and FedPAC's global class centroids
  (seed 001): count-weighted means of the clients' class means.
- FedProto's global prototypes (Tan et al., AAAI 2022): the plain mean over the clients that hold
  the class, as the reference implementation (PFLlib's ``proto_aggregation``) computes it.
- The (prototype, label) pairs the server trains a global head on (FedFCD Eq. 4; FedGH).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raysim.weights import ModelWeights

if TYPE_CHECKING:
    from raysim.models import SplitModel


def weighted_means(means: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C_bar^(j) = sum_i |D_ij| C_i^(j) / N_j over clients i (FedFCD Eq. 5). ``means`` (K, C, d),
    ``counts`` (K, C). Returns the (C, d) float32 means and the (C,) mask of classes anyone holds."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum(axis=0)
    sums = np.einsum("kc,kcd->cd", c, np.asarray(means, dtype=np.float64))
    mask = total > 0
    out = np.zeros_like(sums)
    out[mask] = sums[mask] / total[mask, None]
    return out.astype(np.float32), mask


def plain_means(means: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unweighted mean of C_i^(j) over the clients with class-j samples (FedProto)."""
    has = (np.asarray(counts) > 0).astype(np.float64)
    holders = has.sum(axis=0)
    sums = np.einsum("kc,kcd->cd", has, np.asarray(means, dtype=np.float64))
    mask = holders > 0
    out = np.zeros_like(sums)
    out[mask] = sums[mask] / holders[mask, None]
    return out.astype(np.float32), mask


def prototype_pairs(means: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every uploaded (C_i^(j), j) with |D_ij| > 0, client-major: features (M, d), labels (M,)."""
    k_idx, c_idx = np.nonzero(np.asarray(counts) > 0)
    return np.asarray(means, dtype=np.float32)[k_idx, c_idx], c_idx.astype(np.int64)


def train_head_on_prototypes(
    model: SplitModel,
    head: ModelWeights,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    lr: float,
    epochs: int,
    batch_size: int,
    seed: int,
) -> ModelWeights:
    """SGD with cross-entropy on the global head over (prototype, label) pairs, in shuffled
    mini-batches (FedFCD Eq. 4; FedGH's server step). One thread, so every executor gives the same
    numbers. Returns the new ``head`` part."""
    import torch
    import torch.nn.functional as F

    from raysim.weights import get_weights, set_weights

    if features.shape[0] == 0 or epochs == 0:
        return head
    torch.set_num_threads(1)
    set_weights(model, head)
    module = model.head
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=g)
        for start in range(0, x.shape[0], batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(module(x[idx]), y[idx]).backward()
            opt.step()
    return get_weights(model, ("head",))


__all__ = ["plain_means", "prototype_pairs", "train_head_on_prototypes", "weighted_means"]
