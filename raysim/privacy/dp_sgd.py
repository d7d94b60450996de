"""Sample-level differential privacy: DP-SGD in each client's local training (``privacy.example_clip``).

DP-SGD (Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar and Zhang, "Deep Learning with Differential
Privacy", CCS 2016, Algorithm 1): at each step t a lot L_t of the client's examples is drawn, each
example's gradient g_t(x_i) of the loss over the trained parameters is clipped to the L2 norm C
(over all trained parameters jointly), g~_t(x_i) = g_t(x_i) / max(1, ||g_t(x_i)||_2 / C), and the
step descends along

    g~_t = (1 / L) (sum_i g~_t(x_i) + N(0, sigma^2 C^2 I)),

L the lot's *expected* size. C is ``privacy.example_clip``, sigma ``privacy.example_noise_multiplier``.

Sampling. The accountant (Poisson-subsampled Gaussian mechanism; Mironov, Talwar and Zhang,
"Renyi Differential Privacy of the Sampled Gaussian Mechanism", 2019) assumes each lot is a Poisson
sample: every example in independently with probability q. raysim's ordinary batches are a
permutation cut into fixed-size batches, which that accounting does not describe, so with DP-SGD on
the batches are Poisson samples instead (:func:`poisson_batches`): q = B / n for batch size B
(``train.batch_size``) and n the client's training examples (q = 1 when n <= B), as many lots an
"epoch" as the ordinary loop has batches (``batches_per_epoch``), and the divisor L = q n, the
expected lot size (B, or n when n <= B), whatever size the lot drawn has. A lot may be empty: its
step is the noise alone.

Per-example gradients (``privacy.per_example``), the same numbers up to float rounding:

- ``torch_func``: ``torch.func.vmap`` of ``torch.func.grad`` of the loss on one example, the trained
  parameters substituted by ``torch.func.functional_call``;
- ``opacus``: Opacus's ``GradSampleModule`` hooks (Yousefpour et al., "Opacus: User-Friendly
  Differential Privacy Library in PyTorch", 2021), which compute each layer's per-example gradient
  from its activations and backpropagated gradients during one ordinary backward pass.

The per-example loss is the algorithm's loss function on a batch of that one example: a term that
reads only the parameters (FedProx's proximal term, Ditto's pull to the global model, FedDyn's linear
term) is in every example's gradient, and is clipped with it, under both ways (Opacus's hooks see
only the layers' terms: the gradient of the rest is the ordinary gradient less the mean of the
per-example ones, added to each example's). DP-SGD's guarantee holds for a loss that is a mean of
per-example terms, each reading one example and the parameters; a loss that reads other examples of
the batch (batch statistics, in-batch contrast) or the client's whole data set (class counts) is
not covered. Models with BatchNorm are refused, their normalisation reading the whole batch.

Noise comes from keyed streams: one ``torch.Generator`` per job, seeded from
``raysim.rng.int_seed(seed, "privacy/dp_sgd", round, client)``, drawn on the CPU in the order of the
steps and the trained parameters, and one for the lots (``"privacy/poisson"``), so that serial and
Ray runs give the same numbers bit for bit. Both continue across a job's training passes (FedRep's
head then body): no two steps share a noise draw or a lot draw.

This module imports PyTorch inside its functions: the driver imports :func:`check`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysim import rng
from raysim.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from raysim.config import ExperimentConfig
    from raysim.models import SplitModel

    LossFn = Callable[[SplitModel, torch.Tensor, torch.Tensor], torch.Tensor]

#: the purposes of the keyed streams (raysim.rng): the noise and the Poisson lots
NOISE_PURPOSE = "privacy/dp_sgd"
LOT_PURPOSE = "privacy/poisson"


def check(cfg: ExperimentConfig) -> None:
    """ConfigError, in one sentence and before any work, for a run that DP-SGD cannot protect:
    a model with BatchNorm, or clients trained batched (``train.batch_clients`` > 1)."""
    p = cfg.privacy
    if p.example_clip is None:
        return
    from raysim.registry import MODELS

    if MODELS.get(cfg.model).batch_norm:
        raise ConfigError(
            f"privacy.example_clip (DP-SGD) needs each example's gradient to depend on that example alone, "
            f"and the model {cfg.model} has BatchNorm layers, which normalise by the whole batch."
        )
    if cfg.train.batch_clients > 1:
        raise ConfigError(
            "privacy.example_clip (DP-SGD) trains each client alone on Poisson-sampled lots: set "
            "train.batch_clients to 1."
        )


def sampling_rate(batch_size: int, num_samples: int) -> float:
    """q = B / n, each example's probability of being in a lot (1 when n <= B; 0 without examples)."""
    if num_samples <= 0:
        return 0.0
    return min(1.0, batch_size / num_samples)


@dataclass
class DPSGD:
    """One job's DP-SGD: the clip C, the noise multiplier sigma, the expected lot size L (the
    divisor), how per-example gradients are computed, and the job's noise and lot generators
    (:func:`for_client` seeds them from the run's keyed streams; None: a generator seeded 0)."""

    clip: float
    noise_multiplier: float
    expected_batch: float
    per_example: str = "torch_func"
    noise: torch.Generator | None = None
    lots: torch.Generator | None = None
    #: the DP-SGD steps taken with this object, over every pass it was attached to (an empty lot's
    #: step counted): what the client's accounting composes
    steps: int = field(default=0)

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"DP-SGD's clip must be above 0, not {self.clip}.")
        if self.noise_multiplier < 0:
            raise ValueError(f"DP-SGD's noise multiplier must be at least 0, not {self.noise_multiplier}.")
        if not self.expected_batch > 0:
            raise ValueError(f"DP-SGD's expected batch size must be above 0, not {self.expected_batch}.")
        if self.per_example not in ("torch_func", "opacus"):
            raise ValueError(f"privacy.per_example must be torch_func or opacus, not {self.per_example!r}.")

    def attach(self, model: SplitModel, params: Sequence[torch.nn.Parameter]) -> PrivateSteps:
        """The steps of one training pass over ``params`` (the trained parameters, in order)."""
        import torch

        from raysim.torch_internals import is_batch_norm

        if any(is_batch_norm(m) for m in model.modules()):
            raise ValueError(
                "DP-SGD cannot train a model with BatchNorm layers, which normalise by the whole batch."
            )
        if self.noise is None:
            self.noise = torch.Generator().manual_seed(0)
        return PrivateSteps(self, model, list(params))

    def lot_batches(
        self, x: torch.Tensor, y: torch.Tensor, count: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``count`` Poisson lots of (x, y) drawn from this job's lot generator (:func:`poisson_batches`)."""
        import torch

        if self.lots is None:
            self.lots = torch.Generator().manual_seed(0)
        return poisson_batches(x, y, self.expected_batch / max(int(x.shape[0]), 1), count, self.lots)


def for_client(
    cfg: ExperimentConfig, rnd: int, client: int, num_samples: int, *, evaluating: bool = False
) -> DPSGD | None:
    """The DP-SGD of client ``client``'s job in round ``rnd`` (None without ``privacy.example_clip``):
    q = B / n_k, the divisor q n_k, and the job's keyed generators; ``evaluating``: an evaluation's
    training (fine-tuning, a newcomer's adaptation), on streams of its own, so that it never draws
    the noise or the lots of the round's training job."""
    import torch

    p = cfg.privacy
    if p.example_clip is None:
        return None
    q = sampling_rate(cfg.train.batch_size, num_samples)
    suffix = "/evaluation" if evaluating else ""
    return DPSGD(
        clip=float(p.example_clip),
        noise_multiplier=float(p.example_noise_multiplier),
        expected_batch=max(q * num_samples, 1e-12),
        per_example=p.per_example,
        noise=torch.Generator().manual_seed(rng.int_seed(cfg.seed, NOISE_PURPOSE + suffix, rnd, client)),
        lots=torch.Generator().manual_seed(rng.int_seed(cfg.seed, LOT_PURPOSE + suffix, rnd, client)),
    )


def poisson_batches(
    x: torch.Tensor, y: torch.Tensor, rate: float, count: int, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` lots, each example of (x, y) in a lot independently with probability ``rate``
    (drawn on the CPU from ``generator``, one uniform per example and lot, so any device gives
    the same lots)."""
    import torch

    n = int(x.shape[0])
    for _ in range(count):
        keep = torch.rand(n, generator=generator) < rate
        idx = keep.nonzero().flatten().to(x.device)
        yield x.index_select(0, idx), y.index_select(0, idx)


def clip_and_sum(per_example: Sequence[torch.Tensor], clip: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """sum_i g_i / max(1, ||g_i|| / C) for per-example gradients given as one (B, *shape) tensor
    per parameter, ||g_i|| over all parameters jointly (Abadi et al. 2016, Algorithm 1, "clip
    gradient"); returns the sums (one per parameter) and the B norms before clipping."""
    import torch

    sq = torch.stack([g.flatten(1).pow(2).sum(1) for g in per_example]).sum(0)
    norms = sq.sqrt()
    factor = 1.0 / torch.clamp(norms / clip, min=1.0)
    sums = [torch.tensordot(factor.to(g.dtype), g, dims=1) for g in per_example]
    return sums, norms


class PrivateSteps:
    """DP-SGD's steps in one training pass: :meth:`step` computes a lot's noised, clipped mean
    gradient into the trained parameters' ``.grad``; :meth:`close` detaches what Opacus attached."""

    def __init__(self, dp: DPSGD, model: SplitModel, params: list[torch.nn.Parameter]) -> None:
        self.dp, self.model, self.params = dp, model, params
        named = {id(p): name for name, p in model.named_parameters()}
        missing = [p for p in params if id(p) not in named]
        if missing:
            raise ValueError(
                "DP-SGD computes per-example gradients of the model's parameters only, and this pass "
                "also trains parameters outside the model."
            )
        self.names = ["model." + named[id(p)] for p in params]
        self._opacus: Any = None
        self._contiguous: list[Any] = []
        if dp.per_example == "opacus":
            import torch
            from opacus import GradSampleModule

            # Opacus's convolution per-example gradient (opacus.utils.tensor_utils.unfold2d) reads
            # the layer's input through as_strided with the strides of a contiguous (N, C, H, W)
            # tensor, which are wrong for raysim's channels-last layout (train.channels_last):
            # each convolution's input is made contiguous first (the same values)
            def contiguous(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
                return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)

            for m in model.modules():
                if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
                    self._contiguous.append(m.register_forward_pre_hook(contiguous))
            self._opacus = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=True)

    def close(self) -> None:
        for handle in self._contiguous:
            handle.remove()
        self._contiguous = []
        if self._opacus is not None:
            self._opacus.remove_hooks()
            for p in self.params:
                if hasattr(p, "grad_sample"):
                    setattr(p, "grad_sample", None)  # noqa: B010 (an attribute Opacus adds)
            self._opacus = None

    def __enter__(self) -> PrivateSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def per_example(
        self, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each example's gradient (one (B, *shape) tensor per trained parameter) and the batch's
        mean loss, by ``privacy.per_example``."""
        if self._opacus is not None:
            return self._per_example_opacus(loss_fn, x, y)
        return self._per_example_torch_func(loss_fn, x, y)

    def _per_example_torch_func(
        self, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        from torch.func import functional_call, grad, vmap

        from raysim.models import LossModule

        module = LossModule(self.model, loss_fn)
        theta = {n: p.detach() for n, p in zip(self.names, self.params, strict=True)}

        def one(
            th: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            loss = functional_call(module, th, (xi.unsqueeze(0), yi.unsqueeze(0)))
            return loss, loss.detach()

        grads, losses = vmap(grad(one, has_aux=True), in_dims=(None, 0, 0), randomness="different")(
            theta, x, y
        )
        return [grads[n] for n in self.names], losses.mean()

    def _per_example_opacus(
        self, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        import torch

        for p in self.params:
            p.grad = None
            setattr(p, "grad_sample", None)  # noqa: B010 (an attribute Opacus adds)
        loss = loss_fn(self.model, x, y)
        with warnings.catch_warnings():
            # the hooks of a first layer, whose input needs no gradient, warn at every backward
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        n = int(x.shape[0])
        out = []
        for p in self.params:
            gs = getattr(p, "grad_sample", None)
            if p.grad is None:
                out.append(torch.zeros((n, *p.shape), dtype=p.dtype, device=p.device))
                continue
            if gs is None:
                raise ValueError(
                    "Opacus computed no per-example gradient for a trained parameter of this model: "
                    "use privacy.per_example=torch_func."
                )
            # what the layers' hooks do not see (terms of the parameters alone): the ordinary
            # gradient less the mean of the per-example ones, in every example's gradient
            rest = p.grad - gs.mean(0)
            out.append(gs + rest.unsqueeze(0))
            p.grad = None
            setattr(p, "grad_sample", None)  # noqa: B010 (an attribute Opacus adds)
        return out, loss.detach()

    def step(self, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Set each trained parameter's ``.grad`` to (sum_i clip(g_i) + N(0, sigma^2 C^2)) / L;
        returns the lot's mean loss (None for an empty lot, whose step is the noise alone)."""
        import torch

        dp = self.dp
        loss: torch.Tensor | None = None
        if int(x.shape[0]) > 0:
            per, loss = self.per_example(loss_fn, x, y)
            sums, _ = clip_and_sum(per, dp.clip)
        else:
            sums = [torch.zeros_like(p) for p in self.params]
        std = dp.noise_multiplier * dp.clip
        assert dp.noise is not None
        for p, s in zip(self.params, sums, strict=True):
            if std > 0:
                noise = torch.normal(0.0, std, size=tuple(p.shape), generator=dp.noise, dtype=p.dtype)
                s = s + noise.to(p.device)
            p.grad = (s / dp.expected_batch).detach()
        dp.steps += 1
        return loss


__all__ = [
    "DPSGD",
    "LOT_PURPOSE",
    "NOISE_PURPOSE",
    "PrivateSteps",
    "check",
    "clip_and_sum",
    "for_client",
    "poisson_batches",
    "sampling_rate",
]
