"""Feature statistics a client computes on its own data (PyTorch; client side).

Used by the prototype family: FedFCD's local feature representations (LFR, the FedFCD paper's
Eq. 3), FedProto's and FedGH's class prototypes, FedPAC's class centroids and its
classifier-collaboration statistics (the FedPAC reproduction report; the authors'
``statistics_extraction``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from raysim.models import SplitModel
from raysim.toolkit.prototypes import ClassMeans


def representation(model: SplitModel, x: torch.Tensor) -> torch.Tensor:
    """z = filter(extractor(x)), the input of both heads (the extractor's output when the model
    has no filter): the feature the prototype methods average, align and classify."""
    out: torch.Tensor = model.filter(model.extractor(x))
    return out


def fused_logits(model: SplitModel, z: torch.Tensor) -> torch.Tensor:
    """phead(z) + head(z): the personal and the global head's logits summed on the same features
    (FedFCD's decision fusion, Eq. 7-8; FedRoD's personalised prediction). The order of the terms
    does not change the sum, but it does the order in which autograd adds the heads' gradients
    into z's, and so the last bits of a trained extractor."""
    out: torch.Tensor = model.phead(z) + model.head(z)
    return out


def fused_forward(model: SplitModel) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> :func:`fused_logits` of x's features: a personal model that predicts with both heads."""
    return lambda x: fused_logits(model, representation(model, x))


@torch.inference_mode()
def extract_features(model: SplitModel, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """z = :func:`representation` for every row of ``x`` (the model in eval mode for the pass)."""
    was_training = model.training
    model.eval()
    out = torch.cat([representation(model, x[i : i + batch_size]) for i in range(0, x.shape[0], batch_size)])
    model.train(was_training)
    return out.to(torch.float32)


def class_means(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> ClassMeans:
    """C_i^(j) = (1/|D_ij|) * sum of f(theta_i; x) over client i's class-j samples (FedFCD Eq. 3;
    FedProto's local prototypes; FedPAC's local centroids)."""
    z64 = z.to(torch.float64)
    sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device)
    sums.index_add_(0, y, z64)
    counts = torch.bincount(y, minlength=num_classes).to(torch.float64)
    means = sums / counts.clamp(min=1).unsqueeze(1)
    return ClassMeans(means.to(torch.float32).cpu().numpy(), counts.to(torch.int64).cpu().numpy())


@dataclass(frozen=True)
class PacStatistics:
    """FedPAC's statistics of one client under the received model: class priors p (C,),
    H (C, d) with row c = p(c) * mu(c), and the scalar V."""

    priors: np.ndarray
    h: np.ndarray
    v: float


def pac_statistics(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> PacStatistics:
    """p(c) = n_c / n; H[c] = p(c) mu(c); V = (1/n) sum_c [p(c) mean_{z in c} ||z||^2 - p(c)^2 ||mu(c)||^2]
    (the FedPAC reproduction report, as the authors' ``statistics_extraction`` computes them)."""
    z64 = z.to(torch.float64)
    n = z.shape[0]
    counts = torch.bincount(y, minlength=num_classes).to(torch.float64)
    priors = counts / max(n, 1)
    sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, y, z64)
    sq = torch.zeros(num_classes, dtype=torch.float64, device=z.device).index_add_(0, y, (z64 * z64).sum(1))
    safe = counts.clamp(min=1)
    mu = sums / safe.unsqueeze(1)
    v = (priors * sq / safe - priors**2 * (mu * mu).sum(1)).sum() / max(n, 1)
    return PacStatistics(priors.cpu().numpy(), (priors.unsqueeze(1) * mu).cpu().numpy(), float(v.item()))


def alignment_loss(
    z: torch.Tensor, y: torch.Tensor, centres: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """mean over the batch of (1/d) * ||z - centre_y||^2, where samples of classes without a centre
    (``mask[y]`` false) contribute zero (FedFCD's R_i, Eq. 6 and 9, without lambda; FedPAC's and
    FedProto's alignment terms)."""
    diff = z - centres.index_select(0, y)
    per_sample = (diff * diff).mean(dim=1) * mask.index_select(0, y).to(z.dtype)
    return per_sample.mean()


def aligned_cross_entropy(
    lam: float,
    centres: np.ndarray,
    mask: np.ndarray,
    device: torch.device,
    logits: Callable[[SplitModel, torch.Tensor], torch.Tensor] | None = None,
) -> Callable[[SplitModel, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss CE(logits(z), y) + lam * :func:`alignment_loss` (z, y, centres, mask) of a batch,
    z = :func:`representation` (x): cross-entropy with features pulled to class centres (FedProto's
    prototypes, FedPAC's global centroids, FedFCD's GFR). ``logits`` defaults to the head's; without
    centres yet (d = 0) or with lam = 0 it is the cross-entropy alone."""
    import torch.nn.functional as F

    on = lam > 0 and centres.shape[1] > 0
    c = torch.tensor(centres, device=device) if on else None  # a copy: the array may be read-only (Ray)
    m = torch.from_numpy(mask).to(device) if on else None

    def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = representation(model, x)
        out = F.cross_entropy(logits(model, z) if logits is not None else model.head(z), y)
        if c is not None and m is not None:
            out = out + lam * alignment_loss(z, y, c, m)
        return out

    return loss


__all__ = [
    "aligned_cross_entropy",
    "fused_forward",
    "fused_logits",
    "representation",
    "PacStatistics",
    "alignment_loss",
    "class_means",
    "extract_features",
    "pac_statistics",
]
