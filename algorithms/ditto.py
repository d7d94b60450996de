"""Ditto ("Ditto: Fair and Robust Federated Learning Through Personalization", Li et al., ICML 2021),
a baseline of Fed3+2p and FedDr+.

- The global model w (``extractor``, ``filter``, ``head``) is trained as in FedAvg: each sampled
  client trains it for E epochs from the received weights and the server averages by data size.
- Each client also keeps a personal model v_k on its home worker, trained in the same round for
  ``personal_epochs`` (default E) on CE + lambda/2 ||v_k - w||^2 with w the received global model.
- GM = w; LM of client k = v_k (the initial model until it is first sampled).

lambda defaults to 1, the value of the authors' Fashion-MNIST runs (``run_fashion_clean_ditto_lam1.sh``
of litian96/ditto, read at commit 26d9b29, ``--lam=1``; their other scripts run 1 too) and FL-bench's
default (``--lamda`` 1 in ``src/server/ditto.py`` of KarhouTam/FL-bench, read at commit 06e658b); the
paper tunes it per dataset. The proximal gradient lambda (v_k - w) is the authors' personal step
(their ``trainers_MTL/ditto.py``). At plain SGD with rate eta each step pulls v_k a fraction
eta * lambda of the way to w: with a small lambda the personal model is close to Local's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from algorithms.base import Evaluation, lambda_setting, register
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.weights import GLOBAL_PARTS
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class DittoConfig:
    lam: float = lambda_setting(1.0, at_least=0)  # lambda of the proximal pull (``algo.lambda``)
    personal_epochs: int | None = None  # None: the local epochs E


@register("ditto")
class Ditto(AveragedWeights):
    family = "personal"
    Config = DittoConfig
    has_global_model = True
    has_personal_model = True
    pinned = True  # v_k lives on k's home worker

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        from raysim.toolkit.train import cross_entropy, proximal_anchor, proximal_term

        # the global model w, as in FedAvg
        ctx.load(payload.weights)
        anchor = proximal_anchor(ctx.model, GLOBAL_PARTS)
        stats = ctx.train(GLOBAL_PARTS, payload.lr)
        upload = ctx.weights(GLOBAL_PARTS)
        lam = self.params.lam

        def personal_loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return cross_entropy(model, x, y) + lam / 2 * proximal_term(model, anchor, GLOBAL_PARTS)

        # the personal model v_k, pulled towards the received w (the next epochs of the stream)
        ctx.load(ctx.kept(GLOBAL_PARTS))
        epochs = self.params.personal_epochs
        ctx.train(GLOBAL_PARTS, payload.lr, epochs=epochs, loss_fn=personal_loss)
        ctx.keep(ctx.weights(GLOBAL_PARTS))
        return ctx.result(stats, weights=upload)

    def evaluation(self, state: GlobalState) -> Evaluation:
        return DittoEvaluation(state.weights)


class DittoEvaluation(Evaluation):
    """The global weights; a client's personal model is the one it keeps."""

    def personal_model(self, algo: Ditto, ctx: ClientContext) -> SplitModel:
        ctx.load(ctx.kept(GLOBAL_PARTS))
        return ctx.model


__all__ = ["Ditto", "DittoConfig"]
