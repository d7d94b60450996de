"""FedDr+ ("FedDr+: Stabilizing Dot-regression with Global Feature Distillation for Federated
Learning") and its variant dot-regression (``dotreg``, beta = 1).

- Classifier frozen as a simplex ETF, identical on every client (Eq. 3):
  V = sqrt(C/(C-1)) U (I_C - (1/C) 1 1^T), U in R^{d x C} with orthonormal columns (seeded); the
  ``head`` holds V^T with a zero bias and never trains. A model whose feature size d is below the
  class count C cannot hold an ETF and is refused.
- Local loss (Eq. 2, 4): L = beta L_DR + (1 - beta) L_FD, L_DR = 1/2 (cos(f(x; theta), v_y) - 1)^2,
  L_FD = (1/d) ||f(x; theta) - f(x; theta_g)||^2 with theta_g the received global extractor, frozen.
  Only the body (``extractor``, ``filter``) trains; the server averages it by training-set size.
- Prediction: argmax_c cos(f(x), v_c). Every ETF column has the same norm and the bias is zero, so
  this is the argmax of the head's logits V^T f(x), which the global model evaluates.
- FedDr+ FT (Sec. 4.3, 2-step personalisation): after the last round each client fine-tunes the
  global body on its own training data for ``ft_epochs`` (default E) at ``ft_lr`` (default the
  last round's rate: the paper is silent; FedBABU's code, its base, fine-tunes at the schedule's
  current rate, ``lr`` after its milestones, in junhyeog/FedBABU's ``main_per_fedavg.py`` at
  42515a2; ``suites/feddrplus_ft_lr.yaml`` measures the choice) with ``ft_loss`` = ``dr`` (L_DR, which Appendix D's Table 8 finds best for
  fine-tuning) or ``drplus`` (L_Dr+, as Sec. 4.3 states it, with ``ft_beta``: by default the run's
  beta, and for dotreg FedDr+'s 0.9, Table 8's "Dot-Regression FT (L_Dr+)"); ``lm_ptest`` at the last round reports
  these models (mean and std across clients). The global model is not changed by fine-tuning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from algorithms.base import register
from algorithms.frozen_head import (
    FrozenHead,
    GlobalEval,
    check_etf_fits,
    dr_loss,
    drplus_setup,
    drplus_sources,
    etf_classifier,
)
from raysim import rng
from raysim.config import setting
from raysim.errors import ConfigError
from raysim.registry import MODELS, DatasetInfo, dataset_info
from raysim.setups import Source
from raysim.weights import BODY, ModelWeights
from raysim.wire import ServerContext, WeightsPayload

if TYPE_CHECKING:

    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class FedDrPlusConfig:
    beta: float = setting(0.9, at_least=0, at_most=1)
    ft_loss: Literal["dr", "drplus"] = "dr"  # dr | drplus (FedDr+ FT's loss; its epochs and rate: algo.ft_epochs, algo.ft_lr)
    #: beta of the L_Dr+ fine-tune (ft_loss=drplus); None: the run's beta
    ft_beta: float | None = setting(None, at_least=0, below=1)


@register("feddrplus")
class FedDrPlus(FrozenHead):
    family = "fixed_head"
    Config = FedDrPlusConfig

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        """FedDr+'s setup (:func:`drplus_setup`) with its rates: 0.35 on CIFAR-10 (Table 6), 5.0
        on CIFAR-100 (Table 7), 0.35 on Fashion-MNIST (a choice)."""
        return drplus_setup(dataset, cifar10_lr=0.35, cifar100_lr=5.0, grey_lr=0.35)

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        return drplus_sources(dataset, rates="Table 6 (CIFAR-10), Table 7 (CIFAR-100)")

    @classmethod
    def check(cls, cfg: Any, params: FedDrPlusConfig) -> None:
        check_etf_fits(MODELS.get(cfg.model).feature_dim, dataset_info(cfg.data).num_classes)

    # ---------------------------------------------------------------------------------------- server
    def init(self, ctx: ServerContext) -> GlobalEval:
        import torch

        from raysim.models import get_weights

        model = ctx.build_model()
        etf = etf_classifier(model.filter_dim, ctx.clients.num_classes, rng.int_seed(self.cfg.seed, "etf"))
        with torch.no_grad():
            model.head.weight.copy_(torch.from_numpy(etf))
            model.head.bias.zero_()
        head = get_weights(model, ("head",))
        return GlobalEval(ctx.init_weights.select(BODY).merged(head))

    # ---------------------------------------------------------------------------------------- client
    def body_loss(self, ctx: ClientContext, payload: WeightsPayload) -> LossFn:
        """beta L_DR + (1 - beta) L_FD against the received model (the ETF head stays frozen)."""
        beta = self.params.beta
        return dr_loss(beta, ctx.teacher(payload.weights) if beta < 1.0 else None)

    def ft_loss(self, ctx: ClientContext, weights: ModelWeights) -> LossFn:
        """FedDr+ FT's loss: L_DR (``ft_loss="dr"``) or L_Dr+ with the global model as teacher."""
        p = self.params
        beta = 1.0 if p.ft_loss == "dr" else (p.ft_beta if p.ft_beta is not None else p.beta)
        return dr_loss(beta, ctx.teacher(weights) if beta < 1.0 else None)


@dataclass(frozen=True)
class DotRegConfig(FedDrPlusConfig):
    beta: float = setting(1.0, at_least=0, at_most=1)  # dot-regression alone: no feature distillation
    #: its L_Dr+ fine-tune (Table 8's "Dot-Regression FT (L_Dr+)") distils with FedDr+'s beta
    ft_beta: float | None = setting(0.9, at_least=0, below=1)


@register("dotreg")
class DotReg(FedDrPlus):
    """Dot-regression with the frozen ETF classifier (FedDr+ with beta = 1: no L_FD), and its FT."""
    family = "fixed_head"

    Config = DotRegConfig

    @classmethod
    def check(cls, cfg: Any, params: FedDrPlusConfig) -> None:
        super().check(cfg, params)
        if params.beta != 1.0:
            raise ConfigError("dotreg is FedDr+ with beta = 1; use feddrplus for another beta.")


__all__ = ["DotReg", "DotRegConfig", "FedDrPlus", "FedDrPlusConfig"]
