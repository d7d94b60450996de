"""Fed3+2p's groupings (Eq. 5 and Eq. 10): better than random, balanced, complete."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.grouping import (
    js_divergence_matrix,
    kl_divergence,
    type_a_grouping,
    type_a_objective,
    type_b_grouping,
    type_b_objective,
)
from raysim.config import DataConfig, SyntheticConfig
from raysim.data import build_federated_data


@pytest.fixture(scope="module")
def dir01_counts():
    """Label counts of a Dirichlet(0.1) split of 100 clients (synthetic labels, FMNIST-sized)."""
    synthetic = SyntheticConfig(train_samples=20000, test_samples=100, shape=(1, 2, 2))
    cfg = DataConfig(dataset="synthetic", partition="dirichlet:0.1", synthetic=synthetic)
    return build_federated_data(cfg, 100, seed=0).train_label_counts()


def _random_balanced(n, k, rng):
    perm = rng.permutation(n)
    return [sorted(perm[g::k].tolist()) for g in range(k)]


def test_type_a_beats_200_random_balanced_partitions(dir01_counts):
    grouping = type_a_grouping(dir01_counts, 5)
    rng = np.random.default_rng(0)
    randoms = [type_a_objective(dir01_counts, _random_balanced(100, 5, rng)) for _ in range(200)]
    assert grouping.objective < min(randoms)
    assert grouping.objective == pytest.approx(type_a_objective(dir01_counts, grouping.groups))
    members = sorted(c for g in grouping.groups for c in g)
    assert members == list(range(100))  # every client in exactly one coordinator
    sizes = [len(g) for g in grouping.groups]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("n", "k"), [(7, 3), (10, 4), (20, 20), (5, 1)])
def test_type_a_sizes_balanced_for_any_split(n, k):
    counts = np.random.default_rng(n).integers(0, 30, size=(n, 4))
    counts[:, 0] += 1
    sizes = [len(g) for g in type_a_grouping(counts, k).groups]
    assert sorted(sizes) == sorted([n // k + (i < n % k) for i in range(k)])


def test_kl_and_js_basics():
    p = np.array([0.5, 0.5, 0.0])
    assert kl_divergence(p, p) == pytest.approx(0.0)
    assert kl_divergence(p, np.array([0.25, 0.25, 0.5])) == pytest.approx(np.log(2))
    js = js_divergence_matrix(np.array([[10, 0], [0, 10], [10, 0]]))
    assert js[0, 1] == pytest.approx(np.log(2)) and js[0, 2] == pytest.approx(0.0)
    assert np.allclose(js, js.T)


def test_type_b_recovers_planted_groups():
    rng = np.random.default_rng(1)
    planted = []
    rows = []
    for g in range(4):  # 4 clusters, each dominated by its own two classes
        for _ in range(6):
            dominant = np.zeros(10)
            dominant[[2 * g, 2 * g + 1]] = rng.integers(80, 120, size=2)
            rows.append(dominant + rng.integers(0, 3, size=10))
            planted.append(g)
    order = rng.permutation(len(rows))
    counts = np.array(rows)[order]
    truth = np.array(planted)[order]
    grouping = type_b_grouping(counts, 4)
    found = {frozenset(g) for g in grouping.groups}
    expected = {frozenset(np.flatnonzero(truth == g).tolist()) for g in range(4)}
    assert found == expected


def test_type_b_beats_random_groupings(dir01_counts):
    grouping = type_b_grouping(dir01_counts, 5)
    js = js_divergence_matrix(dir01_counts)
    assert grouping.objective == pytest.approx(type_b_objective(js, grouping.groups))
    assert all(len(g) > 0 for g in grouping.groups)
    assert sorted(c for g in grouping.groups for c in g) == list(range(100))
    rng = np.random.default_rng(0)
    for _ in range(200):
        labels = np.concatenate([np.arange(5), rng.integers(0, 5, size=95)])
        rng.shuffle(labels)
        random_groups = [np.flatnonzero(labels == g).tolist() for g in range(5)]
        assert grouping.objective < type_b_objective(js, random_groups)
