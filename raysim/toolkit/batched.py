"""Many clients' local training as one computation (``train.batch_clients`` > 1; PyTorch, client side).

K clients that start from the same received model and train the same parts with the same loss (a
FedAvg round's clients) are trained together: each trainable parameter is stacked over the K
clients, and one ``torch.func.vmap`` of the loss's gradient steps all of them at once, each on its
own mini-batch. Every client sees exactly the batches it sees when trained alone (its own seeded
shuffles), and the update is SGD as ``torch.optim.SGD`` does it (weight decay added to the gradient,
the momentum buffer started at the first gradient, no dampening), so the numbers agree with
one-by-one training up to the order of floating-point operations inside the batched kernels.

- A step where clients' batches have the same size is one vmapped step for them; a client whose
  batch is smaller (the last batch of an epoch) is stepped alone, with the same arithmetic; a
  client out of data (fewer samples than others) waits, its parameters and momentum untouched.
- What is not trained (frozen parts, buffers) is the same for the K clients and is shared, not
  stacked, unless the frozen parameters differ between the clients (``frozen``: e.g. FedRep's body
  pass, each client's head its own): those are stacked too and enter the step untrained. A model
  whose training changes buffers (BatchNorm in train mode) cannot be batched:
  :func:`why_not_batchable` says so in one sentence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from raysim.models import LossModule, SplitModel, parameters_of
from raysim.toolkit.train import Batch, LossFn, SGDConfig, set_trainable
from raysim.torch_internals import is_batch_norm


def why_not_batchable(model: SplitModel) -> str | None:
    """Why ``model`` cannot be trained batched (a sentence), or None."""
    for m in model.modules():
        if is_batch_norm(m):
            return "Its model has BatchNorm layers, whose statistics one batched step cannot keep per client."
        if isinstance(m, nn.Dropout) and m.p > 0:
            return "Its model has dropout, whose random masks would not be the ones of one-by-one training."
    return None


class BatchedTrainer:
    """Trains K clients at once (:meth:`train`) from the model as it is loaded now, or from
    ``starts`` (client k's trained parameters, one tensor per trainable parameter in order, e.g.
    the previous client's in a chain); ``momenta`` likewise, the momentum buffers a client starts
    from (None: a fresh optimizer's); ``frozen``: client k's values of the untrained parameters of
    ``frozen_parts`` (one tensor per parameter, in order), where they differ between the clients.
    Afterwards :meth:`load` puts client k's trained parameters into the model and :meth:`momentum`
    gives its buffers."""

    def __init__(
        self,
        model: SplitModel,
        parts: Sequence[str],
        k: int,
        starts: Sequence[Sequence[torch.Tensor]] | None = None,
        momenta: Sequence[Sequence[torch.Tensor] | None] | None = None,
        frozen_parts: Sequence[str] = (),
        frozen: Sequence[Sequence[torch.Tensor]] | None = None,
    ) -> None:
        self.model = model
        self.params = set_trainable(model, parts)
        names = {id(p): n for n, p in model.named_parameters()}
        self.names = [f"model.{names[id(p)]}" for p in self.params]
        if set(parts) & set(frozen_parts):
            raise ValueError(f"parts {tuple(parts)} are trained and frozen at once ({tuple(frozen_parts)})")
        held = parameters_of(model, frozen_parts) if frozen is not None else []
        self.frozen_names = [f"model.{names[id(p)]}" for p in held]
        self.frozen_stacks = [torch.stack([f[n].detach() for f in frozen]) for n in range(len(held))] if frozen else []
        if starts is None:
            self.stacks = [p.detach().unsqueeze(0).repeat(k, *([1] * p.dim())) for p in self.params]
        else:
            self.stacks = [torch.stack([s[n].detach() for s in starts]) for n in range(len(self.params))]
        self.k = k
        self.bufs: list[torch.Tensor | None] = [None] * len(self.stacks)
        device = self.stacks[0].device if self.stacks else torch.device("cpu")
        self.started = torch.zeros(k, dtype=torch.bool, device=device)
        if momenta is not None and any(m is not None for m in momenta):
            self.bufs = [torch.zeros_like(s) for s in self.stacks]
            for i, m in enumerate(momenta):
                if m is not None:
                    for buf, t in zip(self.bufs, m, strict=True):
                        buf[i] = t  # type: ignore[index]
                    self.started[i] = True

    def momentum(self, client: int) -> list[torch.Tensor] | None:
        """Client ``client``'s momentum buffers, one per trainable parameter (None before a step)."""
        if not bool(self.started[client]) or any(b is None for b in self.bufs):
            return None
        return [b[client].clone() for b in self.bufs if b is not None]

    def load(self, client: int) -> None:
        """Client ``client``'s trained parameters into the model."""
        with torch.no_grad():
            for p, s in zip(self.params, self.stacks, strict=True):
                p.copy_(s[client])

    def train(
        self,
        batches: Sequence[Iterable[Batch]],
        sgd: SGDConfig,
        loss_fn: LossFn,
        inputs: Sequence[tuple[torch.Tensor, ...]] | None = None,
    ) -> list[tuple[float, int, int]]:
        """Run each client's ``batches[k]`` to its end; per client (mean loss, steps, samples).
        ``inputs[k]``: client k's own further arguments of the loss, ``loss_fn(model, x, y,
        *inputs[k])`` (e.g. FedRoD's log-prior of its labels)."""
        from torch.func import functional_call, grad_and_value, vmap

        extra = [torch.stack(list(t)) for t in zip(*inputs, strict=True)] if inputs else []

        module = LossModule(self.model, loss_fn)
        per_client = set(self.frozen_names)
        fixed: dict[str, torch.Tensor] = {
            f"model.{n}": t
            for n, t in self.model.named_parameters()
            if not t.requires_grad and f"model.{n}" not in per_client
        }
        fixed |= {f"model.{n}": b for n, b in self.model.named_buffers()}
        names, frozen_names = self.names, self.frozen_names

        def loss_of(
            params: tuple[torch.Tensor, ...],
            held: tuple[torch.Tensor, ...],
            more: tuple[torch.Tensor, ...],
            x: torch.Tensor,
            y: torch.Tensor,
        ) -> torch.Tensor:
            values = {**fixed, **dict(zip(frozen_names, held, strict=True)), **dict(zip(names, params, strict=True))}
            out: torch.Tensor = functional_call(module, values, (x, y, *more))
            return out

        step_many = vmap(grad_and_value(loss_of))
        step_one = grad_and_value(loss_of)
        device = self.started.device
        loss_sum = torch.zeros(self.k, dtype=torch.float64, device=device)
        steps = [0] * self.k
        samples = [0] * self.k
        iters = [iter(b) for b in batches]
        while True:
            current = [next(it, None) for it in iters]
            live = [i for i, b in enumerate(current) if b is not None]
            if not live:
                break
            sizes = {i: int(current[i][1].shape[0]) for i in live}  # type: ignore[index]
            top = max(sizes.values())
            groups = [[i for i in live if sizes[i] == top]] + [[i] for i in live if sizes[i] != top]
            for group in groups:
                idx = torch.tensor(group, device=device)
                whole = group == list(range(self.k))  # every client: the stacks themselves, not copies
                params = tuple(self.stacks) if whole else tuple(s.index_select(0, idx) for s in self.stacks)
                held = tuple(s if whole else s.index_select(0, idx) for s in self.frozen_stacks)
                more = tuple(t if whole else t.index_select(0, idx) for t in extra)
                if len(group) > 1:
                    x = torch.stack([current[i][0] for i in group])  # type: ignore[index]
                    y = torch.stack([current[i][1] for i in group])  # type: ignore[index]
                    grads, losses = step_many(params, held, more, x, y)
                else:
                    b = current[group[0]]
                    one = tuple(p[0] for p in params)
                    g, loss = step_one(one, tuple(h[0] for h in held), tuple(t[0] for t in more), b[0], b[1])  # type: ignore[index]
                    grads, losses = tuple(t.unsqueeze(0) for t in g), loss.unsqueeze(0)
                self._sgd(idx, params, grads, sgd, whole)
                loss_sum.index_add_(0, idx, losses.detach().to(torch.float64))
                for i in group:
                    steps[i] += 1
                    samples[i] += sizes[i]
        means = loss_sum.cpu().tolist()
        return [(means[i] / steps[i] if steps[i] else 0.0, steps[i], samples[i]) for i in range(self.k)]

    def _sgd(
        self,
        idx: torch.Tensor,
        params: tuple[torch.Tensor, ...],
        grads: tuple[torch.Tensor, ...],
        sgd: SGDConfig,
        whole: bool,
    ) -> None:
        """``torch.optim.SGD``'s step for the clients ``idx``: d = g + wd p; buf = d at a client's
        first step, else momentum buf + d; p -= lr buf (lr d without momentum). ``whole``: ``idx``
        is every client in order and ``params`` are the stacks themselves, updated in place.

        The step reads and writes K models' worth of memory per operation, which on a CPU does not
        stay in its caches: it takes as few passes as the arithmetic allows (the gradient, a fresh
        tensor, takes the decay in place; the buffers of a step where every client starts are that
        step's d, not a copy; a group of clients all past their first step needs no select
        between the two rules). Each value is computed by the same operations as before, so the
        numbers do not change."""
        first = ~self.started.index_select(0, idx)
        all_first = bool(first.all())
        none_first = not all_first and not bool(first.any())
        with torch.no_grad():
            for n, (stack, p, g) in enumerate(zip(self.stacks, params, grads, strict=True)):
                d = g.add_(p, alpha=sgd.weight_decay) if sgd.weight_decay != 0 else g
                if sgd.momentum != 0:
                    buf = self.bufs[n]
                    if all_first:
                        pass  # buf = d
                    elif none_first:
                        assert buf is not None
                        d = buf.index_select(0, idx).mul_(sgd.momentum).add_(d)
                    else:
                        if buf is None:
                            buf = self.bufs[n] = torch.zeros_like(stack)
                        shape = (-1,) + (1,) * (d.dim() - 1)
                        d = torch.where(first.view(shape), d, buf.index_select(0, idx).mul(sgd.momentum).add(d))
                    if whole and buf is None:
                        self.bufs[n] = d  # d is no longer written: the buffers alias it
                    else:
                        if buf is None:
                            buf = self.bufs[n] = torch.zeros_like(stack)
                        if whole:
                            buf.copy_(d)
                        else:
                            buf.index_copy_(0, idx, d)
                if whole:
                    stack.add_(d, alpha=-sgd.lr)
                else:
                    stack.index_copy_(0, idx, p.add(d, alpha=-sgd.lr))
        self.started.index_fill_(0, idx, True)


__all__ = ["BatchedTrainer", "why_not_batchable"]
