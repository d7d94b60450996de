"""The privacy accountant: what (epsilon, delta) a run has spent, on Google's dp-accounting.

One round of client-level DP-FedAvg (McMahan, Ramage, Talwar and Zhang, "Learning Differentially
Private Recurrent Language Models", ICLR 2018) is the Gaussian mechanism on the sum of the sampled
clients' updates, each clipped to an L2 norm C, with noise N(0, sigma^2 C^2): after dividing by C,
one client moves the sum by at most 1 (it joins or leaves the sum) or by at most 2 (its update is
replaced by another, ||u - u'|| <= 2). How the cohort is drawn decides which neighbouring relation
the accounting can use:

* ``poisson``: every one of the N clients joins independently with probability q. dp-accounting's
  ``PoissonSampledDpEvent`` of a Gaussian is accounted by both its accountants under add/remove one
  client (the relation of Abadi et al., CCS 2016, and of DP-FedAvg): sensitivity 1, noise multiplier
  sigma.
* ``fixed``: exactly K of the N clients, uniformly without replacement. Only dp-accounting's RDP
  accountant composes a ``SampledWithoutReplacementDpEvent``, and only under replace one client
  (its ``RdpAccountant`` refuses any other relation; the PLD accountant has no such event at all),
  with the bound of Wang, Balle and Kasiviswanathan, "Subsampled Renyi Differential Privacy and
  Analytical Moments Accountant" (AISTATS 2019, Theorem 27), whose noise multiplier is over the
  replace-one sensitivity, 2 here: the event carries sigma / 2. With ``accountant=pld`` a fixed cohort
  is therefore accounted by RDP and :meth:`Accountant.describe` says so (``accountant: rdp``,
  ``requested_accountant: pld``). Treating a fixed cohort as Poisson sampling with q = K / N would
  not be a bound at all (Lebeda, Regehr, Kamath and Steinke, "Avoiding Pitfalls for Privacy
  Accounting of Subsampled Mechanisms under Composition", 2024), and RDP's bound is sound, if looser
  than a tight PLD would be.

The PLD accountant (privacy loss distributions composed by FFT: Koskela, Jalko and Honkela,
AISTATS 2020; Doroshenko, Ghazi, Kamath, Kumar and Manurangsi, PETS 2022, the library's
"connect the dots") is tight up to its discretisation (1e-4 here, pessimistic, so an upper bound);
RDP (Mironov, CSF 2017) is an upper bound that is looser, by a few to twenty per cent at the
settings the tests try.

Epsilons are rounded up to 9 significant digits (:func:`_round_up`), so that the FFT's last bits,
which may differ between machines, never show, and the figure stays an upper bound.

This module imports dp-accounting (numpy, scipy) only inside its functions, and never torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysim.errors import ConfigError

if TYPE_CHECKING:
    import dp_accounting

    from raysim.config import ExperimentConfig, PrivacyConfig

#: the sampling schemes, and the neighbouring relation each is accounted under
RELATIONS = {"poisson": "add/remove one client", "fixed": "replace one client"}
ACCOUNTANTS = ("pld", "rdp")
#: the PLD accountant's discretisation of the privacy loss (dp-accounting's default, fixed here so the
#: figure depends on nothing but the settings)
PLD_DISCRETISATION = 1e-4
#: calibration's search under PLD runs on this coarser discretisation (fifty times faster, its epsilon
#: a few 1e-5 above the fine one's at the settings tried: pessimistic, so an upper bound still),
#: then checks its answer at ``PLD_DISCRETISATION``
CALIBRATION_DISCRETISATION = 1e-2
#: calibration searches sigma in [SIGMA_MIN, SIGMA_MAX]
SIGMA_MIN = 0.3
SIGMA_MAX = 1e4
#: calibration stops when the bracket [lo, hi] has hi / lo below 1 + this
CALIBRATION_RTOL = 1e-3


# --------------------------------------------------------------------------------------------------
# small settings


def default_delta(num_clients: int) -> float:
    """delta = 1 / N^1.1 for N clients: below 1 / N, the delta at which a mechanism may publish one
    client's data outright and still claim (0, delta)-DP (Dwork and Roth, "The Algorithmic
    Foundations of Differential Privacy", 2014, Sec. 2.3)."""
    if num_clients < 1:
        raise ConfigError(f"The number of clients is at least 1, not {num_clients}.")
    return 1.0 / num_clients**1.1


def default_count_noise(expected_cohort: float) -> float:
    """sigma_b = m / 20 for an expected m clients a round: the clipped count's noise that Andrew,
    Thakkar, McMahan and Ramaswamy ("Differentially Private Learning with Adaptive Clipping",
    NeurIPS 2021, Sec. 3) recommend, so the noised fraction of unclipped clients errs by about
    1/20 (its standard deviation sigma_b / m)."""
    if not expected_cohort > 0:
        raise ConfigError(f"The expected cohort is positive, not {expected_cohort}.")
    return expected_cohort / 20.0


def adaptive_noise(noise_multiplier: float, count_noise_multiplier: float) -> float:
    """The noise multiplier left for the updates under adaptive clipping.

    Andrew et al. (NeurIPS 2021, Theorem 1 and Sec. 3): releasing the sum of updates clipped to C with
    noise sigma_Delta C and the sum of the clipped-count bits b_i - 1/2 (sensitivity 1/2) with noise
    sigma_b is, for the accountant, one Gaussian mechanism with noise multiplier z where
    z^-2 = sigma_Delta^-2 + (2 sigma_b)^-2. Given the overall z the accountant charges, the updates
    get sigma_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2), which exists only while 2 sigma_b > z.
    """
    z, sigma_b = float(noise_multiplier), float(count_noise_multiplier)
    if not z > 0:
        raise ConfigError(f"Adaptive clipping needs a positive privacy.noise_multiplier, not {z}.")
    if not sigma_b > 0:
        raise ConfigError(f"privacy.count_noise_multiplier is positive, not {sigma_b}.")
    if 2 * sigma_b <= z:
        raise ConfigError(
            f"Adaptive clipping needs twice privacy.count_noise_multiplier ({2 * sigma_b:g}) above the "
            f"overall noise multiplier {z:g}, or no noise is left for the updates."
        )
    return (z**-2 - (2 * sigma_b) ** -2) ** -0.5


# --------------------------------------------------------------------------------------------------
# the clip setting


@dataclass(frozen=True)
class ClipSpec:
    """``privacy.clip`` parsed: ``kind`` is none, fixed (``norm`` is C) or adaptive (``quantile``
    is the target quantile Q of Andrew et al., NeurIPS 2021)."""

    kind: str
    norm: float | None = None
    quantile: float | None = None

    @property
    def on(self) -> bool:
        return self.kind != "none"


def parse_clip(text: Any) -> ClipSpec:
    """``none``, a positive number (the clip norm C) or ``adaptive:Q`` with 0 < Q < 1; anything else
    is refused in one sentence."""
    raw = str(text).strip()
    low = raw.lower()
    if low in ("none", "null", ""):
        return ClipSpec("none")
    if low.startswith("adaptive"):
        rest = low[len("adaptive") :]
        try:
            if not rest.startswith(":"):
                raise ValueError
            q = float(rest[1:])
        except ValueError:
            raise ConfigError(
                f"privacy.clip adaptive is written adaptive:Q with a quantile Q in (0, 1), not {raw!r}."
            ) from None
        if not 0 < q < 1:
            raise ConfigError(
                f"privacy.clip adaptive:Q needs a quantile Q strictly between 0 and 1, not {q:g}."
            )
        return ClipSpec("adaptive", quantile=q)
    try:
        c = float(raw)
    except ValueError:
        raise ConfigError(f"privacy.clip is none, a positive clip norm or adaptive:Q, not {raw!r}.") from None
    if not (c > 0 and math.isfinite(c)):
        raise ConfigError(f"privacy.clip, the clip norm, is a positive finite number, not {raw!r}.")
    return ClipSpec("fixed", norm=c)


# --------------------------------------------------------------------------------------------------
# events and accountants


def _check_population(sampling: str, num_clients: int, cohort: float) -> None:
    if sampling not in RELATIONS:
        raise ConfigError(f"privacy.sampling is 'fixed' or 'poisson', not {sampling!r}.")
    if not (isinstance(num_clients, int) and num_clients >= 1):
        raise ConfigError(f"The number of clients to sample from is a positive integer, not {num_clients!r}.")
    if sampling == "fixed" and not (float(cohort).is_integer() and 1 <= cohort <= num_clients):
        raise ConfigError(
            f"A fixed cohort is a whole number of clients from 1 to {num_clients}, not {cohort!r}."
        )
    if sampling == "poisson" and not 0 < cohort <= num_clients:
        raise ConfigError(f"A Poisson cohort's expected size is in (0, {num_clients}], not {cohort!r}.")


def round_event(
    noise_multiplier: float, sampling: str, num_clients: int, cohort: float
) -> dp_accounting.DpEvent:
    """One round of DP-FedAvg as a dp-accounting event.

    ``poisson``: ``PoissonSampledDpEvent(q = cohort / num_clients, GaussianDpEvent(sigma))``, for
    add/remove one client (sensitivity 1 after dividing by C); ``cohort`` may be the expected,
    fractional, cohort. ``fixed``: ``SampledWithoutReplacementDpEvent(num_clients, cohort,
    GaussianDpEvent(sigma / 2))``, for replace one client: the event's noise multiplier is over the
    replace-one sensitivity, which is 2 (Wang, Balle and Kasiviswanathan, AISTATS 2019, Theorem 27,
    as dp-accounting's RDP accountant implements it).
    """
    import dp_accounting

    _check_population(sampling, num_clients, cohort)
    sigma = float(noise_multiplier)
    if sigma < 0:
        raise ConfigError(f"privacy.noise_multiplier is at least 0, not {sigma}.")
    if sampling == "poisson":
        return dp_accounting.PoissonSampledDpEvent(cohort / num_clients, dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, int(cohort), dp_accounting.GaussianDpEvent(sigma / 2)
    )


def _accountant(
    name: str, sampling: str, discretisation: float = PLD_DISCRETISATION
) -> dp_accounting.PrivacyAccountant:
    """A fresh dp-accounting accountant for this sampling: RDP for a fixed cohort whatever ``name``
    asks (PLD has no sampling without replacement)."""
    import dp_accounting
    from dp_accounting import pld, rdp

    if sampling == "fixed":
        return rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    if name == "pld":
        return pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, discretisation)
    return rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)


def _round_up(x: float, digits: int = 9) -> float:
    """``x`` rounded up to ``digits`` significant digits (inf and 0 stay)."""
    if x == 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(abs(x))))
    return math.ceil(x * scale) / scale


def _check_accountant(name: str) -> None:
    if name not in ACCOUNTANTS:
        raise ConfigError(f"privacy.accountant is 'pld' or 'rdp', not {name!r}.")


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ConfigError(f"privacy.delta is between 0 and 1, not {delta!r}.")


def statistics_event(noise_multiplier: float, sampling: str) -> dp_accounting.DpEvent:
    """One release of a statistic of every client before round 1 (an algorithm's, e.g. Fed3+2p's
    label distributions for its grouping), each client's row of L2 norm at most 1 with Gaussian
    noise of standard deviation sigma, as a dp-accounting event: ``GaussianDpEvent(sigma)``, not
    subsampled (every client's row is released). Under add/remove one client, the client's row
    against a null client's (a row of zeros): sensitivity 1. Under replace one client (a fixed
    cohort's relation), sensitivity 2 as for a round (:func:`round_event`), so the event carries
    sigma / 2 (two rows of norm at most 1 differ by at most 2: a bound, never below the truth)."""
    import dp_accounting

    return dp_accounting.GaussianDpEvent(float(noise_multiplier) / (2 if sampling == "fixed" else 1))


@functools.lru_cache(maxsize=1024)  # a pure function of its settings (calibration and checks repeat them)
def _epsilon(
    sigma: float,
    sampling: str,
    num_clients: int,
    cohort: float,
    rounds: int,
    delta: float,
    accountant: str,
    statistics: int = 0,
    discretisation: float = PLD_DISCRETISATION,
) -> float:
    """epsilon after ``rounds`` rounds and ``statistics`` releases of per-client statistics before
    them (:func:`statistics_event`), unrounded (PLD at ``discretisation``)."""
    import dp_accounting

    if rounds == 0 and statistics == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    acc = _accountant(accountant, sampling, discretisation)
    if statistics:
        acc.compose(dp_accounting.SelfComposedDpEvent(statistics_event(sigma, sampling), statistics))
    if rounds:
        acc.compose(dp_accounting.SelfComposedDpEvent(round_event(sigma, sampling, num_clients, cohort), rounds))
    return float(acc.get_epsilon(delta))


def dp_sgd_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "pld"
) -> float:
    """Sample-level DP-SGD's epsilon for one client's data (Abadi et al., "Deep Learning with
    Differential Privacy", CCS 2016): ``steps`` compositions of the Poisson-sampled Gaussian with
    rate q = ``sample_rate`` and noise multiplier sigma, under add/remove one example."""
    _check_accountant(accountant)
    _check_delta(delta)
    if not 0 < sample_rate <= 1:
        raise ConfigError(f"DP-SGD's sample rate is in (0, 1], not {sample_rate!r}.")
    if steps < 0:
        raise ConfigError(f"DP-SGD's number of steps is at least 0, not {steps!r}.")
    if noise_multiplier < 0:
        raise ConfigError(f"privacy.example_noise_multiplier is at least 0, not {noise_multiplier!r}.")
    import dp_accounting

    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    acc = _accountant(accountant, "poisson")
    event = dp_accounting.PoissonSampledDpEvent(
        sample_rate, dp_accounting.GaussianDpEvent(float(noise_multiplier))
    )
    acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return _round_up(float(acc.get_epsilon(delta)))


@functools.lru_cache(maxsize=256)  # a pure function of its settings: a suite's trials share a few
def calibrate_noise(
    target_epsilon: float,
    delta: float,
    rounds: int,
    sampling: str,
    num_clients: int,
    cohort: float,
    accountant: str = "pld",
    statistics: int = 0,
) -> float:
    """The smallest noise multiplier sigma (to a relative 1e-3, never below ``SIGMA_MIN``) whose
    ``rounds`` rounds (after ``statistics`` releases of per-client statistics,
    :func:`statistics_event`) spend at most ``target_epsilon`` at ``delta``.

    A target not met even by sigma = ``SIGMA_MAX`` is refused before the search. The search brackets
    sigma by doubling or halving from 1, then bisects geometrically; epsilon falls as sigma grows, so
    the upper end of the final bracket is the answer (it always meets the target). Under PLD the
    search reads the coarser ``CALIBRATION_DISCRETISATION`` (a pessimistic bound, at or above the
    fine one's epsilon) and its answer is checked at ``PLD_DISCRETISATION``; where the check fails
    the search runs again at the fine discretisation.
    """
    _check_accountant(accountant)
    _check_delta(delta)
    _check_population(sampling, num_clients, cohort)
    if not target_epsilon > 0:
        raise ConfigError(f"privacy.target_epsilon is positive, not {target_epsilon!r}.")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ConfigError(f"Calibration needs at least one round, not {rounds!r}.")

    def spends(sigma: float, discretisation: float = PLD_DISCRETISATION) -> float:
        return _round_up(
            _epsilon(sigma, sampling, num_clients, cohort, rounds, delta, accountant, statistics, discretisation)
        )

    if spends(SIGMA_MAX) > target_epsilon:
        raise ConfigError(
            f"privacy.target_epsilon {target_epsilon:g} at delta {delta:g} cannot be met in {rounds} rounds "
            f"even with noise multiplier {SIGMA_MAX:g}."
        )
    if accountant == "pld" and sampling == "poisson":
        sigma = _smallest_sigma(lambda x: spends(x, CALIBRATION_DISCRETISATION), target_epsilon)
        if spends(sigma) <= target_epsilon:
            return sigma
    return _smallest_sigma(spends, target_epsilon)


def _smallest_sigma(spends: Callable[[float], float], target_epsilon: float) -> float:
    """:func:`calibrate_noise`'s search: the smallest sigma in [``SIGMA_MIN``, ``SIGMA_MAX``], to a
    relative ``CALIBRATION_RTOL``, whose ``spends(sigma)`` is at most the target."""
    hi = 1.0
    if spends(hi) <= target_epsilon:
        while hi > SIGMA_MIN and spends(max(hi / 2, SIGMA_MIN)) <= target_epsilon:
            hi = max(hi / 2, SIGMA_MIN)
        if hi == SIGMA_MIN:
            return SIGMA_MIN
        lo = max(hi / 2, SIGMA_MIN)
    else:
        lo = hi
        while spends(hi) > target_epsilon:
            lo, hi = hi, min(hi * 2, SIGMA_MAX)
    while hi / lo > 1 + CALIBRATION_RTOL:
        mid = math.sqrt(lo * hi)
        if spends(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass
class Accountant:
    """A run's accountant: its noise multiplier (the overall z under adaptive clipping), sampling,
    population and cohort (expected, for Poisson), the accountant asked for, and delta.

    :meth:`epsilon` is cached per (rounds, delta): a run asks after every round.
    """

    noise_multiplier: float
    sampling: str
    num_clients: int
    cohort: float
    accountant: str = "pld"
    delta: float | None = None
    clip: ClipSpec = field(default_factory=lambda: ClipSpec("fixed", norm=1.0))
    count_noise_multiplier: float | None = None
    calibrated_for: float | None = None
    #: releases of per-client statistics before round 1 (:func:`statistics_event`), the algorithm's
    statistics: int = 0
    _cache: dict[tuple[int, float], float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_accountant(self.accountant)
        _check_population(self.sampling, self.num_clients, self.cohort)
        if self.noise_multiplier < 0:
            raise ConfigError(f"privacy.noise_multiplier is at least 0, not {self.noise_multiplier!r}.")
        if self.delta is None:
            self.delta = default_delta(self.num_clients)
        _check_delta(self.delta)
        if self.clip.kind == "adaptive":
            if self.count_noise_multiplier is None:
                self.count_noise_multiplier = default_count_noise(self.cohort)
            adaptive_noise(self.noise_multiplier, self.count_noise_multiplier)

    @classmethod
    def of(
        cls, privacy: PrivacyConfig, num_clients: int, cohort: float, rounds: int, statistics: int = 0
    ) -> Accountant:
        """The accountant of a run with these ``privacy.*`` settings, ``num_clients`` clients to
        sample from and ``cohort`` clients a round (K for ``fixed``; the expected q N for
        ``poisson``), and ``statistics`` releases of per-client statistics before round 1; sigma is
        calibrated for ``rounds`` rounds when only ``target_epsilon`` is given. Client-level DP must
        be on (``privacy.clip``)."""
        clip = parse_clip(privacy.clip)
        if not clip.on:
            raise ConfigError("Client-level accounting needs privacy.clip, which is none.")
        delta = privacy.delta if privacy.delta is not None else default_delta(num_clients)
        sigma = privacy.noise_multiplier
        if sigma is None:
            if privacy.target_epsilon is None:
                raise ConfigError("privacy.clip needs privacy.noise_multiplier or privacy.target_epsilon.")
            sigma = calibrate_noise(
                privacy.target_epsilon,
                delta,
                rounds,
                privacy.sampling,
                num_clients,
                cohort,
                privacy.accountant,
                statistics,
            )
        return cls(
            noise_multiplier=float(sigma),
            sampling=privacy.sampling,
            num_clients=num_clients,
            cohort=cohort,
            accountant=privacy.accountant,
            delta=delta,
            clip=clip,
            count_noise_multiplier=privacy.count_noise_multiplier,
            calibrated_for=privacy.target_epsilon if privacy.noise_multiplier is None else None,
            statistics=statistics,
        )

    @classmethod
    def for_experiment(cls, cfg: ExperimentConfig, statistics: int = 0) -> Accountant:
        """:meth:`of` for a whole config: the clients that may be sampled
        (``cfg.training_clients``), K = ``cfg.clients_per_round`` for ``fixed`` or the expected
        ``participation`` times their number for ``poisson``, and ``cfg.rounds``; ``statistics``
        the algorithm's releases before round 1."""
        n, cohort = population(cfg)
        return cls.of(cfg.privacy, n, cohort, cfg.rounds, statistics)

    @property
    def used_accountant(self) -> str:
        """The accountant that does the work: RDP for a fixed cohort, whatever was asked."""
        return "rdp" if self.sampling == "fixed" else self.accountant

    @property
    def update_noise_multiplier(self) -> float:
        """The noise multiplier of the clipped updates: z itself, or sigma_Delta under adaptive
        clipping (:func:`adaptive_noise`)."""
        if self.clip.kind == "adaptive" and self.count_noise_multiplier is not None:
            return adaptive_noise(self.noise_multiplier, self.count_noise_multiplier)
        return self.noise_multiplier

    def epsilon(self, rounds_done: int, delta: float | None = None) -> float:
        """epsilon spent after ``rounds_done`` rounds at ``delta`` (the run's delta when None), the
        statistics released before round 1 included: 0 after no round where there are none, inf
        with no noise."""
        d = self.delta if delta is None else delta
        assert d is not None
        _check_delta(d)
        if rounds_done < 0:
            raise ConfigError(f"Rounds done are at least 0, not {rounds_done}.")
        key = (int(rounds_done), float(d))
        if key not in self._cache:
            eps = _epsilon(
                self.noise_multiplier,
                self.sampling,
                self.num_clients,
                self.cohort,
                key[0],
                key[1],
                self.used_accountant,
                self.statistics,
            )
            self._cache[key] = _round_up(eps)
        return self._cache[key]

    def describe(self) -> dict[str, Any]:
        """What summary.json records about the accounting."""
        out: dict[str, Any] = {
            "accountant": self.used_accountant,
            "requested_accountant": self.accountant,
            "sampling": self.sampling,
            "neighbouring_relation": RELATIONS[self.sampling],
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
            "num_clients": self.num_clients,
        }
        if self.sampling == "fixed":
            out["cohort"] = int(self.cohort)
            if self.accountant == "pld":
                out["note"] = (
                    "a fixed cohort is accounted by RDP: the PLD accountant has no sampling without replacement"
                )
        else:
            out["q"] = self.cohort / self.num_clients
        if self.calibrated_for is not None:
            out["calibrated_for_epsilon"] = self.calibrated_for
        if self.statistics:
            out["statistics_releases"] = self.statistics
        if self.clip.kind == "adaptive":
            out["count_noise_multiplier"] = self.count_noise_multiplier
            out["update_noise_multiplier"] = self.update_noise_multiplier
        return out


# --------------------------------------------------------------------------------------------------
# the settings' relations


def population(cfg: ExperimentConfig) -> tuple[int, float]:
    """(N, cohort) the accountant sees: N the clients that may be sampled, the cohort K for
    ``fixed`` or the expected participation * N for ``poisson``."""
    n = len(cfg.training_clients)
    if cfg.privacy.sampling == "poisson":
        return n, cfg.participation * n
    return n, cfg.clients_per_round


def _calibrated_pair(cfg: ExperimentConfig, statistics: int) -> bool:
    """Whether the config's noise multiplier is one calibration gives for its target epsilon (a
    checked run's config.yaml carries both): it meets the target, and a sigma a few calibration
    tolerances below it does not (or it is ``SIGMA_MIN``). Then the pair says one thing, and a rerun
    of it is accepted; two accountant calls, not a search."""
    p = cfg.privacy
    assert p.noise_multiplier is not None and p.target_epsilon is not None
    n, cohort = population(cfg)
    delta = p.delta if p.delta is not None else default_delta(n)
    sigma = p.noise_multiplier
    if not SIGMA_MIN <= sigma <= SIGMA_MAX:
        return False

    def spends(x: float) -> float:
        return _round_up(_epsilon(x, p.sampling, n, cohort, cfg.rounds, delta, p.accountant, statistics))

    below = sigma / (1 + 4 * CALIBRATION_RTOL)
    return spends(sigma) <= p.target_epsilon and (sigma == SIGMA_MIN or spends(below) > p.target_epsilon)


def check_privacy(cfg: ExperimentConfig, statistics: int = 0) -> None:
    """Refuse, in one sentence each and before any work, every ``privacy.*`` combination that cannot
    mean what it says (single values' ranges are checked when the config is built); ``statistics``:
    the algorithm's releases of per-client statistics before round 1."""
    from raysim.config import PrivacyConfig

    p = cfg.privacy
    defaults = PrivacyConfig()
    clip = parse_clip(p.clip)
    example = p.example_clip is not None
    if p.sampling not in RELATIONS:
        raise ConfigError(f"privacy.sampling is 'fixed' or 'poisson', not {p.sampling!r}.")
    _check_accountant(p.accountant)
    if not clip.on:
        if p.noise_multiplier is not None:
            raise ConfigError(
                "privacy.noise_multiplier is client-level noise and needs privacy.clip, which is none."
            )
        if p.target_epsilon is not None:
            raise ConfigError(
                "privacy.target_epsilon calibrates client-level noise and needs privacy.clip, which is none."
            )
        if p.sampling == "poisson" and not example:
            raise ConfigError(
                "privacy.sampling=poisson only matters for differential privacy: set privacy.clip or privacy.example_clip."
            )
        if p.delta is not None and not example:
            raise ConfigError(
                "privacy.delta is given but no differential privacy is on: set privacy.clip or privacy.example_clip."
            )
    else:
        if p.noise_multiplier is not None and p.target_epsilon is not None and not _calibrated_pair(cfg, statistics):
            raise ConfigError(
                "Give privacy.noise_multiplier or privacy.target_epsilon, not both: one decides the other."
            )
        if p.noise_multiplier is None and p.target_epsilon is None:
            raise ConfigError(
                f"privacy.clip={p.clip} needs privacy.noise_multiplier or privacy.target_epsilon."
            )
    if clip.kind != "adaptive":
        for name in ("clip_init", "clip_lr", "count_noise_multiplier"):
            if getattr(p, name) != getattr(defaults, name):
                raise ConfigError(
                    f"privacy.{name} is for adaptive clipping and needs privacy.clip=adaptive:Q, not {p.clip!r}."
                )
    if not example:
        for name in ("example_noise_multiplier", "per_example"):
            if getattr(p, name) != getattr(defaults, name):
                raise ConfigError(f"privacy.{name} is for DP-SGD and needs privacy.example_clip.")
    if not clip.on:
        return
    n, cohort = population(cfg)
    if p.delta is not None and p.delta >= 1 / n:
        raise ConfigError(
            f"privacy.delta {p.delta:g} is not below 1/N = {1 / n:g} for the {n} clients that may be sampled, "
            "a delta at which one client's data may be published outright."
        )
    if clip.kind == "adaptive" and p.noise_multiplier is not None:
        sigma_b = (
            p.count_noise_multiplier if p.count_noise_multiplier is not None else default_count_noise(cohort)
        )
        adaptive_noise(p.noise_multiplier, sigma_b)
    if p.target_epsilon is not None:
        delta = p.delta if p.delta is not None else default_delta(n)
        if (
            _round_up(_epsilon(SIGMA_MAX, p.sampling, n, cohort, cfg.rounds, delta, p.accountant, statistics))
            > p.target_epsilon
        ):
            raise ConfigError(
                f"privacy.target_epsilon {p.target_epsilon:g} at delta {delta:g} cannot be met in {cfg.rounds} rounds "
                f"even with noise multiplier {SIGMA_MAX:g}."
            )
