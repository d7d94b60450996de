"""FedNTD ("Preservation of the Global Knowledge by Not-True Distillation in Federated Learning", Lee
et al., NeurIPS 2022), a baseline of FedDr+ (Tables 1-2).

FedAvg whose local objective adds not-true distillation from the received global model (Eq. 5):
L = CE(q_l, y) + beta * L_NTD, with L_NTD = tau^2 * KL(q~_g^tau || q~_l^tau) and q~^tau the softmax
at temperature tau over the logits of the classes other than the true one (Eq. 4): the global
model's knowledge of the classes a sample is *not* is kept, while the true class is learnt freely.
The teacher is the received global model, frozen for the round; the server averages as FedAvg.
``beta`` and ``tau`` default to (1, 3), FedDr+'s Tables 6-7 setting for FedNTD and the authors'
``NTD_Loss`` class default (Lee-Gihun/FedNTD; their code has the tau^2 factor and the batch-mean
KL; see :func:`raysim.toolkit.distill.not_true_distillation`); the configuration file they ship,
``config/fedntd.json``, runs tau 1, as PFLlib's default does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from algorithms.base import register
from algorithms.fedavg import FedAvg
from raysim.config import setting
from raysim.wire import WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class FedNTDConfig:
    beta: float = setting(1.0, at_least=0)
    tau: float = setting(3.0, above=0)


@register("fedntd")
class FedNTD(FedAvg):
    family = "global"
    Config = FedNTDConfig

    def loss_fn(self, ctx: ClientContext, payload: WeightsPayload) -> LossFn:
        from raysim.toolkit.distill import not_true_distillation

        beta, tau = self.params.beta, self.params.tau
        teacher = ctx.teacher(payload.weights)  # the received global model, frozen

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            import torch

            logits = model(x)
            with torch.no_grad():
                teacher_logits = teacher(x)
            ce = torch.nn.functional.cross_entropy(logits, y)
            return ce + beta * not_true_distillation(logits, teacher_logits, y, tau)

        return loss


__all__ = ["FedNTD", "FedNTDConfig"]
