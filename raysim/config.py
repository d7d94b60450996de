"""The one configuration tree of a raysim experiment.

Everything an experiment needs is an :class:`ExperimentConfig`: a tree of frozen dataclasses with one
place for each default. It loads from a YAML or TOML file (:func:`load_config_file`), takes dotted
overrides (``train.lr=0.05``) and is validated as a whole (:func:`raysim.engine.experiment.validate`, which
reads the registries) before any work starts. The algorithm's own parameters live in ``algo_params``
and are turned into the algorithm's typed, frozen config (its ``Config``) by
:func:`raysim.engine.experiment.algorithm_params`.
"""

from __future__ import annotations

import functools
import json
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import tomllib

from raysim.errors import ConfigError


@dataclass(frozen=True)
class Bounds:
    """A number setting's allowed range, declared where the setting is defined (:func:`setting`)
    and enforced by one checker whenever a config is built (:func:`from_dict`)."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    #: what the setting is, said after a value out of range (e.g. that an accuracy is a fraction)
    hint: str = ""

    def check(self, value: Any, where: str) -> None:
        if value is None:  # an optional setting left to its default
            return
        hint = f" ({self.hint})" if self.hint else ""
        if value != value:  # NaN, which every comparison below would let through
            raise ConfigError(f"{where} must be a number, not {value!r}{hint}.")
        if self.at_least is not None and value < self.at_least:
            raise ConfigError(f"{where} must be at least {self.at_least:g}, not {value!r}{hint}.")
        if self.above is not None and value <= self.above:
            raise ConfigError(f"{where} must be above {self.above:g}, not {value!r}{hint}.")
        if self.at_most is not None and value > self.at_most:
            raise ConfigError(f"{where} must be at most {self.at_most:g}, not {value!r}{hint}.")
        if self.below is not None and value >= self.below:
            raise ConfigError(f"{where} must be below {self.below:g}, not {value!r}{hint}.")


def setting(
    default: Any,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    hint: str = "",
) -> Any:
    """A dataclass field with its allowed range: ``batch_size: int = setting(40, at_least=1)``;
    ``hint`` follows a value out of range. (Allowed words are declared with the type:
    ``Literal["fo", "hf"]``.)"""
    return field(default=default, metadata={"bounds": Bounds(at_least, above, at_most, below, hint)})


def names_setting() -> Any:
    """A dataclass field holding a list of names (``--log mlflow,wandb``), empty by default: an
    empty item and a name given twice are refused (:func:`check_names`); which names are allowed
    is its type's (``tuple[Literal[...], ...]``) or its registry's."""
    return field(default=(), metadata={"names": True})


def check_names(value: Any, where: str) -> None:
    """A list of names as given (``a,b`` or a list): refuse an empty item and a name given twice."""
    items = value.strip("()[] ").split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        return  # not a list: the type's own check says so
    if isinstance(value, str) and not value.strip("()[] "):
        return  # an empty list
    seen: set[str] = set()
    for item in items:
        name = str(item).strip()
        if not name:
            raise ConfigError(f"{where} has an empty item in {value!r}; give names separated by single commas.")
        if name in seen:
            raise ConfigError(f"{where} names {name!r} twice; give each once.")
        seen.add(name)


@dataclass(frozen=True)
class SyntheticConfig:
    """The ``synthetic`` dataset: class-conditional Gaussians shaped as small images.

    Each class c has a mean ``separation * m_c`` with ``m_c ~ N(0, I)``; a sample is its class mean
    plus unit Gaussian noise, reshaped to ``shape``. Generated from the experiment seed.
    """

    #: 200 training and 50 test samples a client of the default federation (100 clients), which its
    #: default split (Dirichlet 0.1, at least ``data.min_samples`` a client) needs
    train_samples: int = 20000
    test_samples: int = 5000
    num_classes: int = 10
    shape: tuple[int, ...] = (1, 16, 16)
    separation: float = 0.5


@dataclass(frozen=True)
class DataConfig:
    """Dataset, partition and local test sets (docs/usage.md, "Data")."""

    dataset: str = "fmnist"  # a name in raysim.registry.DATASETS
    data_dir: str | None = None  # where the dataset's files are (or are downloaded to)
    download: bool = True  # allow torchvision's download when the files are not found
    partition: str = "dirichlet:0.1"  # KIND or KIND:PARAM of raysim.registry.PARTITIONS
    test_mode: str = "matched"  # KIND or KIND:PARAM of raysim.registry.TEST_MODES
    min_samples: int = setting(10, at_least=0)  # dirichlet: redraw until every client has this many (choice)
    samples_per_client: int = setting(600, at_least=1)  # dominant: samples per client (600; 1000 for EMNIST)
    #: pathological: which classes a client holds. shuffled: consecutive classes of a seeded class
    #: permutation; sequential: consecutive labels, client i holding classes i*k .. i*k+k-1 (mod C),
    #: as PFLlib's "pat" split does (the pairs (0,1), (2,3), ... on FMNIST); random: k distinct
    #: classes drawn for each client (FedFCD Sec. 4.1.1), every class held by about as many clients
    class_order: Literal["shuffled", "sequential", "random"] = "shuffled"
    #: pathological: a class's samples split evenly among the clients that hold it (true), or in
    #: random shares as PFLlib's unbalanced "pat" split (false; FedFCD's "unbalanced manner")
    balance: bool = True
    #: the clients' training batches: none, or crop_flip (a random crop of the image padded by 4 and
    #: a horizontal flip, each batch from the client's seeded stream; raysim.toolkit.augment)
    augment: Literal["none", "crop_flip"] = "none"
    #: hold out this fraction of each client's training data as its validation part (never trained
    #: on), for model selection such as Fed3+2p's automatic phase switch
    val_fraction: float = setting(0.0, at_least=0, below=1)
    #: data whose features differ between clients (raysim.data.feature_shift): none, rotate:K (the
    #: clients split into K domains, domain d's images rotated by 360/K * d degrees, IFCA's rotated
    #: MNIST) or corrupt:K (K domains, each one fixed corruption at a fixed strength); any label
    #: partition. Each client's P-Test is in its own domain; G-Test is its union over the domains
    feature_shift: str = "none"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass(frozen=True)
class TrainConfig:
    """Local training: SGD and the learning-rate schedule (docs/usage.md, "Settings")."""

    local_epochs: int = setting(5, at_least=0)
    batch_size: int = setting(40, at_least=1)
    lr: float = setting(0.01, above=0)
    momentum: float = setting(0.9, at_least=0)
    weight_decay: float = setting(1e-5, at_least=0)
    #: multiply the learning rate by this every round; 1: a constant rate, as PFLlib, FL-bench and
    #: pfl-research default to (a paper setup sets its paper's schedule: Fed3+2p's 0.99 a round)
    lr_decay: float = setting(1.0, above=0, at_most=1)
    lr_milestones: tuple[float, ...] = ()  # fractions of the rounds where the rate is multiplied by lr_gamma
    lr_gamma: float = 0.1
    #: intra-op threads of a training job; None: 1 on a CPU worker (which then trains
    #: ``cpus_per_worker`` jobs at once, see ``ray.jobs_per_worker``), ``cpus_per_worker`` (at least 1)
    #: on a GPU worker
    threads: int | None = setting(None, at_least=1)
    #: train up to this many clients of a round at once, as one batched computation (raysim.toolkit.batched),
    #: where the algorithm and the model allow it; 1: one by one
    batch_clients: int = setting(1, at_least=1)
    #: leave out each epoch's last, partial mini-batch (PyTorch's ``DataLoader(drop_last=True)``):
    #: a client then trains on full batches only, and one with fewer samples than a batch not at all
    drop_last: bool = False
    #: convolution kernels (and so activations) in PyTorch's channels-last memory format: faster
    #: convolutional training on CPU (docs/benchmarks.md). False: NCHW, the layout of every run
    #: up to commit 751e35a, whose numbers it gives to the bit (the layouts' kernels sum in
    #: different orders: the same model to float rounding, not to the bit)
    channels_last: bool = True

    def rate(self, rnd: int, rounds: int) -> float:
        """Round ``rnd``'s learning rate (of ``rounds``): lr * lr_decay^(rnd-1), times lr_gamma
        for each milestone (a fraction of the rounds) already passed."""
        rate = self.lr * self.lr_decay ** (rnd - 1)
        for m in self.lr_milestones:
            if rnd > m * rounds:
                rate *= self.lr_gamma
        return rate


@dataclass(frozen=True)
class EvalConfig:
    every: int = setting(1, at_least=0)  # evaluate every k rounds (and always after the last); 0: only after the last
    batch_size: int = setting(500, at_least=1)
    #: summary.json's "last": the mean of each metric over its last k evaluations
    last_k: int = setting(5, at_least=1)
    #: FedDr+'s analyses (raysim.results.analysis): per-class accuracy, observed/unobserved-class accuracy,
    #: feature-classifier alignment and feature norm, of the global and the local models
    analyses: bool = False
    #: ``updated_lm_ptest``, for any algorithm: each client's model as its local update in an
    #: evaluated round left it, on its own P-Test, over the clients trained in that round (PACFL's
    #: authors read their clustered baselines' LM so). For an algorithm without personal models
    #: (FedAvg, FedProx, FedDyn, ...) it is also its ``lm_ptest`` (Fed3+2p's Table 1 reads LM so
    #: for its global-only rows)
    updated_lm: bool = False
    #: Fed3+2p's Fig. 3: after the last round, the features f(x) (the global head's input) of this
    #: many G-Test images, a fixed seeded sample, under the global model and each client's personal
    #: model, to features.parquet, with their t-SNE (scikit-learn) in features_tsne.png and
    #: TensorBoard (0: none)
    features: int = setting(0, at_least=0)
    #: a test accuracy (``target_metric``) whose first reaching, in simulated seconds
    #: (``sim_time_s``) and rounds, the summary reports as ``time_to_target_s`` and
    #: ``rounds_to_target`` (None: not asked; both None if it was never reached)
    target: float | None = setting(None, above=0, at_most=1, hint="an accuracy is a fraction: 0.8 for 80%")
    #: the accuracy ``target`` reads; auto: lm_ptest for an algorithm with personal models, else gm_gtest
    target_metric: Literal["auto", "gm_gtest", "gm_ptest", "lm_ptest", "updated_lm_ptest"] = "auto"
    #: end the run after the first evaluation that reaches ``target`` (its summary written)
    stop_at_target: bool = False
    #: hold out this share of the clients (a seeded draw): they are never sampled, and at each
    #: evaluation they start from the shared model the way the algorithm says a newcomer would
    #: (``new_gm_ptest``, ``new_lm_ptest``)
    new_clients: float = setting(0.0, at_least=0, below=1)
    #: the epochs a held-out client adapts for (the personal parts, or the whole model, by
    #: default); None: the local epochs E
    new_client_epochs: int | None = setting(None, at_least=0)


@dataclass(frozen=True)
class DeploymentConfig:
    """A simulated deployment (raysim.deployment, docs/design.md "Simulated deployments"): which
    clients are available, which drop out, how much of their work they finish, how long it takes on
    their devices, and when a round aggregates. Every draw is keyed by (seed, round, client), so it
    is the same on every executor; the defaults are the ideal deployment, which changes nothing."""

    #: a YAML file of ``deployment.*`` settings, or a registered deployment's name
    #: (raysim.registry.DEPLOYMENTS), put beneath the ``deployment.*`` settings given (once: the
    #: checked config holds its settings and no preset)
    preset: str | None = None
    #: who can be sampled in a round: KIND or KIND:PARAM of raysim.registry.AVAILABILITY
    #: (always, bernoulli:P, diurnal[:MEAN], trace)
    availability: str = "always"
    availability_file: str | None = None  # availability=trace: per client, its intervals of availability
    #: availability=diurnal: the period of its swing, in simulated hours (sim_time_s, not rounds)
    diurnal_period_h: float = setting(24.0, above=0)
    #: availability=diurnal: time zones, evenly spaced over the period: zone z's phase is z/Z of a
    #: period ahead of zone 0's, as a zone z/Z of a day to the east (its clients peak that much earlier)
    time_zones: int = setting(1, at_least=1)
    #: availability=diurnal: each zone's share of the clients, summing to 1 (None: equal); zones hold
    #: contiguous blocks of client ids in this order
    zone_shares: tuple[float, ...] | None = None
    #: each sampled client's update is lost with this probability (it never starts its work)
    dropout: float = setting(0.0, at_least=0, below=1)
    #: how much of its local work a sampled client does in a training round (evaluation-time
    #: fine-tuning and adaptation always run whole): KIND, KIND:PARAM or KIND:P:F of
    #: raysim.registry.COMPLETENESS (full; uniform:F: every client a share drawn from U[F, 1] of each
    #: training pass's steps; stragglers:P:F: FedProx's, each client with probability P a straggler
    #: doing a share drawn from U[F, 1], the rest all of it)
    completeness: str = "full"
    #: each client's device: KIND or KIND:PARAM of raysim.registry.DEVICES (ideal: no time;
    #: fixed: the base device below; lognormal:SIGMA: the base scaled per client; trace)
    devices: str = "ideal"
    devices_file: str | None = None  # devices=trace: a CSV of per-client devices (docs/usage.md)
    seconds_per_sample: float = setting(0.001, at_least=0)  # the base device's compute for one sample
    down_mbps: float = setting(20.0, above=0)  # the base device's download bandwidth (megabits a second)
    up_mbps: float = setting(5.0, above=0)  # its upload bandwidth
    latency_s: float = setting(0.05, at_least=0)  # its latency, once per transfer
    #: when a round aggregates: all (every update that was not lost), deadline (what arrived by
    #: ``deadline_s``), overselect (K(1 + overselect) sampled, the first K to arrive kept)
    policy: Literal["all", "deadline", "overselect"] = "all"
    #: the deadline; None: 1.5 x the median of the clients' nominal round times on their devices
    deadline_s: float | None = setting(None, above=0)
    overselect: float = setting(0.3, above=0)  # the over-selection's extra fraction x
    #: sync: rounds of sampled clients; async: buffered asynchronous aggregation (FedBuff, Nguyen et
    #: al. 2022): ``concurrency`` clients train at once on the simulated clock, each from the model
    #: current when it started, and every ``buffer`` arriving updates are aggregated (a round)
    mode: Literal["sync", "async"] = "sync"
    #: async: clients training at once (at most the clients); None: a synchronous round's cohort K
    concurrency: int | None = setting(None, at_least=1)
    #: async: updates a server step aggregates (at most ``concurrency``); None: half the clients in
    #: flight (at least 1), so that a step waits for the faster half (our choice)
    buffer: int | None = setting(None, at_least=1)
    #: async: each update's weight s(tau), tau the server steps since it started: constant (1),
    #: polynomial[:A] ((1 + tau)^-A, A = 0.5 by default: FedBuff's 1 / sqrt(1 + tau)) or
    #: hinge[:A:B] (1 while tau <= B, then 1 / (A (tau - B) + 1); Xie et al. 2019)
    staleness: str = "polynomial"
    #: async: an update that arrives more than this many server steps after its client started is
    #: dropped (FLSim's and FedScale's max staleness); None: none is
    max_staleness: int | None = setting(None, at_least=0)
    #: stop the run once the simulated clock reaches this many seconds (``--sim-time``), so that
    #: runs compare at equal simulated time; ``rounds`` is then an upper bound. None: no budget
    time_budget_s: float | None = setting(None, above=0)

    @property
    def ideal(self) -> bool:
        """Trains as a run without a deployment: every client available, no update lost, all work
        done, every update waited for (the devices then only time the rounds)."""
        return (
            self.availability == "always"
            and self.dropout == 0
            and self.completeness == "full"
            and self.policy == "all"
            and self.mode == "sync"
        )

    @property
    def active(self) -> bool:
        """Whether there is a deployment at all: anything but the ideal one on ideal devices (the
        ideal one on timed devices keeps a clock)."""
        return not self.ideal or self.devices != "ideal"


@dataclass(frozen=True)
class RayConfig:
    executor: str = "ray"  # a name in raysim.registry.EXECUTORS
    address: str | None = None  # join this cluster; None: RAY_ADDRESS, else start Ray locally
    workers: int | None = setting(None, at_least=1)  # client-worker actors; None: as many as the resources allow
    cpus_per_worker: float = setting(1.0, at_least=0)
    gpus_per_worker: float = setting(0.0, at_least=0)
    #: jobs a client worker trains at once, each in a thread of its own on ``train.threads`` intra-op
    #: threads (independent jobs only: two jobs of one client run in order); None: a CPU worker
    #: ``floor(cpus_per_worker / threads)`` (at least 1), a GPU worker 1. Small convolutions scale
    #: poorly over intra-op threads, so two one-thread jobs beat one two-thread job (docs/design.md, "Job slots")
    jobs_per_worker: int | None = setting(None, at_least=1)
    object_store_mb: int | None = setting(None, at_least=1)  # local Ray only
    #: client workers that die (a lost node, an OOM kill, ``ray.kill``) are replaced, their clients'
    #: state restored and the lost jobs retried, at most this many times in a run
    max_worker_restarts: int = setting(10, at_least=0)
    #: how long a replacement worker may wait for a place in the cluster (e.g. for an autoscaler to
    #: add a node) before the run ends with a checkpoint
    replace_timeout_s: float = setting(300.0, at_least=0)
    #: after a run on a cluster it joined (not a local Ray, not a suite's trial), each node that hosted
    #: the run's actors starts as many idle worker processes for the next run, kept at least this
    #: many seconds (0: none); the next run's actors start in them, without a process's start or
    #: (where the nodes were started with ``RAY_preload_python_modules=torch``) PyTorch's import
    prestart_s: float = setting(600.0, at_least=0)
    #: a run in a Ray session it did not start (ray.init() by the caller, or a cluster it joined; not
    #: a suite's trial) leaves its client-worker and server actors idle, holding their resources,
    #: for the next run of this Python process with the same worker resources, which takes them as
    #: they are instead of starting processes and importing PyTorch (about a second each): for
    #: many runs in one process, e.g. a notebook's or a test session's. Off: each run's actors end
    #: with it, freeing their CPUs and GPUs
    reuse_workers: bool = False


@dataclass(frozen=True)
class OutputConfig:
    out: str | None = None  # the run directory; None: runs/<algo>-<dataset>-<time>
    tensorboard: bool = True
    progress: bool = True
    #: write RUN_DIR/checkpoint.pkl every k rounds (0: only when stopped by Ctrl-C or a failure)
    checkpoint_every: int = setting(10, at_least=0)
    #: experiment trackers the run logs to (``--log mlflow,wandb``; raysim.results.trackers): its
    #: settings, every evaluated round's metrics and its files
    log: tuple[Literal["mlflow", "wandb"], ...] = names_setting()
    #: MLflow's tracking server (``--tracking-uri``); None: a store in the run directory (RUN_DIR/mlruns)
    tracking_uri: str | None = None
    #: what groups runs in the trackers (MLflow's experiment, W&B's group; a suite's name); None:
    #: MLflow's experiment "raysim", no W&B group
    log_group: str | None = None
    #: callbacks registered by plugins (raysim.plugins.register_callback) that the run is told to
    callbacks: tuple[str, ...] = names_setting()


@dataclass(frozen=True)
class PrivacyConfig:
    """Differential privacy (raysim.privacy; docs/usage.md, "Privacy"); off by default. The server is
    trusted: client-level DP (``clip``) clips each sampled client's upload, its change from the model
    it received, to an L2 norm C and adds Gaussian noise N(0, sigma^2 C^2) to their sum (DP-FedAvg);
    sample-level DP (``example_clip``) is DP-SGD in every client's local training. What stays on a
    client (its personal parts) is never clipped or noised."""

    #: client-level DP: none, the clip norm C (a number), or adaptive:Q (the clip follows the Q
    #: quantile of the update norms, Andrew et al., NeurIPS 2021, from ``clip_init``)
    clip: str = "none"
    #: sigma, the noise's standard deviation over C; None: calibrated from ``target_epsilon``
    noise_multiplier: float | None = setting(None, at_least=0)
    #: the epsilon the whole run may spend (at ``delta``): sigma is calibrated for the run's rounds
    #: before any work
    target_epsilon: float | None = setting(None, above=0)
    #: delta of the (epsilon, delta) guarantee; None: 1 / N^1.1 for N clients
    delta: float | None = setting(None, above=0, below=1)
    #: who a round samples: fixed (K clients without replacement, the default cohort) or poisson
    #: (each client independently with probability q = participation)
    sampling: Literal["fixed", "poisson"] = "fixed"
    #: the privacy accountant (Google's dp-accounting): pld (privacy loss distributions) or rdp
    accountant: Literal["pld", "rdp"] = "pld"
    #: adaptive clipping: the clip before round 1, the step size eta_C of its geometric update and
    #: the noise multiplier sigma_b of the clipped count (None: the expected cohort / 20, the paper's)
    clip_init: float = setting(0.1, above=0)
    clip_lr: float = setting(0.2, above=0)
    count_noise_multiplier: float | None = setting(None, above=0)
    #: sample-level DP (DP-SGD at each client): each example's gradient clipped to this L2 norm, and
    #: Gaussian noise of ``example_noise_multiplier`` times it added to each step's summed gradient
    example_clip: float | None = setting(None, above=0)
    example_noise_multiplier: float = setting(1.0, at_least=0)
    #: how DP-SGD computes per-example gradients: torch_func (torch.func's vmap of grad) or opacus
    per_example: Literal["torch_func", "opacus"] = "torch_func"


@dataclass(frozen=True)
class ExperimentConfig:
    algo: str = "fedavg"
    model: str = "cnn3p2_fmnist"
    clients: int = setting(100, at_least=1)
    participation: float = setting(0.1, above=0, at_most=1)
    rounds: int = setting(20, at_least=1)
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    algo_params: Mapping[str, Any] = field(default_factory=dict)
    #: modules (or scripts) of user code that registers what this config names, imported by every
    #: process before it reads a registry (raysim.plugins)
    plugins: tuple[str, ...] = ()
    #: the command line puts the algorithm's paper setup (``Algorithm.paper_setup``) beneath the
    #: settings given; false: every algorithm runs on these common defaults, for one shared setup
    paper_setup: bool = True

    @property
    def train_threads(self) -> int:
        """Intra-op threads every executor trains a job with (part of the numbers, see docs/design.md)."""
        if self.train.threads is not None:
            return self.train.threads
        if self.ray.gpus_per_worker > 0:
            return max(1, int(self.ray.cpus_per_worker))
        return 1

    @property
    def worker_jobs(self) -> int:
        """Jobs a client worker trains at once (``ray.jobs_per_worker``, or its default). Where
        jobs run does not change their numbers: each trains with :attr:`train_threads` threads."""
        if self.ray.jobs_per_worker is not None:
            return self.ray.jobs_per_worker
        if self.ray.gpus_per_worker > 0:
            return 1
        return max(1, int(self.ray.cpus_per_worker + 1e-9) // self.train_threads)

    @property
    def new_clients(self) -> tuple[int, ...]:
        """The clients held out of training (``eval.new_clients``): ``round(F * clients)`` of them,
        at least one when F > 0, a seeded draw (:func:`raysim.rng.held_out_clients`), sorted."""
        from raysim.rng import held_out_clients

        return held_out_clients(self.seed, self.clients, self.eval.new_clients)

    @property
    def training_clients(self) -> tuple[int, ...]:
        """The clients that may be sampled: every client but :attr:`new_clients`, in id order."""
        held = set(self.new_clients)
        return tuple(c for c in range(self.clients) if c not in held)

    @property
    def clients_per_round(self) -> int:
        """K: the participation's share of the clients that may be sampled."""
        return max(1, round(self.participation * len(self.training_clients)))


# --------------------------------------------------------------------------------------------------
# building a config from plain data


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Turn ``value`` (from YAML/TOML/the command line) into the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        for allowed in args:
            if value == allowed or (isinstance(value, str) and not isinstance(allowed, str) and value == str(allowed)):
                return allowed
        words = [repr(a) for a in args]
        choice = " or ".join(words) if len(words) == 2 else "one of " + ", ".join(words)
        raise ConfigError(f"{_name(where)} is {choice}, not {value!r}.")
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{_name(where)} cannot be {value!r}.")
    if is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{_name(where)} must be a table of settings, not {value!r}.")
        return from_dict(tp, value, where)
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.strip("()[] ").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{_name(where)} must be a list, not {value!r}.")
        item = args[0] if args else str
        return tuple(_coerce(v, item, where) for v in value)
    if origin in (Mapping, dict) or tp in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{_name(where)} must be a table, not {value!r}.")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "no", "0", "off"):
            return False
        raise ConfigError(f"{_name(where)} must be true or false, not {value!r}.")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{_name(where)} must be an integer, not {value!r}.")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{_name(where)} must be an integer, not {value!r}.") from None
        if not f.is_integer():
            raise ConfigError(f"{_name(where)} must be an integer, not {value!r}.")
        return int(f)
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{_name(where)} must be a number, not {value!r}.") from None
    if tp is str:
        return str(value)
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved field types, once per class: resolving them costs more than building
    the object, and an algorithm's settings are built in every local update (the regularisers')."""
    return typing.get_type_hints(cls)


def from_dict(cls: type, data: Mapping[str, Any], where: str = "config") -> Any:
    """Build the dataclass ``cls`` from nested plain data, rejecting unknown keys."""
    hints = _type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"Unknown setting {_name(f'{where}.{unknown[0]}')} (known: {', '.join(sorted(known))}).")
    for f in fields(cls):
        if f.metadata.get("names") and f.name in data:
            check_names(data[f.name], _name(f"{where}.{f.name}"))
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    for f in fields(cls):
        bounds = f.metadata.get("bounds")
        if bounds is not None and f.name in kwargs:
            bounds.check(kwargs[f.name], _name(f"{where}.{f.name}"))
    return cls(**kwargs)


def _name(where: str) -> str:
    """A setting's dotted name as the user writes it (``train.lr``, not ``config.train.lr``)."""
    return where.removeprefix("config.")


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested data (tuples as lists) for YAML/JSON output."""

    def plain(v: Any) -> Any:
        if is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    out: dict[str, Any] = plain(cfg)
    return out


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml), TOML (.toml) or JSON file into plain nested data; a file that does
    not parse is one sentence naming the file and the line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"The config file {p} does not exist.")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:  # any parse error is the user's file
        raise ConfigError(f"The config file {p} does not parse: {_parse_error(e)}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"The config file {p} must hold a table of settings.")
    return data


def _parse_error(e: Exception) -> str:
    """A parser's error as a clause: what is wrong, and on which line."""
    mark = getattr(e, "problem_mark", None)  # YAML
    if mark is not None:
        problem = getattr(e, "problem", None) or type(e).__name__
        return f"{problem} on line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} on line {e.lineno}, column {e.colno}"
    text = " ".join(str(e).split()).rstrip(".")  # TOML: "... (at line 3, column 5)"
    return text or type(e).__name__


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``set_dotted(d, "train.lr", 0.1)`` sets ``d["train"]["lr"]``; ``algo.X`` sets an algorithm
    parameter."""
    keys = dotted.split(".")
    if keys[0] == "algo" and len(keys) > 1:
        keys = ["algo_params", *keys[1:]]
    node = data
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"The setting {dotted} does not name a table.")
        node = nxt
    node[keys[-1]] = value


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def replace(cfg: ExperimentConfig, **changes: Any) -> ExperimentConfig:
    """``dataclasses.replace`` that also takes dotted keys: ``replace(cfg, **{"train.lr": 0.1})``."""
    data = to_dict(cfg)
    for k, v in changes.items():
        set_dotted(data, k, v)
    result: ExperimentConfig = from_dict(ExperimentConfig, data)
    return result


def evaluation_due(cfg: ExperimentConfig, rnd: int) -> bool:
    """Whether round ``rnd`` is evaluated: every ``eval.every`` rounds, and always the last."""
    return rnd == cfg.rounds or (cfg.eval.every > 0 and rnd % cfg.eval.every == 0)


def dump_yaml(cfg: ExperimentConfig, path: str | os.PathLike[str]) -> None:
    import yaml

    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


__all__ = [
    "DataConfig",
    "DeploymentConfig",
    "EvalConfig",
    "ExperimentConfig",
    "OutputConfig",
    "RayConfig",
    "SyntheticConfig",
    "TrainConfig",
    "dump_yaml",
    "evaluation_due",
    "from_dict",
    "load_config_file",
    "merge",
    "replace",
    "set_dotted",
    "to_dict",
]
