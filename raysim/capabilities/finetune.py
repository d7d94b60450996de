"""The "-FT" personalisation capability (:class:`FineTune`), declared on an algorithm's class.

FedBABU's and FedDr+'s personalisation, and the "-FT" rows of FedDr+'s Table 3 for any method with a
global model: with ``algo.ft_epochs`` > 0, after the last round each client fine-tunes the final
global model on its own training data, the capability's ``parts``, for ``ft_epochs`` at
``algo.ft_lr`` (default the last round's rate), on its own random stream ("finetune"); ``lm_ptest`` at the
last round reports these models. Nothing the client or the server keeps changes: the global model is
untouched.

An algorithm with the capability may define two hooks, which the others never see:
``ft_weights(payload) -> ModelWeights``, the global model it fine-tunes from the payload of its
evaluation (``Algorithm.evaluation(state).payload``; default: the payload itself), and
``ft_loss(ctx, weights) -> LossFn``, made before ``weights`` are loaded (default: cross-entropy on
the global path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raysim.capabilities.declared import Capability
from raysim.capabilities.settings import engine_settings
from raysim.config import ExperimentConfig
from raysim.weights import GLOBAL_PARTS, ModelWeights

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class FineTune(Capability):
    """``finetune = FineTune(parts=BODY, default_epochs=None)`` on an algorithm's class:
    ``parts`` train when fine-tuning; ``default_epochs`` is ``ft_epochs`` when not given (None: the
    local epochs E; 0: no fine-tuning unless asked for)."""

    parts: tuple[str, ...] = GLOBAL_PARTS
    default_epochs: int | None = 0

    def setting(self, cfg: ExperimentConfig) -> tuple[int, float]:
        """(epochs, rate): ``algo.ft_epochs`` (default ``default_epochs``) and ``algo.ft_lr``
        (default the last round's learning rate: fine-tuning goes on where training stopped)."""
        p = engine_settings(cfg.algo_params)
        epochs = self.default_epochs if "ft_epochs" not in cfg.algo_params else p.ft_epochs
        return (
            cfg.train.local_epochs if epochs is None else epochs,
            cfg.train.rate(cfg.rounds, cfg.rounds) if p.ft_lr is None else p.ft_lr,
        )

    def on(self, cfg: ExperimentConfig) -> bool:
        """Whether the run fine-tunes (declared, and ``ft_epochs`` > 0)."""
        return self.declared and self.setting(cfg)[0] > 0

    @staticmethod
    def weights(algo: Any, payload: Any) -> ModelWeights:
        """The global model ``algo`` fine-tunes from its evaluation's ``payload``: its
        ``ft_weights`` hook's, else the payload."""
        hook = getattr(algo, "ft_weights", None)
        weights: ModelWeights = hook(payload) if hook is not None else payload
        return weights

    def personal_model(self, algo: Any, ctx: ClientContext, payload: Any) -> SplitModel | None:
        """Client ``ctx.cid``'s fine-tuned model, loaded into ``ctx.model``, at the last round (None
        before it, or when the run does not fine-tune)."""
        epochs, lr = self.setting(algo.cfg)
        if not self.declared or epochs == 0 or ctx.rnd < algo.cfg.rounds:
            return None
        weights = self.weights(algo, payload)
        hook = getattr(algo, "ft_loss", None)
        if hook is not None:
            loss_fn = hook(ctx, weights)
        else:
            from raysim.toolkit.train import cross_entropy

            loss_fn = cross_entropy
        ctx.load(weights)
        ctx.train(self.parts, lr, epochs=epochs, loss_fn=loss_fn, stream="finetune")
        return ctx.model


__all__ = ["FineTune"]
