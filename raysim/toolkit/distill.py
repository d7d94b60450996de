"""Distillation and regularisation terms between a local model and the received global model, as
loss terms on the shared training loop (PyTorch; client side only).

- :func:`not_true_distillation`: FedNTD's L_NTD (Lee et al., "Preservation of the Global Knowledge
  by Not-True Distillation in Federated Learning", NeurIPS 2022, Eq. 4-5).
- the terms of FedDr+'s Table 1 (Sec. 3.4), any of which an algorithm with the ``regularizers``
  capability adds to its own loss by name (``algo.regularizers=[fd]``; each name's term:
  :func:`raysim.capabilities.regularizers.term`):

  - ``prox`` (:func:`prox_term`): ||theta - theta_g||^2 over the trained parameters (FedProx, Li
    et al. 2020, Eq. 2, without its mu/2: the weight is the combination's);
  - ``kd`` (:func:`kd_term`): tau^2 KL(softmax(z_g / tau) || softmax(z / tau)), the
    softened-softmax distillation of the logits (Hinton et al. 2015, the paper's [29]);
  - ``ntd`` (:func:`ntd_term`): the same over the not-true classes only
    (:func:`not_true_distillation`);
  - ``ld`` (:func:`ld_term`): (1/C) ||z - z_g||^2, the whole logit vector by mean squared error
    (Kim et al. 2021, the paper's [30]);
  - ``fd`` (:func:`fd_term`): (1/d) ||f(x) - f_g(x)||^2, the features (FedDr+'s L_FD, Eq. 4).

  Each is a batch mean, is zero when the local model equals the global one, and is combined as
  FedDr+'s Eq. 4 combines L_DR and L_FD: L = beta L_own + (1 - beta) sum of the named terms
  (:func:`regularized`), so dot-regression with ``fd`` at beta = 0.9 is FedDr+.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raysim.models import SplitModel
from raysim.toolkit.features import representation
from raysim.toolkit.train import LossFn, proximal_term
from raysim.torch_internals import is_batch_norm


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The (B, C-1) logits of the classes other than each sample's true class, in class order."""
    c = logits.shape[1]
    others = torch.arange(c - 1, device=logits.device).unsqueeze(0)
    index = others + (others >= y.unsqueeze(1)).long()  # 0..C-1 skipping y; no in-place write (vmap)
    return logits.gather(1, index)


def not_true_distillation(
    logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor, tau: float
) -> torch.Tensor:
    """L_NTD = tau^2 * mean over the batch of KL(q~_g || q~_l), q~ the softmax at temperature
    ``tau`` over the not-true classes only (the true class's logit is removed before the softmax,
    so it neither gets nor gives probability). The teacher's side carries no gradient. The tau^2
    factor keeps the gradient's scale across temperatures (Hinton et al.; the authors' code has it)."""
    return knowledge_distillation(not_true_logits(logits, y), not_true_logits(teacher_logits, y), tau)


def knowledge_distillation(logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """tau^2 * mean over the batch of KL(softmax(z_g / tau) || softmax(z / tau))."""
    log_q = F.log_softmax(logits / tau, dim=1)
    with torch.no_grad():
        p = F.softmax(teacher_logits / tau, dim=1)
    return tau * tau * F.kl_div(log_q, p, reduction="batchmean")


def as_teacher(model: SplitModel) -> SplitModel:
    """``model`` as the frozen teacher of a distillation term: in eval mode (no dropout), but with
    its BatchNorm layers normalising by the batch's own statistics, as the student's do while it
    trains. Each term then compares like with like, and is zero when the local weights equal the
    global ones, as FedDr+'s Eq. 4 and FedNTD's Eq. 5 intend; against a teacher normalising by its
    running statistics it is not. We keep the models' BatchNorm as it is (running statistics at evaluation) rather than
    drop the running statistics, as FedBABU's MobileNet does, so that no model's evaluation changes.
    The teacher's running statistics move as it runs but are never read: it is a scratch model,
    loaded anew for every job."""
    model.eval()
    for m in model.modules():
        if is_batch_norm(m):
            m.train()
    return model


@dataclass(frozen=True)
class Outputs:
    """One batch through the local model and the frozen global one."""

    x: torch.Tensor
    y: torch.Tensor
    features: torch.Tensor
    logits: torch.Tensor
    teacher_features: torch.Tensor
    teacher_logits: torch.Tensor


@dataclass(frozen=True)
class RegContext:
    """What the terms compare with: the received global model, frozen, and its parameters."""

    teacher: SplitModel
    anchor: Sequence[torch.Tensor]  # the received parameters of ``parts`` (for prox)
    parts: tuple[str, ...]  # the trained parts
    tau: float


Term = Callable[[SplitModel, Outputs, RegContext], torch.Tensor]




def prox_term(model: SplitModel, o: Outputs, rc: RegContext) -> torch.Tensor:
    """``prox``: ||theta - theta_g||^2 over the trained parameters."""
    return proximal_term(model, rc.anchor, rc.parts)


def kd_term(model: SplitModel, o: Outputs, rc: RegContext) -> torch.Tensor:
    """``kd``: the softened-softmax distillation of the logits."""
    return knowledge_distillation(o.logits, o.teacher_logits, rc.tau)


def ntd_term(model: SplitModel, o: Outputs, rc: RegContext) -> torch.Tensor:
    """``ntd``: the same over the not-true classes only."""
    return not_true_distillation(o.logits, o.teacher_logits, o.y, rc.tau)


def ld_term(model: SplitModel, o: Outputs, rc: RegContext) -> torch.Tensor:
    """``ld``: the logits by mean squared error."""
    return F.mse_loss(o.logits, o.teacher_logits)


def fd_term(model: SplitModel, o: Outputs, rc: RegContext) -> torch.Tensor:
    """``fd``: the features by mean squared error."""
    return F.mse_loss(o.features, o.teacher_features)


def regularized(own: LossFn, terms: Sequence[Term], beta: float, rc: RegContext) -> LossFn:
    """beta * own + (1 - beta) * the sum of ``terms`` (the global model's outputs carry no
    gradient)."""

    def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            zg = representation(rc.teacher, x)
            logits_g = rc.teacher.head(zg)
        z = representation(model, x)
        outputs = Outputs(x, y, z, model.head(z), zg, logits_g)
        reg = torch.stack([t(model, outputs, rc) for t in terms]).sum()
        return beta * own(model, x, y) + (1.0 - beta) * reg

    return loss


__all__ = [
    "Outputs",
    "RegContext",
    "Term",
    "as_teacher",
    "fd_term",
    "kd_term",
    "ld_term",
    "ntd_term",
    "prox_term",
    "knowledge_distillation",
    "not_true_distillation",
    "not_true_logits",
    "regularized",
]
