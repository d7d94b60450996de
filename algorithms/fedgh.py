"""FedGH ("FedGH: Heterogeneous Federated Learning with Generalized Global Header", Yi et al., ACM MM
2023), a baseline of the FedFCD paper, as the reference implementation that paper's
comparisons come from (PFLlib) runs it.

- Each client keeps its body (``extractor``, ``filter``) on its home worker. Every round it replaces
  its head with the received global head, trains body and head for E epochs with cross-entropy, and
  uploads the class means of z under its trained body (the local averaged representations) with counts.
- Server: SGD with cross-entropy on the global head over the round's (class mean, label) pairs
  (``server_lr``, ``server_epochs`` passes in mini-batches of B), as FedFCD's server does.
- LM = the client's body with the current global head. No global extractor (``gm_*`` null).
- A newcomer (``eval.new_clients``) trains its initial body under the global head as a client's
  local update does, for ``eval.new_client_epochs`` epochs; its model is that body with the global head.

The server's rate defaults to 0.01 for one pass over the round's pairs, a few small steps a round;
PFLlib's server trains the head at 1.0. The authors' code (LipingYi/FedGH at ff50ac0) steps the
optimiser of the client's network after the head's backward pass, so its global head keeps its
initial weights; its reported accuracy is the client's model right after local training, with the
head it trained, where LM here (and PFLlib's) is the body with the current global head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from algorithms.base import Algorithm, Evaluation, register
from raysim import rng
from raysim.capabilities.batching import Batching
from raysim.config import setting
from raysim.toolkit.prototypes import ClassMeans, train_head_on_class_means
from raysim.weights import BODY, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class FedGHConfig:
    server_lr: float = setting(0.01, above=0)
    server_epochs: int = setting(1, at_least=0)  # passes over the round's uploaded pairs


@dataclass(frozen=True)
class HeadPayload:
    head: ModelWeights  # the global head
    lr: float


@dataclass(frozen=True)
class GHState:
    rnd: int
    head: ModelWeights


@register("fedgh")
class FedGH(Algorithm[GHState]):
    family = "prototypes"
    batching = Batching(
        why_not="its clients keep personal bodies on their home workers."
    )
    Config = FedGHConfig
    has_global_model = False
    has_personal_model = True

    def init(self, ctx: ServerContext) -> GHState:
        self._model = ctx.build_model()  # the global head is trained here
        return GHState(0, ctx.init_weights.select(("head",)))

    def plan(self, state: GHState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = HeadPayload(state.head, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: GHState, rnd: int, results: Sequence[JobResult]) -> GHState:
        head = train_head_on_class_means(
            self._model,
            state.head,
            ClassMeans.stack([r.extra for jr in results for r in jr.results]),
            lr=self.params.server_lr,
            epochs=self.params.server_epochs,
            batch_size=self.cfg.train.batch_size,
            seed=rng.int_seed(self.cfg.seed, "fedgh/server", rnd),
        )
        return GHState(rnd, head)

    def evaluation(self, state: GHState) -> Evaluation:
        return GHEvaluation(state.head)

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer trains its own body under the global head (:meth:`GHEvaluation.newcomer_model`)."""
        return cfg.eval.new_clients > 0

    def local_update(self, ctx: ClientContext, payload: HeadPayload) -> ClientResult:
        ctx.load(ctx.kept(BODY).merged(payload.head))  # the local head replaced by the global one
        stats = ctx.train((*BODY, "head"), payload.lr)
        ctx.keep(ctx.weights(BODY))
        return ctx.result(stats, extra=ctx.class_means())


class GHEvaluation(Evaluation):
    """The global head; a client's personal model is its own body with it."""

    def personal_model(self, algo: FedGH, ctx: ClientContext) -> SplitModel:
        ctx.load(ctx.kept(BODY).merged(self.payload))
        return ctx.model

    def newcomer_model(self, algo: FedGH, ctx: ClientContext) -> SplitModel:
        """A client held out of training: its initial body with the global head, both trained with
        cross-entropy as a client's local update trains them, for ``eval.new_client_epochs``; then,
        as a client's model is, that body with the global head."""
        from raysim.engine.evaluation import adapt_newcomer

        self.personal_model(algo, ctx)  # a client that never trained: the initial body
        adapt_newcomer(algo, ctx, (*BODY, "head"))
        ctx.load(ctx.weights(BODY).merged(self.payload))
        return ctx.model


__all__ = ["FedGH", "FedGHConfig"]
