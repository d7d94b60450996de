"""Server optimisers for an algorithm whose server averages the uploads (:class:`ServerOptimizer`):
FedOpt's (Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2) and FedAvgM's (Hsu, Qi and Brown, "Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification", 2019, Sec. 3).

The round's average of the uploads, y, against the weights the clients received, x, gives the
pseudo-gradient Delta = y - x (Reddi et al.'s Delta_t, the mean of the clients' changes). The server
steps with ``algo.server_opt``:

- ``sgd``: x <- x + eta Delta (eta = ``server_lr``; eta = 1 is FedAvg, to the bit: the average itself);
- ``sgdm`` (FedAvgM): m <- beta m + Delta, x <- x + eta m (beta = ``server_momentum``; Hsu et al.'s
  v <- beta v + (x - y), x <- x - eta v, the same step with the sign folded in);
- ``adam``, ``yogi``, ``adagrad`` (FedAdam, FedYogi, FedAdagrad): m <- beta1 m + (1 - beta1) Delta and
  v <- beta2 v + (1 - beta2) Delta^2 (Adam), v - (1 - beta2) Delta^2 sign(v - Delta^2) (Yogi) or
  v + Delta^2 (Adagrad), then x <- x + eta m / (sqrt(v) + tau), element by element (tau = ``tau``,
  the adaptivity). m starts at 0 and v at tau^2 (Algorithm 2's v_{-1} >= tau^2, at its bound;
  Flower starts v at 0); there is no bias correction, as in Algorithm 2. Algorithm 2 is followed
  where the authors' experiments' code differs (google-research/federated: Keras's Adam and
  Adagrad and its own Yogi): there Adam and Yogi correct the bias (at round 20, with beta1 0.9 and
  beta2 0.99, m / sqrt(v) here is about twice theirs), and Adagrad has no momentum (beta1 acts
  here, as Algorithm 2 writes it) and starts v at 0.

Every step is in float64 and stored as float32. The optimiser's state (m, v) is part of the
algorithm's server state, so a checkpoint keeps it. Registered names carry defaults: ``fedavgm``
(sgdm, eta 1, beta 0.9: Hsu et al.'s), ``fedadam`` and ``fedyogi`` (eta 10^-2.5, tau 1e-4) and
``fedadagrad`` (eta 0.1, tau 1e-2), each with beta1 0.9 and beta2 0.99: Reddi et al. tune eta and
tau per task (Sec. 5 and App. D), and these are their best for the task nearest raysim's image
sets, EMNIST character recognition with a CNN (the authors' google-research/federated,
``optimization/docs/hyperparameters.md``). Flower's eta 0.1 for FedAdam steps every coordinate by
about 0.1 in the first round (m / sqrt(v) is about sign(Delta) there), which a small CNN at a
client rate of 0.01 does not survive. Any other algorithm whose aggregate is
:class:`algorithms.fedavg.AveragedWeights`'s (FedProx, FedPer's body, Ditto's global model, MOON,
FedBN's shared entries: :meth:`ServerOptimizer.applies`) takes ``algo.server_opt`` as a setting.
Where the algorithm's own Config has a setting of the same name (MOON's and FedNTD's ``tau``, a
temperature) the name stays the algorithm's, and the adaptivity is ``algo.server_tau``. An
optimiser set on another algorithm (``algo.server_opt=adam`` on FedProx) takes that optimiser's
registered defaults (:data:`DEFAULTS`: FedAdam's eta and tau for adam), not FedAvg's rate 1, under
the settings given.

Only parameters are stepped: on a model with BatchNorm, the layers' running mean and variance
(estimates, not parameters; :func:`statistics_masks`) take the round's average, as under FedAvg.
Reddi et al.'s models use GroupNorm, whose entries are all parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raysim.capabilities.declared import Capability
from raysim.capabilities.presum import Presum
from raysim.config import ExperimentConfig
from raysim.weights import ModelWeights

#: the server optimisers (``algo.server_opt``)
OPTIMIZERS = ("sgd", "sgdm", "adam", "yogi", "adagrad")
ADAPTIVE = ("adam", "yogi", "adagrad")


@dataclass(frozen=True)
class OptSettings:
    """A run's server optimiser, its settings resolved (the capability's defaults under the given)."""

    opt: str
    lr: float
    momentum: float
    beta1: float
    beta2: float
    tau: float

    @property
    def plain(self) -> bool:
        """FedAvg's own step (sgd at rate 1): the average itself, no state."""
        return self.opt == "sgd" and self.lr == 1.0


@dataclass(frozen=True)
class OptState:
    """The server optimiser's state: the first moment m (sgdm's momentum) and the second v."""

    m: ModelWeights | None = None
    v: ModelWeights | None = None


@dataclass(frozen=True)
class ServerOptimizer(Capability):
    """``server_opt = ServerOptimizer(...)`` on an averaging algorithm's class: its defaults."""

    opt: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    @classmethod
    def applies(cls, algorithm: Any) -> bool:
        """Whether ``algorithm`` (class or object) takes the ``algo.server_opt`` settings: it declares
        the capability and its aggregate is the averaging one that declared ``Presum``."""
        return cls.of(algorithm).declared and Presum.averages(algorithm)

    def settings(self, cfg: ExperimentConfig, algorithm: Any) -> OptSettings:
        """The run's optimiser: ``algo.server_opt`` and its settings where given, else this
        declaration's defaults; a name ``algorithm``'s own Config has is the algorithm's (MOON's
        ``tau``), not the optimiser's."""
        from raysim.capabilities.settings import config_fields, engine_settings

        own = config_fields(algorithm)
        p = engine_settings({k: v for k, v in cfg.algo_params.items() if k not in own})

        def pick(given: Any, default: Any) -> Any:
            return default if given is None else given

        opt = pick(p.server_opt, self.opt)
        # another optimiser than the algorithm's: its registered defaults (FedAdam's for adam, ...)
        base = self if opt == self.opt else DEFAULTS[opt]
        return OptSettings(
            opt, float(pick(p.server_lr, base.lr)), float(pick(p.server_momentum, base.momentum)),
            float(pick(p.beta1, base.beta1)), float(pick(p.beta2, base.beta2)),
            float(pick(p.server_tau if p.server_tau is not None else p.tau, base.tau)),
        )  # fmt: skip


#: each optimiser's defaults where an algorithm runs it other than by its registered name
#: (``algo.server_opt=adam`` on FedProx takes FedAdam's): those of fedavgm, fedadam, fedyogi and
#: fedadagrad (the module docstring), and FedAvg's own step for sgd
DEFAULTS: dict[str, ServerOptimizer] = {
    "sgd": ServerOptimizer(),
    "sgdm": ServerOptimizer("sgdm", lr=1.0, momentum=0.9),
    "adam": ServerOptimizer("adam", lr=10**-2.5, tau=1e-4),
    "yogi": ServerOptimizer("yogi", lr=10**-2.5, tau=1e-4),
    "adagrad": ServerOptimizer("adagrad", lr=0.1, tau=1e-2),
}


def statistics_masks(ctx: Any, parts: Sequence[str]) -> dict[str, np.ndarray] | None:
    """For a model with BatchNorm, each of ``parts``' running-statistics entries
    (:func:`raysim.models.statistics_mask`), read from the model the server context builds; None
    for a model without (whose every entry is a parameter: the server imports no PyTorch for it)."""
    from raysim.registry import MODELS

    if not MODELS.get(ctx.cfg.model).batch_norm:
        return None
    from raysim.models import statistics_mask

    model = ctx.build_model()
    masks = {p: statistics_mask(model, p) for p in parts}
    return {p: m for p, m in masks.items() if m.any()} or None


def keep_statistics(
    stepped: ModelWeights, average: ModelWeights, statistics: Mapping[str, np.ndarray] | None
) -> ModelWeights:
    """``stepped`` with the entries ``statistics`` marks (:func:`statistics_masks`) taken from
    ``average``: a server's step past the average moves parameters, not running statistics."""
    if not statistics:
        return stepped
    parts = {n: stepped.part(n).copy() for n in stepped.part_names}
    for n, mask in statistics.items():
        parts[n][mask] = average.part(n)[mask]
    return ModelWeights(**parts)


def server_step(
    x: ModelWeights,
    y: ModelWeights,
    state: OptState | None,
    s: OptSettings,
    statistics: Mapping[str, np.ndarray] | None = None,
) -> tuple[ModelWeights, OptState]:
    """One server step from the weights sent, ``x``, and the round's average, ``y`` (see the module
    docstring): the new weights and the optimiser's new state. The entries ``statistics`` marks (a
    BatchNorm layer's running mean and variance, :func:`statistics_masks`) are estimates, not
    parameters: they take the average itself, and no optimiser steps them."""
    state = state or OptState()
    new_x, new_m, new_v = {}, {}, {}
    for n in x.part_names:
        xs = x.part(n).astype(np.float64)
        delta = y.part(n).astype(np.float64) - xs
        if s.opt == "sgd":
            new_x[n] = xs + s.lr * delta
            continue
        m_prev = state.m.part(n).astype(np.float64) if state.m is not None else np.zeros_like(xs)
        if s.opt == "sgdm":
            m = s.momentum * m_prev + delta
            new_x[n], new_m[n] = xs + s.lr * m, m
            continue
        m = s.beta1 * m_prev + (1 - s.beta1) * delta
        v_prev = state.v.part(n).astype(np.float64) if state.v is not None else np.full_like(xs, s.tau**2)
        sq = delta * delta
        if s.opt == "adam":
            v = s.beta2 * v_prev + (1 - s.beta2) * sq
        elif s.opt == "yogi":
            v = v_prev - (1 - s.beta2) * sq * np.sign(v_prev - sq)
        else:  # adagrad
            v = v_prev + sq
        new_x[n], new_m[n], new_v[n] = xs + s.lr * m / (np.sqrt(v) + s.tau), m, v

    def weights(parts: dict[str, np.ndarray]) -> ModelWeights | None:
        return ModelWeights(**{n: a.astype(np.float32) for n, a in parts.items()}) if parts else None

    out = weights(new_x)
    assert out is not None
    return keep_statistics(out, y, statistics), OptState(weights(new_m), weights(new_v))


__all__ = ["ADAPTIVE", "DEFAULTS", "OPTIMIZERS", "OptSettings", "OptState", "ServerOptimizer", "keep_statistics", "server_step", "statistics_masks"]
