"""APFL (Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", 2020, Algorithm 1 and
Eq. 5-8): each client mixes a personal model with the global one, by a weight it learns.

Client k keeps a personal model v_k and a mixing weight alpha_k on its home worker (pinned jobs;
before it first trains, v_k is the run's initial model and alpha_k the setting ``alpha``). In a
round it receives the global model w and, on each of its mini-batches xi (Algorithm 1's local
iterations, E epochs of them):

- w <- w - eta * grad f_k(w; xi): FedAvg's local step; the trained w is uploaded and the server
  averages the uploads by training-set size, as FedAvg;
- v_k <- v_k - eta * grad_v f_k(v_bar; xi) with v_bar = alpha_k v_k + (1 - alpha_k) w, the mixed
  model (Eq. 5-6; the gradient is alpha_k grad f_k(v_bar));
- alpha_k <- clip(alpha_k - eta_alpha * <v_k - w, grad f_k(v_bar; xi)>, 0, 1) (Eq. 8: the
  derivative of f_k(v_bar) in alpha), with ``adapt_alpha``.

GM = w; LM of client k = alpha_k v_k + (1 - alpha_k) w, w the current global model and v_k,
alpha_k as the client kept them (the initial model and ``alpha`` for a client that never trained).
w's step never reads v_k or alpha_k (in the authors' code and PFLlib too, which step w on its own
cross-entropy), so the global model's trajectory is FedAvg's, to the bit, whatever alpha does (on
models without dropout, whose masks the mixed model's forward passes would draw too): APFL differs
from FedAvg in its LM only. A newcomer (``eval.new_clients``) personalises as a client does, with w
fixed at the global model (:meth:`APFLEvaluation.newcomer_model`).

Readings where the paper leaves a choice, and the two implementations read:

- What is mixed. The paper mixes parameters (v_bar = alpha v + (1 - alpha) w), and so do we, in
  training and in the LM. The authors' code (MLOPTPSU/FedTorch, fedtorch/comms/trainings/federated/apfl.py
  and comms/utils/eval.py, read at commit 1edcfbfc) mixes the two models' outputs instead,
  alpha v(x) + (1 - alpha) w(x); PFLlib's clientapfl.py (read at commit 11443bef) trains v on its
  own cross-entropy, unmixed, and sets v <- alpha v + (1 - alpha) w once at the end of the round.
- The order of the steps. Algorithm 1 computes the three updates of a local iteration from the
  same iterates and the same mini-batch, and so do we: one backward pass of
  CE(w; xi) + CE(v_bar; xi), with w entering v_bar without gradient, gives w's and v's gradients
  and alpha's derivative; alpha steps, then one SGD step moves w and v. The authors' code and
  PFLlib step w first and then v from the moved w.
- When alpha moves. We follow the paper's Eq. 8, every local iteration, by the exact derivative.
  The authors' code moves alpha once a round (at the round's first iteration) and PFLlib at every
  iteration, both by <v - w, alpha grad_v + (1 - alpha) grad_w> + 0.02 alpha, a surrogate with a
  decay term, which we do not follow.
- The optimizer. v trains with the run's SGD settings (momentum, weight decay), a fresh optimizer
  each round as w's; alpha by plain gradient steps of ``alpha_lr`` (default: the round's rate, as
  the authors' code and PFLlib step it with the training rate).
- ``alpha`` (the initial alpha_k) defaults to 0.5, the authors' code's (``--fed_personal_alpha``);
  PFLlib's is 1.0. The paper reports fixed alpha of 0.25, 0.5 and 0.75 and an adaptive one.
- BatchNorm (none in the default models): the mixed model's forward passes move v's running
  statistics, and the LM mixes the running statistics as it mixes the weights (every floating
  array of the flat weights).
- The round's training loss is CE(w) + CE(v_bar), the sum that is differentiated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from algorithms.base import Evaluation, register
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.capabilities.batching import Batching
from raysim.config import ExperimentConfig, setting
from raysim.errors import ConfigError
from raysim.weights import GLOBAL_PARTS, ModelWeights, map_parts
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import TrainStats


@dataclass(frozen=True)
class APFLConfig:
    alpha: float = setting(0.5, at_least=0, at_most=1)  # each client's initial mixing weight
    adapt_alpha: bool = True  # learn alpha_k by Eq. 8 (false: alpha stays fixed)
    alpha_lr: float | None = setting(None, above=0)  # alpha's step size; None: the round's rate


def mixed(v: ModelWeights, w: ModelWeights, alpha: float) -> ModelWeights:
    """alpha v + (1 - alpha) w, part by part (computed in float64, stored as float32)."""
    return map_parts(
        lambda a, b: (alpha * a.astype(np.float64) + (1.0 - alpha) * b.astype(np.float64)).astype(np.float32),
        v.select(GLOBAL_PARTS),
        w.select(GLOBAL_PARTS),
    )


@register("apfl")
class APFL(AveragedWeights):
    """FedAvg's server; each client trains w, its personal v_k on the mixed model, and alpha_k."""
    family = "personal"

    example_privacy = (
        'it steps its personal model and its mixing weight in a loop of its own, which DP-SGD does not run'
    )

    Config = APFLConfig
    has_global_model = True
    has_personal_model = True
    pinned = True  # v_k and alpha_k live on k's home worker
    batching = Batching(
        why_not="each client trains its own personal model and mixing weight beside the global model."
    )

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: APFLConfig) -> None:
        if params.alpha_lr is not None and not params.adapt_alpha:
            raise ConfigError(
                "apfl's algo.alpha_lr is the step size of an adapting alpha: drop it, or set algo.adapt_alpha=true."
            )

    def alpha_of(self, ctx: ClientContext) -> float:
        """The client's mixing weight as it kept it (``alpha`` before it first trains)."""
        return float(ctx.stored("alpha", self.params.alpha))

    def personal_weights(self, ctx: ClientContext, w: ModelWeights) -> ModelWeights:
        """The client's personalised model alpha_k v_k + (1 - alpha_k) w from its kept state."""
        return mixed(ctx.kept(GLOBAL_PARTS), w, self.alpha_of(ctx))

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        ctx.load(payload.weights)  # w, the received global model
        stats, v, alpha = self.train_mixed(ctx, ctx.kept(GLOBAL_PARTS), self.alpha_of(ctx), payload.lr)
        ctx.keep(v)
        if self.params.adapt_alpha:
            ctx.store("alpha", alpha)
        return ctx.result(stats, weights=ctx.weights(GLOBAL_PARTS))

    def train_mixed(
        self,
        ctx: ClientContext,
        v: ModelWeights,
        alpha: float,
        lr: float,
        *,
        train_global: bool = True,
        epochs: int | None = None,
        stream: str = "local",
    ) -> tuple[TrainStats, ModelWeights, float]:
        """One pass of APFL's local iterations from w (loaded in ``ctx.model``), ``v`` and
        ``alpha``: w on its cross-entropy (with ``train_global``; else w stays as loaded), v on
        the mixed model's, alpha by Eq. 8 (with ``adapt_alpha``). Returns the stats, the trained v
        and alpha; w is left trained in ``ctx.model``."""
        import torch

        from raysim.models import get_weights, parameters_of, set_weights

        p = self.params
        personal = ctx.scratch_model("apfl/personal")
        set_weights(personal, v)
        personal.train()
        v_params = parameters_of(personal, GLOBAL_PARTS)
        for param in v_params:
            param.requires_grad_(True)
        a = torch.tensor(alpha, dtype=torch.float32, device=ctx.device, requires_grad=p.adapt_alpha)
        loss = apfl_loss(ctx.model, personal, a, global_term=train_global)
        state = [alpha]
        step_alpha: Callable[[], None] | None = None
        if p.adapt_alpha:
            rate = lr if p.alpha_lr is None else p.alpha_lr

            def step_alpha() -> None:
                assert a.grad is not None
                state[0] = min(1.0, max(0.0, state[0] - rate * float(a.grad)))
                with torch.no_grad():
                    a.fill_(state[0])
                a.grad = None

        parts = GLOBAL_PARTS if train_global else ()
        stats = ctx.train(
            parts, lr, epochs=epochs, loss_fn=loss, extra=v_params, after_backward=step_alpha, stream=stream
        )
        return stats, get_weights(personal, GLOBAL_PARTS), state[0]

    def evaluation(self, state: GlobalState) -> Evaluation:
        return APFLEvaluation(state.weights)


def apfl_loss(
    model: SplitModel, personal: SplitModel, alpha: torch.Tensor, *, global_term: bool = True
) -> Callable[..., torch.Tensor]:
    """CE(w; x, y) + CE(v_bar; x, y), w the parameters of ``model`` (trained), v those of
    ``personal`` (trained through v_bar), v_bar = alpha v + (1 - alpha) w with w detached, so that
    w's gradient is its own cross-entropy's, v's is alpha grad f(v_bar), and alpha's (when it
    requires one) is <v - w, grad f(v_bar)>. Without ``global_term``: CE(v_bar; x, y) alone."""
    import torch.nn.functional as F
    from torch.func import functional_call

    names = [f"{part}.{n}" for part in GLOBAL_PARTS for n, _ in personal.part(part).named_parameters()]
    v_of = dict(personal.named_parameters())
    w_of = dict(model.named_parameters())

    def loss(m: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mix = {n: alpha * v_of[n] + (1 - alpha) * w_of[n].detach() for n in names}
        if not global_term:
            return F.cross_entropy(functional_call(personal, mix, (x,)), y)
        return F.cross_entropy(m(x), y) + F.cross_entropy(functional_call(personal, mix, (x,)), y)

    return loss


class APFLEvaluation(Evaluation):
    """The global weights w; a client's personal model is alpha_k v_k + (1 - alpha_k) w."""

    def personal_model(self, algo: APFL, ctx: ClientContext) -> SplitModel:
        ctx.load(algo.personal_weights(ctx, self.payload))
        return ctx.model

    def newcomer_model(self, algo: APFL, ctx: ClientContext) -> SplitModel:
        """A client held out of training (``eval.new_clients``) personalises as APFL's clients do,
        with w fixed at the global model (it uploads nothing): v starts from w and alpha from
        ``alpha``, and v (and alpha, with ``adapt_alpha``) train on the mixed model's
        cross-entropy for ``eval.new_client_epochs`` on the newcomer's own stream; its model is
        alpha v + (1 - alpha) w. Nothing the client keeps changes."""
        from raysim.engine.evaluation import newcomer_epochs

        w = self.payload
        v, alpha = w, algo.params.alpha
        epochs = newcomer_epochs(algo.cfg)
        if epochs > 0:
            ctx.load(w)
            _, v, alpha = algo.train_mixed(
                ctx, w, alpha, algo.lr(ctx.rnd), train_global=False, epochs=epochs, stream="newcomer"
            )
        ctx.load(mixed(v, w, alpha))
        return ctx.model


__all__ = ["APFL", "APFLConfig", "APFLEvaluation", "apfl_loss", "mixed"]
