"""More image datasets as plain arrays: MNIST, EMNIST (byclass), SVHN, CINIC-10 and Tiny ImageNet.

Each is read from the files it is distributed as, in the style of :mod:`raysim.data.datasets`: idx
files for MNIST and EMNIST, MATLAB ``.mat`` files for SVHN (scipy), and folders of PNG or JPEG
images for CINIC-10 and Tiny ImageNet (Pillow). Images are kept as uint8 ``(n, C, H, W)`` arrays with
their per-channel mean and std (:class:`~raysim.data.datasets.ArrayDataset`), labels as int64, and
the split is the dataset's official (train, test) one. torchvision downloads MNIST, EMNIST and SVHN
when their files are missing and the download is allowed; CINIC-10 and Tiny ImageNet have no
torchvision dataset, so a missing one is reported with the address to download it from.

A missing, corrupt or wrong file is a :class:`~raysim.errors.ConfigError` of one sentence naming the
file or directory and what is wrong with it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from raysim.config import DataConfig
from raysim.data.datasets import DEFAULT_DATA_ROOT, ArrayDataset, Download, locate, one_line, read_idx
from raysim.errors import ConfigError

logger = logging.getLogger(__name__)

#: The training set's pixel mean and std, as in PyTorch's MNIST example.
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
#: The values commonly used with torchvision's EMNIST (``Normalize((0.1736,), (0.3317,))``); not
#: recomputed here from the byclass files.
EMNIST_MEAN, EMNIST_STD = (0.1736,), (0.3317,)
#: The per-channel statistics of SVHN's training split as commonly quoted; not recomputed here.
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)
#: Computed by CINIC-10's authors and given in the dataset's README.
CINIC10_MEAN = (0.47889522, 0.47227842, 0.43047404)
CINIC10_STD = (0.24205776, 0.23828046, 0.25874835)
#: The per-channel statistics of Tiny ImageNet's training set as commonly quoted; not recomputed here.
TINYIMAGENET_MEAN, TINYIMAGENET_STD = (0.4802, 0.4481, 0.3975), (0.2302, 0.2265, 0.2262)

#: CINIC-10's class folders, sorted (as torchvision's ImageFolder orders them): label = position.
CINIC10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CINIC10_URL = "https://datashare.ed.ac.uk/handle/10283/3192"
TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINYIMAGENET_CLASSES = 200
EMNIST_CLASSES = 62

_MNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
_EMNIST_FILES = {
    "train_x": "emnist-byclass-train-images-idx3-ubyte",
    "train_y": "emnist-byclass-train-labels-idx1-ubyte",
    "test_x": "emnist-byclass-test-images-idx3-ubyte",
    "test_y": "emnist-byclass-test-labels-idx1-ubyte",
}
_SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}


# the registered loaders: (DataConfig, seed) -> (train, test)


def mnist(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_mnist(cfg.data_dir, cfg.download)


def emnist(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_emnist(cfg.data_dir, cfg.download)


def svhn(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_svhn(cfg.data_dir, cfg.download)


def cinic10(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_cinic10(cfg.data_dir, cfg.download)


def tinyimagenet(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_tinyimagenet(cfg.data_dir, cfg.download)


# --------------------------------------------------------------------------------------------------
# helpers


def _root(data_dir: str | None) -> Path:
    return Path(data_dir or DEFAULT_DATA_ROOT).expanduser()


def _find_files(dirs: list[Path], names: dict[str, str], gz: bool) -> dict[str, Path] | None:
    """All of ``names`` (plain preferred over .gz where ``gz``) in the first of ``dirs`` holding them."""
    for directory in dirs:
        found = {}
        for key, base in names.items():
            candidates = (base, base + ".gz") if gz else (base,)
            path = next((directory / n for n in candidates if (directory / n).is_file()), None)
            if path is None:
                break
            found[key] = path
        else:
            return found
    return None


def _read_images(paths: list[Path], size: int, title: str) -> np.ndarray:
    """The images at ``paths`` as uint8 ``(n, 3, size, size)`` RGB (greyscale and palette images are
    converted), read one by one into a preallocated array."""
    from PIL import Image

    x = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                if image.size != (size, size):
                    width, height = image.size
                    raise ConfigError(
                        f"The {title} image {path} is {width}x{height} pixels, not {size}x{size}."
                    )
                pixels = np.asarray(image.convert("RGB"))
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 (Pillow raises many kinds for a bad file)
            raise ConfigError(f"The {title} image {path} cannot be read ({one_line(e)}).") from e
        x[i] = pixels.transpose(2, 0, 1)
    return x


def _image_files(directory: Path, suffix: str) -> list[Path]:
    """The files of ``directory`` ending in ``suffix`` (any case), sorted by name."""
    return sorted(p for p in directory.iterdir() if p.suffix.lower() == suffix and not p.is_dir())


def _subfolders(directory: Path) -> list[str]:
    """The names of ``directory``'s folders, hidden ones (``.ipynb_checkpoints``) left out."""
    return sorted(p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


# --------------------------------------------------------------------------------------------------
# MNIST and EMNIST (idx files)


def _read_idx(path: Path, title: str) -> np.ndarray:
    try:
        return read_idx(path)
    except ConfigError:
        raise
    except (OSError, EOFError, ValueError, zlib.error) as e:  # a bad gzip stream, an unreadable file
        raise ConfigError(f"The {title} file {path} cannot be read ({one_line(e)}).") from e


def _idx_split(
    files: dict[str, Path], part: str, title: str, classes: int, upright: bool
) -> tuple[np.ndarray, np.ndarray]:
    """One split's uint8 ``(n, 1, 28, 28)`` images and int64 labels, checked."""
    xp, yp = files[f"{part}_x"], files[f"{part}_y"]
    images = _read_idx(xp, title)
    labels = _read_idx(yp, title)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ConfigError(
            f"The {title} file {xp} holds {images.dtype} values of shape {images.shape}, "
            "not uint8 28x28 images."
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(
            f"The {title} file {yp} holds {labels.dtype} values of shape {labels.shape}, not one label per image."
        )
    if len(labels) != len(images):
        raise ConfigError(f"The {title} file {yp} holds {len(labels)} labels for {len(images)} images.")
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise ConfigError(f"The {title} file {yp} holds labels outside 0..{classes - 1}.")
    if upright:  # EMNIST stores every image transposed (column by column)
        images = images.transpose(0, 2, 1)
    return np.ascontiguousarray(images[:, None]), labels.astype(np.int64)


def _load_idx_dataset(
    name: str,
    title: str,
    names: dict[str, str],
    searched: list[Path],
    root: Path,
    download: bool,
    fetch: Callable[[Any], object],
    classes: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    upright: bool = False,
) -> tuple[ArrayDataset, ArrayDataset]:
    files = locate(
        title,
        searched,
        lambda: _find_files(searched, names, gz=True),
        f"pass --data-dir pointing at the folder that holds {names['train_x']} and its three other idx files, "
        "or allow the download",
        download=Download(download, root, fetch, "idx files"),
        folder=lambda files: files["train_x"].parent,
    )
    splits = []
    for part in ("train", "test"):
        x, y = _idx_split(files, part, title, classes, upright)
        splits.append(ArrayDataset(x, y, classes, name, mean, std))
    return splits[0], splits[1]


def load_mnist(data_dir: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """MNIST (LeCun, Bottou, Bengio and Haffner 1998, "Gradient-based learning applied to document
    recognition") from its idx files, as ``(n, 1, 28, 28)`` uint8 images of 10 digits.

    Looks for the four idx files (plain or .gz) in ``data_dir`` (default ``data``) and torchvision's
    ``MNIST/raw`` below it; downloads them with torchvision first if they are missing and
    ``download`` is on. Normalised with 0.1307 and 0.3081, the training set's pixel mean and std (the
    values of PyTorch's MNIST example).
    """
    root = _root(data_dir)
    tv_raw = root / "MNIST" / "raw"

    def fetch(tv: Any) -> None:
        for train in (True, False):
            tv.MNIST(root=str(root), train=train, download=True)

    return _load_idx_dataset(
        "mnist", "MNIST", _MNIST_FILES, [root, tv_raw], root, download, fetch, 10, MNIST_MEAN, MNIST_STD
    )


def load_emnist(data_dir: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """EMNIST's byclass split (Cohen, Afshar, Tapson and van Schaik 2017, "EMNIST: an extension of
    MNIST to handwritten letters"): 62 classes (10 digits, 26 upper- and 26 lower-case letters, in
    that order) as ``(n, 1, 28, 28)`` uint8 images.

    Looks for ``emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte`` (plain or .gz) in
    torchvision's ``EMNIST/raw`` below ``data_dir`` (default ``data``) and in ``data_dir`` itself;
    downloads them with torchvision (the whole EMNIST archive, about 0.5 GB) first if they are
    missing and ``download`` is on. EMNIST's idx files hold every image transposed; they are turned
    upright here (torchvision's EMNIST leaves them as stored). Normalised with 0.1736 and 0.3317, the
    values commonly used with torchvision's EMNIST, not recomputed here from the byclass files.
    """
    root = _root(data_dir)
    tv_raw = root / "EMNIST" / "raw"

    def fetch(tv: Any) -> None:
        for train in (True, False):
            tv.EMNIST(root=str(root), split="byclass", train=train, download=True)

    return _load_idx_dataset(
        "emnist",
        "EMNIST (byclass)",
        _EMNIST_FILES,
        [tv_raw, root],
        root,
        download,
        fetch,
        EMNIST_CLASSES,
        EMNIST_MEAN,
        EMNIST_STD,
        upright=True,
    )


# --------------------------------------------------------------------------------------------------
# SVHN (MATLAB files)


def _read_svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN's ``X`` ``(32, 32, 3, n)`` as uint8 ``(n, 3, 32, 32)`` and ``y`` ``(n, 1)`` (1..10, 10 for
    the digit 0) as int64 labels 0..9."""
    import scipy.io

    try:
        mat = scipy.io.loadmat(str(path), variable_names=("X", "y"))
    except Exception as e:  # noqa: BLE001 (scipy raises many kinds for a bad file)
        raise ConfigError(f"The SVHN file {path} is not a readable MATLAB file ({one_line(e)}).") from e
    x, y = mat.get("X"), mat.get("y")
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        raise ConfigError(f"The SVHN file {path} does not hold the arrays X and y.")
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise ConfigError(
            f"The SVHN file {path} holds X of {x.dtype} {x.shape}, not uint8 images of shape (32, 32, 3, n)."
        )
    n = x.shape[3]
    if y.shape not in ((n, 1), (n,)) or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(
            f"The SVHN file {path} holds y of {y.dtype} {y.shape}, not one integer label for each of its "
            f"{n} images."
        )
    labels = y.reshape(-1).astype(np.int64)
    if n and (labels.min() < 1 or labels.max() > 10):
        raise ConfigError(f"The SVHN file {path} holds labels outside 1..10.")
    labels[labels == 10] = 0  # SVHN's label 10 is the digit 0
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), labels


def load_svhn(data_dir: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """SVHN's cropped digits (Netzer, Wang, Coates, Bissacco, Wu and Ng 2011, "Reading digits in
    natural images with unsupervised feature learning"), train and test without "extra", as
    ``(n, 3, 32, 32)`` uint8 images of 10 digits (label 10 of the files is the digit 0).

    Reads ``train_32x32.mat`` and ``test_32x32.mat`` from ``data_dir`` (default ``data``, where
    torchvision puts them) or its ``svhn`` folder; downloads them with torchvision first if they are
    missing and ``download`` is on. Normalised with the per-channel mean and std of the training split
    as commonly quoted (0.4377, 0.4438, 0.4728 and 0.1980, 0.2010, 0.1970), not recomputed here.
    """
    root = _root(data_dir)
    searched = [root, root / "svhn"]

    def fetch(tv: Any) -> None:
        for split in ("train", "test"):
            tv.SVHN(root=str(root), split=split, download=True)

    files = locate(
        "SVHN",
        searched,
        lambda: _find_files(searched, _SVHN_FILES, gz=False),
        "pass --data-dir pointing at the folder that holds train_32x32.mat and test_32x32.mat, "
        "or allow the download",
        download=Download(download, root, fetch, ".mat files"),
        folder=lambda files: files["train"].parent,
    )
    splits = []
    for part in ("train", "test"):
        x, y = _read_svhn_mat(files[part])
        splits.append(ArrayDataset(x, y, 10, "svhn", SVHN_MEAN, SVHN_STD))
    return splits[0], splits[1]


# --------------------------------------------------------------------------------------------------
# CINIC-10 (folders of PNG images)


def _cinic_split(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    folders = _subfolders(directory)
    unknown = [f for f in folders if f not in CINIC10_CLASSES]
    if unknown:
        raise ConfigError(
            f"The CINIC-10 folder {directory} holds the unknown class folder {unknown[0]!r} "
            f"(the classes are {', '.join(CINIC10_CLASSES)})."
        )
    missing = [c for c in CINIC10_CLASSES if c not in folders]
    if missing:
        raise ConfigError(f"The CINIC-10 folder {directory} lacks the class folders {', '.join(missing)}.")
    paths: list[Path] = []
    counts = []
    for cls in CINIC10_CLASSES:
        files = _image_files(directory / cls, ".png")
        paths += files
        counts.append(len(files))
    if not paths:
        raise ConfigError(f"The CINIC-10 folder {directory} holds no PNG images.")
    labels = np.repeat(np.arange(len(CINIC10_CLASSES), dtype=np.int64), counts)
    return _read_images(paths, 32, "CINIC-10"), labels


def load_cinic10(data_dir: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """CINIC-10 (Darlow, Crowley, Antoniou and Storkey 2018, "CINIC-10 is not ImageNet or CIFAR-10")
    as ``(n, 3, 32, 32)`` uint8 images of CIFAR-10's 10 classes: its official train split (90,000,
    without "valid") and test split (90,000).

    Reads the PNG folders ``train/<class>/*.png`` and ``test/<class>/*.png`` (greyscale images are
    converted to RGB) from ``data_dir``'s ``cinic10`` (or ``CINIC-10``) folder or ``data_dir``
    itself (default ``data``). There is no torchvision dataset to download it with (``download`` has
    no effect). Normalised with the per-channel mean and std given by the dataset's authors.
    """
    root = _root(data_dir)
    searched = [root / "cinic10", root / "CINIC-10", root / "cinic-10", root]
    directory = locate(
        "CINIC-10",
        searched,
        lambda: next((d for d in searched if (d / "train").is_dir() and (d / "test").is_dir()), None),
        f"download it from {CINIC10_URL} and unpack it into {root / 'cinic10'}, or pass --data-dir",
        download="torchvision cannot download it",
        folder=lambda d: d,
        looked_for=" (no train and test folders)",
    )
    splits = []
    for part in ("train", "test"):
        x, y = _cinic_split(directory / part)
        splits.append(ArrayDataset(x, y, 10, "cinic10", CINIC10_MEAN, CINIC10_STD))
    return splits[0], splits[1]


# --------------------------------------------------------------------------------------------------
# Tiny ImageNet (folders of JPEG images)


def _read_wnids(path: Path) -> list[str]:
    try:
        wnids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"The Tiny ImageNet file {path} cannot be read ({one_line(e)}).") from e
    if len(wnids) != TINYIMAGENET_CLASSES or len(set(wnids)) != len(wnids):
        raise ConfigError(
            f"The Tiny ImageNet file {path} lists {len(wnids)} class ids ({len(set(wnids))} distinct), "
            f"not {TINYIMAGENET_CLASSES} distinct ones."
        )
    return wnids


def _tiny_train(directory: Path, wnids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    folders = _subfolders(directory)
    known = set(wnids)
    unknown = [f for f in folders if f not in known]
    if unknown:
        raise ConfigError(
            f"The Tiny ImageNet folder {directory} holds the class folder {unknown[0]!r}, which is not "
            "in wnids.txt."
        )
    missing = [w for w in wnids if w not in set(folders)]
    if missing:
        raise ConfigError(
            f"The Tiny ImageNet folder {directory} lacks the folders of {len(missing)} classes of "
            f"wnids.txt (such as {missing[0]})."
        )
    paths: list[Path] = []
    counts = []
    for wnid in wnids:
        images = directory / wnid / "images"
        if not images.is_dir():
            raise ConfigError(f"The Tiny ImageNet folder {directory / wnid} has no images folder.")
        files = _image_files(images, ".jpeg")
        paths += files
        counts.append(len(files))
    if not paths:
        raise ConfigError(f"The Tiny ImageNet folder {directory} holds no JPEG images.")
    labels = np.repeat(np.arange(len(wnids), dtype=np.int64), counts)
    return _read_images(paths, 64, "Tiny ImageNet"), labels


def _tiny_val(directory: Path, wnids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The validation images in the order of ``val_annotations.txt`` (file name, wnid, box)."""
    annotations = directory / "val_annotations.txt"
    images = directory / "images"
    if not annotations.is_file() or not images.is_dir():
        raise ConfigError(f"The Tiny ImageNet folder {directory} lacks val_annotations.txt or images.")
    try:
        lines = annotations.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"The Tiny ImageNet file {annotations} cannot be read ({one_line(e)}).") from e
    label_of = {w: i for i, w in enumerate(wnids)}
    entries: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise ConfigError(
                f"Line {number} of the Tiny ImageNet file {annotations} is not tab-separated "
                "(file name, class id, box)."
            )
        name, wnid = fields[0].strip(), fields[1].strip()
        if wnid not in label_of:
            raise ConfigError(
                f"Line {number} of the Tiny ImageNet file {annotations} names the class {wnid!r}, "
                "which is not in wnids.txt."
            )
        if name in entries:
            raise ConfigError(f"The Tiny ImageNet file {annotations} lists {name!r} twice.")
        entries[name] = label_of[wnid]
    files = {p.name: p for p in _image_files(images, ".jpeg")}
    unlisted = sorted(set(files) - set(entries))
    if unlisted:
        raise ConfigError(
            f"The Tiny ImageNet image {files[unlisted[0]]} has no entry in {annotations} "
            f"({len(unlisted)} images have none)."
        )
    absent = [name for name in entries if name not in files]
    if absent:
        raise ConfigError(
            f"The Tiny ImageNet file {annotations} lists {absent[0]!r}, which is not a JPEG image in "
            f"{images} ({len(absent)} such entries)."
        )
    if not entries:
        raise ConfigError(f"The Tiny ImageNet folder {images} holds no JPEG images.")
    labels = np.fromiter(entries.values(), dtype=np.int64, count=len(entries))
    return _read_images([files[name] for name in entries], 64, "Tiny ImageNet"), labels


def load_tinyimagenet(data_dir: str | None, download: bool) -> tuple[ArrayDataset, ArrayDataset]:
    """Tiny ImageNet (Le and Yang 2015, "Tiny ImageNet visual recognition challenge", Stanford CS231N)
    as ``(n, 3, 64, 64)`` uint8 images of 200 classes: train (100,000) and, as the test split, val
    (10,000; the test images have no labels).

    Reads ``tiny-imagenet-200`` below ``data_dir`` (default ``data``), or ``data_dir`` itself:
    ``wnids.txt`` (the class ids, in label order), ``train/<wnid>/images/*.JPEG`` and
    ``val/images/*.JPEG`` labelled by ``val/val_annotations.txt``, in its order. Greyscale images are
    converted to RGB. There is no torchvision dataset to download it with (``download`` has no
    effect). Normalised with the per-channel mean and std of the training set as commonly quoted
    (0.4802, 0.4481, 0.3975 and 0.2302, 0.2265, 0.2262), not recomputed here.
    """
    root = _root(data_dir)
    searched = [root / "tiny-imagenet-200", root]

    def find() -> Path | None:
        directory = next((d for d in searched if (d / "wnids.txt").is_file()), None)
        for sub in ("train", "val"):
            if directory is not None and not (directory / sub).is_dir():
                raise ConfigError(f"The Tiny ImageNet folder {directory} has no {sub} folder.")
        return directory

    directory = locate(
        "Tiny ImageNet",
        searched,
        find,
        f"download {TINYIMAGENET_URL} and unzip it into {root}, or pass --data-dir",
        download="torchvision cannot download it",
        folder=lambda d: d,
        looked_for=" (no wnids.txt)",
    )
    wnids = _read_wnids(directory / "wnids.txt")
    train_x, train_y = _tiny_train(directory / "train", wnids)
    test_x, test_y = _tiny_val(directory / "val", wnids)
    classes = TINYIMAGENET_CLASSES
    return (
        ArrayDataset(train_x, train_y, classes, "tinyimagenet", TINYIMAGENET_MEAN, TINYIMAGENET_STD),
        ArrayDataset(test_x, test_y, classes, "tinyimagenet", TINYIMAGENET_MEAN, TINYIMAGENET_STD),
    )
