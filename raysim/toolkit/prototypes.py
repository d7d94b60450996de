"""Class means (prototypes) and their server-side arithmetic (NumPy; PyTorch only inside
:func:`train_head_on_class_means`).

- :class:`ClassMeans`: the one record of the prototype family, a client's upload (FedProto, FedGH,
  FedFCD's LFR, FedPAC's local centroids) or, stacked, many clients' (a leading client axis).
- FedFCD's global feature representation (GFR, the FedFCD paper's Eq. 5) and FedPAC's global class centroids
  (the FedPAC reproduction report): count-weighted means of the clients' class means (:func:`weighted_means`).
- FedProto's global prototypes (Tan et al., AAAI 2022): the plain mean over the clients that hold
  the class, as the reference implementation (PFLlib's ``proto_aggregation``) computes it.
- The global head trained on the server on the (class mean, class) pairs (FedFCD Eq. 4; FedGH).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raysim.weights import ModelWeights

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel


@dataclass(frozen=True)
class ClassMeans:
    """Per-class mean features and sample counts; rows of absent classes are zero. One client's:
    ``means`` (C, d) float32 and ``counts`` (C,) int64; stacked over K clients: (K, C, d) and (K, C)."""

    means: np.ndarray
    counts: np.ndarray

    @classmethod
    def stack(cls, uploads: Sequence[ClassMeans]) -> ClassMeans:
        return cls(np.stack([u.means for u in uploads]), np.stack([u.counts for u in uploads]))


def weighted_means(cm: ClassMeans) -> tuple[np.ndarray, np.ndarray]:
    """C_bar^(j) = sum_i |D_ij| C_i^(j) / N_j over the stacked clients i (FedFCD Eq. 5). Returns
    the (C, d) float32 means and the (C,) mask of classes anyone holds."""
    c = np.asarray(cm.counts, dtype=np.float64)
    total = c.sum(axis=0)
    sums = np.einsum("kc,kcd->cd", c, np.asarray(cm.means, dtype=np.float64))
    mask = total > 0
    out = np.zeros_like(sums)
    out[mask] = sums[mask] / total[mask, None]
    return out.astype(np.float32), mask


def plain_means(cm: ClassMeans) -> tuple[np.ndarray, np.ndarray]:
    """The unweighted mean of C_i^(j) over the stacked clients with class-j samples (FedProto)."""
    has = (np.asarray(cm.counts) > 0).astype(np.float64)
    holders = has.sum(axis=0)
    sums = np.einsum("kc,kcd->cd", has, np.asarray(cm.means, dtype=np.float64))
    mask = holders > 0
    out = np.zeros_like(sums)
    out[mask] = sums[mask] / holders[mask, None]
    return out.astype(np.float32), mask


def prototype_pairs(cm: ClassMeans) -> tuple[np.ndarray, np.ndarray]:
    """Every uploaded (C_i^(j), j) with |D_ij| > 0, client-major: features (M, d), labels (M,)."""
    k_idx, c_idx = np.nonzero(np.asarray(cm.counts) > 0)
    return np.asarray(cm.means, dtype=np.float32)[k_idx, c_idx], c_idx.astype(np.int64)


def train_head_on_class_means(
    model: SplitModel,
    head: ModelWeights,
    uploads: ClassMeans,
    *,
    lr: float,
    epochs: int,
    batch_size: int,
    seed: int,
) -> ModelWeights:
    """SGD with cross-entropy on the global head over the (class mean, class) pairs of the stacked
    ``uploads``, ``epochs`` passes in shuffled mini-batches (FedFCD Eq. 4; FedGH's server step),
    shuffled from ``seed``: the one training loop (:func:`raysim.toolkit.train.local_train`) on the
    ``head`` part, fed the pairs. It runs on the threads the process was given for training, like
    every other step of a run. Returns the new ``head`` part."""
    import torch
    import torch.nn.functional as F

    from raysim.models import get_weights, set_weights
    from raysim.toolkit.train import SGDConfig, iterate_batches, local_train

    features, labels = prototype_pairs(uploads)
    if features.shape[0] == 0 or epochs == 0:
        return head
    set_weights(model, head)
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    g = torch.Generator().manual_seed(seed)

    def pairs(epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iterate_batches(x, y, torch.randperm(x.shape[0], generator=g), batch_size)

    def head_loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model.head(x), y)

    local_train(model, pairs, epochs=epochs, parts=("head",), sgd=SGDConfig(lr), loss_fn=head_loss)
    return get_weights(model, ("head",))


__all__ = ["ClassMeans", "plain_means", "prototype_pairs", "train_head_on_class_means", "weighted_means"]
