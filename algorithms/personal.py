"""The shared-and-personal family: some parts of the model are shared (FedAvg's server averages
them), the others stay personal on each client's home worker. FedPer and FedRep (the head
personal), FedRoD (the personal head beside a shared generic one) and Local (everything personal,
nothing shared) are this base with their own parts and training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from algorithms.base import Evaluation
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.capabilities.batching import Batching
from raysim.engine.evaluation import adapt_newcomer
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import TrainStats


class Pass(NamedTuple):
    """One pass of a local update: ``parts`` train with ``loss`` for ``epochs`` (None: the
    configured local epochs); ``inputs(ctx)``, when given, is the client's own further arguments of
    the loss, ``loss(model, x, y, *inputs(ctx))``."""

    parts: tuple[str, ...]
    loss: Callable[..., Any]
    epochs: int | None = None
    inputs: Callable[[ClientContext], tuple[Any, ...]] | None = None

    def loss_of(self, ctx: ClientContext) -> Callable[..., Any]:
        """The loss of a batch for client ``ctx`` (its own inputs bound)."""
        if self.inputs is None:
            return self.loss
        own, loss = self.inputs(ctx), self.loss
        return lambda model, x, y: loss(model, x, y, *own)


class SharedAndPersonal(AveragedWeights):
    """A sampled client loads the received ``shared_parts`` and its own ``personal_parts`` (the
    initial model's before it first trains), trains, keeps its personal parts and uploads the shared
    ones. Its personalised model is the current shared parts with its own.

    A subclass describes its local training once, as its :meth:`passes`; one-by-one training
    (:meth:`train`) and batched training (:meth:`batch_update`) both read that description, so the
    two cannot drift apart."""

    batching = Batching(pinned=True)  # its passes, each client from its own personal parts

    personal_parts: ClassVar[tuple[str, ...]] = ("head",)
    has_personal_model = True
    pinned = True  # the personal parts live on the client's home worker

    def passes(self) -> Sequence[Pass]:
        """The local update's training of the loaded model, pass after pass, the same for every
        client; the local update's stats are the last pass's."""
        raise NotImplementedError

    def train(self, ctx: ClientContext, lr: float) -> TrainStats:
        """One client's local training: each of :meth:`passes` in turn."""
        stats = None
        for step in self.passes():
            stats = ctx.train(step.parts, lr, epochs=step.epochs, loss_fn=step.loss_of(ctx))
        assert stats is not None, "a local update has at least one pass"
        return stats

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[WeightsPayload]) -> list[ClientResult]:
        """:meth:`local_update` for each of ``ctxs``, trained together pass by pass, each client
        from the received shared parts and its own personal ones. In a pass, the untrained parts
        whose values differ between the clients (e.g. personal heads, or parts an earlier pass
        trained) enter as each client's own (``frozen``); those equal for all are shared."""
        from raysim.toolkit.context import ClientContext

        payload = payloads[0]
        if any(p is not payload for p in payloads):
            return [self.local_update(c, p) for c, p in zip(ctxs, payloads, strict=True)]
        models = [payload.weights.merged(self.own_parts(ctx)) for ctx in ctxs]
        trained: list[tuple[TrainStats, ModelWeights]] = []
        for step in self.passes():
            ctxs[0].load(models[0])  # what is not trained and the same for every client
            held = [
                p
                for p in models[0].part_names
                if p not in step.parts and any(not np.array_equal(m.part(p), models[0].part(p)) for m in models[1:])
            ]
            trained = ClientContext.train_together(
                ctxs,
                step.parts,
                payload.lr,
                loss_fn=step.loss,
                epochs=step.epochs,
                starts=models,
                frozen=[m.select(held) for m in models] if held else None,
                inputs=[step.inputs(ctx) for ctx in ctxs] if step.inputs is not None else None,
            )
            models = [m.merged(w) for m, (_, w) in zip(models, trained, strict=True)]
        out = []
        for ctx, model, (stats, _) in zip(ctxs, models, trained, strict=True):
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

    def evaluation(self, state: GlobalState) -> Evaluation:
        return SharedAndPersonalEvaluation(state.weights)

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer starts from the shared parts (none shared, Local's: from its own initial model)."""
        return cfg.eval.new_clients > 0


class SharedAndPersonalEvaluation(Evaluation):
    """The shared weights; a client's personal model is them with its own parts. A newcomer
    (``eval.new_clients``) takes the shared weights with the initial model's personal parts and
    trains its personal parts, pass by pass as the algorithm's local update does (only the passes'
    personal parts, for ``eval.new_client_epochs`` each); it predicts as a personal model does.
    Where nothing is shared (Local) that is the newcomer's own initial model trained alone, as a
    Local client's first round trains it."""

    def personal_model(self, algo: SharedAndPersonal, ctx: ClientContext) -> SplitModel:
        ctx.load(self.payload.merged(algo.own_parts(ctx)))
        return ctx.model

    def newcomer_model(self, algo: SharedAndPersonal, ctx: ClientContext) -> SplitModel:
        # a client that never trained keeps nothing: its own parts are the initial model's (with
        # FedDr+'s ETF head where Local's loss has one), so its personal model is the start
        self.personal_model(algo, ctx)
        for step in algo.passes():
            parts = tuple(p for p in step.parts if p in algo.personal_parts)
            if parts:
                adapt_newcomer(algo, ctx, parts, step.loss_of(ctx))
        return ctx.model

    def newcomer_forward(self, algo: SharedAndPersonal, model: SplitModel) -> Any:
        return self.forward(algo, model)


__all__ = ["Pass", "SharedAndPersonal"]
