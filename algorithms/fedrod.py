"""FedRoD ("On Bridging Generic and Personalized Federated Learning for Image Classification", Chen
and Chao, ICLR 2022), a baseline of Fed3+2p and FedDr+.

- The body (``extractor``, ``filter``) and the generic head (``head``) are shared and averaged by
  training-set size; the generic head is trained with the balanced softmax loss
  CE(h_G(z) + log p_k, y), p_k client k's class frequencies (classes it lacks get log 1e-8).
- The personal head (``phead``) stays on its client and is trained, in the same steps, with
  cross-entropy on h_G(z) + h_P(z) where z and h_G are detached: it adds to the generic prediction
  and does not move the shared parts.
- GM = body and generic head; LM of client k = logits h_G(z) + h_P_k(z).

The personal head is the paper's linear one (PFLlib's FedRoD); the paper's hypernetwork variant,
which generates h_P from the client's class distribution, is not here. A client's personal head
starts from the seeded initial model's own ``phead``, where PFLlib and FL-bench start it as a copy
of the generic head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from algorithms.base import Evaluation, register
from algorithms.fedavg import GlobalState
from algorithms.personal import Pass, SharedAndPersonal, SharedAndPersonalEvaluation
from raysim.weights import GLOBAL_PARTS

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@register("fedrod")
class FedRoD(SharedAndPersonal):
    """The shared state: body and generic head."""
    family = "split"

    example_privacy = (
        "its balanced softmax reads the client's class counts, a statistic of all its data"
    )

    has_global_model = True
    shared_parts = GLOBAL_PARTS
    personal_parts = ("phead",)

    def passes(self) -> list[Pass]:
        """One pass of everything, each client's log-prior a further input of its loss."""
        return [Pass((*GLOBAL_PARTS, "phead"), rod_loss, inputs=log_prior_of)]

    def evaluation(self, state: GlobalState) -> Evaluation:
        return RoDEvaluation(state.weights)


class RoDEvaluation(SharedAndPersonalEvaluation):
    """FedRoD's personal model predicts with the generic plus the personal head's logits."""

    def forward(self, algo: FedRoD, model: SplitModel) -> Any:
        from raysim.toolkit.features import fused_forward

        return fused_forward(model)


def log_prior_of(ctx: ClientContext) -> tuple[torch.Tensor]:
    """log p_k, the client's class frequencies (log 1e-8 for the classes it lacks)."""
    import torch

    _, y_all = ctx.train_tensors()
    counts = torch.bincount(y_all, minlength=ctx.model.num_classes).to(torch.float32)
    return (torch.log((counts / counts.sum()).clamp(min=1e-8)),)


def rod_loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """The local update's loss: the sum of :func:`rod_losses`."""
    return rod_losses(model, x, y, log_prior).sum()


def rod_losses(model: SplitModel, x: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """(balanced softmax loss of the generic head, cross-entropy of the personal prediction on
    detached features and generic logits): the second moves only the personal head."""
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.features import representation

    z = representation(model, x)
    generic = model.head(z)
    balanced = F.cross_entropy(generic + log_prior, y)
    personal = F.cross_entropy(generic.detach() + model.phead(z.detach()), y)
    return torch.stack([balanced, personal])


__all__ = ["FedRoD", "log_prior_of", "rod_loss", "rod_losses"]
