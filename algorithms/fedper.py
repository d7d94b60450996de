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
- No global model by default (``gm_*`` null): the head never leaves its client, and neither
  paper evaluates one. Fed3+2p's Table 1 quotes a GM for both without saying how it was read;
  ``algo.global_head=true`` gives the reading of a shared body with an averaged head (a choice):
  each trained client also uploads its head, and the server averages the heads by training-set
  size, beside the body, into a global model that is only evaluated. Training and the LM are the
  same either way; the upload grows by the head. (PFLlib's FedPer server aggregates only the
  uploaded bodies and evaluates only the personalised models: ``system/flcore/servers/
  serverper.py``, read at commit 0c46403.)

FedRep's epochs do not follow E: its 10 + 1 are the authors' CIFAR-10 script's (their CIFAR-100
script runs 10 + 5, PFLlib's default 1 + E), so at E = 1 a FedRep round trains 11 epochs a client
(a results page's client-epochs column shows it). The authors' code also trains every client's head
alone in its last round before the final evaluation; here a client never sampled keeps its initial
head (at full participation the two agree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from algorithms.base import register
from algorithms.fedavg import GlobalState
from algorithms.personal import Pass, SharedAndPersonal
from raysim.config import setting
from raysim.weights import BODY
from raysim.wire import Job, WeightsPayload


@dataclass(frozen=True)
class SharedBodyConfig:
    #: evaluate a global model: the body with the trained clients' heads averaged (PFLlib's)
    global_head: bool = False


class SharedBody(SharedAndPersonal):
    """Shared, averaged body; personal head on the home worker (and, with ``global_head``, the
    heads also averaged on the server into a global model that is only evaluated)."""

    Config = SharedBodyConfig
    has_global_model = False
    shared_parts: tuple[str, ...] = BODY
    personal_parts = ("head",)

    def __init__(self, cfg: Any, params: Any) -> None:
        super().__init__(cfg, params)
        if params.global_head:  # the head goes up with the body and is averaged beside it
            self.shared_parts = (*BODY, "head")

    @classmethod
    def evaluates_global(cls, cfg: Any) -> bool:
        from raysim.engine.experiment import algorithm_params

        return bool(algorithm_params(cfg, cls).global_head)  # type: ignore[arg-type]

    def plan(self, state: GlobalState, rnd: int, sampled: Sequence[int]) -> list[Job]:
        """The body goes down; a client trains with its own head, so the averaged one stays here."""
        payload = WeightsPayload(state.weights.select(BODY), self.lr(rnd))
        return [Job((c,), payload, pinned=self.pinned) for c in sampled]


@register("fedper")
class FedPer(SharedBody):
    family = "split"
    def passes(self) -> list[Pass]:
        """One pass of body and head, cross-entropy."""
        from raysim.toolkit.train import cross_entropy

        return [Pass((*BODY, "head"), cross_entropy)]


@dataclass(frozen=True)
class FedRepConfig(SharedBodyConfig):
    head_epochs: int = setting(10, at_least=0)
    body_epochs: int = setting(1, at_least=0)


@register("fedrep")
class FedRep(SharedBody):
    family = "split"
    Config = FedRepConfig

    def passes(self) -> list[Pass]:
        """The head (the body frozen, the received one), then the body (the client's head frozen)."""
        from raysim.toolkit.train import cross_entropy

        p = self.params
        return [Pass(("head",), cross_entropy, p.head_epochs), Pass(BODY, cross_entropy, p.body_epochs)]


__all__ = ["FedPer", "FedRep", "FedRepConfig", "SharedBody", "SharedBodyConfig"]
