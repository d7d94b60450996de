"""Distillation terms between a local model's outputs and a frozen teacher's (the received global
model's), as loss terms on the shared training loop (PyTorch; client side only).

- :func:`not_true_distillation`: FedNTD's L_NTD (Lee et al., "Preservation of the Global Knowledge
  by Not-True Distillation in Federated Learning", NeurIPS 2022, Eq. 4-5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The (B, C-1) logits of the classes other than each sample's true class, in class order."""
    b, c = logits.shape
    keep = torch.ones(b, c, dtype=torch.bool, device=logits.device)
    keep[torch.arange(b, device=logits.device), y] = False
    return logits[keep].view(b, c - 1)


def not_true_distillation(
    logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor, tau: float
) -> torch.Tensor:
    """L_NTD = tau^2 * mean over the batch of KL(q~_g || q~_l), q~ the softmax at temperature
    ``tau`` over the not-true classes only (the true class's logit is removed before the softmax,
    so it neither gets nor gives probability). The teacher's side carries no gradient. The tau^2
    factor keeps the gradient's scale across temperatures (Hinton et al.; the authors' code has it)."""
    log_q = F.log_softmax(not_true_logits(logits, y) / tau, dim=1)
    with torch.no_grad():
        p = F.softmax(not_true_logits(teacher_logits, y) / tau, dim=1)
    return tau * tau * F.kl_div(log_q, p, reduction="batchmean")


__all__ = ["not_true_distillation", "not_true_logits"]
