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
from algorithms.personal import Pass, SharedAndPersonal
from raysim.errors import ConfigError
from raysim.weights import BODY

if TYPE_CHECKING:
    pass


class SharedBody(SharedAndPersonal):
    """Shared, averaged body; personal head on the home worker."""

    has_global_model = False
    shared_parts = BODY
    personal_parts = ("head",)


@register("fedper")
class FedPer(SharedBody):
    def passes(self) -> list[Pass]:
        """One pass of body and head, cross-entropy."""
        from raysim.toolkit.train import cross_entropy

        return [Pass((*BODY, "head"), cross_entropy)]


@dataclass(frozen=True)
class FedRepConfig:
    head_epochs: int = 10
    body_epochs: int = 1


@register("fedrep")
class FedRep(SharedBody):
    Config = FedRepConfig

    @classmethod
    def check(cls, cfg: Any, params: FedRepConfig) -> None:
        if params.head_epochs < 0 or params.body_epochs < 0:
            raise ConfigError("FedRep's head_epochs and body_epochs must be >= 0.")

    def passes(self) -> list[Pass]:
        """The head (the body frozen, the received one), then the body (the client's head frozen)."""
        from raysim.toolkit.train import cross_entropy

        p = self.params
        return [Pass(("head",), cross_entropy, p.head_epochs), Pass(BODY, cross_entropy, p.body_epochs)]


__all__ = ["FedPer", "FedRep", "FedRepConfig", "SharedBody"]
