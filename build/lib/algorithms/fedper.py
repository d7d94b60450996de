"""FedPer ("Federated Learning with Personalization Layers", Arivazhagan et al. 2019) and FedRep
("Exploiting Shared Representations for Personalized Federated Learning", Collins et al., ICML 2021),
baselines of Fed3+2p and FedDr+: the body (``extractor``, ``filter``) is shared and averaged by
training-set size; the ``head`` is personal and never leaves its client (kept on its home worker).

- FedPer: each sampled client loads the global body and its own head and trains both for E epochs
  with cross-entropy; it uploads the body.
- FedRep: each sampled client first trains its head for ``head_epochs`` with the body frozen, then
  the body for ``body_epochs`` with the head frozen (defaults 10 and 1, as the FedRep paper's
  experiments do); it uploads the body.
- LM of client k = the global body with k's head (its initial head until it is first sampled).
  There is no global model (``gm_*`` null).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from algorithms.base import register
from algorithms.personal import BatchPass, SharedAndPersonal
from raysim.errors import ConfigError
from raysim.weights import BODY

if TYPE_CHECKING:
    from raysim.context import ClientContext
    from raysim.train import TrainStats


class SharedBody(SharedAndPersonal):
    """Shared, averaged body; personal head on the home worker."""

    has_global_model = False
    shared_parts = BODY
    personal_parts = ("head",)


@register("fedper")
class FedPer(SharedBody):
    batchable = True  # train.batch_clients: one pass of body and head, cross-entropy

    def train(self, ctx: ClientContext, lr: float) -> TrainStats:
        return ctx.train((*BODY, "head"), lr)

    def batch_plan(self) -> list[BatchPass]:
        from raysim.train import cross_entropy

        return [BatchPass((*BODY, "head"), cross_entropy)]


@dataclass(frozen=True)
class FedRepConfig:
    head_epochs: int = 10
    body_epochs: int = 1


@register("fedrep")
class FedRep(SharedBody):
    #: train.batch_clients: the head pass (the body the received one) then the body pass (each
    #: client's head its own, frozen)
    batchable = True
    Config = FedRepConfig

    @classmethod
    def check(cls, cfg: Any, params: FedRepConfig) -> None:
        if params.head_epochs < 0 or params.body_epochs < 0:
            raise ConfigError("FedRep's head_epochs and body_epochs must be >= 0.")

    def train(self, ctx: ClientContext, lr: float) -> TrainStats:
        p = self.params
        ctx.train(("head",), lr, epochs=p.head_epochs)  # the body frozen
        return ctx.train(BODY, lr, epochs=p.body_epochs)  # the head frozen

    def batch_plan(self) -> list[BatchPass]:
        from raysim.train import cross_entropy

        p = self.params
        return [BatchPass(("head",), cross_entropy, p.head_epochs), BatchPass(BODY, cross_entropy, p.body_epochs)]


__all__ = ["FedPer", "FedRep", "FedRepConfig", "SharedBody"]
