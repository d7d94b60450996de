"""The one local-training loop every algorithm shares.

docs/design.md, "Algorithm hooks": local training takes small hooks (the loss of a batch, the parts that
train, an ``after_backward`` step) instead of each algorithm writing its own loop. FedProx is then a
loss term; FedRep is two calls with different parts; SCAFFOLD is an ``after_backward`` correction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from raysim.models import SplitModel, layout, parameters_of
from raysim.toolkit.sgd import SGD
from raysim.weights import PARTS

if TYPE_CHECKING:
    from raysim.privacy.dp_sgd import DPSGD

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[SplitModel, torch.Tensor, torch.Tensor], torch.Tensor]
BatchSource = Callable[[int], Iterable[Batch]]


@dataclass(frozen=True)
class SGDConfig:
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0


@dataclass(frozen=True)
class TrainStats:
    loss: float  # mean training loss over every step
    steps: int
    samples: int  # samples seen, over all epochs
    #: the optimizer's momentum buffers at the end, one per trainable parameter in order (empty
    #: without momentum or steps): what a chain passes on when momentum carries along it
    momentum: tuple[torch.Tensor, ...] = ()


def cross_entropy(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the global path head(filter(extractor(x)))."""
    return F.cross_entropy(model(x), y)


def personal_cross_entropy(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the personal path phead(filter(extractor(x)))."""
    return F.cross_entropy(model.personal_forward(x), y)


def proximal_anchor(model: SplitModel, parts: Sequence[str]) -> list[torch.Tensor]:
    """Detached copies of the parameters of ``parts`` as they are now: the w^t of a proximal term."""
    return [p.detach().clone() for p in parameters_of(model, parts)]


def proximal_term(model: SplitModel, anchor: Sequence[torch.Tensor], parts: Sequence[str]) -> torch.Tensor:
    """sum over the parameters of ``parts`` of ||w - w_anchor||^2 (FedProx's mu/2 ||w - w^t||^2
    without mu/2; Ditto's pull to the global model; FedPAC's proximal head training)."""
    params = parameters_of(model, parts)
    return torch.stack([(p - a).pow(2).sum() for p, a in zip(params, anchor, strict=True)]).sum()


def set_trainable(model: SplitModel, parts: Sequence[str]) -> list[torch.nn.Parameter]:
    """Make exactly ``parts`` trainable; frozen parts go to eval mode (BatchNorm statistics stay
    put), so a frozen part is bit-identical after training. Returns the trainable parameters."""
    params: list[torch.nn.Parameter] = []
    for name in PARTS:
        module = model.part(name)
        lay = layout(module)  # its modules and parameters, read once
        train = name in parts
        if any(m.training != train for m in lay.modules):  # (setting a mode costs more than reading it)
            module.train(train)
        for p in lay.params:
            if p.requires_grad != train:
                p.requires_grad_(train)
        if train:
            params += lay.params
    return params


def local_train(
    model: SplitModel,
    batches: BatchSource,
    *,
    epochs: int,
    parts: Sequence[str],
    sgd: SGDConfig,
    loss_fn: LossFn = cross_entropy,
    after_backward: Callable[[], None] | None = None,
    max_steps: int | None = None,
    momentum: Sequence[torch.Tensor] | None = None,
    extra: Sequence[torch.nn.Parameter] = (),
    dp: DPSGD | None = None,
) -> TrainStats:
    """Train ``parts`` of ``model`` for ``epochs`` passes over ``batches(epoch)`` with SGD, or for
    ``max_steps`` steps if that comes first. ``extra``: parameters outside the model that the loss
    uses and the same optimizer trains (an algorithm's own modules, e.g. GPFL's).

    A fresh optimizer each call, its momentum buffers zero, or ``momentum`` (one buffer per
    trainable parameter, in order: the buffers another call ended with, e.g. the previous client's
    in a chain that carries momentum along).

    ``dp``: DP-SGD (:mod:`raysim.privacy.dp_sgd`): each step's gradient is then the lot's clipped
    per-example gradients summed, noised and divided by the expected lot size, and the mean loss is
    over the steps whose lot had examples.
    """
    params = set_trainable(model, parts) + list(extra)
    if not params or epochs == 0 or max_steps == 0:
        return TrainStats(0.0, 0, 0)
    opt = SGD(params, sgd.lr, sgd.momentum, sgd.weight_decay, buffers=momentum)
    private = dp.attach(model, params) if dp is not None else None
    total: torch.Tensor | None = None  # summed on the device: no host sync per step
    loss: torch.Tensor | None
    steps = samples = counted = 0
    try:
        for epoch in range(epochs):
            if max_steps is not None and steps >= max_steps:
                break
            for x, y in batches(epoch):
                if max_steps is not None and steps >= max_steps:
                    break
                opt.zero_grad()
                if private is None:
                    loss = loss_fn(model, x, y)
                    loss.backward()
                else:
                    loss = private.step(loss_fn, x, y)  # None for an empty Poisson lot
                if after_backward is not None:
                    after_backward()
                opt.step()
                if loss is not None:
                    step_loss = loss.detach().to(torch.float64)
                    total = step_loss if total is None else total + step_loss
                    counted += 1
                steps += 1
                samples += int(y.shape[0])
    finally:
        if private is not None:
            private.close()
    mean = float(total) / counted if total is not None else 0.0
    return TrainStats(mean, steps, samples, opt.momentum_buffers())


def iterate_batches(
    x: torch.Tensor, y: torch.Tensor, order: torch.Tensor, batch_size: int, drop_last: bool = False
) -> Iterator[Batch]:
    """Mini-batches of (x, y) in the order of ``order``: the last one may be smaller, or with
    ``drop_last`` is left out (PyTorch's ``DataLoader(drop_last=True)``)."""
    for start in range(0, batches_per_epoch(order.numel(), batch_size, drop_last) * batch_size, batch_size):
        idx = order[start : start + batch_size]
        yield x.index_select(0, idx), y.index_select(0, idx)


def batches_per_epoch(samples: int, batch_size: int, drop_last: bool = False) -> int:
    """How many mini-batches an epoch over ``samples`` has: every full batch, and the remainder
    as one more unless ``drop_last``."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


@torch.inference_mode()
def predict(
    forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """argmax of ``forward`` over ``x`` in batches, on x's device."""
    out = []
    for start in range(0, x.shape[0], batch_size):
        out.append(forward(x[start : start + batch_size]).argmax(dim=1))
    if not out:
        return torch.zeros(0, dtype=torch.long, device=x.device)
    return torch.cat(out)
