"""Local training: every client trains its own model on its own data and nothing is communicated.
The lower bound of personalisation baselines (e.g. Fed3+2p's and FedPAC's "Local", FedDr+'s Table 3
"Local" rows). Only ``lm_ptest`` applies. All clients start from the same seeded initial model,
built on each worker from the seed.

``loss`` gives FedDr+'s Table 3 local-only variants:

- ``ce`` (default): cross-entropy, the whole model trained;
- ``ce_etf``: cross-entropy with the classifier frozen as FedDr+'s simplex ETF (Eq. 3, the same
  seeded ETF as ``feddrplus``), only the body trained;
- ``dr``: dot-regression L_DR (FedDr+'s Eq. 2) under the same frozen ETF, only the body trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from algorithms.base import register
from algorithms.frozen_head import check_etf_fits, dr_loss, etf_classifier
from algorithms.personal import Pass, SharedAndPersonal
from raysim import rng
from raysim.registry import MODELS, dataset_info
from raysim.weights import BODY, GLOBAL_PARTS, ModelWeights

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientContext

@dataclass(frozen=True)
class LocalConfig:
    loss: Literal["ce", "ce_etf", "dr"] = "ce"


@register("local")
class Local(SharedAndPersonal):
    family = "local"
    Config = LocalConfig
    has_global_model = False
    shared_parts = ()
    personal_parts = GLOBAL_PARTS

    def __init__(self, cfg: Any, params: LocalConfig) -> None:
        super().__init__(cfg, params)
        self._etf: ModelWeights | None = None

    @classmethod
    def check(cls, cfg: Any, params: LocalConfig) -> None:
        if params.loss != "ce":
            check_etf_fits(MODELS.get(cfg.model).feature_dim, dataset_info(cfg.data).num_classes)

    def etf_head(self, ctx: ClientContext) -> ModelWeights:
        """FedDr+'s frozen ETF classifier as a head (the rows v_c, a zero bias), built once a worker."""
        if self._etf is None:
            import torch

            from raysim.models import get_weights

            model = ctx.scratch_model("etf")
            etf = etf_classifier(model.filter_dim, model.num_classes, rng.int_seed(self.cfg.seed, "etf"))
            with torch.no_grad():
                model.head.weight.copy_(torch.from_numpy(etf))
                model.head.bias.zero_()
            self._etf = get_weights(model, ("head",))
        return self._etf

    def own_parts(self, ctx: ClientContext) -> ModelWeights:
        kept = super().own_parts(ctx)
        return kept if self.params.loss == "ce" else kept.merged(self.etf_head(ctx))

    def passes(self) -> list[Pass]:
        """One pass of the configured epochs. ce: the whole model; ce_etf: the body, cross-entropy
        on the frozen ETF's logits; dr: the body, dot-regression."""
        from raysim.toolkit.train import cross_entropy

        if self.params.loss == "ce":
            return [Pass(GLOBAL_PARTS, cross_entropy)]
        if self.params.loss == "ce_etf":
            return [Pass(BODY, cross_entropy)]
        return [Pass(BODY, dr_loss(1.0, None))]


__all__ = ["Local", "LocalConfig"]
