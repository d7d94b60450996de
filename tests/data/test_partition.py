"""Partitions over clients and matched local test sets (raysim/data/partition.py)."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.config import DataConfig
from raysim.data.partition import (
    dirichlet_partition,
    dominant_partition,
    iid_partition,
    label_entropy,
    matched_test_indices,
    partition_indices,
    pathological_partition,
    shard_partition,
)
from raysim.errors import ConfigError
from raysim.registry import PartitionSpec, parse_partition

C = 10


def make_labels(n: int = 6000, num_classes: int = C, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, size=n)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def split(labels: np.ndarray, text: str, num_clients: int = 20, seed: int = 0, **kw: int):
    """``kw``: data settings (``samples_per_client``, ``min_samples``, ...)."""
    return partition_indices(labels, num_clients, parse_partition(text), rng(seed), C, DataConfig(**kw))


def assert_sorted_int64(parts: list[np.ndarray]) -> None:
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)


EVERY_SAMPLE = ["iid", "dirichlet:0.5", "pathological:2", "shard:2"]
ALL = [*EVERY_SAMPLE, "dominant:20"]


@pytest.mark.parametrize("text", EVERY_SAMPLE)
def test_every_sample_used_exactly_once(text: str) -> None:
    labels = make_labels()
    parts = split(labels, text)
    assert len(parts) == 20
    assert_sorted_int64(parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


@pytest.mark.parametrize("text", ALL)
def test_same_seed_same_split_and_different_seed_different_split(text: str) -> None:
    labels = make_labels()
    kw = {"samples_per_client": 100}
    a, b, c = (
        split(labels, text, **kw),
        split(labels, text, **kw),
        split(labels, text, seed=1, **kw),
    )
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dispatch_matches_the_direct_functions() -> None:
    labels = make_labels()
    pairs = [
        (split(labels, "iid"), iid_partition(labels, 20, rng())),
        (split(labels, "dirichlet:0.3"), dirichlet_partition(labels, 20, 0.3, rng(), C, 10)),
        (split(labels, "pathological:3"), pathological_partition(labels, 20, 3, rng(), C)),
        (split(labels, "shard:4"), shard_partition(labels, 20, 4, rng())),
        (
            split(labels, "dominant:30", samples_per_client=50),
            dominant_partition(labels, 20, 30.0, rng(), C, 50),
        ),
    ]
    for via_spec, direct in pairs:
        assert all(np.array_equal(x, y) for x, y in zip(via_spec, direct, strict=True))


def test_iid_is_near_equal() -> None:
    sizes = [len(p) for p in split(make_labels(6001), "iid", num_clients=7)]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_min_samples_holds() -> None:
    labels = make_labels(10000)
    parts = dirichlet_partition(labels, 50, 0.1, rng(), C, min_samples=20)
    assert min(len(p) for p in parts) >= 20
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(10000))


def test_dirichlet_entropy_falls_with_alpha() -> None:
    labels = make_labels(20000)

    def mean_entropy(alpha: float) -> float:
        parts = dirichlet_partition(labels, 50, alpha, rng(), C, min_samples=10)
        counts = np.stack([np.bincount(labels[p], minlength=C) for p in parts])
        return float(label_entropy(counts).mean())

    high, mid, low = mean_entropy(10.0), mean_entropy(1.0), mean_entropy(0.1)
    assert high > mid > low
    assert high > 0.9 * np.log(C)


def test_dirichlet_errors() -> None:
    with pytest.raises(ConfigError, match="fewer clients"):
        dirichlet_partition(make_labels(100), 20, 0.5, rng(), C, min_samples=10)
    with pytest.raises(ConfigError, match="alpha is too small"):
        dirichlet_partition(make_labels(2000), 100, 1e-3, rng(), C, min_samples=15)


@pytest.mark.parametrize(("num_clients", "k", "num_classes"), [(20, 2, 10), (7, 3, 10), (30, 10, 100)])
def test_pathological_gives_exactly_k_classes(num_clients: int, k: int, num_classes: int) -> None:
    labels = make_labels(20000, num_classes)
    parts = pathological_partition(labels, num_clients, k, rng(), num_classes)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    held = [set(np.unique(labels[p]).tolist()) for p in parts]
    assert all(len(h) == k for h in held)
    holders = np.bincount([c for h in held for c in h], minlength=num_classes)
    assert holders.max() - holders.min() <= 1  # every class held by about as many clients
    for c in range(num_classes):  # a class is split evenly among its holders
        shares = [np.sum(labels[p] == c) for p, h in zip(parts, held, strict=True) if c in h]
        assert max(shares) - min(shares) <= 1


def test_pathological_sequential_classes_are_pflibs_pairs() -> None:
    """class_order=sequential: client i holds classes 2i, 2i+1 (mod C), as PFLlib's "pat" split."""
    labels = make_labels(20000, 10)
    parts = pathological_partition(labels, 20, 2, rng(), 10, class_order="sequential")
    held = [sorted(np.unique(labels[p]).tolist()) for p in parts]
    assert held == [[(2 * i) % 10, (2 * i + 1) % 10] for i in range(20)]
    shuffled = pathological_partition(labels, 20, 2, rng(), 10)
    assert [sorted(np.unique(labels[p]).tolist()) for p in shuffled] != held  # a seeded permutation


@pytest.mark.parametrize(("num_clients", "k", "num_classes"), [(20, 2, 10), (7, 3, 10), (20, 10, 100)])
def test_pathological_random_classes_vary_and_stay_balanced(num_clients: int, k: int, num_classes: int) -> None:
    """class_order=random (FedFCD Sec. 4.1.1, "each client is randomly assigned 2 class labels"):
    k distinct classes a client, not fixed groups, every class held by about as many clients."""
    labels = make_labels(20000, num_classes)
    parts = pathological_partition(labels, num_clients, k, rng(), num_classes, class_order="random")
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    held = [frozenset(np.unique(labels[p]).tolist()) for p in parts]
    assert all(len(h) == k for h in held)
    holders = np.bincount([c for h in held for c in h], minlength=num_classes)
    assert holders.max() - holders.min() <= 1
    again = pathological_partition(labels, num_clients, k, rng(), num_classes, class_order="random")
    assert [frozenset(np.unique(labels[p]).tolist()) for p in again] == held  # seeded
    if (num_clients, k) == (20, 2):
        # fixed groups (shuffled, sequential) give 5 distinct pairs, each twice over 20 clients;
        # random pairs overlap in one class too
        assert len(set(held)) > num_classes // k
        assert any(len(a & b) == 1 for a in held for b in held)


def test_pathological_unbalanced_follows_pflibs_shares() -> None:
    """balance=False: every holder of a class but the last gets a uniform draw from
    [n/(10h), n/h) of its n samples, the last the rest (PFLlib's unbalanced "pat" split)."""
    labels = make_labels(20000, 10)
    pools = np.bincount(labels, minlength=10)
    even = pathological_partition(labels, 20, 2, rng(), 10, class_order="sequential")
    parts = pathological_partition(labels, 20, 2, rng(), 10, class_order="sequential", balance=False)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    # the same classes a client as the balanced split; only the counts differ
    assert [sorted(np.unique(labels[p]).tolist()) for p in parts] == [
        sorted(np.unique(labels[p]).tolist()) for p in even
    ]
    for c in range(10):
        shares = [int(np.sum(labels[p] == c)) for p in parts if np.any(labels[p] == c)]
        h, n = len(shares), int(pools[c])
        assert h == 4
        assert all(n / (10 * h) - 1 <= s < n / h for s in shares[:-1])
        assert shares[-1] == n - sum(shares[:-1]) and shares[-1] > n / h - 1
    sizes = np.array([len(p) for p in parts])
    assert sizes.std() > 10 * np.array([len(p) for p in even]).std()


def test_pathological_errors() -> None:
    with pytest.raises(ConfigError):
        pathological_partition(make_labels(), 20, 11, rng(), C)
    with pytest.raises(ConfigError, match="unused"):
        pathological_partition(make_labels(), 4, 2, rng(), C)


def test_shard_gives_s_shards_worth() -> None:
    labels = make_labels(6003)
    parts = shard_partition(labels, 20, 3, rng())
    shard = 6003 / 60
    for p in parts:
        assert 3 * np.floor(shard) <= len(p) <= 3 * np.ceil(shard)
        assert len(np.unique(labels[p])) <= 6  # a shard spans at most two classes here
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(6003))
    with pytest.raises(ConfigError):
        shard_partition(make_labels(50), 20, 3, rng())


def test_dominant_partition() -> None:
    labels = make_labels(20000)
    parts = dominant_partition(labels, 25, 20.0, rng(), C, 300)
    assert_sorted_int64(parts)
    assert all(len(p) == 300 for p in parts)
    every = np.concatenate(parts)
    assert len(np.unique(every)) == len(every)  # no sample used twice
    counts = np.stack([np.bincount(labels[p], minlength=C) for p in parts])
    top2 = np.sort(counts, axis=1)[:, -2:]
    # 80% from two dominant classes, plus their share of the uniform 20%
    assert np.all(top2.sum(axis=1) >= 0.8 * 300)
    assert np.all(counts.min(axis=1) >= 5)  # the uniform part reaches every class
    dominant = [frozenset(np.argsort(row)[-2:].tolist()) for row in counts]
    groups = set(dominant)
    assert len(groups) == C // 2
    assert len(set().union(*groups)) == C  # groups have disjoint dominant classes


def test_dominant_too_small_raises() -> None:
    with pytest.raises(ConfigError, match="samples_per_client"):
        dominant_partition(make_labels(1000), 20, 20.0, rng(), C, 600)


def test_bad_client_count() -> None:
    with pytest.raises(ConfigError):
        partition_indices(make_labels(), 0, PartitionSpec("iid"), rng(), C)


def test_matched_test_follows_training_distribution() -> None:
    labels = make_labels(6000)
    test_labels = make_labels(1000, seed=5)
    parts = split(labels, "dirichlet:0.3")
    client_labels = [labels[p] for p in parts]
    ratio = len(test_labels) / len(labels)
    tests = matched_test_indices(client_labels, test_labels, C, ratio, rng())
    have = np.bincount(test_labels, minlength=C)
    assert_sorted_int64(tests)
    for train_l, idx in zip(client_labels, tests, strict=True):
        train_counts = np.bincount(train_l, minlength=C)
        test_counts = np.bincount(test_labels[idx], minlength=C)
        expected = np.minimum(np.floor(ratio * train_counts + 0.5), have)
        if expected.sum() > 0:
            np.testing.assert_array_equal(test_counts, expected)
        assert np.all(test_counts[train_counts == 0] == 0)  # absent classes stay absent
        assert len(idx) >= 1


def test_matched_caps_by_the_test_set_and_keeps_one_sample() -> None:
    test_labels = np.array([0, 0, 1])
    tests = matched_test_indices([np.array([0] * 50), np.array([1, 2])], test_labels, 3, 0.1, rng())
    np.testing.assert_array_equal(tests[0], [0, 1])  # wanted 5 of class 0, the test set has 2
    np.testing.assert_array_equal(tests[1], [2])  # rounds to nothing: one of a held class


def test_label_entropy() -> None:
    counts = np.array([[5, 5, 5, 5], [0, 9, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_allclose(label_entropy(counts), [np.log(4), 0.0, 0.0, np.log(2)])
