"""The extension points: one registry each for algorithms, datasets, partitions, local test modes,
models and executors, all readable without PyTorch.

A registry maps a name to an entry that says what the thing needs and where its code is. Code is named
by a ``"module:attribute"`` reference (or given as the object itself) and imported only when it is
used, so the driver reads every registry, validates a whole config and prints ``--help`` without
loading PyTorch, the data or Ray. ``validate``, the CLI's help and every "unknown ..." message read
these registries, so adding a dataset, a partition, a test mode, a model or an executor is one
``register`` call here (or from a user's own code); an algorithm registers itself with
``@algorithms.base.register("name")`` in its own module. Algorithms live in plugin packages that the
algorithm registry imports by name the first time it is read (``algorithms`` by default): the engine
never imports them itself.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from raysim.config import DataConfig
from raysim.errors import ConfigError

T = TypeVar("T")

#: a ``"module:attribute"`` reference, imported when used, or the object itself
Ref = str | Callable[..., Any]


def load_ref(ref: Ref) -> Any:
    """The object ``ref`` names (``"package.module:attribute"``), or ``ref`` itself."""
    if not isinstance(ref, str):
        return ref
    module_name, sep, attr = ref.partition(":")
    if not sep:
        raise ValueError(f"a reference is 'module:attribute', not {ref!r}")
    obj: Any = importlib.import_module(module_name)
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


#: one lock for every registry's plugin import (a module-level object, so a registry stays picklable)
_PLUGINS_LOCK = threading.RLock()


class Registry(Generic[T]):
    """Names to entries of one kind. ``plugins`` are modules imported, once, before the registry
    is first read: they register their entries as they are imported."""

    def __init__(self, kind: str, plugins: Sequence[str] = ()) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._plugins = tuple(plugins)
        self._loaded = not self._plugins
        self._loading = False

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        if not name or ":" in name or "," in name:
            raise ValueError(f"{name!r} cannot name a {self.kind}")
        self._entries[name] = entry
        return entry

    def _load_plugins(self) -> None:
        """Import the plugins once. Another thread reading the registry meanwhile (runs started in
        threads of one process) waits for them; a read from within their import (this thread)
        sees what is registered so far."""
        if self._loaded:
            return
        with _PLUGINS_LOCK:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                for module in self._plugins:
                    importlib.import_module(module)
            finally:
                self._loading = False
                self._loaded = True

    def get(self, name: str) -> T:
        """The entry ``name``; ConfigError with the known names if there is none."""
        self._load_plugins()
        if name not in self._entries:
            raise ConfigError(f"Unknown {self.kind} {name!r} (known: {', '.join(self.names())}).")
        return self._entries[name]

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        self._load_plugins()
        return iter(sorted(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def choices(self) -> str:
        """The names as a help text: ``a | b | c``."""
        return " | ".join(self.names())


# --------------------------------------------------------------------------------------------------
# datasets


@dataclass(frozen=True)
class DatasetInfo:
    """What the driver knows of a dataset before loading it: enough to check a model, a partition
    and an algorithm against it, and to pick an algorithm's paper setup."""

    name: str
    num_classes: int
    input_shape: tuple[int, ...]  # one sample's shape, (C, H, W) for images
    train_size: int
    test_size: int

    @property
    def channels(self) -> int:
        return self.input_shape[0]


def _fixed(value: Any) -> Callable[[DataConfig], Any]:
    return lambda cfg: value


@dataclass(frozen=True)
class DatasetEntry:
    """``loader(cfg: DataConfig, seed) -> (train, test)`` ArrayDatasets (the official split).
    The sizes may depend on the data config (the synthetic dataset's do)."""

    loader: Ref
    num_classes: Callable[[DataConfig], int]
    input_shape: Callable[[DataConfig], tuple[int, ...]]
    train_size: Callable[[DataConfig], int]
    test_size: Callable[[DataConfig], int]
    description: str
    reads_files: bool = True  # False: generated, data.data_dir does not matter
    #: a registered model that fits it, used when neither the settings nor the algorithm's paper
    #: setup name one ("": the config's default model)
    model: str = ""
    #: how many clients of its own the data has (FEMNIST's writers; 0: none), for the ``natural``
    #: partition's check before loading
    natural_clients: int = 0

    def info(self, name: str, cfg: DataConfig) -> DatasetInfo:
        return DatasetInfo(
            name,
            self.num_classes(cfg),
            tuple(self.input_shape(cfg)),
            self.train_size(cfg),
            self.test_size(cfg),
        )


def image_dataset(
    loader: Ref, classes: int, shape: tuple[int, ...], train: int, test: int, description: str, model: str = ""
) -> DatasetEntry:
    """An entry for a dataset of fixed size read from files (``model``: one that fits it)."""
    return DatasetEntry(
        loader, _fixed(classes), _fixed(shape), _fixed(train), _fixed(test), description, model=model
    )


DATASETS: Registry[DatasetEntry] = Registry("dataset")
DATASETS.register(
    "fmnist",
    image_dataset(
        "raysim.data.datasets:fmnist", 10, (1, 28, 28), 60_000, 10_000, "Fashion-MNIST (idx files)",
        model="cnn3p2_fmnist",
    ),
)
DATASETS.register(
    "cifar10",
    image_dataset(
        "raysim.data.datasets:cifar10", 10, (3, 32, 32), 50_000, 10_000, "CIFAR-10 (python pickles)",
        model="cnn3p2_cifar",
    ),
)
DATASETS.register(
    "cifar100",
    image_dataset(
        "raysim.data.datasets:cifar100",
        100,
        (3, 32, 32),
        50_000,
        10_000,
        "CIFAR-100, fine labels (python pickles)",
        model="cnn3p2_cifar",
    ),
)
DATASETS.register(
    "mnist",
    image_dataset(
        "raysim.data.extra_datasets:mnist", 10, (1, 28, 28), 60_000, 10_000, "MNIST (idx files)", model="cnn_pac"
    ),
)
DATASETS.register(
    "emnist",  # byclass, as FedPAC uses it (1000 samples a client: --partition dominant --set data.samples_per_client=1000)
    image_dataset(
        "raysim.data.extra_datasets:emnist",
        62,
        (1, 28, 28),
        697_932,
        116_323,
        "EMNIST byclass: digits and upper- and lower-case letters (idx files)",
        model="cnn_pac",
    ),
)
DATASETS.register(
    "svhn",
    image_dataset(
        "raysim.data.extra_datasets:svhn",
        10,
        (3, 32, 32),
        73_257,
        26_032,
        "SVHN cropped digits, without extra (.mat files)",
        model="cnn_pac_cifar",
    ),
)
DATASETS.register(
    "cinic10",
    image_dataset(
        "raysim.data.extra_datasets:cinic10",
        10,
        (3, 32, 32),
        90_000,
        90_000,
        "CINIC-10, train and test without valid (PNG folders)",
        model="cnn3p2_cifar",
    ),
)
DATASETS.register(
    "tinyimagenet",
    image_dataset(
        "raysim.data.extra_datasets:tinyimagenet",
        200,
        (3, 64, 64),
        100_000,
        10_000,
        "Tiny ImageNet, val as the test split (JPEG folders)",
        model="resnet18",
    ),
)
DATASETS.register(
    "femnist",  # LEAF's FEMNIST; --partition natural (and --test-mode natural) follow its writers
    DatasetEntry(
        "raysim.data.leaf:femnist",
        num_classes=_fixed(62),
        input_shape=_fixed((1, 28, 28)),
        # LEAF's full FEMNIST (its paper's Table 1: 805,263 samples, 3,550 writers), split about 90/10
        # by its sample split: nominal, for the checks before loading (a LEAF run may give a few more)
        train_size=_fixed(724_737),
        test_size=_fixed(80_526),
        description="LEAF's FEMNIST: 62 classes, samples with their writers (LEAF's json files)",
        model="cnn_pac",
        natural_clients=3550,
    ),
)
DATASETS.register(
    "synthetic",
    DatasetEntry(
        "raysim.data.datasets:synthetic",
        num_classes=lambda cfg: cfg.synthetic.num_classes,
        input_shape=lambda cfg: tuple(cfg.synthetic.shape),
        train_size=lambda cfg: cfg.synthetic.train_samples,
        test_size=lambda cfg: cfg.synthetic.test_samples,
        description="class-conditional Gaussians shaped as images (data.synthetic.*)",
        reads_files=False,
    ),
)


def dataset_info(cfg: DataConfig) -> DatasetInfo:
    return DATASETS.get(cfg.dataset).info(cfg.dataset, cfg)


# --------------------------------------------------------------------------------------------------
# partitions and local test modes: ``kind`` or ``kind:param``


@dataclass(frozen=True)
class Param:
    """The parameter of a partition or test mode: its kind, its default and what it means."""

    kind: str  # none | positive | whole | percent | fraction | share
    default: float | None = None  # None with a kind other than none: the parameter must be given
    meaning: str = ""  # e.g. "concentration alpha", for messages

    def parse(self, what: str, name: str, text: str, full: str) -> float | None:
        """The value of ``text`` (empty: not given) in ``full``, e.g. ``dirichlet:0.1``; ``what`` is
        "partition" or "local test mode"."""
        if self.kind == "none":
            if text:
                raise ConfigError(f"The {name} {what} takes no parameter.")
            return None
        if not text:
            if self.default is None:
                raise ConfigError(
                    f"The {name} {what} needs its {self.meaning}, e.g. {name}:{_EXAMPLE[self.kind]}."
                )
            return self.default
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"The {what} parameter in {full!r} is not a number.") from None
        bad = {
            "positive": not (value > 0 and math.isfinite(value)),
            "whole": value < 1 or not value.is_integer(),
            "percent": not 0 <= value <= 100,
            "fraction": not 0 < value < 1,
            "share": not 0 < value <= 1,
        }
        if bad[self.kind]:
            raise ConfigError(f"The {name} {what}'s {self.meaning} must be {_RANGE[self.kind]}, not {text}.")
        return value

    def usage(self, name: str) -> str:
        """How it is written, e.g. ``dirichlet:A`` or ``shard[:S]``."""
        if self.kind == "none":
            return name
        letter = self.meaning.split()[-1][0].upper()
        return f"{name}:{letter}" if self.default is None else f"{name}[:{letter}]"


_EXAMPLE = {"positive": "0.1", "whole": "2", "percent": "20", "fraction": "0.25", "share": "0.5"}
_RANGE = {
    "positive": "positive",
    "whole": "a whole number of at least 1",
    "percent": "a percentage (0 to 100)",
    "fraction": "in (0, 1)",
    "share": "in (0, 1]",
}


@dataclass(frozen=True)
class ParamPair:
    """Two parameters, both needed, written ``KIND:A:B`` (e.g. ``stragglers:0.5:0.25``): each
    checked as its :class:`Param`; parsed to the pair ``(A, B)``."""

    first: Param
    second: Param
    example: str  # e.g. "0.5:0.25", for messages

    def parse(self, what: str, name: str, text: str, full: str) -> tuple[float, float]:
        """As :meth:`Param.parse`, for ``text`` = ``A:B``."""
        a, b = self.first.meaning, self.second.meaning
        parts = [part.strip() for part in text.split(":")] if text else []
        if len(parts) > 2:
            raise ConfigError(
                f"The {name} {what} takes two parameters ({a} and {b}), not {len(parts)}: {full!r}."
            )
        first, second = [*parts, "", ""][:2]
        e = f"e.g. {name}:{self.example}"
        if not first and not second:
            raise ConfigError(f"The {name} {what} needs its {a} and {b}, {e}.")
        if not second:
            raise ConfigError(f"The {name} {what} needs its {b} after its {a}, {e}.")
        if not first:
            raise ConfigError(f"The {name} {what} needs its {a} before its {b}, {e}.")
        x, y = self.first.parse(what, name, first, full), self.second.parse(what, name, second, full)
        assert x is not None and y is not None
        return x, y

    def usage(self, name: str) -> str:
        """How it is written, e.g. ``stragglers:P:F``."""
        letters = (p.meaning.split()[-1][0].upper() for p in (self.first, self.second))
        return ":".join([name, *letters])


@dataclass(frozen=True)
class PartitionEntry:
    """``split(labels, num_clients, param, rng, num_classes, cfg: DataConfig)`` -> one sorted index
    array per client. ``feasible(param, num_clients, num_classes, pool_size, cfg)`` raises a
    ConfigError when the partition cannot be made from a pool of ``pool_size`` samples: checked
    before any data is loaded (the split checks again, on the real labels)."""

    split: Ref
    param: Param
    feasible: Ref
    description: str
    #: the split also takes ``groups=``: each sample's client of the data's own (ArrayDataset.groups)
    uses_groups: bool = False


PARTITIONS: Registry[PartitionEntry] = Registry("partition")
_P = "raysim.data.partition:"
PARTITIONS.register(
    "iid", PartitionEntry(_P + "split_iid", Param("none"), _P + "check_iid", "shuffled, equal parts")
)
PARTITIONS.register(
    "dirichlet",
    PartitionEntry(
        _P + "split_dirichlet",
        Param("positive", None, "concentration alpha"),
        _P + "check_dirichlet",
        "each class split by shares drawn from Dir(alpha) (Hsu et al. 2019)",
    ),
)
PARTITIONS.register(
    "pathological",
    PartitionEntry(
        _P + "split_pathological",
        Param("whole", 2.0, "classes per client K"),
        _P + "check_pathological",
        "K classes a client (data.class_order)",
    ),
)
PARTITIONS.register(
    "shard",
    PartitionEntry(
        _P + "split_shard",
        Param("whole", 2.0, "shards per client S"),
        _P + "check_shard",
        "S label-sorted shards a client (McMahan et al. 2017)",
    ),
)
PARTITIONS.register(
    "dominant",
    PartitionEntry(
        _P + "split_dominant",
        Param("percent", 20.0, "uniform share S"),
        _P + "check_dominant",
        "FedPAC's: S% spread over all classes, the rest over the group's dominant ones",
    ),
)
PARTITIONS.register(
    "natural",
    PartitionEntry(
        _P + "split_natural",
        Param("none"),
        _P + "check_natural",
        "the data's own clients (FEMNIST's writers), N of them drawn by the seed",
        uses_groups=True,
    ),
)


@dataclass(frozen=True)
class TestModeEntry:
    """How the clients' local test sets (P-Test) are made. ``build(train, test, param, partition,
    rng)`` returns ``(pool, ptest, client_train, client_test)``: the dataset the clients train on, the
    one their test indices point into, and the index arrays; ``partition(labels)`` splits a label
    array over the clients. ``pools_test_set``: the clients' data comes from train and test pooled,
    so the partition draws from both."""

    build: Ref
    param: Param
    pools_test_set: bool
    description: str


TEST_MODES: Registry[TestModeEntry] = Registry("local test mode")
TEST_MODES.register(
    "matched",
    TestModeEntry(
        "raysim.data.federated:matched_test_sets",
        Param("none"),
        False,
        "drawn from the test set to follow each client's training labels",
    ),
)
TEST_MODES.register(
    "split",
    TestModeEntry(
        "raysim.data.federated:split_test_sets",
        Param("fraction", 0.25, "test fraction F"),
        True,
        "train and test pooled, then F of each client's data held out for its test set",
    ),
)
TEST_MODES.register(
    "natural",
    TestModeEntry(
        "raysim.data.federated:natural_test_sets",
        Param("none"),
        False,
        "each client's own test samples (FEMNIST's writers; with --partition natural)",
    ),
)


@dataclass(frozen=True)
class KindSpec:
    """A parsed ``KIND``, ``KIND:PARAM`` or ``KIND:A:B`` (a :class:`ParamPair`'s) of a registry of
    parametrised kinds (``data.partition``, ``data.test_mode``, ``deployment.completeness``)."""

    kind: str
    param: float | tuple[float, float] | None = None

    def __str__(self) -> str:
        if self.param is None:
            return self.kind
        values = self.param if isinstance(self.param, tuple) else (self.param,)
        return ":".join([self.kind, *(f"{v:g}" for v in values)])


PartitionSpec = KindSpec
TestModeSpec = KindSpec


def parse_kind(text: str, registry: Registry[Any]) -> KindSpec:
    """``dirichlet:0.1`` -> KindSpec("dirichlet", 0.1) for the partitions; checks the parameter."""
    kind, _, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind not in registry:
        raise ConfigError(f"Unknown {registry.kind} {text!r} (known: {usages(registry)}).")
    return KindSpec(kind, registry.get(kind).param.parse(registry.kind, kind, arg.strip(), text))


def parse_partition(text: str) -> KindSpec:
    return parse_kind(text, PARTITIONS)


def parse_test_mode(text: str) -> KindSpec:
    return parse_kind(text, TEST_MODES)


@dataclass(frozen=True)
class FeatureShiftEntry:
    """A feature shift (``data.feature_shift``, :mod:`raysim.data.feature_shift`): ``transform(x,
    domain, num_domains, rng, bounded)`` turns float32 ``(n, C, H, W)`` images into domain
    ``domain``'s (``bounded``: uint8 images scaled to [0, 1]); None for ``none``. ``most_domains``:
    the most domains it can make (0: any)."""

    transform: Ref | None
    param: Param
    description: str
    most_domains: int = 0


FEATURE_SHIFTS: Registry[FeatureShiftEntry] = Registry("feature shift")
_F = "raysim.data.feature_shift:"
FEATURE_SHIFTS.register("none", FeatureShiftEntry(None, Param("none"), "every client's data as it is"))
FEATURE_SHIFTS.register(
    "rotate",
    FeatureShiftEntry(
        _F + "rotate", Param("whole", None, "domains K"), "domain d's images rotated by 360/K * d degrees"
    ),
)
FEATURE_SHIFTS.register(
    "corrupt",
    FeatureShiftEntry(
        _F + "corrupt",
        Param("whole", None, "domains K"),
        "domain d's images under the d-th of raysim.data.feature_shift.CORRUPTIONS, at its fixed strength",
        most_domains=6,
    ),
)


def parse_feature_shift(text: str) -> KindSpec:
    return parse_kind(text, FEATURE_SHIFTS)


def usages(registry: Registry[Any]) -> str:
    """``iid, dirichlet:A, ...``: how each entry of a registry of parametrised kinds is written."""
    return ", ".join(entry.param.usage(name) for name, entry in registry.items())


# --------------------------------------------------------------------------------------------------
# models


@dataclass(frozen=True)
class ModelEntry:
    """``builder(input_shape, num_classes) -> SplitModel`` and what it needs of the input."""

    builder: Ref
    #: the size of the features both heads read (``SplitModel.filter_dim``): what an ETF classifier
    #: or a prototype has as its dimension
    feature_dim: int
    min_size: int = 1  # the smallest height and width of an input image it accepts
    channels: int | None = None  # the input channels it needs (None: any)
    description: str = ""
    #: whether clients can train on it batched (``train.batch_clients``): not with BatchNorm
    batchable: bool = True
    #: whether it has BatchNorm layers (FedBN keeps them local)
    batch_norm: bool = False
    #: whether it trains on a batch of one sample: not with a BatchNorm after a fully connected
    #: layer, which cannot normalise one value per channel (a run that would is refused)
    single_sample_batches: bool = True

    def check_input(self, name: str, shape: tuple[int, ...]) -> None:
        """ConfigError unless inputs of ``shape`` (one sample's) fit this model."""
        if self.channels is not None and (len(shape) < 1 or shape[0] != self.channels):
            raise ConfigError(
                f"The model {name} takes inputs of {self.channels} channels, not of shape {shape}."
            )
        if self.min_size > 1 and (len(shape) < 3 or min(shape[1:]) < self.min_size):
            raise ConfigError(
                f"The model {name} needs images of at least {self.min_size}x{self.min_size} pixels, not "
                f"inputs of shape {shape}."
            )

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> Any:
        return load_ref(self.builder)(input_shape, num_classes)


MODELS: Registry[ModelEntry] = Registry("model")
_M = "raysim.models:"
MODELS.register("cnn3p2_fmnist", ModelEntry(_M + "cnn3p2_fmnist", 50, 16, description="Fed3+2p's FMNIST CNN"))
MODELS.register(
    "cnn3p2_fmnist_bn",
    ModelEntry(
        _M + "cnn3p2_fmnist_bn",
        50,
        16,
        description="cnn3p2_fmnist with BatchNorm (FedBN's placement)",
        batchable=False,
        batch_norm=True,
        single_sample_batches=False,
    ),
)
MODELS.register("cnn3p2_cifar", ModelEntry(_M + "cnn3p2_cifar", 64, 18, description="Fed3+2p's CIFAR CNN"))
MODELS.register("mlp_fcd", ModelEntry(_M + "mlp_fcd", 100, description="FedFCD's FMNIST MLP"))
MODELS.register("cnn_fcd", ModelEntry(_M + "cnn_fcd", 512, 4, description="FedFCD's CIFAR-10 CNN"))
MODELS.register("cnn_pac", ModelEntry(_M + "cnn_pac", 128, 12, description="FedPAC's (E)MNIST/FMNIST CNN"))
MODELS.register(
    "cnn_pac_bn",
    ModelEntry(
        _M + "cnn_pac_bn",
        128,
        12,
        description="cnn_pac with BatchNorm (FedBN's placement)",
        batchable=False,
        batch_norm=True,
        single_sample_batches=False,
    ),
)
MODELS.register("cnn_pac_cifar", ModelEntry(_M + "cnn_pac_cifar", 128, 16, description="FedPAC's CIFAR CNN"))
MODELS.register("vgg11", ModelEntry(_M + "vgg11", 512, 32, description="VGG-11 for 32x32 images"))
MODELS.register(
    "mobilenet",
    ModelEntry(_M + "mobilenet", 1024, description="MobileNet v1 for 32x32 images", batchable=False, batch_norm=True),
)
MODELS.register(
    "resnet18",
    ModelEntry(_M + "resnet18", 512, description="ResNet-18 for 32x32 images", batchable=False, batch_norm=True),
)


# --------------------------------------------------------------------------------------------------
# executors and algorithms


@dataclass(frozen=True)
class ExecutorEntry:
    """``cls.start(cfg, load_data)`` returns a running executor (``raysim.engine.executors.base.Executor``)."""

    cls: Ref
    description: str


EXECUTORS: Registry[ExecutorEntry] = Registry("executor")
EXECUTORS.register(
    "ray",
    ExecutorEntry(
        "raysim.engine.executors.ray_executor:RayExecutor", "client-worker actors and a server actor on Ray"
    ),
)
EXECUTORS.register(
    "serial", ExecutorEntry("raysim.engine.executors.serial:SerialExecutor", "everything in this process")
)

# --------------------------------------------------------------------------------------------------
# simulated deployments (raysim.deployment.model): ``KIND`` or ``KIND:PARAM``, and named deployments


@dataclass(frozen=True)
class DeploymentKind:
    """A model of one side of a deployment: ``make`` builds it (its signature per registry, in
    :mod:`raysim.deployment.model`)."""

    make: Ref
    param: Param | ParamPair
    description: str


#: ``make(param, deployment_config, num_clients)`` -> ``online(seed, rnd, client, now_s)``,
#: ``next_online_s(now_s, clients)`` and optionally ``offline_at(client, start_s, end_s)``
AVAILABILITY: Registry[DeploymentKind] = Registry("availability")
#: ``make(param, deployment_config, seed, num_clients)`` -> one Device per client
DEVICES: Registry[DeploymentKind] = Registry("device model")
#: ``make(param)`` -> ``fraction(seed, rnd, client)``, the share of each training pass's steps a
#: client does in a training round (evaluation-time work is never cut)
COMPLETENESS: Registry[DeploymentKind] = Registry("completeness")
#: named deployments: name -> ``deployment.*`` settings (without the prefix)
DEPLOYMENTS: Registry[Mapping[str, Any]] = Registry("deployment")

_D = "raysim.deployment.model:make_"
AVAILABILITY.register("always", DeploymentKind(_D + "always", Param("none"), "every client, every round"))
AVAILABILITY.register(
    "bernoulli",
    DeploymentKind(
        _D + "bernoulli",
        Param("fraction", None, "probability P"),
        "each client each round with probability P",
    ),
)
AVAILABILITY.register(
    "diurnal",
    DeploymentKind(
        _D + "diurnal",
        Param("fraction", 0.5, "mean share M"),
        "with probability M + A sin(2 pi (t/(deployment.diurnal_period_h h) + z/Z)), A = 0.8 min(M, 1-M), "
        "t the simulated time, a phase per time zone z of deployment.time_zones Z; the federation's share "
        "swings by A |sum_z share_z exp(2 pi i z/Z)| (one zone: A; equal shares over the zones: none)",
    ),
)
AVAILABILITY.register(
    "trace",
    DeploymentKind(
        _D + "availability_trace", Param("none"), "online in deployment.availability_file's intervals"
    ),
)
DEVICES.register("ideal", DeploymentKind(_D + "ideal", Param("none"), "no time at all"))
DEVICES.register("fixed", DeploymentKind(_D + "fixed", Param("none"), "every client the base device"))
DEVICES.register(
    "lognormal",
    DeploymentKind(
        _D + "lognormal",
        Param("positive", 1.0, "log-std S"),
        "the base device, its speed and bandwidths each scaled per client by a lognormal(0, S) factor",
    ),
)
DEVICES.register(
    "trace", DeploymentKind(_D + "device_trace", Param("none"), "deployment.devices_file's devices")
)
COMPLETENESS.register(
    "full", DeploymentKind(_D + "full", Param("none"), "every client does all its local work")
)
COMPLETENESS.register(
    "uniform",
    DeploymentKind(
        _D + "uniform",
        Param("fraction", 0.5, "least share F"),
        "every sampled client each round does a share drawn from U[F, 1] of each training pass's steps",
    ),
)
COMPLETENESS.register(
    "stragglers",
    DeploymentKind(
        _D + "stragglers",
        ParamPair(
            Param("share", None, "straggler share P"), Param("share", None, "least share F"), "0.5:0.25"
        ),
        "FedProx's stragglers (Li et al. 2020, Sec. 5.2): each sampled client each round is one with "
        "probability P, doing a share drawn from U[F, 1] of each training pass's steps; the rest do "
        "all theirs",
    ),
)
DEPLOYMENTS.register("ideal", {})  # no time, no failures: a run without a deployment
DEPLOYMENTS.register("homogeneous", {"devices": "fixed"})  # the base device for all, no failures: timed
DEPLOYMENTS.register("dropout30", {"devices": "fixed", "dropout": 0.3})
DEPLOYMENTS.register("stragglers", {"devices": "lognormal:1", "policy": "deadline"})

#: the algorithm classes (``algorithms.base.Algorithm`` subclasses), registered by their modules
ALGORITHMS: Registry[Any] = Registry("algorithm", plugins=("algorithms",))


__all__ = [
    "ALGORITHMS",
    "AVAILABILITY",
    "COMPLETENESS",
    "DEPLOYMENTS",
    "DEVICES",
    "DeploymentKind",
    "DATASETS",
    "DatasetEntry",
    "DatasetInfo",
    "EXECUTORS",
    "ExecutorEntry",
    "FEATURE_SHIFTS",
    "FeatureShiftEntry",
    "MODELS",
    "ModelEntry",
    "PARTITIONS",
    "Param",
    "ParamPair",
    "PartitionEntry",
    "PartitionSpec",
    "Registry",
    "TEST_MODES",
    "TestModeEntry",
    "TestModeSpec",
    "dataset_info",
    "KindSpec",
    "image_dataset",
    "load_ref",
    "parse_kind",
    "parse_partition",
    "parse_feature_shift",
    "parse_test_mode",
    "usages",
]
