"""The shared-and-personal family: some parts of the model are shared (FedAvg's server averages
them), the others stay personal on each client's home worker. FedPer and FedRep (the head
personal), FedRoD (the personal head beside a shared generic one) and Local (everything personal,
nothing shared) are this base with their own parts and training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from algorithms.fedavg import AveragedWeights
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    from raysim.context import ClientContext
    from raysim.models import SplitModel
    from raysim.train import TrainStats


class SharedAndPersonal(AveragedWeights):
    """A sampled client loads the received ``shared_parts`` and its own ``personal_parts`` (the
    initial model's before it first trains), trains (:meth:`train`), keeps its personal parts and
    uploads the shared ones. Its personalised model is the current shared parts with its own."""
    unbatchable = (
        "its clients keep personal parts on their home workers, so their jobs are pinned there "
        "(batched personal parts: not yet)."
    )

    personal_parts: ClassVar[tuple[str, ...]] = ("head",)
    has_personal_model = True
    pinned = True  # the personal parts live on the client's home worker

    def train(self, ctx: ClientContext, lr: float) -> TrainStats:
        """The local update's training of the loaded model."""
        raise NotImplementedError

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
