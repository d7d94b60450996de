"""Tiny CIFAR-10 / CIFAR-100 folders in CIFAR's own python pickle format, for tests.

The layout is the one torchvision extracts: ``cifar-10-batches-py/data_batch_1..5, test_batch,
batches.meta`` and ``cifar-100-python/train, test, meta``, each a pickled dict with bytes keys,
``b"data"`` a uint8 ``(n, 3072)`` array (R, G, B planes of 32x32) and ``b"labels"`` (CIFAR-10) or
``b"fine_labels"`` and ``b"coarse_labels"`` (CIFAR-100).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def _dump(path: Path, entry: dict[bytes, object]) -> None:
    with path.open("wb") as f:
        pickle.dump(entry, f)


def write_cifar10(
    root: Path, per_batch: int = 8, n_test: int = 10, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Write ``root/cifar-10-batches-py``; return (train data, train labels, test data, test labels)
    as written (data uint8 ``(n, 3072)``)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    datas, labels = [], []
    for i in range(1, 6):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        lab = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        _dump(folder / f"data_batch_{i}", {b"batch_label": b"batch", b"data": data, b"labels": lab})
        datas.append(data)
        labels.extend(lab)
    test = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    test_labels = [int(v) for v in rng.integers(0, 10, size=n_test)]
    _dump(folder / "test_batch", {b"batch_label": b"test", b"data": test, b"labels": test_labels})
    names = [f"class{c}".encode() for c in range(10)]
    _dump(folder / "batches.meta", {b"label_names": names, b"num_cases_per_batch": per_batch})
    return np.concatenate(datas), np.array(labels), test, np.array(test_labels)


def write_cifar100(
    root: Path, n_train: int = 30, n_test: int = 10, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Write ``root/cifar-100-python``; return (train data, fine labels, test data, fine labels)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = []
    for name, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, size=n)]
        coarse = [v // 5 for v in fine]
        _dump(
            folder / name,
            {b"data": data, b"fine_labels": fine, b"coarse_labels": coarse, b"batch_label": b"x"},
        )
        out += [data, np.array(fine)]
    names = [f"fine{c}".encode() for c in range(100)]
    _dump(folder / "meta", {b"fine_label_names": names, b"coarse_label_names": names[:20]})
    return out[0], out[1], out[2], out[3]
