"""FedRoD ("On Bridging Generic and Personalized Federated Learning for Image Classification", Chen
and Chao, ICLR 2022), a baseline of Fed3+2p and FedDr+.

- The body (``extractor``, ``filter``) and the generic head (``head``) are shared and averaged by
  training-set size; the generic head is trained with the balanced softmax loss
  CE(h_G(z) + log p_k, y), p_k client k's class frequencies (classes it lacks get log 1e-8).
- The personal head (``phead``) stays on its client and is trained, in the same steps, with
  cross-entropy on h_G(z) + h_P(z) where z and h_G are detached: it adds to the generic prediction
  and does not move the shared parts.
- GM = body and generic head; LM of client k = logits h_G(z) + h_P_k(z).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from algorithms.base import (
    ClientResult,
    NoConfig,
    WeightsPayload,
    register,
)
from algorithms.fedavg import AveragedWeights
from raysim.weights import GLOBAL_PARTS, ModelWeights, set_weights

if TYPE_CHECKING:
    import torch

    from raysim.client import ClientContext
    from raysim.models import SplitModel


@dataclass(frozen=True)
class OwnPHead:
    phead: ModelWeights


@register("fedrod")
class FedRoD(AveragedWeights):
    """The shared state: body and generic head."""

    Config = NoConfig
    has_global_model = True
    has_personal_model = True
    pinned = True  # the personal head lives on the home worker

    def _phead(self, ctx: ClientContext) -> ModelWeights:
        state: OwnPHead | None = ctx.state
        return state.phead if state is not None else ctx.initial_weights.select(("phead",))

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        import torch

        ctx.load(payload.weights.merged(self._phead(ctx)))
        _, y_all = ctx.train_tensors()
        counts = torch.bincount(y_all, minlength=ctx.model.num_classes).to(torch.float32)
        log_prior = torch.log((counts / counts.sum()).clamp(min=1e-8))

        def loss_fn(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return rod_losses(model, x, y, log_prior).sum()

        stats = ctx.train((*GLOBAL_PARTS, "phead"), payload.lr, loss_fn=loss_fn)
        ctx.set_state(OwnPHead(ctx.weights(("phead",))))
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))

    def global_model(self, model: SplitModel, eval_payload: ModelWeights) -> SplitModel:
        set_weights(model, eval_payload)
        return model

    def personal_model(self, ctx: ClientContext, eval_payload: ModelWeights) -> SplitModel:
        ctx.load(eval_payload.merged(self._phead(ctx)))
        return ctx.model

    def personal_forward(self, model: SplitModel, eval_payload: Any = None) -> Any:
        from raysim.features import representation

        def forward(x: torch.Tensor) -> torch.Tensor:
            z = representation(model, x)
            out: torch.Tensor = model.head(z) + model.phead(z)
            return out

        return forward


def rod_losses(model: SplitModel, x: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """(balanced softmax loss of the generic head, cross-entropy of the personal prediction on
    detached features and generic logits): the second moves only the personal head."""
    import torch
    import torch.nn.functional as F

    from raysim.features import representation

    z = representation(model, x)
    generic = model.head(z)
    balanced = F.cross_entropy(generic + log_prior, y)
    personal = F.cross_entropy(generic.detach() + model.phead(z.detach()), y)
    return torch.stack([balanced, personal])


__all__ = ["FedRoD", "rod_losses"]
