"""The natural partition and test mode: clients are the data's own (FEMNIST's writers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raysim.config import DataConfig
from raysim.data.datasets import ArrayDataset
from raysim.data.federated import matched_test_sets, natural_test_sets
from raysim.data.partition import partition_indices, split_natural
from raysim.errors import ConfigError
from raysim.registry import parse_partition


def _grouped(n_writers: int, per: list[int], seed: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    groups = np.concatenate([np.full(k, w) for w, k in zip(range(n_writers), per, strict=True)])
    rng.shuffle(groups)  # the writers' samples interleaved, as in a pooled file
    n = len(groups)
    return ArrayDataset(rng.random((n, 4)).astype(np.float32), rng.integers(0, 3, n), 3, "grouped", groups=groups)


def test_each_client_is_one_writer_with_all_its_samples():
    data = _grouped(6, [3, 5, 2, 7, 4, 1], seed=0)
    spec = parse_partition("natural")
    parts = partition_indices(data.y, 4, spec, np.random.default_rng(1), 3, DataConfig(), groups=data.groups)
    again = partition_indices(data.y, 4, spec, np.random.default_rng(1), 3, DataConfig(), groups=data.groups)
    assert [p.tolist() for p in parts] == [p.tolist() for p in again]  # seeded
    assert data.groups is not None
    writers = [int(np.unique(data.groups[p])[0]) for p in parts]
    for p, w in zip(parts, writers, strict=True):
        assert len(np.unique(data.groups[p])) == 1  # one writer a client
        np.testing.assert_array_equal(p, np.flatnonzero(data.groups == w))  # all of its samples, sorted
    assert writers == sorted(set(writers)) and len(writers) == 4
    whole = split_natural(data.y, 6, None, np.random.default_rng(1), 3, DataConfig(), groups=data.groups)
    assert [int(data.groups[p][0]) for p in whole] == list(range(6))  # every writer, in id order
    with pytest.raises(ConfigError, match="6 clients of the data's own, fewer than 7"):
        split_natural(data.y, 7, None, np.random.default_rng(1), 3, DataConfig(), groups=data.groups)
    with pytest.raises(ConfigError, match="follows the data's own clients; fmnist has none"):
        split_natural(data.y, 2, None, np.random.default_rng(1), 3, DataConfig(dataset="fmnist"))


def test_natural_test_sets_are_each_writers_own():
    train, test = _grouped(5, [4, 6, 3, 5, 2], seed=2), _grouped(5, [1, 2, 1, 2, 1], seed=3)
    spec = parse_partition("natural")
    rng = np.random.default_rng(0)

    def partition(labels, groups=None):  # type: ignore[no-untyped-def]
        return partition_indices(labels, 3, spec, rng, 3, DataConfig(), groups=groups)

    _, ptest, client_train, client_test = natural_test_sets(train, test, None, partition, np.random.default_rng(0))
    assert ptest is test and train.groups is not None and test.groups is not None
    for tr, te in zip(client_train, client_test, strict=True):
        writer = int(train.groups[tr][0])
        np.testing.assert_array_equal(te, np.flatnonzero(test.groups == writer))

    def mixed(labels, groups=None):  # type: ignore[no-untyped-def]
        return [np.arange(len(labels))]

    with pytest.raises(ConfigError, match="needs the natural partition"):
        natural_test_sets(train, test, None, mixed, np.random.default_rng(0))
    plain = ArrayDataset(train.x, train.y, 3, "plain")
    with pytest.raises(ConfigError, match="plain has none"):
        natural_test_sets(plain, test, None, partition, np.random.default_rng(0))
    # the matched mode follows the natural partition too (its P-Tests drawn from G-Test)
    _, _, natural_train, _ = matched_test_sets(train, test, None, partition, np.random.default_rng(0))
    assert all(len(np.unique(train.groups[p])) == 1 for p in natural_train)


def _leaf(root: Path, writers: dict[str, tuple[int, int]], seed: int = 0) -> None:
    """A tiny LEAF femnist in LEAF's own layout (train/ and test/ json files), random pixels."""
    rng = np.random.default_rng(seed)
    for split, k in (("train", 0), ("test", 1)):
        folder = root / "femnist" / "data" / split
        folder.mkdir(parents=True)
        users = sorted(writers)
        data = {
            u: {"x": rng.random((writers[u][k], 784)).round(3).tolist(), "y": rng.integers(0, 62, writers[u][k]).tolist()}
            for u in users
        }
        (folder / f"all_data_0_niid_0_keep_0_{split}_9.json").write_text(
            json.dumps({"users": users, "num_samples": [writers[u][k] for u in users], "user_data": data})
        )


def test_femnist_runs_on_its_writers(tmp_path):
    """LEAF's FEMNIST, a generated copy in its own format: --partition natural --test-mode natural
    gives each client a writer's training samples and its own test samples."""
    from raysim.data import build_federated_data

    _leaf(tmp_path, {"f0003_21": (9, 2), "f0100_44": (6, 3), "f0007_10": (12, 2), "f0042_17": (5, 1)})
    cfg = DataConfig(dataset="femnist", data_dir=str(tmp_path), partition="natural", test_mode="natural")
    data = build_federated_data(cfg, 3, seed=0)
    assert data.train.groups is not None and data.gtest.groups is not None
    for tr, te in zip(data.client_train, data.client_test, strict=True):
        (writer,) = np.unique(data.train.groups[tr])
        np.testing.assert_array_equal(te, np.flatnonzero(data.gtest.groups == writer))
    sizes = sorted(len(p) for p in data.client_train)
    assert set(sizes) <= {9, 6, 12, 5} and data.train.input_shape == (1, 28, 28) and data.num_classes == 62
