"""The deployment model of a run (``deployment.*``, docs/design.md "Simulated deployments"): its
registries, and :class:`Deployment`, which every process builds from the config alone and which
answers, from (seed, round, client), who is available, who is lost, how much work a client does,
how long it takes and which updates a round aggregates.

The registries (:mod:`raysim.registry`) are extension points like the partitions: a user registers
an availability model, a device model, a completeness model or a named deployment from a plugin
(``plugins:``) and names it in ``deployment.availability``, ``deployment.devices``,
``deployment.completeness`` or ``--deployment``. This module holds the built-in ones' makers:

- ``AVAILABILITY``: ``make(param, deployment_config, num_clients)`` -> an object with
  ``online(seed, rnd, client, now_s) -> bool`` and ``next_online_s(now_s, clients) -> float`` (how
  long until one of ``clients`` is online, for a round in which no one is; 0 for a draw per round),
  and optionally ``offline_at(client, start_s, end_s) -> float | None`` (when a client goes offline
  during its work, losing its update; without it a client online at its start stays online);
- ``DEVICES``: ``make(param, deployment_config, seed, num_clients)`` -> one
  :class:`~raysim.deployment.clock.Device` per client;
- ``COMPLETENESS``: ``make(param)`` -> ``fraction(seed, rnd, client)``, the share of each training
  pass's steps the client does, in (0, 1];
- ``DEPLOYMENTS``: named sets of ``deployment.*`` settings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from raysim import rng
from raysim.config import DeploymentConfig, ExperimentConfig, from_dict, load_config_file
from raysim.deployment import draws
from raysim.deployment.clock import Arrival, Device, close_round, default_deadline
from raysim.deployment.staleness import Staleness
from raysim.deployment.traces import MEGABIT, AvailabilityTrace, read_devices
from raysim.errors import ConfigError
from raysim.registry import AVAILABILITY, COMPLETENESS, DEPLOYMENTS, DEVICES, KindSpec, load_ref, parse_kind
from raysim.wire import Job, JobResult

# ---- availability


class Always:
    def online(self, seed: int, rnd: int, client: int, now_s: float) -> bool:
        return True

    def next_online_s(self, now_s: float, clients: Sequence[int]) -> float:
        """Seconds from ``now_s`` until one of ``clients`` is online, for a model whose clients
        come and go on the clock (0: a draw per round, which waits for no one)."""
        return 0.0

    def offline_at(self, client: int, start_s: float, end_s: float) -> float | None:
        """When ``client``, online at ``start_s``, goes offline before ``end_s`` (None: it stays)."""
        return None


@dataclass(frozen=True)
class Bernoulli(Always):
    p: float

    def online(self, seed: int, rnd: int, client: int, now_s: float) -> bool:
        return draws.available(seed, rnd, client, self.p)


@dataclass(frozen=True)
class DiurnalAvailability(Always):
    pattern: draws.Diurnal

    def online(self, seed: int, rnd: int, client: int, now_s: float) -> bool:
        return draws.available(seed, rnd, client, self.pattern, now_s)


@dataclass(frozen=True)
class Traced:
    trace: AvailabilityTrace

    def online(self, seed: int, rnd: int, client: int, now_s: float) -> bool:
        return self.trace.online(client, now_s)

    def next_online_s(self, now_s: float, clients: Sequence[int]) -> float:
        return self.trace.next_online_s(now_s, clients)

    def offline_at(self, client: int, start_s: float, end_s: float) -> float | None:
        return self.trace.offline_at(client, start_s, end_s)


def make_always(param: float | None, d: DeploymentConfig, n: int) -> Always:
    return Always()


def make_bernoulli(param: float | None, d: DeploymentConfig, n: int) -> Bernoulli:
    assert param is not None
    return Bernoulli(param)


def make_diurnal(param: float | None, d: DeploymentConfig, n: int) -> DiurnalAvailability:
    """Mean M (default 0.5), amplitude 0.8 min(M, 1 - M), the ``n`` clients placed in the zones."""
    mean = 0.5 if param is None else param
    shares = d.zone_shares if d.zone_shares is not None else (1 / d.time_zones,) * d.time_zones
    ends = draws.zone_ends(shares, n) if d.time_zones > 1 else ()
    return DiurnalAvailability(draws.Diurnal(mean, 0.8 * min(mean, 1 - mean), d.diurnal_period_h, ends))


def check_diurnal(cfg: ExperimentConfig) -> None:
    """The diurnal settings (``deployment.diurnal_period_h``, ``time_zones``, ``zone_shares``)
    against each other, the availability and the devices: one sentence, before any work."""
    d = cfg.deployment
    diurnal = parse_kind(d.availability, AVAILABILITY).kind == "diurnal"
    defaults = DeploymentConfig()
    if not diurnal:
        given = [
            f"deployment.{name}"
            for name in ("diurnal_period_h", "time_zones", "zone_shares")
            if getattr(d, name) != getattr(defaults, name)
        ]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} read only with "
                f"deployment.availability=diurnal, not {d.availability}."
            )
        return
    if not math.isfinite(d.diurnal_period_h):
        raise ConfigError(
            f"deployment.diurnal_period_h must be a finite number of hours, not {d.diurnal_period_h}."
        )
    shares = d.zone_shares
    if shares is not None:
        if len(shares) != d.time_zones:
            raise ConfigError(
                f"deployment.zone_shares gives {len(shares)} share{'s' if len(shares) != 1 else ''} "
                f"but deployment.time_zones is {d.time_zones}: one share a zone."
            )
        bad = next((s for s in shares if not s >= 0), None)  # NaN fails every comparison
        if bad is not None:
            raise ConfigError(f"Each of deployment.zone_shares must be a share at least 0, not {bad}.")
        if not math.isfinite(sum(shares)) or abs(sum(shares) - 1) > 1e-6:
            raise ConfigError(f"deployment.zone_shares must sum to 1, not {sum(shares):g}.")
    if parse_kind(d.devices, DEVICES).kind == "ideal":
        raise ConfigError(
            "deployment.availability=diurnal needs devices that take time (deployment.devices=fixed, "
            "lognormal or trace): on ideal devices the simulated clock never moves, so availability would "
            "never swing."
        )


def make_availability_trace(param: float | None, d: DeploymentConfig, n: int) -> Traced:
    if d.availability_file is None:
        raise ConfigError("deployment.availability=trace needs deployment.availability_file.")
    return Traced(AvailabilityTrace.read(d.availability_file))


# ---- devices


def base_device(d: DeploymentConfig) -> Device:
    return Device(d.seconds_per_sample, d.down_mbps * MEGABIT, d.up_mbps * MEGABIT, d.latency_s)


def make_ideal(param: float | None, d: DeploymentConfig, seed: int, n: int) -> tuple[Device, ...]:
    return (Device(),) * n


def make_fixed(param: float | None, d: DeploymentConfig, seed: int, n: int) -> tuple[Device, ...]:
    return (base_device(d),) * n


def make_lognormal(param: float | None, d: DeploymentConfig, seed: int, n: int) -> tuple[Device, ...]:
    assert param is not None
    return tuple(draws.device(seed, c, base_device(d), param) for c in range(n))


def make_device_trace(param: float | None, d: DeploymentConfig, seed: int, n: int) -> tuple[Device, ...]:
    if d.devices_file is None:
        raise ConfigError("deployment.devices=trace needs deployment.devices_file.")
    traced = read_devices(d.devices_file, base_device(d))
    return tuple(traced[c % len(traced)] for c in range(n))


# ---- completeness


def make_full(param: float | None) -> Callable[[int, int, int], float]:
    return lambda seed, rnd, client: 1.0


def make_uniform(param: float | None) -> Callable[[int, int, int], float]:
    low = 0.5 if param is None else param

    def fraction(seed: int, rnd: int, client: int) -> float:
        return low + (1 - low) * float(rng.generator(seed, "completeness", rnd, client).random())

    return fraction


def make_stragglers(param: tuple[float, float] | None) -> Callable[[int, int, int], float]:
    """FedProx's systems heterogeneity (Li et al. 2020, Sec. 5.2), ``stragglers:P:F``: each sampled
    client each round is a straggler with probability P (its own draw, "straggler"), doing a share
    drawn from U[F, 1] of each training pass's steps (``uniform:F``'s draw, "completeness"); the
    others do all their work. FedProx's code (flearn/trainers/fedprox.py) picks exactly
    round(K(1 - P)) of a round's K clients to work whole and gives the others a random whole number
    of epochs in [1, E); a worker does not know its round's cohort, so here each client is drawn
    on its own and a round's share of stragglers is P only on average."""
    assert param is not None
    share, low = param

    def fraction(seed: int, rnd: int, client: int) -> float:
        if float(rng.generator(seed, "straggler", rnd, client).random()) >= share:
            return 1.0
        return low + (1 - low) * float(rng.generator(seed, "completeness", rnd, client).random())

    return fraction


def preset_settings(preset: str) -> dict[str, Any]:
    """The ``deployment.*`` settings (without the prefix) of a registered deployment or of a YAML
    file (its settings either at the top level or under ``deployment:``)."""
    if preset in DEPLOYMENTS:
        return dict(DEPLOYMENTS.get(preset))
    path = Path(preset).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"--deployment takes a YAML file or a registered deployment ({', '.join(DEPLOYMENTS.names())}), "
            f"not {preset!r}."
        )
    data = load_config_file(path)
    inner = data.get("deployment", data) if set(data) <= {"deployment"} else data
    if not isinstance(inner, Mapping):
        raise ConfigError(f"{preset} holds no deployment settings.")
    if "preset" in inner:
        raise ConfigError(
            f"{preset} names another deployment (preset); a deployment file gives settings only."
        )
    return dict(inner)


def apply_preset(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with the deployment its ``deployment.preset`` names put beneath its own deployment
    settings, once (the preset is then cleared). For a config object, which carries every setting,
    the settings that differ from their defaults count as given; a config read from settings (a
    file, the flags, a suite) is resolved by :func:`raysim.engine.experiment.resolve_config`, which
    knows exactly what was given."""
    d = cfg.deployment
    if d.preset is None:
        return cfg
    defaults = DeploymentConfig()
    given = {f.name: getattr(d, f.name) for f in fields(d) if getattr(d, f.name) != getattr(defaults, f.name)}
    merged = {**preset_settings(d.preset), **given, "preset": None}
    return dataclasses.replace(cfg, deployment=from_dict(DeploymentConfig, merged, where="deployment"))


# ---- one run's deployment


@dataclass(frozen=True)
class RoundClose:
    """What reaches the server of a round: the job results it aggregates (chains cut at their
    first link that did not arrive), how long the round lasted, and the updates that came late."""

    kept: list[JobResult]
    duration_s: float
    late: int
    offline: int = 0  # updates lost as their clients went offline before the upload
    #: the late updates' clients and arrivals (seconds from the round's start): still working
    late_until: tuple[tuple[int, float], ...] = ()


@dataclass
class Deployment:
    """A run's deployment, the same in the driver (sampling), the server (lost and late updates, the
    round's time) and the client workers (completeness): built from the config alone."""

    cfg: ExperimentConfig

    def __post_init__(self) -> None:
        self.cfg = apply_preset(self.cfg)  # a no-op for a checked config, whose preset was applied

    @property
    def d(self) -> DeploymentConfig:
        return self.cfg.deployment

    def applies(self, rnd: int) -> bool:
        """Training rounds only: a prologue or epilogue pass over every client runs as it would anyway."""
        return 1 <= rnd <= self.cfg.rounds

    @cached_property
    def availability(self) -> Any:
        spec = parse_kind(self.d.availability, AVAILABILITY)
        return load_ref(AVAILABILITY.get(spec.kind).make)(spec.param, self.d, self.cfg.clients)

    @cached_property
    def completeness(self) -> Callable[[int, int, int], float]:
        spec = parse_kind(self.d.completeness, COMPLETENESS)
        fn: Callable[[int, int, int], float] = load_ref(COMPLETENESS.get(spec.kind).make)(spec.param)
        return fn

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        spec = parse_kind(self.d.devices, DEVICES)
        devices = tuple(load_ref(DEVICES.get(spec.kind).make)(spec.param, self.d, self.cfg.seed, self.cfg.clients))
        if len(devices) != self.cfg.clients:
            raise ConfigError(f"The device model {self.d.devices} gave {len(devices)} devices, not one a client.")
        return devices

    # ---- the driver: who is sampled
    def cohort(self) -> int:
        """How many clients a round samples: K, or K(1 + x) under over-selection."""
        k = self.cfg.clients_per_round
        return math.ceil(k * (1 + self.d.overselect)) if self.d.policy == "overselect" else k

    def sample(self, rnd: int, now_s: float, busy: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """Round ``rnd``'s clients, drawn uniformly without replacement from those available at
        ``now_s`` (simulated seconds since the run's start) and not ``busy`` (still working on an
        earlier round's update), sorted; the same draw as a run without a deployment when every
        client is available and free and the cohort is K."""
        if self.cfg.privacy.clip != "none":
            # client-level DP: the draw the accountant models, over every training client; a client
            # still busy with an earlier round's update is sampled all the same and contributes
            # nothing, as a dropout (it changes who contributes, not the sampling)
            drawn = self.draw_private(rnd)
            return [c for c in drawn if c not in busy]
        pool = [c for c in self.available(rnd, now_s) if c not in busy]
        return self.draw(rnd, 0, pool, self.cohort())

    def draw_private(self, rnd: int) -> list[int]:
        """Round ``rnd``'s cohort under client-level DP: ``privacy.sampling=poisson``, each training
        client independently with probability q = participation (one uniform a client, in id
        order, from the round's sample stream); fixed, K of them without replacement (the draw of a
        run without DP)."""
        clients = list(self.cfg.training_clients)
        if self.cfg.privacy.sampling == "poisson":
            u = rng.generator(self.cfg.seed, "sample", rnd).random(len(clients))
            return [c for c, x in zip(clients, u, strict=True) if x < self.cfg.participation]
        return self.draw(rnd, 0, clients, self.cohort())

    def available(self, rnd: int, now_s: float) -> list[int]:
        """The clients available at ``now_s`` in round ``rnd``, in id order (of those that train)."""
        clients = self.cfg.training_clients  # never one held out as a new client (eval.new_clients)
        if self.d.availability == "always":
            return list(clients)
        return [c for c in clients if self.availability.online(self.cfg.seed, rnd, c, now_s)]

    def draw(self, rnd: int, batch: int, pool: Sequence[int], k: int) -> list[int]:
        """``k`` of ``pool`` uniformly without replacement, sorted: a round's first draw
        (``batch`` 0) on the round's sample stream, as a synchronous round draws (every client:
        :func:`raysim.rng.sample_clients`); an async round's later draws each on a stream of its own."""
        if k >= len(pool):
            return sorted(pool)
        if batch == 0 and len(pool) == self.cfg.clients:
            return rng.sample_clients(self.cfg.seed, rnd, self.cfg.clients, k)
        g = rng.generator(self.cfg.seed, "sample", rnd) if batch == 0 else rng.generator(self.cfg.seed, "async_start", rnd, batch)
        return sorted(pool[int(i)] for i in g.choice(len(pool), size=k, replace=False))

    def idle_s(self, now_s: float, clients: Sequence[int] | None = None) -> float:
        """How long a round in which no client is available lasts: until one of ``clients``
        (default: the run's) is (under an availability trace; 0 for a draw per round)."""
        clients = self.cfg.training_clients if clients is None else clients
        wait = float(self.availability.next_online_s(now_s, clients))
        return wait if math.isfinite(wait) else 0.0

    def offline_at(self, client: int, start_s: float, end_s: float) -> float | None:
        """When ``client`` goes offline during its work from ``start_s`` to ``end_s``, losing its
        update (None: it stays online)."""
        offline_at = getattr(self.availability, "offline_at", None)  # optional for a model of one's own
        return offline_at(client, start_s, end_s) if offline_at is not None else None

    # ---- the client workers: partial work
    def work_fraction(self, rnd: int, client: int) -> float:
        """The share of each training pass's steps ``client`` does in round ``rnd``."""
        if self.d.completeness == "full" or not self.applies(rnd):
            return 1.0
        return self.completeness(self.cfg.seed, rnd, client)

    # ---- the server: lost updates, the round's close
    def lost(self, rnd: int, client: int) -> bool:
        return self.applies(rnd) and draws.dropped(self.cfg.seed, rnd, client, self.d.dropout)

    def without_lost(self, rnd: int, jobs: Sequence[Job]) -> tuple[list[Job], list[int]]:
        """The planned ``jobs`` without their lost clients (a chain goes on from the last client
        whose update arrived; a job with none left is not run), and the lost clients."""
        if self.d.dropout == 0 or not self.applies(rnd):
            return list(jobs), []
        out, lost = [], []
        for job in jobs:
            kept = tuple(c for c in job.clients if not self.lost(rnd, c))
            lost += [c for c in job.clients if c not in kept]
            if kept:
                out.append(job if len(kept) == len(job.clients) else Job(kept, job.payload, job.pinned))
        return out, lost

    def nominal_s(self, client: int, samples: int, model_bytes: int) -> float:
        """``client``'s nominal time for a round: E epochs of its ``samples``, the model down and
        up, on its device. A lost update is known to the server this long after its client started
        (its time-out: the server learns of a dropout when the update was due)."""
        e = self.cfg.train.local_epochs
        return self.devices[client].round_time(e * int(samples), model_bytes, model_bytes)

    def chain_arrivals(self, jr: JobResult, start_s: float = 0.0) -> list[Arrival]:
        """When each of a job's updates arrives, from the round's start: its links one after
        another, each its download, compute (the samples it trained) and upload on its device. A
        client that goes offline before its upload (an availability trace; ``start_s`` is the
        round's start on the clock) loses its update then, and the links after it too."""
        out, t = [], 0.0
        for r in jr.results:
            end = t + self.devices[r.client].round_time(r.samples_trained, r.bytes_down, r.bytes_up)
            off = self.offline_at(r.client, start_s + t, start_s + end)
            if off is not None:
                out.append(Arrival(r.client, off - start_s, dropped=True))
                out += [Arrival(later.client, off - start_s, dropped=True) for later in jr.results[len(out):]]
                break
            out.append(Arrival(r.client, end))
            t = end
        return out

    def work_s(self, jr: JobResult) -> float:
        """A job's time on its clients' devices, from its start to its last link's upload (whether
        its clients stay online the while is :meth:`offline_at`'s)."""
        return sum(self.devices[r.client].round_time(r.samples_trained, r.bytes_down, r.bytes_up) for r in jr.results)

    def arrivals(self, results: Sequence[JobResult], start_s: float = 0.0) -> list[Arrival]:
        """Every update's arrival, from the round's start (every job starts with it)."""
        return [a for jr in results for a in self.chain_arrivals(jr, start_s)]

    def default_deadline_s(self, train_sizes: Sequence[int], model_bytes: int) -> float:
        """1.5 x the median of the clients' nominal round times: E epochs of their data, the model
        down and up, on their devices."""
        return default_deadline([self.nominal_s(c, int(n), model_bytes) for c, n in enumerate(train_sizes)])

    def close(
        self,
        rnd: int,
        results: Sequence[JobResult],
        deadline_s: float | None,
        *,
        start_s: float = 0.0,
        lost: Sequence[Arrival] = (),
    ) -> RoundClose:
        """The round's close under the policy (:func:`~raysim.deployment.clock.close_round`): the
        results it keeps, each chain cut at its first link that was not kept; ``lost``: the
        dropouts, each at the time its loss is known."""
        if not self.applies(rnd):
            return RoundClose(list(results), 0.0, 0)
        arrivals = self.arrivals(results, start_s)
        closed = close_round([*arrivals, *lost], self.d.policy, deadline_s=deadline_s, want=self.cfg.clients_per_round)
        kept_clients = set(closed.kept)
        kept: list[JobResult] = []
        for jr in results:
            n = 0
            while n < len(jr.results) and jr.results[n].client in kept_clients:
                n += 1
            if n == len(jr.results):
                kept.append(jr)
            elif n:
                kept.append(JobResult(Job(jr.job.clients[:n], jr.job.payload, jr.job.pinned), jr.results[:n]))
        alive = [a for a in arrivals if not a.dropped]
        offline = len(arrivals) - len(alive)
        late = [a for a in alive if a.client not in kept_clients]
        return RoundClose(kept, closed.duration_s, len(late), offline, tuple((a.client, a.time_s) for a in late))


ASYNC = DeploymentConfig()  # the async settings' defaults


def async_sizes(cfg: ExperimentConfig) -> tuple[int, int]:
    """Async mode's (concurrency, buffer): as set, or by default the cohort K and half of it."""
    d = cfg.deployment
    concurrency = d.concurrency if d.concurrency is not None else cfg.clients_per_round
    return concurrency, d.buffer if d.buffer is not None else max(1, concurrency // 2)


def check(cfg: ExperimentConfig) -> None:
    """The deployment's settings against each other and the registries, its trace files read (in
    :func:`raysim.engine.experiment.validate`, before any work)."""
    check_diurnal(cfg)
    d = cfg.deployment
    devices: KindSpec = parse_kind(d.devices, DEVICES)
    parse_kind(d.completeness, COMPLETENESS)
    availability = parse_kind(d.availability, AVAILABILITY)
    if d.policy in ("deadline", "overselect") and devices.kind == "ideal":
        raise ConfigError(
            f"The {d.policy} policy needs devices that take time (deployment.devices=fixed, lognormal or trace); "
            "on ideal devices every update arrives at once."
        )
    if d.deadline_s is not None and d.policy != "deadline":
        raise ConfigError(f"deployment.deadline_s is read only by the deadline policy, not by {d.policy}.")
    if d.availability_file is not None and availability.kind != "trace":
        raise ConfigError("deployment.availability_file is read only with deployment.availability=trace.")
    if d.devices_file is not None and devices.kind != "trace":
        raise ConfigError("deployment.devices_file is read only with deployment.devices=trace.")
    if d.mode == "async":
        concurrency, buffer = async_sizes(cfg)
        if d.policy != "all":
            raise ConfigError(
                f"The {d.policy} policy closes a synchronous round; in async mode the server steps every "
                "deployment.buffer updates instead."
            )
        if concurrency > len(cfg.training_clients):
            raise ConfigError(
                f"deployment.concurrency ({concurrency}) cannot exceed the clients that train ({len(cfg.training_clients)})."
            )
        if buffer > concurrency:
            raise ConfigError(
                f"deployment.buffer ({buffer}) cannot exceed deployment.concurrency ({concurrency}): "
                "a server step waits for that many updates of the clients in flight."
            )
        Staleness.parse(d.staleness)
    else:
        given = [
            f"deployment.{name}"
            for name in ("concurrency", "buffer", "staleness", "max_staleness")
            if getattr(d, name) != getattr(ASYNC, name)
        ]
        if given:
            raise ConfigError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} read only in async mode (deployment.mode=async).")
    if d.time_budget_s is not None:
        if not math.isfinite(d.time_budget_s):
            raise ConfigError(f"deployment.time_budget_s (--sim-time) must be a finite number of seconds, not {d.time_budget_s}.")
        if devices.kind == "ideal":
            raise ConfigError(
                "deployment.time_budget_s (--sim-time) needs devices that take time (deployment.devices=fixed, "
                "lognormal or trace): on ideal devices the simulated clock never moves."
            )
    if d.completeness != "full" and cfg.train.batch_clients > 1:
        raise ConfigError(
            "deployment.completeness cannot be combined with train.batch_clients: a batched step trains "
            "every client of the batch for the same number of steps."
        )
    deployment = Deployment(cfg)
    if availability.kind not in ("always", "bernoulli", "diurnal"):
        _ = deployment.availability  # a trace file read (a bad one refused) before any work
    if devices.kind not in ("ideal", "fixed", "lognormal"):
        _ = deployment.devices


__all__ = [
    "apply_preset",
    "Deployment",
    "RoundClose",
    "base_device",
    "check",
    "preset_settings",
]
