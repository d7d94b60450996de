"""The shared-and-personal family: some parts of the model are shared (FedAvg's server averages
them), the others stay personal on each client's home worker. FedPer and FedRep (the head
personal), FedRoD (the personal head beside a shared generic one) and Local (everything personal,
nothing shared) are this base with their own parts and training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from algorithms.fedavg import AveragedWeights
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    from raysim.context import ClientContext
    from raysim.models import SplitModel
    from raysim.train import LossFn, TrainStats


class SharedAndPersonal(AveragedWeights):
    """A sampled client loads the received ``shared_parts`` and its own ``personal_parts`` (the
    initial model's before it first trains), trains (:meth:`train`), keeps its personal parts and
    uploads the shared ones. Its personalised model is the current shared parts with its own."""
    unbatchable = "its local training is not one pass with one loss for every client."
    #: train.batch_clients: a subclass whose :meth:`batch_plan` gives its one pass sets both
    batches_pinned = True

    personal_parts: ClassVar[tuple[str, ...]] = ("head",)
    has_personal_model = True
    pinned = True  # the personal parts live on the client's home worker

    def train(self, ctx: ClientContext, lr: float) -> TrainStats:
        """The local update's training of the loaded model."""
        raise NotImplementedError

    def batch_plan(self) -> tuple[tuple[str, ...], LossFn]:
        """(parts, loss) of :meth:`train` when it is one pass of those parts with that loss, the
        same for every client, and the parts it does not train are the same for every client (a
        ``batchable`` subclass's)."""
        raise NotImplementedError

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[WeightsPayload]) -> list[ClientResult]:
        """:meth:`local_update` for each of ``ctxs``, trained together, each client from the
        received shared parts and its own personal ones."""
        from raysim.context import ClientContext

        payload = payloads[0]
        if any(p is not payload for p in payloads):
            return [self.local_update(c, p) for c, p in zip(ctxs, payloads, strict=True)]
        parts, loss = self.batch_plan()
        starts = [payload.weights.merged(self.own_parts(ctx)) for ctx in ctxs]
        ctxs[0].load(starts[0])  # what is not trained, the same for every client
        trained = ClientContext.train_together(ctxs, parts, payload.lr, loss_fn=loss, starts=starts)
        out = []
        for ctx, start, (stats, w) in zip(ctxs, starts, trained, strict=True):
            model = start.merged(w)
            ctx.keep(model.select(self.personal_parts))
            shared = model.select(self.shared_parts) if self.shared_parts else None
            out.append(ctx.result(stats, weights=shared))
        return out

    def own_parts(self, ctx: ClientContext) -> ModelWeights:
        """The client's personal parts as it kept them (the initial model's before it first trains)."""
        return ctx.kept(self.personal_parts)

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        ctx.load(payload.weights.merged(self.own_parts(ctx)))
        stats = self.train(ctx, payload.lr)
        ctx.keep(ctx.weights(self.personal_parts))
        return ctx.result(stats, weights=ctx.weights(self.shared_parts) if self.shared_parts else None)

    def personal_model(self, ctx: ClientContext, eval_payload: ModelWeights) -> SplitModel:
        ctx.load(eval_payload.merged(self.own_parts(ctx)))
        return ctx.model


__all__ = ["SharedAndPersonal"]
