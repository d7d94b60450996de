"""What the workers evaluate with: :class:`Evaluation`, the object an algorithm's one evaluation
hook (``Algorithm.evaluation(state)``, in the server) returns.

It carries the payload the workers need (the global weights, usually) and the behaviour that turns
it into models on a client worker: the global model, a client's personal model, and the forward pass
that scores a personal model. The defaults are this class's; an algorithm that evaluates otherwise
defines its own subclass in its module (FedProto's prototype distances, Fed3+2p's group filters).
It is frozen and holds no algorithm: the worker passes its own algorithm instance (``algo``, for
its settings and its helpers) to each method, as it does to a capability's hooks. PyTorch is
imported inside the methods, which run on the workers only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raysim.capabilities.finetune import FineTune

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class Evaluation:
    """``payload``: what the workers need to evaluate (default: the global weights, a
    ``ModelWeights``, or None for an algorithm without a global model)."""

    payload: Any = None

    def global_model(self, algo: Any, model: SplitModel) -> SplitModel | None:
        """Load the global model into ``model`` (return it), or None when ``algo`` has none. By
        default the payload is the global weights."""
        from raysim.models import set_weights

        if not algo.evaluates_global(algo.cfg):
            return None
        set_weights(model, self.payload)
        return model

    def personal_model(self, algo: Any, ctx: ClientContext) -> SplitModel | None:
        """Load client ``ctx.cid``'s personalised model into ``ctx.model`` (return it), or None.
        By default: the fine-tuned global model of an algorithm with ``finetune``, else none."""
        return FineTune.of(algo).personal_model(algo, ctx, self.payload)

    def forward(self, algo: Any, model: SplitModel) -> Any:
        """The forward function (inputs to class scores) a personal model predicts with (default:
        the global path); e.g. fused logits, or distances to prototypes from the payload."""
        return model


__all__ = ["Evaluation"]
