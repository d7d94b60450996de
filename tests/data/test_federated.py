"""build_federated_data: partitions, P-Test in matched and split modes, seeding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from raysim.config import DataConfig, SyntheticConfig
from raysim.data import ArrayDataset, FederatedData, build_federated_data, federated
from raysim.data.datasets import CIFAR10_MEAN, CIFAR10_STD
from raysim.data.federated import split_test_size
from raysim.errors import ConfigError

from .cifar_fixture import write_cifar10

SYNTH = SyntheticConfig(train_samples=3000, test_samples=600, num_classes=10, shape=(1, 4, 4))


def synthetic(partition: str = "dirichlet:0.5", test_mode: str = "matched", **kw) -> DataConfig:
    return DataConfig(dataset="synthetic", partition=partition, test_mode=test_mode, synthetic=SYNTH, **kw)


def same(a: FederatedData, b: FederatedData) -> bool:
    return all(
        np.array_equal(x, y)
        for x, y in zip(a.client_train + a.client_test, b.client_train + b.client_test, strict=True)
    )


def test_matched_mode() -> None:
    data = build_federated_data(synthetic(), 20, seed=0)
    assert data.num_clients == 20 and data.num_classes == 10
    assert data.ptest is data.gtest and data.train is not data.gtest
    assert (len(data.train), len(data.gtest)) == (3000, 600)
    np.testing.assert_array_equal(np.sort(np.concatenate(data.client_train)), np.arange(3000))
    train_counts, test_counts = data.train_label_counts(), data.test_label_counts()
    assert train_counts.shape == test_counts.shape == (20, 10)
    assert train_counts.dtype == test_counts.dtype == np.int64
    assert np.all(test_counts[train_counts == 0] == 0)
    for idx in data.client_test:
        assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0) and idx.max() < 600
    # the test label proportions follow training (up to rounding and the test set's supply)
    ratio = 600 / 3000
    big = train_counts >= 50
    np.testing.assert_allclose(test_counts[big], ratio * train_counts[big], rtol=0.1, atol=1)


def test_split_mode() -> None:
    data = build_federated_data(synthetic(test_mode="split:0.25"), 20, seed=0)
    assert data.ptest is data.train and data.gtest is not data.train
    assert (len(data.train), len(data.gtest)) == (3600, 600)
    every = np.concatenate(data.client_train + data.client_test)
    np.testing.assert_array_equal(np.sort(every), np.arange(3600))  # each pooled sample once
    for tr, te in zip(data.client_train, data.client_test, strict=True):
        assert len(np.intersect1d(tr, te)) == 0
        n = len(tr) + len(te)
        assert len(te) == split_test_size(n, 0.25)
        assert abs(len(te) / n - 0.25) < 0.05
    # the pool is train then test: its tail is the official test set
    np.testing.assert_array_equal(data.train.features()[3000:], data.gtest.features())
    np.testing.assert_array_equal(data.train.y[3000:], data.gtest.y)


def test_split_mode_pools_uint8_images(tmp_path) -> None:
    train_data, _, test_data, _ = write_cifar10(tmp_path)
    cfg = DataConfig(dataset="cifar10", data_dir=str(tmp_path), download=False, partition="iid")
    data = build_federated_data(dataclasses.replace(cfg, test_mode="split:0.25"), 5, seed=0)
    pool = data.train
    assert data.ptest is pool and len(pool) == 50
    assert pool.x.dtype == np.uint8 and pool.x.nbytes == 50 * 3072  # still the raw images
    assert (pool.mean, pool.std) == (data.gtest.mean, data.gtest.std) == (CIFAR10_MEAN, CIFAR10_STD)
    np.testing.assert_array_equal(pool.x.reshape(50, -1), np.concatenate([train_data, test_data]))
    np.testing.assert_array_equal(pool.features()[40:], data.gtest.features())
    idx = data.client_train[0]
    matched = build_federated_data(cfg, 5, seed=0)
    np.testing.assert_array_equal(pool.features(idx[idx < 40]), matched.train.features(idx[idx < 40]))


def test_split_mode_needs_one_normalisation(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)

    def images(n: int, mean: tuple[float, ...]) -> ArrayDataset:
        x = rng.integers(0, 256, size=(n, 1, 4, 4), dtype=np.uint8)
        return ArrayDataset(x, np.arange(n) % 10, 10, "img", mean, (0.5,))

    train, test = images(100, (0.5,)), images(20, (0.4,))
    monkeypatch.setattr(federated, "load_dataset", lambda cfg, seed: (train, test))
    with pytest.raises(ValueError, match="cannot be pooled"):
        build_federated_data(DataConfig(partition="iid", test_mode="split:0.25"), 5, seed=0)
    data = build_federated_data(DataConfig(partition="iid"), 5, seed=0)  # matched mode never pools
    assert data.train is train


def test_split_test_size() -> None:
    assert [split_test_size(n, 0.25) for n in (0, 1, 2, 3, 4, 10, 100)] == [0, 0, 1, 1, 1, 3, 25]
    assert split_test_size(2, 0.9) == 1  # a client keeps at least one training sample


@pytest.mark.parametrize("partition", ["iid", "dirichlet:0.1", "pathological:2", "shard:2"])
@pytest.mark.parametrize("test_mode", ["matched", "split:0.25"])
def test_same_seed_same_split(partition: str, test_mode: str) -> None:
    cfg = synthetic(partition, test_mode)
    a, b, c = (build_federated_data(cfg, 10, s) for s in (5, 5, 6))
    assert same(a, b)
    assert not same(a, c)


def test_dominant_mode() -> None:
    data = build_federated_data(synthetic("dominant:20", samples_per_client=200), 10, seed=0)
    assert all(len(i) == 200 for i in data.client_train)
    assert len(np.unique(np.concatenate(data.client_train))) == 2000


def test_bad_input() -> None:
    with pytest.raises(ConfigError):
        build_federated_data(synthetic(), 0, seed=0)
    with pytest.raises(ConfigError):
        build_federated_data(synthetic(partition="nonsense"), 10, seed=0)
    with pytest.raises(ConfigError):
        build_federated_data(synthetic(test_mode="split:2"), 10, seed=0)


@pytest.mark.parametrize("partition", ["dirichlet:0.1", "pathological:2", "dominant:20"])
def test_fmnist_sized_partitions_give_every_client_its_own_samples(
    partition: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 clients of an FMNIST-sized label set: disjoint training samples, each client's test
    samples drawn from its own training classes (matched test sets), none empty (the time this takes
    is scripts/bench/data_prep.py's)."""
    rng = np.random.default_rng(0)
    train_y = np.repeat(np.arange(10), 6000)
    rng.shuffle(train_y)
    test_y = np.repeat(np.arange(10), 1000)
    train = ArrayDataset(np.zeros((60000, 1), np.float32), train_y, 10, "fmnist-like")
    test = ArrayDataset(np.zeros((10000, 1), np.float32), test_y, 10, "fmnist-like")
    monkeypatch.setattr(federated, "load_dataset", lambda cfg, seed: (train, test))
    data = build_federated_data(DataConfig(partition=partition), 100, seed=0)
    assert data.num_clients == 100 and min(len(i) for i in data.client_test) >= 1
    every = np.concatenate(data.client_train)
    assert len(np.unique(every)) == len(every) and min(len(i) for i in data.client_train) >= 1
    for tr, te in zip(data.client_train, data.client_test, strict=True):
        assert set(test_y[te]) <= set(train_y[tr])


def test_validation_parts_are_held_out_of_training():
    from raysim.config import SyntheticConfig

    cfg = DataConfig(
        dataset="synthetic",
        partition="dirichlet:0.5",
        val_fraction=0.2,
        synthetic=SyntheticConfig(shape=(1, 2, 2)),
    )
    data = build_federated_data(cfg, 10, seed=0)
    plain = build_federated_data(
        DataConfig(
            dataset="synthetic", partition="dirichlet:0.5", synthetic=SyntheticConfig(shape=(1, 2, 2))
        ),
        10,
        seed=0,
    )
    for train, val, whole in zip(data.client_train, data.client_val, plain.client_train, strict=True):
        assert len(np.intersect1d(train, val)) == 0
        np.testing.assert_array_equal(np.union1d(train, val), whole)  # the same partition, split again
        assert abs(len(val) - 0.2 * len(whole)) <= 1
    assert all(len(v) == 0 for v in plain.client_val)
    again = build_federated_data(cfg, 10, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(again.client_val, data.client_val, strict=True))


def test_the_default_synthetic_run_fits_its_split_and_a_misfit_is_refused_in_the_driver():
    """``--dataset synthetic`` with every other setting at its default (100 clients, Dirichlet 0.1,
    at least 10 samples a client) is a valid run; a synthetic set too small for its split is
    refused by the driver's check, before any Ray or training, with the partition's sentence."""
    from raysim.engine.experiment import resolve_config, validate

    validate(resolve_config({"data": {"dataset": "synthetic"}}))
    small = {"data": {"dataset": "synthetic", "synthetic": {"train_samples": 2000}}}
    with pytest.raises(ConfigError, match=r"^The Dirichlet partition with alpha=0.1 left some client with fewer than 10"):
        validate(resolve_config(small))
