"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, Sec. 3, Eq. 1-3 and
Algorithm 1): FedAvg whose local objective adds a model-contrastive term.

A sampled client trains the received global model w^t on

    L = CE(w; x, y) + mu * l_con,
    l_con = -log( exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) )

(Eq. 1-3), ``sim`` the cosine similarity, z the representation of x under the model being trained,
z_glob under the received global model (the positive, fixed for the round) and z_prev under the
client's previous local model (the negative, fixed), averaged over the batch; the server averages
the uploads as FedAvg (Algorithm 1). GM = the averaged model; LM only with FedAvg's "-FT"
(``algo.ft_epochs`` > 0), which applies unchanged, as do FedAvg's added regularisers
(``algo.regularizers``, combined with CE + mu * l_con as with any algorithm's own loss).

Readings where the paper leaves a choice:

- The representation z. The paper's z is a projection head's output (Sec. 3.2: base encoder, a
  two-layer projection head, then the classifier); raysim's models have no projection head, so z is
  the body's output, filter(extractor(x)), the head's input (:func:`raysim.toolkit.features.representation`),
  as PFLlib's clientmoon.py takes its model's ``base`` output (read at commit 04240b97).
- The previous local model is the model the client uploaded the last time it trained, kept on its
  home worker (pinned jobs); only its body is kept, the part z reads. Before a client first trains
  it is the run's initial model, as PFLlib's clientmoon.py starts ``old_model`` (a copy of the
  initial model). The authors' code (QinbinLi/MOON main.py, read at commit 2f7199e7) differs in two
  places we do not follow: in its first round the pool of previous models is empty, so the term has
  no negative, and later a never-trained client's negative is its own separately initialised
  network. With the initial model as the negative, round 1 agrees with the authors' gradient: the
  received model is the initial model, z_glob = z_prev, and l_con is the constant log 2.
- The frozen models run as :func:`raysim.toolkit.distill.as_teacher` runs a teacher (eval mode,
  BatchNorm on the batch's statistics), as the other terms against the received model here do; the
  authors' code runs them in eval mode.
- l_con is computed as the cross-entropy of the two similarities over tau with the positive as the
  label, the authors' code's form of Eq. 3 (the same number, stable in floating point).
- ``mu`` defaults to 1, the paper's value for CIFAR-100 and Tiny-ImageNet (Sec. 4.1: 5 for
  CIFAR-10); PFLlib's command-line default is 0. ``tau`` is 0.5, the paper's (Sec. 4.1). The
  models here have no projection head, so the paper's tuned mu need not carry over: set it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from algorithms.base import register
from algorithms.fedavg import FedAvg
from raysim.capabilities.batching import Batching
from raysim.config import setting
from raysim.weights import BODY, ModelWeights
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn


@dataclass(frozen=True)
class MoonConfig:
    mu: float = setting(1.0, at_least=0)  # the contrastive term's weight
    tau: float = setting(0.5, above=0)  # the temperature


def contrastive_term(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """l_con (Eq. 3), the batch mean: the cross-entropy of [sim(z, z_glob), sim(z, z_prev)] / tau
    with the first (the global model's representation) as the label; each representation
    flattened per sample, the similarity PyTorch's cosine similarity (eps 1e-8)."""
    import torch
    import torch.nn.functional as F

    z, z_glob, z_prev = z.flatten(1), z_glob.flatten(1), z_prev.flatten(1)
    logits = torch.stack(
        [F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1
    )
    positive = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / tau, positive)


def moon_loss(glob: SplitModel, prev: SplitModel, mu: float, tau: float) -> LossFn:
    """CE + mu * l_con of a batch, ``glob`` and ``prev`` the frozen received and previous models."""
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.features import representation

    def loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = representation(model, x)
        with torch.no_grad():
            z_glob = representation(glob, x)
            z_prev = representation(prev, x)
        return F.cross_entropy(model.head(z), y) + mu * contrastive_term(z, z_glob, z_prev, tau)

    return loss


@register("moon")
class Moon(FedAvg):
    """FedAvg's server and "-FT"; the client's loss adds l_con, and it keeps its upload's body."""
    family = "global"

    Config = MoonConfig
    pinned = True  # the previous local model lives on the client's home worker
    batching = Batching(
        why_not="each client's loss reads its own previous local model, which the clients of a batch do not share."
    )

    def loss_fn(self, ctx: ClientContext, payload: WeightsPayload) -> LossFn:
        from raysim.models import set_weights
        from raysim.toolkit.distill import as_teacher

        glob = ctx.teacher(payload.weights)  # the received global model (just loaded in ctx.model)
        prev = ctx.scratch_model("moon/previous")
        set_weights(prev, self.previous(ctx))
        return moon_loss(glob, as_teacher(prev), self.params.mu, self.params.tau)

    @staticmethod
    def previous(ctx: ClientContext) -> ModelWeights:
        """The body of the client's previous local model: its last upload's, or the initial model's."""
        return ctx.kept(BODY)

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        result = super().local_update(ctx, payload)
        assert result.weights is not None
        ctx.keep(result.weights.select(BODY))  # the next round's negative
        return result


__all__ = ["Moon", "MoonConfig", "contrastive_term", "moon_loss"]
