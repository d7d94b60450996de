"""Client-level differential privacy on a trusted server: DP-FedAvg (McMahan, Ramage, Talwar and
Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018, Algorithm 1), with
adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with
Adaptive Clipping", NeurIPS 2021, Algorithm 1).

A round's uploads reach the server as the algorithm's clients sent them. Before the algorithm
aggregates, :meth:`ClientLevel.private_round` replaces them with one noised mean:

- each upload's change from the shared weights the client received, Delta_k = w_k - w (over every
  uploaded part at once: the shared parts; what a client keeps, its personal parts, never leaves it
  and is never clipped or noised), is clipped to L2 norm C: Delta_k * min(1, C / ||Delta_k||);
- their sum, in the plan's order in float64, gets Gaussian noise N(0, sigma^2 C^2) per coordinate,
  drawn from the keyed stream (seed, "privacy/noise", round), so every executor adds the same noise;
- it is divided by the expected cohort m (K for a fixed-size cohort, q N under Poisson sampling):
  the unbiased estimator of McMahan et al.'s Algorithm 1 (its fixed denominator W = q N), whatever
  the number of updates that arrived (a dropout or a deadline changes who contributes, not the
  sensitivity);
- the algorithm then aggregates that one upload, w + mean, as it would a round's (its aggregate is
  the size-weighted mean of its uploads, so of one upload, itself).

It applies to an algorithm whose aggregate is exactly the size-weighted mean of every upload (it
declares :class:`raysim.capabilities.presum.Presum` on the class whose ``aggregate`` it uses): the
mean is all the server does with the uploads, so the noised mean is a private release of the round.
An algorithm whose server does more with the uploads, but whose every use of them can be bounded one
client at a time, makes its own release through :class:`Release` (it declares
:class:`raysim.capabilities.private_release.PrivateRelease`; Fed3+2p's chains and Type-B groups),
and reads per-client statistics before round 1 only through :meth:`ClientLevel.noised_rows`.
Any other algorithm is refused in one sentence (:func:`raysim.engine.private.check_client_level`).

Adaptive clipping: each client also reports whether its update's norm was at most C (b_k), the
server releases b = (sum_k b_k + N(0, sigma_b^2)) / m and moves the clip geometrically towards the
quantile gamma, C <- C exp(-eta_C (b - gamma)) (Andrew et al., Algorithm 1 with the geometric update
of their Sec. 3); the updates' own noise multiplier is then the one left after the count's share of
the budget (:func:`raysim.privacy.accounting.adaptive_noise`), so the run's sigma is accounted as
a whole. The clip lives in the server's state (a checkpoint keeps it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from raysim import rng
from raysim.config import ExperimentConfig
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult


@dataclass(frozen=True)
class PrivateState:
    """What client-level DP keeps between rounds: the clip (it moves under adaptive clipping)."""

    clip: float
    #: sample-level DP: each client's DP-SGD steps so far (client, steps), sorted
    example_steps: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class RoundRelease:
    """One round's release: the uploads' noised mean as one upload, and what the log reads."""

    results: tuple[JobResult, ...]
    state: PrivateState
    scalars: tuple[tuple[str, float], ...]


def expected_cohort(cfg: ExperimentConfig) -> float:
    """m: the cohort a round samples in expectation: K for a fixed-size cohort, q N under Poisson
    sampling (q the participation, N the clients that train), the accountant's
    (:func:`raysim.privacy.accounting.population`)."""
    from raysim.privacy.accounting import population

    return float(population(cfg)[1])


def on(cfg: ExperimentConfig) -> bool:
    """Whether the run is private at the client level (``privacy.clip`` is not none)."""
    return cfg.privacy.clip != "none"


def private_rounds(cfg: ExperimentConfig, statistics: int = 0) -> ClientLevel | None:
    """The run's client-level DP (None where ``privacy.clip`` is none), with the noise multiplier
    the config gives (the driver calibrated it from ``privacy.target_epsilon`` before any work,
    :func:`calibrated`); ``statistics``: the algorithm's releases of per-client statistics before
    round 1 (:class:`raysim.capabilities.private_release.PrivateRelease`)."""
    if not on(cfg):
        return None
    cfg = calibrated(cfg, statistics)  # (as the driver did: a config it checked carries its sigma and delta)
    sigma = cfg.privacy.noise_multiplier
    assert sigma is not None, "check_privacy refuses client-level DP without a sigma or a target epsilon"
    return ClientLevel(cfg, sigma, statistics)


def calibrated(cfg: ExperimentConfig, statistics: int = 0) -> ExperimentConfig:
    """``cfg`` with ``privacy.noise_multiplier`` set where it is calibrated from
    ``privacy.target_epsilon`` (at ``privacy.delta``, over the run's rounds and the algorithm's
    ``statistics`` releases before them), and ``privacy.delta`` set to its default 1 / N^1.1 where
    it is not given: what every process of the run reads."""
    from raysim.privacy.accounting import calibrate_noise, default_delta, population

    p = cfg.privacy
    if not on(cfg):  # (sample-level DP's delta has its default of its own: raysim.privacy.sample_level)
        return cfg
    n, cohort = population(cfg)  # the accountant's: the expected cohort q N under Poisson sampling
    delta = p.delta if p.delta is not None else default_delta(n)
    sigma = p.noise_multiplier
    if sigma is None and p.target_epsilon is not None:
        sigma = calibrate_noise(p.target_epsilon, delta, cfg.rounds, p.sampling, n, cohort, p.accountant, statistics)
    return replace(cfg, privacy=replace(p, delta=delta, noise_multiplier=sigma))


def noised_mean(
    g: np.random.Generator,
    base: ModelWeights,
    uploads: Sequence[ModelWeights],
    clip: float,
    sd: float,
    denominator: float,
) -> tuple[ModelWeights, int]:
    """base + (sum_k clip(u_k - base) + N(0, sd^2)) / denominator over ``base``'s parts, and how many
    of the changes were within ``clip``: each change's norm over all the parts at once, the sum in
    float64 in the uploads' order, the noise drawn from ``g`` part by part in the weights' order (the
    same draws on every executor)."""
    names = base.part_names
    changes = [({n: up.part(n).astype(np.float64) - base.part(n) for n in names},) for up in uploads]
    (total,), unclipped = noised_sum(g, (base,), changes, clip, sd)
    mean = {n: (base.part(n) + total[n] / denominator).astype(np.float32) for n in names}
    return ModelWeights(**mean), unclipped


def noised_sum(
    g: np.random.Generator,
    like: Sequence[ModelWeights],
    changes: Sequence[Sequence[Mapping[str, np.ndarray]]],
    clip: float,
    sd: float,
) -> tuple[list[dict[str, np.ndarray]], int]:
    """sum_k clip(x_k) + N(0, sd^2) per coordinate, in float64, and how many x_k were within
    ``clip``: each upload's change x_k is a tuple of components shaped as ``like``'s (each a part
    name -> array), clipped as one vector (its L2 norm over every component and part), the sum in
    the uploads' order, the noise drawn from ``g`` component by component and part by part in their
    order (the same draws on every executor)."""
    totals = [{n: np.zeros(w.part(n).size, np.float64) for n in w.part_names} for w in like]
    unclipped = 0
    for change in changes:
        # (einsum, not np.dot: OpenBLAS's threads made each dot product 400 times slower on a busy CPU)
        norm = math.sqrt(sum(float(np.einsum("i,i->", d, d)) for component in change for d in component.values()))
        unclipped += norm <= clip
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        for total, component in zip(totals, change, strict=True):
            for n, d in component.items():
                total[n] += scale * d
    for total in totals:
        for n in total:
            if sd > 0:
                total[n] = total[n] + g.normal(0.0, sd, total[n].size)
    return totals, unclipped


class ClientLevel:
    """Client-level DP for one run: its clip, noise multipliers and expected cohort."""

    def __init__(self, cfg: ExperimentConfig, noise_multiplier: float, statistics: int = 0) -> None:
        from raysim.privacy.accounting import adaptive_noise, default_count_noise, parse_clip

        self.cfg = cfg
        p = cfg.privacy
        clip = parse_clip(p.clip)
        self.kind = clip.kind
        self.cohort = expected_cohort(cfg)
        #: sigma of the run, as accounted
        self.noise_multiplier = noise_multiplier
        self.quantile = clip.quantile
        self.count_noise = (
            (p.count_noise_multiplier if p.count_noise_multiplier is not None else default_count_noise(self.cohort))
            if self.kind == "adaptive"
            else 0.0
        )
        #: the updates' own noise multiplier: sigma, less the clipped count's share under adaptive clipping
        self.update_noise = (
            adaptive_noise(noise_multiplier, self.count_noise) if self.kind == "adaptive" and noise_multiplier > 0 else noise_multiplier
        )
        #: the algorithm's releases of per-client statistics before round 1 (:meth:`noised_rows`)
        self.statistics = statistics
        self.initial = PrivateState(p.clip_init if self.kind == "adaptive" else float(clip.norm or 0.0))
        self._accountant: Any = None

    def accountant(self) -> Any:
        """The run's accountant (:class:`raysim.privacy.accounting.Accountant`), made once."""
        if self._accountant is None:
            from raysim.privacy.accounting import Accountant

            self._accountant = Accountant.for_experiment(self.cfg, self.statistics)
        return self._accountant

    def epsilon(self, rounds: int) -> float:
        """The epsilon spent after ``rounds`` rounds, at the run's delta."""
        assert self.cfg.privacy.delta is not None, "calibrated() sets the delta"
        return float(self.accountant().epsilon(rounds, self.cfg.privacy.delta))

    def private_round(
        self, rnd: int, base: ModelWeights, results: Sequence[JobResult], state: PrivateState
    ) -> RoundRelease:
        """The round's uploads (each job's final client's shared weights) as one noised mean over
        ``base``, the shared weights the clients received; the clip's next value; the round's log
        (the clip, the share of updates clipped)."""
        clip = state.clip
        uploads = []
        for jr in results:
            if jr.final.weights is None:
                raise ValueError("client-level DP reads every client's upload of shared weights")
            uploads.append(jr.final.weights)
        g = rng.generator(self.cfg.seed, "privacy/noise", rnd)
        released, unclipped = noised_mean(g, base, uploads, clip, self.update_noise * clip, self.cohort)
        nxt = state
        if self.kind == "adaptive":
            assert self.quantile is not None
            count = (unclipped + rng.generator(self.cfg.seed, "privacy/count", rnd).normal(0.0, self.count_noise)) / self.cohort
            nxt = replace(state, clip=clip * math.exp(-self.cfg.privacy.clip_lr * (count - self.quantile)))
        one = ClientResult(client=-1, num_samples=1, train_loss=0.0, weights=released)
        scalars = (("privacy_clip", float(clip)), ("privacy_unclipped", unclipped / max(len(results), 1)))
        return RoundRelease((JobResult(Job((-1,), None), (one,)),), nxt, scalars)

    def release(self, rnd: int, state: PrivateState) -> Release:
        """Round ``rnd``'s release for an algorithm that makes its own (its units and their
        denominators: :class:`Release`), at the fixed clip ``state`` holds."""
        return Release(self, rnd, state.clip)

    def noised_rows(self, purpose: str, rows: np.ndarray) -> np.ndarray:
        """A statistic of every client released once before round 1 (one of the algorithm's
        ``statistics``, accounted by :func:`raysim.privacy.accounting.statistics_event`): each
        client's row scaled to L2 norm at most 1, plus Gaussian noise N(0, sigma^2) per entry drawn
        from the keyed stream (seed, "privacy/statistics/" + ``purpose``)."""
        x = np.asarray(rows, np.float64)
        norms = np.sqrt(np.einsum("ij,ij->i", x, x))
        x = x / np.maximum(norms, 1.0)[:, None]
        g = rng.generator(self.cfg.seed, f"privacy/statistics/{purpose}")
        return x + g.normal(0.0, self.noise_multiplier, x.shape) if self.noise_multiplier > 0 else x


class Release:
    """One round's client-level DP release for an algorithm whose server does more than average the
    uploads (it declares :class:`raysim.capabilities.private_release.PrivateRelease`): it hands the
    release each of its *units*, a set of uploads that one client's data reaches at most one of
    (a Type-B group's filters; a Fed3+2p chain, whose one model every client of the chain trained),
    and takes back the unit's noised mean (:func:`noised_mean`). Each unit's upload is clipped to C;
    the noise on each unit's sum is N(0, (sigma s C)^2) with s the unit's ``sensitivity``: the most one
    client's joining or leaving moves the clipped sum, over C (1 where each upload is one client's;
    2 for a chain, whose clipped change without the client is another vector of norm at most C).
    As one client reaches one unit, the round is one Gaussian mechanism of noise multiplier sigma,
    accounted as a round of DP-FedAvg (:func:`raysim.privacy.accounting.round_event`)."""

    def __init__(self, level: ClientLevel, rnd: int, clip: float) -> None:
        self.level = level
        self.rnd = rnd
        self.clip = clip
        self.units = 0
        self.unclipped = 0

    def expected(self, members: int) -> float:
        """The expected number of a unit's ``members`` clients that a round samples: q times them
        under Poisson sampling, K / N times them for a fixed cohort of K of N."""
        from raysim.privacy.accounting import population

        n, cohort = population(self.level.cfg)
        return cohort * members / n

    def noised_mean(
        self,
        key: int,
        base: ModelWeights,
        uploads: Sequence[ModelWeights],
        denominator: float,
        sensitivity: float = 1.0,
    ) -> ModelWeights:
        """Unit ``key``'s release over ``base`` (what its uploads started from): base + (the sum of
        their changes, each clipped to C, + N(0, (sigma ``sensitivity`` C)^2)) / ``denominator``, the
        expected size of the unit (fixed: never the number that arrived), with noise from the keyed
        stream (seed, "privacy/noise", round, ``key``). Released even where ``uploads`` is empty."""
        if denominator <= 0:
            raise ValueError(f"a unit's denominator is positive, not {denominator}")
        g = rng.generator(self.level.cfg.seed, "privacy/noise", self.rnd, key)
        sd = self.level.update_noise * self.clip * sensitivity
        out, unclipped = noised_mean(g, base, uploads, self.clip, sd, denominator)
        self.units += len(uploads)
        self.unclipped += unclipped
        return out

    def noised_sums(
        self, key: int, uploads: Sequence[Sequence[ModelWeights]], like: Sequence[ModelWeights], sensitivity: float = 1.0
    ) -> list[ModelWeights]:
        """Unit ``key``'s release of changes that are uploaded as they are (SCAFFOLD's Delta y and
        Delta c): each upload a tuple of components shaped as ``like``'s, clipped to C as one
        vector, summed, + N(0, (sigma ``sensitivity`` C)^2) per coordinate, one sum per component
        (float32), for the algorithm to scale by its own fixed denominators."""
        g = rng.generator(self.level.cfg.seed, "privacy/noise", self.rnd, key)
        sd = self.level.update_noise * self.clip * sensitivity
        changes = [tuple({n: w.part(n).astype(np.float64) for n in w.part_names} for w in up) for up in uploads]
        totals, unclipped = noised_sum(g, like, changes, self.clip, sd)
        self.units += len(uploads)
        self.unclipped += unclipped
        return [ModelWeights(**{n: t[n].astype(np.float32) for n in t}) for t in totals]

    @property
    def scalars(self) -> tuple[tuple[str, float], ...]:
        """The round's log: the clip and the share of the units' uploads within it."""
        return (("privacy_clip", float(self.clip)), ("privacy_unclipped", self.unclipped / max(self.units, 1)))


__all__ = [
    "ClientLevel",
    "PrivateState",
    "Release",
    "RoundRelease",
    "calibrated",
    "expected_cohort",
    "noised_mean",
    "noised_sum",
    "on",
    "private_rounds",
]
