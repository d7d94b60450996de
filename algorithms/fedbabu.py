"""FedBABU ("FedBABU: Toward Enhanced Representation for Federated Image Classification", Oh, Kim
and Yun, ICLR 2022), a baseline of FedDr+: the head is randomly initialised (seeded, the
same everywhere) and frozen during federated training; only the body (``extractor``, ``filter``) is
trained with cross-entropy and averaged by training-set size. FedBABU-FT: after the last round
each client fine-tunes the whole global model (body and head) with cross-entropy on its own data
for ``algo.ft_epochs`` (default E) at ``algo.ft_lr`` (default the last round's rate), the engine's "-FT"
(:class:`raysim.capabilities.finetune.FineTune`); ``lm_ptest`` at the last round reports them.
The fine-tuning length defaults to E as for every "-FT" here; the authors fine-tune 5 epochs
(``--ft_ep`` 5 in ``utils/options.py`` of jhoon-oh/FedBABU, read at commit e34c15b) and PFLlib 10:
set ``algo.ft_epochs`` for theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from algorithms.base import register
from algorithms.frozen_head import FrozenHead, GlobalEval
from raysim.capabilities.finetune import FineTune
from raysim.weights import BODY
from raysim.wire import ServerContext, WeightsPayload

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@register("fedbabu")
class FedBABU(FrozenHead):
    family = "fixed_head"
    example_privacy: ClassVar[str | None] = None  # raysim.privacy.dp_sgd
    #: FedBABU-FT fine-tunes the whole model, with cross-entropy
    finetune = FineTune(parts=(*BODY, "head"), default_epochs=None)

    def init(self, ctx: ServerContext) -> GlobalEval:
        return GlobalEval(ctx.init_weights.select((*BODY, "head")))

    def body_loss(self, ctx: ClientContext, payload: WeightsPayload) -> LossFn:
        """Cross-entropy, the head frozen."""
        from raysim.toolkit.train import cross_entropy

        return cross_entropy


__all__ = ["FedBABU"]
