"""SGD as ``torch.optim.SGD`` computes it, without ``torch.optim``.

The arithmetic is ``torch.optim.SGD``'s (no dampening, no Nesterov), operation for operation, so the
numbers are the same to the bit: d = g + wd * p; with momentum, buf = d at the first step, else
buf = momentum * buf + d, and d = buf; then p += -lr * d. A parameter whose gradient is None is
skipped and its buffer kept, as ``torch.optim.SGD`` does.

Why not ``torch.optim.SGD`` itself (start-up): the first optimizer a process builds imports
``torch._dynamo`` (every ``Optimizer.__init__`` is wrapped to disable TorchDynamo, and the wrapper
imports it on first use), about a second of every worker's and the server's start-up on this
machine's cores, for a compiler raysim does not use. The step also skips the optimizer's per-step
bookkeeping (param groups, state dicts, hooks), which is per-job overhead for the small models of
federated experiments. On an accelerator the step runs as foreach calls (``raysim.torch_internals``: a few
kernel launches for the whole model, as ``torch.optim.SGD`` defaults to there); on the CPU per tensor (as
``torch.optim.SGD`` does there): the same operations either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from raysim.torch_internals import foreach_add, foreach_add_, foreach_mul_


class SGD:
    """Plain SGD with momentum and weight decay over ``params``. ``buffers``: momentum buffers to start
    from (one per parameter, in order; copied), e.g. those the previous client of a chain ended with."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        buffers: Sequence[torch.Tensor] | None = None,
    ) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)
        if buffers is not None and self.momentum != 0:
            if len(buffers) != len(self.params):
                raise ValueError(f"{len(buffers)} momentum buffers for {len(self.params)} parameters")
            self.buffers = [b.detach().clone() for b in buffers]
        self.foreach = any(p.device.type != "cpu" for p in self.params)

    def zero_grad(self) -> None:
        """Drop the gradients (``set_to_none``)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        params = [self.params[i] for i in live]
        grads: list[torch.Tensor] = [self.params[i].grad for i in live]  # type: ignore[misc]
        if self.foreach:
            self._step_foreach(live, params, grads)
            return
        for i, p, g in zip(live, params, grads, strict=True):
            if self.weight_decay != 0:
                g = g.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = self.buffers[i]
                if buf is None:
                    # the first step's buffer is d itself, not a copy of it (as torch.optim.SGD
                    # makes): d is this step's gradient, which the next zero_grad drops (or a
                    # tensor made above), so nothing else writes it, and a client of one step
                    # (the cross-device regime) copies no model's worth of memory for a buffer
                    # it never uses again; the values are the same
                    buf = self.buffers[i] = g.detach()
                else:
                    buf.mul_(self.momentum).add_(g, alpha=1)
                g = buf
            p.add_(g, alpha=-self.lr)

    def _step_foreach(self, live: list[int], params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        if self.weight_decay != 0:
            grads = foreach_add(grads, params, self.weight_decay)
        if self.momentum != 0:
            old = [i for i in live if self.buffers[i] is not None]
            if old:
                at = {i: k for k, i in enumerate(live)}
                bufs: list[torch.Tensor] = [self.buffers[i] for i in old]  # type: ignore[misc]
                foreach_mul_(bufs, self.momentum)
                foreach_add_(bufs, [grads[at[i]] for i in old], 1)
            for k, i in enumerate(live):
                if self.buffers[i] is None:
                    self.buffers[i] = grads[k].detach().clone()
                grads[k] = self.buffers[i]  # type: ignore[assignment]
        foreach_add_(params, grads, -self.lr)

    def momentum_buffers(self) -> tuple[torch.Tensor, ...]:
        """Every parameter's momentum buffer, in order; empty unless every parameter has one."""
        if self.momentum == 0 or any(b is None for b in self.buffers):
            return ()
        return tuple(b for b in self.buffers if b is not None)


__all__ = ["SGD"]
