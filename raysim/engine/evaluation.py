"""What the workers evaluate with: :class:`Evaluation`, the object an algorithm's one evaluation
hook (``Algorithm.evaluation(state)``, in the server) returns.

It carries the payload the workers need (the global weights, usually) and the behaviour that turns
it into models on a client worker: the global model, a client's personal model, the forward pass
that scores a personal model, and a newcomer's model (a client held out of training by
``eval.new_clients``, adapted from what the federation shares) with its forward pass. The defaults are this class's; an algorithm that evaluates otherwise
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

    def newcomer_model(self, algo: Any, ctx: ClientContext) -> SplitModel | None:
        """The model of client ``ctx.cid``, held out of training (``eval.new_clients``), as it
        would personalise on joining now, loaded into ``ctx.model`` (return it), or None where the
        algorithm has nothing a newcomer could start from. By default, for an algorithm with a
        global model: its own "-FT" personalisation where it declares one (:class:`FineTune`: its
        parts, its starting weights and its loss, e.g. FedBABU's body frozen, FedDr+'s
        dot-regression), else the whole global model fine-tuned with cross-entropy; for
        ``eval.new_client_epochs`` epochs (:func:`adapt_newcomer`). None for an algorithm without a
        global model. Nothing the client or the server keeps changes."""
        if not algo.evaluates_global(algo.cfg):
            return None
        finetune = FineTune.of(algo)
        if finetune.declared:
            weights = finetune.weights(algo, self.payload)
            hook = getattr(algo, "ft_loss", None)
            loss_fn = hook(ctx, weights) if hook is not None else None
            ctx.load(weights)
            return adapt_newcomer(algo, ctx, finetune.parts, loss_fn)
        from raysim.weights import GLOBAL_PARTS

        self.global_model(algo, ctx.model)
        return adapt_newcomer(algo, ctx, GLOBAL_PARTS)

    def newcomer_forward(self, algo: Any, model: SplitModel) -> Any:
        """The forward function a newcomer's model predicts with: a fine-tuned model's (the
        personal :meth:`forward`) where the algorithm declares "-FT", else the global path."""
        return self.forward(algo, model) if FineTune.of(algo).declared else model


def newcomer_epochs(cfg: Any) -> int:
    """``eval.new_client_epochs``, or the local epochs E where it is not set."""
    epochs = cfg.eval.new_client_epochs
    return cfg.train.local_epochs if epochs is None else int(epochs)


def adapt_newcomer(
    algo: Any, ctx: ClientContext, parts: tuple[str, ...], loss_fn: Any = None, lr: float | None = None
) -> SplitModel:
    """A newcomer's adaptation of the model loaded in ``ctx.model``: ``parts`` trained for
    :func:`newcomer_epochs` epochs at ``lr`` (default the evaluated round's rate) on the client's
    training data, on its own random stream ("newcomer"), with ``loss_fn`` (cross-entropy on the
    global path by default)."""
    epochs = newcomer_epochs(algo.cfg)
    if epochs > 0 and parts:
        from raysim.toolkit.train import cross_entropy

        rate = algo.lr(ctx.rnd) if lr is None else lr
        ctx.train(parts, rate, epochs=epochs, loss_fn=loss_fn or cross_entropy, stream="newcomer")
    return ctx.model


__all__ = ["Evaluation", "adapt_newcomer", "newcomer_epochs"]
