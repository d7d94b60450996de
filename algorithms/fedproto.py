"""FedProto ("FedProto: Federated Prototype Learning across Heterogeneous Clients", Tan et al.,
AAAI 2022), a baseline of the FedFCD paper, as the reference implementation that paper's
comparisons come from (PFLlib) runs it: only class prototypes travel; every model stays personal.

- Each client keeps its whole model (body and ``head``) on its home worker and trains it for E epochs
  on CE + lambda * (1/d) ||z - C_bar^(y)||^2 (classes without a global prototype add nothing).
- It uploads its class prototypes C_i^(j) (class means of z under its trained body) and counts
  (``raysim.toolkit.prototypes.ClassMeans``).
- Server: C_bar^(j) = the unweighted mean of the round's C_i^(j) over the clients holding class j.
- LM: with ``predict="proto"`` (default) a sample goes to the nearest global prototype,
  argmin_j ||z - C_bar^(j)||; ``predict="head"`` uses the client's own head. No global model.
- A newcomer (``eval.new_clients``) trains its initial model as a client's local update does, on
  the current global prototypes, for ``eval.new_client_epochs`` epochs, and predicts as a client does.

Prediction runs over every class with a global prototype, as PFLlib's ``clientproto.py`` does. The
authors' test (``lib/update.py`` of yuetan031/FedProto, read at commit 97e42e2) takes the nearest
prototype among the client's own training classes only, which lifts their figures where clients
hold few classes (a pathological split). The local prototypes here are the class means under the
trained body in evaluation mode; the authors' are the training-mode features of the last local
epoch, PFLlib's those of every epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from algorithms.base import Algorithm, Evaluation, lambda_setting, register
from raysim.capabilities.batching import Batching
from raysim.toolkit.prototypes import ClassMeans, plain_means
from raysim.weights import BODY
from raysim.wire import ClientResult, Job, JobResult, ServerContext

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext

OWN_PARTS = (*BODY, "head")


@dataclass(frozen=True)
class FedProtoConfig:
    lam: float = lambda_setting(1.0, at_least=0)  # lambda of the prototype term (``algo.lambda``)
    predict: Literal["proto", "head"] = "proto"  # proto: nearest global prototype | head: the client's own head


@dataclass(frozen=True)
class ProtoPayload:
    protos: np.ndarray  # (C, d) global prototypes (d = 0 before the first round)
    mask: np.ndarray  # (C,) classes that have one
    lr: float


@dataclass(frozen=True)
class ProtoState:
    rnd: int
    protos: np.ndarray
    mask: np.ndarray


@register("fedproto")
class FedProto(Algorithm[ProtoState]):
    family = "prototypes"
    batching = Batching(
        why_not="its clients keep personal models and align to prototypes of their own classes."
    )
    Config = FedProtoConfig
    has_global_model = False
    has_personal_model = True

    def init(self, ctx: ServerContext) -> ProtoState:
        c = ctx.clients.num_classes
        return ProtoState(0, np.zeros((c, 0), np.float32), np.zeros(c, bool))

    def plan(self, state: ProtoState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        payload = ProtoPayload(state.protos, state.mask, self.lr(rnd))
        return [Job((c,), payload, pinned=True) for c in sampled]

    def aggregate(self, state: ProtoState, rnd: int, results: Sequence[JobResult]) -> ProtoState:
        protos, mask = plain_means(ClassMeans.stack([r.extra for jr in results for r in jr.results]))
        return ProtoState(rnd, protos, mask)

    def evaluation(self, state: ProtoState) -> Evaluation:
        return ProtoEvaluation(ProtoPayload(state.protos, state.mask, 0.0))

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer trains its own model on the global prototypes (:meth:`ProtoEvaluation.newcomer_model`)."""
        return cfg.eval.new_clients > 0

    def prototype_loss(self, ctx: ClientContext, payload: ProtoPayload) -> Any:
        """CE + lambda * (1/d) ||z - C_bar^(y)||^2 on ``payload``'s global prototypes."""
        from raysim.toolkit.features import aligned_cross_entropy

        return aligned_cross_entropy(self.params.lam, payload.protos, payload.mask, ctx.device)

    def local_update(self, ctx: ClientContext, payload: ProtoPayload) -> ClientResult:
        ctx.load(ctx.kept(OWN_PARTS))
        stats = ctx.train(OWN_PARTS, payload.lr, loss_fn=self.prototype_loss(ctx, payload))
        ctx.keep(ctx.weights(OWN_PARTS))
        return ctx.result(stats, extra=ctx.class_means())


class ProtoEvaluation(Evaluation):
    """The global prototypes (a :class:`ProtoPayload`); a client's personal model is its own, and
    predicts with its head or, with ``predict=proto``, by the nearest global prototype."""

    payload: ProtoPayload | None

    def personal_model(self, algo: FedProto, ctx: ClientContext) -> SplitModel:
        ctx.load(ctx.kept(OWN_PARTS))
        return ctx.model

    def newcomer_model(self, algo: FedProto, ctx: ClientContext) -> SplitModel:
        """A client held out of training: its initial model, trained as a client's local update
        trains it (the current global prototypes in its loss) for ``eval.new_client_epochs``."""
        from raysim.engine.evaluation import adapt_newcomer

        assert self.payload is not None
        self.personal_model(algo, ctx)  # a client that never trained keeps nothing: the initial model
        return adapt_newcomer(algo, ctx, OWN_PARTS, algo.prototype_loss(ctx, self.payload))

    def newcomer_forward(self, algo: FedProto, model: SplitModel) -> Any:
        return self.forward(algo, model)

    def forward(self, algo: FedProto, model: SplitModel) -> Any:
        if algo.params.predict == "head" or self.payload is None or self.payload.protos.shape[1] == 0:
            return model
        import torch

        from raysim.toolkit.features import representation

        # copies: the payload's arrays are the object store's read-only buffers
        protos_cpu = torch.tensor(self.payload.protos)
        mask_cpu = torch.tensor(self.payload.mask)

        def nearest_prototype(x: torch.Tensor) -> torch.Tensor:
            z = representation(model, x)
            protos = protos_cpu.to(z.device)
            mask = mask_cpu.to(z.device)
            score = -(torch.cdist(z, protos) ** 2)  # the nearest prototype scores highest
            return score.masked_fill(~mask, float("-inf"))

        return nearest_prototype


__all__ = ["FedProto", "FedProtoConfig"]
