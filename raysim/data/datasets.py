"""Datasets as plain arrays: Fashion-MNIST, CIFAR-10, CIFAR-100 and a synthetic one.

The real datasets are read from their own file formats (idx for Fashion-MNIST, the python pickles
for CIFAR) with numpy, so loading needs torchvision only to download missing files. Images are kept
as their raw uint8 ``(n, C, H, W)`` arrays with the per-channel mean and std, a quarter of the memory
of float32, ready to go into Ray's object store once and be indexed by every client (docs/design.md).
:meth:`ArrayDataset.features` gathers a set of samples and normalises them then, per channel,
``(v / 255 - mean) / std`` as float32. The synthetic dataset is float32 features, used as they are.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import logging
import math
import os
import pickle
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from raysim.config import DataConfig, SyntheticConfig
from raysim.errors import ConfigError

logger = logging.getLogger(__name__)

#: Where Debian's ``dataset-fashion-mnist`` package puts the idx files.
DEBIAN_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
#: Where datasets are looked for (and downloaded to) when ``data.data_dir`` is not set.
DEFAULT_DATA_ROOT = "data"

FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

_FMNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
# idx type codes (http://yann.lecun.com/exdb/mnist/): the data is big-endian.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """Samples ``x`` (``(n, *input_shape)``, C-contiguous) and int64 labels ``y``.

    ``x`` is either uint8 images ``(n, C, H, W)`` with their per-channel normalisation ``mean`` and
    ``std`` (one value per channel each), or float32 features used as they are (``mean`` and ``std``
    None); any other dtype is converted to float32. Models see :meth:`features`, never ``x``.
    ``groups``: for data that comes with its own clients (FEMNIST's writers), each sample's client
    (int64, 0 to G - 1), which the ``natural`` partition and test mode follow; None otherwise.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    groups: np.ndarray | None = None

    def __post_init__(self) -> None:
        x = np.asarray(self.x)
        if x.dtype == np.uint8:
            if self.mean is None or self.std is None:
                raise ValueError(f"The uint8 images of {self.name} need a per-channel mean and std.")
            mean = tuple(float(v) for v in self.mean)
            std = tuple(float(v) for v in self.std)
            channels = x.shape[1] if x.ndim >= 2 else None
            if channels is None or len(mean) != channels or len(std) != channels:
                raise ValueError(
                    f"The uint8 images of {self.name} {x.shape} need one mean and std per channel "
                    f"(axis 1), not {len(mean)} and {len(std)}."
                )
            if not all(math.isfinite(v) for v in mean) or not all(math.isfinite(v) and v > 0 for v in std):
                raise ValueError(f"The mean {mean} and std {std} of {self.name} must be finite, std > 0.")
            object.__setattr__(self, "mean", mean)
            object.__setattr__(self, "std", std)
            x = np.ascontiguousarray(x)
        else:
            if self.mean is not None or self.std is not None:
                raise ValueError(
                    f"A mean and std normalise uint8 images only; {self.name} holds {x.dtype} features."
                )
            x = np.ascontiguousarray(x, dtype=np.float32)
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", np.ascontiguousarray(self.y, dtype=np.int64))
        if self.y.ndim != 1 or len(self.x) != len(self.y):
            raise ValueError(f"x {self.x.shape} and y {self.y.shape} do not match.")
        if len(self.y) and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise ValueError(f"Labels of {self.name} fall outside [0, {self.num_classes}).")
        if self.groups is not None:
            groups = np.ascontiguousarray(self.groups, dtype=np.int64)
            if groups.shape != self.y.shape or (len(groups) and groups.min() < 0):
                raise ValueError(f"The groups of {self.name} must be one non-negative id per sample.")
            object.__setattr__(self, "groups", groups)

    @property
    def num_groups(self) -> int:
        """How many clients of its own the data has (0 without ``groups``)."""
        return int(self.groups.max()) + 1 if self.groups is not None and len(self.groups) else 0

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.y)

    def features(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """The samples ``x[idx]`` (all of them when ``idx`` is None) as the model's float32 input.

        uint8 images are normalised per channel (:func:`normalise_images`); float32 features are
        copied. The result is always a fresh, writable, C-contiguous array, never a view of ``x``
        (which may be a read-only buffer in Ray's object store). ``idx`` is an index array, a
        boolean mask or a slice over the samples.
        """
        sub = self.x if idx is None else self.x[idx]
        if sub.ndim != self.x.ndim:
            raise IndexError(
                f"features() takes an index array or a slice over the samples of {self.name}, "
                f"not {type(idx).__name__} {idx!r}."
            )
        if self.mean is None or self.std is None:
            # fancy indexing already made a fresh array: copy only views of x (or odd layouts)
            fresh = sub.flags.c_contiguous and sub.flags.writeable and not np.may_share_memory(sub, self.x)
            return sub if fresh else np.array(sub, dtype=np.float32, order="C", copy=True)
        return normalise_images(sub, self.mean, self.std)


_FOUND = threading.local()  # per loading thread: what to call once the files are found


def files_found(title: str, where: Path | str, detail: str = "") -> None:
    """A loader's word that its files are there (downloaded first if need be) and reading begins.
    A run waits for it before starting Ray, so that a missing dataset is refused before any work,
    while the reading itself goes on beside Ray's start (:class:`raysim.data.DataLoad`). A loader
    that never says it is waited for to its end."""
    logger.info("Loading %s from %s%s.", title, where, f" ({detail})" if detail else "")
    callback = getattr(_FOUND, "callback", None)
    if callback is not None:
        callback()


def on_files_found(callback: Any) -> None:
    """Call ``callback()`` when a loader in this thread finds its files (None: nothing)."""
    _FOUND.callback = callback


def load_dataset(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """The official (train, test) split of ``cfg.dataset`` by its registered loader
    (:data:`raysim.registry.DATASETS`); ``seed`` matters only for generated data."""
    from raysim.registry import DATASETS, load_ref

    loaded: tuple[ArrayDataset, ArrayDataset] = load_ref(DATASETS.get(cfg.dataset).loader)(cfg, seed)
    return loaded


# the registered loaders: (DataConfig, seed) -> (train, test)


def fmnist(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_fmnist(cfg.data_dir, cfg.download)


def cifar10(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_cifar("cifar10", cfg.data_dir, cfg.download)


def cifar100(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_cifar("cifar100", cfg.data_dir, cfg.download)


def synthetic(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return make_synthetic(cfg.synthetic, seed)


# --------------------------------------------------------------------------------------------------
# helpers


#: Elements normalised per step in :func:`normalise_images` (its int index buffer stays in cache).
_NORMALISE_CHUNK = 1 << 16


@functools.lru_cache(maxsize=16)
def _level_table(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """The 256 normalised levels of each channel, channel after channel, computed in float64 and
    rounded to float32 once; made once per (mean, std), not per call (a one-step client's 20
    images are normalised in about the time the table took to make)."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    table = np.concatenate([((levels - m) / s).astype(np.float32) for m, s in zip(mean, std, strict=True)])
    table.setflags(write=False)
    return table


def normalise_images(images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """uint8 ``(n, C, H, W)`` -> float32 ``(v / 255 - mean_c) / std_c``, by a per-channel table.

    The table holds the 256 levels of each channel, computed in float64 and rounded to float32 once.
    Lookups go a few samples at a time through one cache-sized index buffer (numpy would otherwise
    widen every uint8 index to intp in a full-size temporary), twice as fast on CIFAR batches.
    """
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim < 2:
        raise ValueError(
            f"normalise_images takes uint8 (n, C, ...) images, not {images.dtype} {images.shape}."
        )
    channels = images.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"{channels} channels need as many means and stds, not {len(mean)} and {len(std)}.")
    table = _level_table(tuple(float(m) for m in mean), tuple(float(s) for s in std))
    # channel c's levels start at 256 * c in the table
    offsets = (256 * np.arange(channels, dtype=np.intp)).reshape((channels,) + (1,) * (images.ndim - 2))
    out = np.empty(images.shape, dtype=np.float32)
    n = len(images)
    step = max(1, _NORMALISE_CHUNK // max(1, math.prod(images.shape[1:])))
    buffer = np.empty((min(n, step),) + images.shape[1:], dtype=np.intp)
    for start in range(0, n, step):
        stop = min(n, start + step)
        index = buffer[: stop - start]
        np.add(images[start:stop], offsets, out=index)
        np.take(table, index, out=out[start:stop], mode="clip")  # indices are in range: clip is a no-op
    return out


def one_line(err: BaseException) -> str:
    """An exception as a short clause that fits inside one sentence."""
    text = " ".join(str(err).split()) or type(err).__name__
    text = text.replace(". ", "; ").rstrip(".")
    return text if len(text) <= 200 else text[:197] + "..."


def places(dirs: Sequence[Path]) -> str:
    names = list(dict.fromkeys(str(d) for d in dirs))
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


Found = TypeVar("Found")


@dataclass(frozen=True)
class Download:
    """How a dataset that torchvision has is downloaded where its files are missing."""

    allowed: bool  # ``data.download``
    root: Path  # where torchvision puts it
    fetch: Callable[[Any], object]  # ``fetch(torchvision.datasets)`` downloads it into ``root``
    files: str  # what the loader looks for, for a download that left none ("idx files")


def locate(
    title: str,
    searched: Sequence[Path],
    find: Callable[[], Found | None],
    advice: str,
    *,
    download: Download | str,
    folder: Callable[[Found], Path],
    looked_for: str = "",
    detail: Callable[[Found], str] = lambda found: "",
) -> Found:
    """A dataset's files, the one way every loader finds them: ``find()`` (the files in the first of
    ``searched`` that holds them, or None; it may refuse a folder that holds them wrong itself), else
    the download and ``find()`` again, else one sentence: "{title} was not found in {searched}
    {looked_for}, and {why}; {advice}." ``download`` is a :class:`Download`, or, for a dataset that
    cannot be downloaded, the clause that says so. Once found, :func:`files_found` says where
    (``folder``, ``detail``) and the reading may begin."""
    found = find()
    if found is None:
        if isinstance(download, str):
            reason = download
        elif not download.allowed:
            reason = "download was off"
        else:
            reason = f"the download left no {download.files}"
            try:
                import torchvision

                logger.info("Downloading %s to %s with torchvision.", title, download.root)
                download.fetch(torchvision.datasets)
            except Exception as e:  # noqa: BLE001 (any download failure becomes one sentence)
                reason = f"the download failed ({one_line(e)})"
            found = find()
        if found is None:
            raise ConfigError(
                f"{title} was not found in {places(searched)}{looked_for}, and {reason}; {advice}."
            )
    files_found(title, folder(found), detail(found))
    return found


# --------------------------------------------------------------------------------------------------
# Fashion-MNIST (idx files)


def cache_dir() -> Path:
    """Where decoded datasets are kept between runs: ``RAYSIM_CACHE_DIR``, else ``raysim`` in
    ``XDG_CACHE_HOME`` (default ``~/.cache``)."""
    if os.environ.get("RAYSIM_CACHE_DIR"):
        return Path(os.environ["RAYSIM_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "raysim"


def _decoded_copy(path: Path) -> Path | None:
    """The cache file of a gzipped file's decoded array, named by the file's absolute path, size
    and modification time (a changed file is decoded anew); None when ``path`` cannot be read."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]
    return cache_dir() / "idx" / f"{path.name.removesuffix('.gz')}-{key}.npy"


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an idx file (plain or gzipped) into a native-endian numpy array of its shape.

    A gzipped file's array is kept decoded in :func:`cache_dir` (Fashion-MNIST's take 0.7 s of CPU
    to decompress, at every run's start, beside Ray's; EMNIST's several seconds); the next read of
    the same, unchanged file loads that copy. Where the cache cannot be written, every read decodes.
    """
    p = Path(path)
    with p.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    copy = _decoded_copy(p) if gz else None
    if copy is not None and copy.is_file():
        try:
            return np.load(copy, allow_pickle=False)
        except (OSError, ValueError):  # damaged, e.g. by a full disk: decode again below
            pass
    raw = p.read_bytes()
    if gz:
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ConfigError(f"The file {p} is not an idx file (bad magic number).")
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConfigError(f"The idx file {p} is truncated in its header.")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    count = math.prod(dims)
    if len(raw) - header < count * dtype.itemsize:
        raise ConfigError(f"The idx file {p} is truncated: it should hold {count} values of {dims}.")
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=header).reshape(dims)
    data = data.astype(dtype.newbyteorder("="))
    if copy is not None:
        _keep(copy, data)
    return data


def _keep(copy: Path, data: np.ndarray) -> None:
    """Write ``data`` to ``copy`` whole or not at all (runs of a suite may write it at once)."""
    tmp = None
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=copy.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, data, allow_pickle=False)
        os.replace(tmp, copy)
    except OSError as e:  # a read-only home, a full disk: the data is decoded at every run
        logger.debug("the decoded copy %s was not written (%s)", copy, e)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _find_idx_files(directory: Path) -> dict[str, Path] | None:
    """The four Fashion-MNIST files in ``directory`` (plain preferred over .gz), or None."""
    found = {}
    for key, base in _FMNIST_FILES.items():
        for name in (base, base + ".gz"):
            if (directory / name).is_file():
                found[key] = directory / name
                break
        else:
            return None
    return found


def load_fmnist(data_dir: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """Fashion-MNIST (Xiao et al. 2017) from its idx files, as ``(n, 1, 28, 28)`` uint8 images.

    Looks in ``data_dir`` (and torchvision's ``FashionMNIST/raw`` below it), then in Debian's
    ``/usr/share/datasets/fashion-mnist``, then downloads with torchvision if ``download``.
    """
    root = Path(data_dir or DEFAULT_DATA_ROOT).expanduser()
    searched = [root, root / "FashionMNIST" / "raw", DEBIAN_FMNIST_DIR]

    def fetch(tv: Any) -> None:
        for train in (True, False):
            tv.FashionMNIST(root=str(root), train=train, download=True)

    files = locate(
        "Fashion-MNIST",
        searched,
        lambda: next((f for d in searched if (f := _find_idx_files(d)) is not None), None),
        "install the Debian package dataset-fashion-mnist, pass --data-dir, or allow the download",
        download=Download(download, root, fetch, "idx files"),
        folder=lambda files: files["train_x"].parent,
    )
    splits = []
    for part in ("train", "test"):
        images = read_idx(files[f"{part}_x"])
        labels = read_idx(files[f"{part}_y"])
        if images.ndim != 3 or images.dtype != np.uint8 or len(images) != len(labels):
            raise ConfigError(
                f"The Fashion-MNIST files in {files['train_x'].parent} do not hold uint8 images "
                "with one label each."
            )
        x = images[:, None]
        splits.append(ArrayDataset(x, labels.astype(np.int64), 10, "fmnist", FMNIST_MEAN, FMNIST_STD))
    return splits[0], splits[1]


# --------------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (python pickles, torchvision's extracted layout)

_CIFAR = {
    # name: (folder, train files, test files, label key, classes, mean, std, torchvision class)
    "cifar10": (
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "labels",
        10,
        CIFAR10_MEAN,
        CIFAR10_STD,
        "CIFAR10",
    ),
    "cifar100": (
        "cifar-100-python",
        ("train",),
        ("test",),
        "fine_labels",
        100,
        CIFAR100_MEAN,
        CIFAR100_STD,
        "CIFAR100",
    ),
}
_CIFAR_TITLE = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def _read_cifar_pickle(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    with path.open("rb") as f:
        entry: dict[Any, Any] = pickle.load(f, encoding="bytes")
    entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}
    data = np.asarray(entry["data"], dtype=np.uint8)
    labels = np.asarray(entry[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
        raise ConfigError(f"The CIFAR file {path} does not hold (n, 3072) images with one label each.")
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar(name: str, data_dir: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """CIFAR-10 or CIFAR-100 (Krizhevsky 2009, fine labels) as ``(n, 3, 32, 32)`` uint8 images.

    Reads torchvision's extracted pickle folder under ``data_dir`` (default ``data``); downloads it
    with torchvision first if it is missing and ``download`` is on.
    """
    folder, train_files, test_files, label_key, classes, mean, std, tv_name = _CIFAR[name]
    title = _CIFAR_TITLE[name]
    root = Path(data_dir or DEFAULT_DATA_ROOT).expanduser()
    searched = [root / folder, root]

    def find() -> Path | None:
        for d in searched:
            if all((d / f).is_file() for f in train_files + test_files):
                return d
        return None

    directory = locate(
        title,
        searched,
        find,
        f"pass --data-dir pointing at the folder that holds {folder}, or allow the download",
        download=Download(
            download,
            root,
            lambda tv: getattr(tv, tv_name)(root=str(root), train=True, download=True),
            "pickle files",
        ),
        folder=lambda d: d,
    )
    splits = []
    for files in (train_files, test_files):
        parts = [_read_cifar_pickle(directory / f, label_key) for f in files]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        if len(labels) and (labels.min() < 0 or labels.max() >= classes):
            raise ConfigError(f"The {title} files in {directory} hold labels outside 0..{classes - 1}.")
        splits.append(ArrayDataset(images, labels, classes, name, mean, std))
    return splits[0], splits[1]


# --------------------------------------------------------------------------------------------------
# synthetic


def make_synthetic(cfg: SyntheticConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """Class-conditional Gaussians shaped as small images (config.SyntheticConfig).

    Class c has mean ``separation * m_c`` with ``m_c ~ N(0, I)`` drawn once for train and test; a
    sample is its class mean plus ``N(0, I)`` noise, and labels are uniform over the classes. All
    draws come from ``SeedSequence([seed, 7919])``, so a seed gives the same data everywhere.
    """
    if cfg.num_classes < 1 or cfg.train_samples < 1 or cfg.test_samples < 1:
        raise ConfigError("The synthetic dataset needs at least 1 class, 1 training and 1 test sample.")
    if not cfg.shape or any(d < 1 for d in cfg.shape):
        raise ConfigError(f"The synthetic sample shape must be positive sizes, not {cfg.shape}.")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7919]))
    dim = math.prod(cfg.shape)
    means = (cfg.separation * rng.standard_normal((cfg.num_classes, dim))).astype(np.float32)
    splits = []
    for n in (cfg.train_samples, cfg.test_samples):
        y = rng.integers(0, cfg.num_classes, size=n, dtype=np.int64)
        x = rng.standard_normal((n, dim), dtype=np.float32)
        x += means[y]
        splits.append(ArrayDataset(x.reshape(n, *cfg.shape), y, cfg.num_classes, "synthetic"))
    return splits[0], splits[1]
