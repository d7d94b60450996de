"""FedBN (Li, Jiang, Zhang, Kamp and Dou, "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR 2021, Algorithm 1): FedAvg in which every BatchNorm layer stays local.

- Each sampled client loads the received weights with its own BatchNorm entries put back (their
  weight, bias, running mean and running variance; the initial model's before it first trains),
  trains the whole model for E epochs with cross-entropy (Algorithm 1's local SGD on every
  parameter), and keeps its BatchNorm entries on its home worker.
- Weights travel as one flat array per part, so the BatchNorm entries travel too: a client uploads
  the entries it RECEIVED in their place. No BatchNorm value of a client ever leaves it, and the
  server's average (FedAvg's, by training-set size; Algorithm 1 averages every layer but the
  BatchNorm ones) leaves the BatchNorm entries as it sent them: the seeded initial model's, for
  the whole run. (Under ``deployment.mode=async`` their rebased update is zero, the same.)
- Which entries of a part's flat array belong to BatchNorm layers is read from the model
  (:func:`raysim.models.batch_norm_mask`: every tensor of a batch-norm layer; the integer
  ``num_batches_tracked`` is no entry and is not carried).
- No global model (``gm_*`` null): the paper evaluates each client's own model, and the shared
  weights with the initial BatchNorm layers are no model anyone trained. LM of client k = the
  current shared weights with k's BatchNorm entries (the initial ones until it first trains).

Where the paper is silent, the authors' code was followed (med-air/FedBN ``federated/fed_digits.py``,
``communication``, read at commit 0927bb8): the server averages every state entry whose name does
not hold "bn" and never touches the clients' BatchNorm layers. Two choices differ from that code:
there every client trains every round, here the sampled ones do, as in FedAvg; there each client
weighs 1/K (its digits clients hold equally many samples), here its share of the training samples,
as FedAvg weighs. The BatchNorm models are ``cnn_pac_bn`` and ``cnn3p2_fmnist_bn``
(``raysim/models.py``: a BatchNorm after every convolution and every FC layer but the last, as the
authors' models place them), and the registry's ``mobilenet`` and ``resnet18``. A model without
BatchNorm layers is refused before
any work: in the driver, from its registry entry (``batch_norm``, ``raysim/registry.py``), and
again by the first client that finds no BatchNorm entry in the model it built (a user's model
declared otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import Evaluation, register
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.capabilities.batching import Batching
from raysim.engine.evaluation import adapt_newcomer
from raysim.errors import ConfigError
from raysim.registry import MODELS
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext

#: the name under which a client stores its BatchNorm entries (one array per part, in mask order)
BN_STORE = "fedbn/bn"


def _with_batch_norm_models() -> str:
    return ", ".join(name for name, entry in MODELS.items() if entry.batch_norm)


def refusal(model: str) -> str:
    return (
        f"fedbn keeps each client's BatchNorm layers local, and the model {model} has none: choose a "
        f"model with BatchNorm layers ({_with_batch_norm_models()})."
    )


@register("fedbn")
class FedBN(AveragedWeights):
    family = "split"
    has_global_model = False
    has_personal_model = True
    pinned = True  # a client's BatchNorm entries live on its home worker
    batching = Batching(
        why_not="its models have BatchNorm layers, whose statistics one batched step cannot keep per client."
    )

    @classmethod
    def evaluates_newcomers(cls, cfg: Any) -> bool:
        """A newcomer starts from the shared weights (FedBNEvaluation.newcomer_model)."""
        return bool(cfg.eval.new_clients > 0)

    @classmethod
    def check(cls, cfg: Any, params: Any) -> None:
        if not MODELS.get(cfg.model).batch_norm:
            raise ConfigError(refusal(cfg.model))

    # ---- client side
    def masks(self, model: SplitModel) -> dict[str, np.ndarray]:
        """Each shared part's BatchNorm entries (:func:`raysim.models.batch_norm_mask`, kept per model)."""
        from raysim.models import batch_norm_mask

        masks = {p: batch_norm_mask(model, p) for p in GLOBAL_PARTS}
        if not any(m.any() for m in masks.values()):
            raise ConfigError(refusal(self.cfg.model))
        return masks

    def own_batch_norm(self, ctx: ClientContext) -> ModelWeights:
        """The client's BatchNorm entries of each part as it kept them (the initial model's before
        it first trains), in the order of the part's mask."""
        kept: ModelWeights | None = ctx.stored(BN_STORE)
        if kept is not None:
            return kept
        init = ctx.initial_weights
        return ModelWeights(**{p: init.part(p)[m] for p, m in self.masks(ctx.model).items()})

    def with_own_batch_norm(self, ctx: ClientContext, shared: ModelWeights) -> ModelWeights:
        """``shared`` with the client's own BatchNorm entries in their places."""
        own = self.own_batch_norm(ctx)
        out = {}
        for p, m in self.masks(ctx.model).items():
            arr = shared.part(p)
            if m.any():
                arr = arr.copy()  # (the received arrays may be the object store's, read-only)
                arr[m] = own.part(p)
            out[p] = arr
        return ModelWeights(**out)

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        from raysim.toolkit.train import cross_entropy

        received = payload.weights
        ctx.load(self.with_own_batch_norm(ctx, received))
        stats = ctx.train(GLOBAL_PARTS, payload.lr, loss_fn=cross_entropy)
        trained = ctx.weights(GLOBAL_PARTS)  # fresh arrays of this job's own
        masks = self.masks(ctx.model)
        ctx.store(BN_STORE, ModelWeights(**{p: trained.part(p)[m] for p, m in masks.items()}))
        for p, m in masks.items():  # the BatchNorm entries go back as they came
            trained.part(p)[m] = received.part(p)[m]
        return ctx.result(stats, weights=trained)

    def evaluation(self, state: GlobalState) -> Evaluation:
        return FedBNEvaluation(state.weights)


class FedBNEvaluation(Evaluation):
    """The shared weights; a client's personal model is them with its own BatchNorm entries. A
    newcomer (``eval.new_clients``) starts from the shared weights, whose BatchNorm entries are the
    initial model's, and trains the whole model, so that it learns BatchNorm layers of its own as
    FedBN's clients do."""

    def personal_model(self, algo: FedBN, ctx: ClientContext) -> SplitModel:
        ctx.load(algo.with_own_batch_norm(ctx, self.payload))
        return ctx.model

    def newcomer_model(self, algo: FedBN, ctx: ClientContext) -> SplitModel:
        ctx.load(self.payload)
        return adapt_newcomer(algo, ctx, GLOBAL_PARTS)


__all__ = ["FedBN", "FedBNEvaluation"]
