"""What the engine asks of differential privacy (raysim.privacy) about an algorithm: which runs it
can protect, refused in one sentence before any work where it cannot, and the privacy fields of a
run's summary.json. The mechanisms and the accountant are in :mod:`raysim.privacy`; these checks read
the algorithm's class and its capabilities, which sit above it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raysim.capabilities.finetune import FineTune
from raysim.capabilities.presum import Presum
from raysim.capabilities.private_release import PrivateRelease
from raysim.config import ExperimentConfig
from raysim.errors import ConfigError
from raysim.privacy import client_level, dp_sgd


def eligible(algorithm: Any) -> bool:
    """Whether client-level DP can protect ``algorithm`` (class or object): its aggregate averages
    the uploads (:meth:`~raysim.capabilities.presum.Presum.averages`: then the noised mean is a
    private release of its round), or it makes its own release
    (:class:`~raysim.capabilities.private_release.PrivateRelease`)."""
    return Presum.averages(algorithm) or PrivateRelease.of(algorithm).declared


def released_statistics(cfg: ExperimentConfig, algorithm: Any, params: Any = None) -> int:
    """How many releases of per-client statistics ``algorithm`` (class with ``params``, or object)
    makes before round 1 under client-level DP (0 without it)."""
    if not client_level.on(cfg):
        return 0
    if params is None and not isinstance(algorithm, type):
        params = algorithm.params
    return PrivateRelease.of(algorithm).released_statistics(cfg, params)


def check_client_level(cfg: ExperimentConfig, algorithm: Any) -> None:
    """Refuse, in one sentence, what client-level DP cannot protect or account: an algorithm whose
    server does more with the uploads than average them, an asynchronous deployment, and a
    deployment whose sampling is not the one accounted (availability traces, over-selection)."""
    if not client_level.on(cfg):
        return
    if not eligible(algorithm):
        raise ConfigError(
            f"{cfg.algo} cannot run under client-level DP (privacy.clip): its server does more with the "
            "clients' uploads than average them, so no clip bounds what one client changes."
        )
    own = PrivateRelease.of(algorithm)
    if own.declared and own.not_adaptive is not None and cfg.privacy.clip.startswith("adaptive"):
        raise ConfigError(f"{cfg.algo} cannot adapt its clip (privacy.clip={cfg.privacy.clip}): {own.not_adaptive}; give a number.")
    d = cfg.deployment
    if d.mode == "async":
        raise ConfigError(
            "Client-level DP accounts rounds of sampled clients, and deployment.mode=async has none: "
            "run it synchronously."
        )
    if d.availability != "always":
        raise ConfigError(
            f"Client-level DP's accountant assumes every client can be sampled in every round, which "
            f"deployment.availability={d.availability} does not give: leave it always."
        )
    if d.policy == "overselect":
        raise ConfigError(
            "Over-selection keeps the first K of a larger cohort, a sampling the accountant does not "
            "model: use the all or deadline policy under client-level DP."
        )


def check_sample_level(cfg: ExperimentConfig, algorithm: Any) -> None:
    """:func:`raysim.privacy.dp_sgd.check` (BatchNorm, batched clients), an asynchronous deployment,
    the algorithm's own word on DP-SGD (its class's ``example_privacy``: None where every step its
    clients take on their data runs through DP-SGD), and "-FT", whose steps after the last round no
    accountant sees; each refused in one sentence before any work."""
    if cfg.privacy.example_clip is None:
        return
    dp_sgd.check(cfg)
    if cfg.deployment.mode == "async":
        raise ConfigError(
            "privacy.example_clip (DP-SGD) accounts each client's steps round by round, which "
            "deployment.mode=async does not have: run it synchronously."
        )
    why = getattr(algorithm, "example_privacy", "it declares nothing about DP-SGD")
    if why is not None:
        raise ConfigError(f"{cfg.algo} cannot run under privacy.example_clip (DP-SGD): {why}.")
    if FineTune.of(algorithm).on(cfg):
        raise ConfigError(
            "privacy.example_clip (DP-SGD) accounts the rounds' steps, and the fine-tuning after the last "
            "round (algo.ft_epochs) would take more on the same data: set algo.ft_epochs=0."
        )


def privacy_summary(
    cfg: ExperimentConfig,
    algorithm: Any,
    rounds_done: int,
    rows: Sequence[dict[str, Any]] = (),
    params: Any = None,
) -> dict[str, Any]:
    """summary.json's privacy fields: under client-level DP the epsilon spent over its
    ``rounds_done`` rounds at its delta (0 for an algorithm that uploads nothing, Local), the noise
    multiplier, the accountant and how it accounted the sampling; under sample-level DP the largest
    epsilon over the clients (``example_epsilon``, the last of the metric ``rows`` that has it); nothing
    for a run without DP."""
    out: dict[str, Any] = {}
    if cfg.privacy.example_clip is not None:
        spent = [r["example_epsilon"] for r in rows if r.get("example_epsilon") is not None]
        out = {
            "example_epsilon": spent[-1] if spent else 0.0,
            "example_noise_multiplier": cfg.privacy.example_noise_multiplier,
            "per_example": cfg.privacy.per_example,
        }
    if not client_level.on(cfg):
        return out
    private = client_level.private_rounds(cfg, released_statistics(cfg, algorithm, params))
    assert private is not None
    p = private.cfg.privacy
    accounting = private.accountant().describe()
    own = PrivateRelease.of(algorithm)
    if own.declared:
        accounting["clipped"] = own.clipped
    uploads = bool(getattr(algorithm, "shared_parts", ())) or PrivateRelease.of(algorithm).declared
    return {
        **out,
        "epsilon": private.epsilon(rounds_done) if uploads else 0.0,
        "delta": p.delta,
        "noise_multiplier": private.noise_multiplier,
        "accountant": accounting["accountant"],
        "sampling": p.sampling,
        "privacy": accounting,
    }


__all__ = [
    "check_client_level",
    "check_sample_level",
    "eligible",
    "privacy_summary",
    "released_statistics",
]
