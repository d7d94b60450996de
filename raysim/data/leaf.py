"""FEMNIST from LEAF (Caldas, Duddu, Wu, Li, Konečný, McMahan, Smith and Talwalkar 2018, "LEAF: A
Benchmark for Federated Settings"), read from LEAF's own json files, with each sample's writer.

FEMNIST is NIST Special Database 19's handwritten digits and letters grouped by the person who wrote
them: 62 classes (0-9 the digits, 10-35 the upper-case and 36-61 the lower-case letters), 28x28
greyscale images. LEAF makes its json files with its own scripts from NIST's images; there is no
download here. After ``./preprocess.sh -s niid --sf 1.0 -k 0 -t sample`` in ``leaf/data/femnist``
(https://github.com/TalwalkarLab/leaf) the split lies in ``femnist/data/train/*.json`` and
``femnist/data/test/*.json``. Each file is one json object::

    {"users": [writer ids], "num_samples": [samples per writer],
     "user_data": {writer id: {"x": [[784 floats in 0..1], ...], "y": [labels 0..61]}}}

(other keys, such as ``hierarchies``, are ignored; so are ``user_data`` entries for writers missing
from ``users``, which LEAF's sample split leaves, empty, for the writers it drops). With ``-t sample``
LEAF splits every writer's own samples, 90% to train and 10% to test, so a writer appears in both.

Choices made here:

- The writers are the data's own clients (:attr:`ArrayDataset.groups`): one index over the writers
  with training samples, sorted by writer id (so it does not depend on how LEAF sharded the files),
  numbers the samples of both splits; a test writer without training samples is an error.
- Images are ``(n, 1, 28, 28)`` uint8, ``round(clip(x, 0, 1) * 255)``. LEAF's values are kept as
  they are (dark ink on a light background, NIST's way, not inverted to MNIST's look); they are
  ``k / 255`` from LEAF's scripts, so the uint8 images hold LEAF's values exactly.
- LEAF publishes no normalisation statistics, so the per-channel mean and std of the loaded training
  pixels (as ``v / 255``, in float64) normalise both splits.
- Samples are ordered as read: json files sorted by name, writers in each file's ``users`` order.

A missing, unreadable or malformed file is a :class:`~raysim.errors.ConfigError` of one sentence
naming the file or folder and what is wrong with it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from raysim.config import DataConfig
from raysim.data.datasets import DEFAULT_DATA_ROOT, ArrayDataset, locate, one_line
from raysim.errors import ConfigError

logger = logging.getLogger(__name__)

FEMNIST_CLASSES = 62
#: The size of LEAF's full FEMNIST in the LEAF paper's Table 1 (writers and samples), nominal sizes for
#: the registry's checks before loading; the files of a given preprocess.sh run (which keeps the
#: writers with at least 2 samples for its per-writer split) may hold slightly different counts.
FEMNIST_WRITERS = 3550
FEMNIST_SAMPLES = 805263
LEAF_URL = "https://github.com/TalwalkarLab/leaf"
LEAF_COMMAND = "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample"

_PIXELS = 28 * 28
#: Samples per step when counting pixel levels for the mean and std (a bounded intp buffer).
_STATS_CHUNK = 1 << 14


# the registered loader: (DataConfig, seed) -> (train, test)


def femnist(cfg: DataConfig, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    return load_femnist(cfg.data_dir)


# --------------------------------------------------------------------------------------------------
# reading LEAF's json files


def _json_files(folder: Path) -> list[Path]:
    """The ``.json`` files of ``folder``, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() == ".json" and p.is_file())


def _user_arrays(path: Path, writer: str, xs: Any, ys: Any) -> tuple[np.ndarray, np.ndarray]:
    """One writer's images as uint8 ``(n, 1, 28, 28)`` and labels as int64, checked."""
    if not isinstance(xs, list) or not isinstance(ys, list):
        raise ConfigError(f"The FEMNIST file {path} holds no lists x and y for the writer {writer!r}.")
    if len(xs) != len(ys):
        raise ConfigError(
            f"The FEMNIST file {path} holds {len(xs)} images but {len(ys)} labels for the writer {writer!r}."
        )
    if not ys:
        return np.empty((0, 1, 28, 28), dtype=np.uint8), np.empty(0, dtype=np.int64)
    try:
        pixels: np.ndarray | None = np.asarray(xs, dtype=np.float32)
    except (ValueError, TypeError):  # ragged lists, or values that are not numbers
        pixels = None
    if pixels is None or pixels.ndim != 2 or pixels.shape[1] != _PIXELS:
        odd = next((v for v in xs if not isinstance(v, list) or len(v) != _PIXELS), None)
        what = f" (one holds {len(odd)} values)" if isinstance(odd, list) else ""
        raise ConfigError(
            f"The images of the writer {writer!r} in the FEMNIST file {path} are not lists of "
            f"{_PIXELS} numbers{what}."
        )
    if not np.isfinite(pixels).all():
        raise ConfigError(f"The images of the writer {writer!r} in the FEMNIST file {path} hold NaN or inf.")
    try:
        labels: np.ndarray | None = np.asarray(ys)
    except (ValueError, TypeError):
        labels = None
    if labels is None or labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(f"The labels of the writer {writer!r} in the FEMNIST file {path} are not integers.")
    if labels.min() < 0 or labels.max() >= FEMNIST_CLASSES:
        raise ConfigError(
            f"The FEMNIST file {path} holds labels outside 0..{FEMNIST_CLASSES - 1} for the writer {writer!r}."
        )
    np.clip(pixels, 0.0, 1.0, out=pixels)
    pixels *= 255.0
    np.rint(pixels, out=pixels)
    images = pixels.astype(np.uint8).reshape(-1, 1, 28, 28)
    return images, labels.astype(np.int64)


def _read_leaf_file(path: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The writers of one LEAF json file in its ``users`` order: (writer id, images, labels)."""
    try:
        with path.open("rb") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"The FEMNIST file {path} is not readable JSON ({one_line(e)}).") from e
    if not isinstance(data, dict) or not isinstance(data.get("users"), list):
        raise ConfigError(f"The FEMNIST file {path} is not a LEAF file: it has no list users.")
    user_data = data.get("user_data")
    if not isinstance(user_data, dict):
        raise ConfigError(f"The FEMNIST file {path} is not a LEAF file: it has no object user_data.")
    users = [str(u) for u in data["users"]]
    counts = data.get("num_samples")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        raise ConfigError(f"The num_samples of the FEMNIST file {path} are not one count per user.")
    out = []
    seen: set[str] = set()
    for i, writer in enumerate(users):
        if writer in seen:
            raise ConfigError(f"The FEMNIST file {path} lists the writer {writer!r} twice.")
        seen.add(writer)
        entry = user_data.get(writer)
        if not isinstance(entry, dict):
            raise ConfigError(
                f"The FEMNIST file {path} lists the writer {writer!r} but holds no data for it."
            )
        images, labels = _user_arrays(path, writer, entry.get("x"), entry.get("y"))
        if counts is not None and counts[i] != len(labels):
            raise ConfigError(
                f"The FEMNIST file {path} gives num_samples {counts[i]!r} for the writer {writer!r}, "
                f"who has {len(labels)} samples."
            )
        out.append((writer, images, labels))
    return out


def _read_split(
    folder: Path, files: list[Path]
) -> tuple[list[tuple[str, np.ndarray, np.ndarray]], dict[str, Path]]:
    """Every writer's samples in ``files`` (one split), and the file each writer came from."""
    writers: list[tuple[str, np.ndarray, np.ndarray]] = []
    source: dict[str, Path] = {}
    for path in files:
        for writer, images, labels in _read_leaf_file(path):
            if writer in source:
                raise ConfigError(
                    f"The writer {writer!r} appears in both {source[writer]} and {path}; {folder} may hold "
                    "the files of two preprocess.sh runs (LEAF asks to delete train and test before a rerun)."
                )
            source[writer] = path
            writers.append((writer, images, labels))
    return writers, source


def _pixel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of uint8 ``images`` as ``v / 255``, in float64, from a
    count of the 256 levels (no float copy of the images)."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for c in range(images.shape[1]):
        counts = np.zeros(256, dtype=np.int64)
        for start in range(0, len(images), _STATS_CHUNK):
            counts += np.bincount(images[start : start + _STATS_CHUNK, c].ravel(), minlength=256)
        total = counts.sum()
        mean = float(counts @ levels) / total
        var = float(counts @ (levels - mean) ** 2) / total
        means.append(mean)
        stds.append(float(np.sqrt(var)))
    return tuple(means), tuple(stds)


def _leaf_dirs(root: Path) -> list[Path]:
    """Where FEMNIST's LEAF folders are looked for, in order."""
    return [root / "femnist" / "data", root / "data", root]


def _find_leaf_dir(searched: list[Path]) -> tuple[Path, list[Path], list[Path]] | None:
    """The first of ``searched`` with ``train`` and ``test`` folders of .json files, and those
    files; None when none has both folders."""
    pairs = [d for d in searched if (d / "train").is_dir() and (d / "test").is_dir()]
    for d in pairs:
        train, test = _json_files(d / "train"), _json_files(d / "test")
        if train and test:
            return d, train, test
    if pairs:
        d = pairs[0]
        empty = d / "train" if not _json_files(d / "train") else d / "test"
        raise ConfigError(
            f"The FEMNIST folder {empty} holds no .json files; run LEAF's {LEAF_COMMAND} in "
            f"leaf/data/femnist ({LEAF_URL}) to make them."
        )
    return None


def load_femnist(data_dir: str | None) -> tuple[ArrayDataset, ArrayDataset]:
    """LEAF's FEMNIST (its per-writer train/test split) as ``(n, 1, 28, 28)`` uint8 images of 62
    classes, each sample's writer in ``groups``.

    Looks for ``train`` and ``test`` folders of LEAF json files in ``data_dir/femnist/data``,
    ``data_dir/data`` and ``data_dir`` (default ``data``). The writer index is the sorted ids of the
    writers with training samples, shared by both splits. Normalised with the mean and std of the
    loaded training pixels (``v / 255``, float64), as LEAF publishes none. See the module docstring.
    """
    searched = _leaf_dirs(Path(data_dir or DEFAULT_DATA_ROOT).expanduser())
    directory, train_files, test_files = locate(
        "FEMNIST",
        searched,
        lambda: _find_leaf_dir(searched),
        f"run LEAF's {LEAF_COMMAND} in leaf/data/femnist ({LEAF_URL}) and pass --data-dir pointing at "
        "leaf/data (or at leaf/data/femnist/data)",
        download="it cannot be downloaded",
        folder=lambda found: found[0],
        looked_for=" (no train and test folders of LEAF json files)",
        detail=lambda found: f"{len(found[1])} train and {len(found[2])} test json files",
    )
    train_writers, _ = _read_split(directory / "train", train_files)
    test_writers, test_source = _read_split(directory / "test", test_files)
    index = {w: i for i, w in enumerate(sorted(w for w, _, y in train_writers if len(y)))}
    if not index:
        raise ConfigError(f"The FEMNIST files in {directory / 'train'} hold no training samples.")
    for writer, _, labels in test_writers:
        if len(labels) and writer not in index:
            raise ConfigError(
                f"The FEMNIST file {test_source[writer]} holds test samples of the writer {writer!r}, "
                f"who has no training samples in {directory / 'train'}."
            )

    def assemble(writers: list[tuple[str, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
        kept = [(w, x, y) for w, x, y in writers if len(y)]
        if not kept:
            return (
                np.empty((0, 1, 28, 28), dtype=np.uint8),
                np.empty(0, dtype=np.int64),
                np.empty(0, dtype=np.int64),
            )
        x = np.concatenate([x for _, x, _ in kept])
        y = np.concatenate([y for _, _, y in kept])
        groups = np.concatenate([np.full(len(y), index[w], dtype=np.int64) for w, _, y in kept])
        return x, y, groups

    train_x, train_y, train_groups = assemble(train_writers)
    del train_writers
    test_x, test_y, test_groups = assemble(test_writers)
    del test_writers
    mean, std = _pixel_stats(train_x)
    if not all(s > 0 for s in std):
        raise ConfigError(
            f"The FEMNIST training images in {directory / 'train'} all have one pixel value, so their "
            "std cannot normalise them."
        )
    logger.info(
        "FEMNIST: %d writers, %d training and %d test samples, pixel mean %.4f and std %.4f.",
        len(index),
        len(train_y),
        len(test_y),
        mean[0],
        std[0],
    )
    train = ArrayDataset(train_x, train_y, FEMNIST_CLASSES, "femnist", mean, std, groups=train_groups)
    test = ArrayDataset(test_x, test_y, FEMNIST_CLASSES, "femnist", mean, std, groups=test_groups)
    return train, test
