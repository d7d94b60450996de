"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma and Guan, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI 2023, Eq. 3-6 and Algorithm 1): FedAvg on the server; on a
client, before local training, an adaptive local aggregation (ALA) of the received global model
theta into its own local model theta_i.

- Lower and higher layers. The model's parameter tensors of the global path, in the order
  an optimizer holds them (``extractor``, then ``filter``, then ``head``: raysim's parts are flat
  arrays, so the layers are read from the model's tensors), split into the last ``layer_idx`` (the
  authors' name for the paper's p, also set as ``algo.p``; it counts parameter tensors, so a linear
  layer is two, its weight and bias; default 2, the head, the authors' default) and the rest. The higher layers may be a suffix of the extractor or filter plus the
  head; a ``layer_idx`` above the count of tensors makes every layer a higher one. The lower
  layers of theta_hat are the received global model's; so are every buffer (BatchNorm
  statistics), where PFLlib leaves the local model's buffers in place (it touches parameters only).
- Higher layers: theta_hat = theta_i + (theta - theta_i) * W, computed as
  theta * W + theta_i * (1 - W) (the same number, and exact at W = 1, the global model, and at
  W = 0, the local model), with W element-wise weights of the higher layers' entries only.
- Learning W: W <- clip(W - eta * grad_{theta_hat} L(theta_hat) * (theta - theta_i), 0, 1),
  one step per mini-batch of a random ``rand_percent``% of the client's training data (the
  authors' s = 80, drawn from (seed, round, client), the same subset in the same order for every
  pass of the round, batches of ``train.batch_size`` with the last one partial where the subset
  does not divide, as the authors' ``DataLoader(..., drop_last=False)`` in ``ALA.py``; their subset
  is a contiguous slice of the client's data from a random start, this one a random draw of s%
  of the samples, as the paper describes the subset), the loss
  cross-entropy of theta_hat with the model in training mode (BatchNorm on the batch's
  statistics, whose running values are put back afterwards). W starts at ones and is the client's own state between rounds (on
  its home worker: jobs are pinned).
- How long W learns (Algorithm 1, the authors' ``ALA.py``): in the client's first ALA, pass after
  pass until the standard deviation of the last ``num_pre_loss`` (10) passes' losses (each pass's
  last mini-batch loss, as the authors record it) is below ``threshold`` (0.1), with more than
  ``num_pre_loss`` passes recorded; capped at ``max_start_passes`` passes (a cap of this
  implementation's: the authors' loop has none). In every later ALA, one pass.
- When ALA is skipped (the authors' code): when the received higher layers equal the client's own
  (its local model is the initial one and so is the global model: round 1), theta_hat is the
  global model whatever W is, and the first ALA (the one that learns until the losses settle) is
  left for the client's next round. The authors test the first parameter tensor for that; this
  tests the higher layers, which are what W mixes. A client first sampled later starts ALA from
  its initial model as its local one, as PFLlib's clients do (each is built with the initial
  model).
- Then the client trains theta_hat with cross-entropy for E epochs and uploads it (the server
  averages the uploads by training-set size, FedAvg). Its personal model is the model after its
  last local training (kept on its home worker; the initial model before it first trains), which
  is also its theta_i for the next ALA. The W-learning passes count as trained samples (each is a
  forward and backward pass over a mini-batch) in the round's compute.
- Only a round's sampled clients run ALA, as only they work in a round here. The authors' server
  (``serverALA.py``'s ``send_models``, as PFLlib's) runs it for every client each round, sampled
  or not, so there an unsampled client's local model becomes theta_hat of the newest global model;
  at full participation the two agree.
- GM = the FedAvg average of the uploads; LM = each client's kept model, the one its last local
  training left. PFLlib's server evaluates at another point: after every client's ALA of the
  round's global model and before their training (``serverala.py`` calls ``send_models``, which
  runs ALA, then ``evaluate``), so its figure is theta_hat's, the global lower layers with the mixed
  higher ones; the kept model here has the client's own trained lower layers, as the other
  personalised methods' LM has their trained local model. Every random draw is keyed
  by (seed, round, client), so serial and Ray runs agree to the bit. No asynchronous mode: a
  client does not start from the global model, so a stale upload cannot be rebased.

Where the paper is silent this follows the authors' code, read in PFLlib's ``system/utils/ALA.py``
(commit 2b077c1; the ALA module the authors maintain there) and TsingZ0/FedALA's
``system/flcore/clients/clientALA.py`` (commit 7939ca7) and ``system/main.py`` (commit 0a05cfe: the
defaults eta 1.0, s 80, p 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from algorithms.base import Evaluation, register
from algorithms.fedavg import AveragedWeights, GlobalState
from raysim.capabilities.asynchronous import Asynchronous
from raysim.config import setting
from raysim.engine.evaluation import adapt_newcomer
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.toolkit.context import ClientContext


@dataclass(frozen=True)
class FedALAConfig:
    #: p: how many of the model's last parameter tensors are the higher layers that ALA mixes
    layer_idx: int = setting(2, at_least=1)
    eta: float = setting(1.0, above=0)  # the learning rate of W
    rand_percent: int = setting(80, at_least=1, at_most=100)  # s: the share of the data W learns on
    threshold: float = setting(0.1, at_least=0)  # the first ALA stops when its losses' std is below it
    num_pre_loss: int = setting(10, at_least=1)  # ... over the last this many passes
    max_start_passes: int = setting(100, at_least=1)  # the first ALA's cap (the authors' has none)


#: where a higher layer lies in the flat weights: (part, start, stop, shape)
Slot = tuple[str, int, int, tuple[int, ...]]


def higher_slots(model: SplitModel, layer_idx: int) -> list[Slot]:
    """The last ``layer_idx`` parameter tensors of the global path (extractor, filter, head), each
    as its part and its range in the part's flat array (buffers are laid out there too, and are
    never a layer)."""
    import torch

    from raysim.models import float_tensors

    slots: list[Slot] = []
    for part in GLOBAL_PARTS:
        offset = 0
        for t in float_tensors(model.part(part)):
            if isinstance(t, torch.nn.Parameter):
                slots.append((part, offset, offset + t.numel(), tuple(t.shape)))
            offset += t.numel()
    return slots[-layer_idx:]


def mixed(
    global_w: ModelWeights, local_w: ModelWeights, slots: Sequence[Slot], w: Sequence[np.ndarray]
) -> ModelWeights:
    """theta_hat: the global weights, with each higher layer theta * W + theta_i * (1 - W)."""
    out = {name: arr.copy() for name, arr in global_w.select(GLOBAL_PARTS).items()}
    for (part, a, b, _), wk in zip(slots, w, strict=True):
        g, loc = global_w.part(part)[a:b], local_w.part(part)[a:b]
        flat = wk.reshape(-1)
        out[part][a:b] = g * flat + loc * (1 - flat)
    return ModelWeights(**out)


def learn_weights(
    model: SplitModel,
    slots: Sequence[Slot],
    global_w: ModelWeights,
    local_w: ModelWeights,
    w: Sequence[np.ndarray],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    eta: float,
    passes: int,
    settle: tuple[float, int] | None,
) -> tuple[list[np.ndarray], int]:
    """The W-learning steps on ``batches``: the model holds the global weights; its higher layers become
    theta_hat for every step. ``passes`` passes, or with ``settle`` = (threshold, n) until the std of
    the last n passes' losses is below threshold (more than n recorded), at most ``passes``.
    Returns W and the passes made; the model is left holding theta_hat's higher layers."""
    import torch

    from raysim.toolkit.train import cross_entropy, set_trainable

    params = set_trainable(model, GLOBAL_PARTS)
    higher = params[len(params) - len(slots) :]
    for p in params[: len(params) - len(slots)]:
        p.requires_grad_(False)  # only the higher layers' gradients are asked for

    def tensors(weights: ModelWeights | Sequence[np.ndarray]) -> list[torch.Tensor]:
        """The higher layers' entries of flat ``weights`` (or W's arrays), shaped as their tensors."""
        out = []
        for k, ((part, a, b, shape), p) in enumerate(zip(slots, higher, strict=True)):
            flat = weights.part(part)[a:b] if isinstance(weights, ModelWeights) else weights[k]
            out.append(torch.tensor(np.asarray(flat, dtype=np.float32).reshape(shape), device=p.device))
        return out

    g, loc, ws = tensors(global_w), tensors(local_w), tensors(w)
    diff = [gk - lk for gk, lk in zip(g, loc, strict=True)]

    def load_hat() -> None:
        with torch.no_grad():
            for p, gk, lk, wk in zip(higher, g, loc, ws, strict=True):
                p.copy_(gk * wk + lk * (1 - wk))

    load_hat()
    losses: list[float] = []
    done = 0
    while done < passes:
        loss = None
        for x, y in batches:
            loss = cross_entropy(model, x, y)
            grads = torch.autograd.grad(loss, higher)
            with torch.no_grad():
                for k, (grad, d) in enumerate(zip(grads, diff, strict=True)):
                    ws[k] = torch.clamp(ws[k] - eta * (grad * d), 0, 1)
            load_hat()
        done += 1
        if loss is not None:
            losses.append(float(loss.detach()))
        if settle is not None:
            threshold, n = settle
            if len(losses) > n and float(np.std(losses[-n:])) < threshold:
                break
    return [wk.detach().cpu().numpy().reshape(-1).astype(np.float32) for wk in ws], done


@register("fedala")
class FedALA(AveragedWeights):
    """FedAvg's server; each client's adaptive local aggregation, then E epochs, on its home worker."""
    family = "personal"

    example_privacy = (
        "its adaptive local aggregation learns its weights with gradient steps of its own on the client's data"
    )

    Config = FedALAConfig
    aliases = {"p": "layer_idx"}
    has_global_model = True
    has_personal_model = True
    pinned = True  # W and the local model live on the client's home worker
    asynchronous = Asynchronous(
        why_not="a client starts from its own mix of the global and its local model, not from the "
        "global model, so a stale upload has no one start to be rebased from."
    )

    def ala_batches(self, ctx: ClientContext) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The round's random s% of the client's training data, in mini-batches (the last one
        partial where the subset does not divide, as the authors' ``drop_last=False``)."""
        import torch

        x, y = ctx.train_tensors()
        n = x.shape[0]
        size = max(1, int(self.params.rand_percent / 100 * n))
        order = ctx.generator("fedala/subset").permutation(n)[:size]
        idx = torch.from_numpy(order).to(x.device)
        bs = self.cfg.train.batch_size
        return [(x[idx[a : a + bs]], y[idx[a : a + bs]]) for a in range(0, size, bs)]

    def adaptive_local_aggregation(
        self, ctx: ClientContext, global_w: ModelWeights, *, keep: bool = True
    ) -> ModelWeights:
        """theta_hat for client ``ctx`` from the received ``global_w`` and its own local model, W
        learned (Eq. 3-6) and, with ``keep``, kept for the client's next rounds (without, e.g. for a
        model that is only evaluated, nothing the client keeps changes); the global model where the
        two agree on the higher layers."""
        local_w = ctx.kept(GLOBAL_PARTS)
        slots = higher_slots(ctx.model, self.params.layer_idx)
        if all(np.array_equal(global_w.part(p)[a:b], local_w.part(p)[a:b]) for p, a, b, _ in slots):
            return global_w.select(GLOBAL_PARTS)  # theta_hat = theta whatever W: nothing to learn yet
        kept = ctx.stored("fedala_weights")
        first = kept is None
        w = [np.ones(b - a, np.float32) for _, a, b, _ in slots] if first else list(kept)
        batches = self.ala_batches(ctx)
        ctx.load(global_w)
        p = self.params
        w, passes = learn_weights(
            ctx.model,
            slots,
            global_w,
            local_w,
            w,
            batches,
            p.eta,
            p.max_start_passes if first else 1,
            (p.threshold, p.num_pre_loss) if first else None,
        )
        ctx.samples_trained += passes * sum(int(yb.shape[0]) for _, yb in batches)
        if keep:
            ctx.store("fedala_weights", tuple(w))
        return mixed(global_w, local_w, slots, w)

    def local_update(self, ctx: ClientContext, payload: WeightsPayload) -> ClientResult:
        ctx.load(self.adaptive_local_aggregation(ctx, payload.weights))
        stats = ctx.train(GLOBAL_PARTS, payload.lr)
        trained = ctx.weights(GLOBAL_PARTS)
        ctx.keep(trained)
        return ctx.result(stats, weights=trained)

    def evaluation(self, state: GlobalState) -> Evaluation:
        return FedALAEvaluation(state.weights)


class FedALAEvaluation(Evaluation):
    """The global weights; a client's personal model is the one it kept after its last training.
    A newcomer (``eval.new_clients``) joins as a client taking part for the first time does: its
    local model is the initial one, its first ALA mixes the global model into it (W learned until
    the losses settle, and not kept), and it trains the result for ``eval.new_client_epochs``."""

    def personal_model(self, algo: FedALA, ctx: ClientContext) -> SplitModel:
        ctx.load(ctx.kept(GLOBAL_PARTS))
        return ctx.model

    def newcomer_model(self, algo: FedALA, ctx: ClientContext) -> SplitModel:
        ctx.load(algo.adaptive_local_aggregation(ctx, self.payload, keep=False))
        return adapt_newcomer(algo, ctx, GLOBAL_PARTS)


__all__ = ["FedALA", "FedALAConfig", "FedALAEvaluation", "higher_slots", "learn_weights", "mixed"]
