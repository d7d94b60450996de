"""FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks", Eq. 2): FedAvg whose
local objective adds the proximal term mu/2 * ||w - w^t||^2 to the loss, w^t the received global model.

The term covers every trained parameter and its gradient mu (w - w^t) is added to the loss's before
the optimiser's weight decay and momentum. The paper tunes mu per dataset and gives no default (the
authors' README: tune it from {0.001, 0.01, 0.1, 0.5, 1}; their code defaults to 0, FL-bench to 1:
litian96/FedProx read at commit d2a4501, KarhouTam/FL-bench at 06e658b). raysim's 0.01 is a light
pull: at plain SGD with rate eta a step moves w a fraction eta * mu of the way back to w^t, so at
eta 0.01 FedProx trains close to FedAvg. Set ``algo.mu`` for a stronger one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from algorithms.base import register
from algorithms.fedavg import FedAvg
from raysim.config import setting
from raysim.weights import GLOBAL_PARTS
from raysim.wire import WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class FedProxConfig:
    mu: float = setting(0.01, at_least=0)


@register("fedprox")
class FedProx(FedAvg):
    family = "global"
    Config = FedProxConfig

    def loss_fn(self, ctx: ClientContext, payload: WeightsPayload) -> LossFn:
        from raysim.toolkit.train import cross_entropy, proximal_anchor, proximal_term

        mu = self.params.mu
        anchor = proximal_anchor(ctx.model, GLOBAL_PARTS)  # w^t: the received model, just loaded

        def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return cross_entropy(model, x, y) + 0.5 * mu * proximal_term(model, anchor, GLOBAL_PARTS)

        return loss


__all__ = ["FedProx", "FedProxConfig"]
