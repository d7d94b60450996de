"""The federated view of a dataset: who trains on what, who tests on what (docs/algorithms.md).

:func:`build_federated_data` loads the dataset, partitions it over the clients and gives each client
a local test set (P-Test); the official test set is kept whole as G-Test. Clients hold index arrays
into shared arrays, so the data goes into Ray's object store once, images as raw uint8; a client
gathers its samples as normalised float32 with :meth:`ArrayDataset.features`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from raysim.config import DataConfig
from raysim.data.datasets import ArrayDataset, load_dataset
from raysim.data.feature_shift import (
    FeatureShift,
    assign_domains,
    check_feature_shift,
    check_images,
    domain_copies,
    noise_generator,
    shift_by_owner,
)
from raysim.data.partition import label_entropy, matched_test_indices, partition_indices
from raysim.errors import ConfigError
from raysim.registry import TEST_MODES, load_ref, parse_partition, parse_test_mode

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class FederatedData:
    """A dataset split over clients.

    ``client_train[i]`` indexes ``train`` and ``client_test[i]`` indexes ``ptest`` (sorted int64).
    In ``matched`` test mode ``train`` is the official train set and ``ptest`` is ``gtest``; in
    ``split`` mode ``train`` is the official train and test sets pooled and ``ptest`` is that same
    object (uint8 images still, with the official sets' shared mean and std). ``gtest`` is the
    official test set, whole; under a feature shift (``data.feature_shift``,
    :mod:`raysim.data.feature_shift`) it is the K domains' copies of it, and every client's
    samples, its P-Test among them, are in its domain.
    """

    train: ArrayDataset
    gtest: ArrayDataset
    ptest: ArrayDataset
    client_train: tuple[np.ndarray, ...]
    client_test: tuple[np.ndarray, ...]
    #: per client, indices into ``train`` held out from training (``data.val_fraction``); empty
    #: arrays when there is no validation part
    client_val: tuple[np.ndarray, ...] = ()
    #: under a feature shift, each client's domain (int64, 0 to K - 1); None without one
    client_domains: np.ndarray | None = None
    #: under a feature shift, each G-Test sample's domain (int64): domain d's copy of the official
    #: test set is ``gtest[d * n : (d + 1) * n]``; None without one
    gtest_domains: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.client_train) != len(self.client_test):
            raise ValueError("client_train and client_test must have one entry per client.")
        if not self.client_val:
            empty = tuple(np.zeros(0, dtype=np.int64) for _ in self.client_train)
            object.__setattr__(self, "client_val", empty)
        if len(self.client_val) != len(self.client_train):
            raise ValueError("client_val must have one entry per client.")
        if (self.client_domains is None) != (self.gtest_domains is None):
            raise ValueError("client_domains and gtest_domains are given together, or neither.")
        if self.client_domains is not None and len(self.client_domains) != len(self.client_train):
            raise ValueError("client_domains must have one entry per client.")
        if self.gtest_domains is not None and len(self.gtest_domains) != len(self.gtest):
            raise ValueError("gtest_domains must have one entry per G-Test sample.")

    @property
    def num_domains(self) -> int:
        """The feature shift's domains K (0 without one)."""
        return 0 if self.client_domains is None else int(self.client_domains.max()) + 1

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    @property
    def num_classes(self) -> int:
        return self.train.num_classes

    def train_label_counts(self) -> np.ndarray:
        """``(num_clients, num_classes)`` int64: each client's training samples per class."""
        return _label_counts(self.train.y, self.client_train, self.num_classes)

    def test_label_counts(self) -> np.ndarray:
        """``(num_clients, num_classes)`` int64: the same for the clients' local test sets."""
        return _label_counts(self.ptest.y, self.client_test, self.num_classes)


def _label_counts(y: np.ndarray, parts: tuple[np.ndarray, ...], num_classes: int) -> np.ndarray:
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, idx in enumerate(parts):
        counts[i] = np.bincount(y[idx], minlength=num_classes)
    return counts


#: ``partition(labels, groups=None)``: the clients' index arrays into ``labels`` (``groups``: each
#: sample's client of the data's own, for the natural partition)
Partition = Callable[..., list[np.ndarray]]


def build_federated_data(cfg: DataConfig, num_clients: int, seed: int, *, quiet: bool = False) -> FederatedData:
    """Load ``cfg.dataset``, partition it over ``num_clients`` clients and build their test sets
    by the registered test mode (:data:`raysim.registry.TEST_MODES`); log the split's sizes unless
    ``quiet`` (the driver's check of a generated dataset, which is built again for the run).

    The partition draws from ``SeedSequence([seed, 1])``, the test sets from
    ``SeedSequence([seed, 2])``, the validation parts from ``[seed, 3]`` and a feature shift
    (``cfg.feature_shift``, :func:`apply_feature_shift`) from ``[seed, 4]``
    and ``[seed, 5]``, so a seed gives the same data on every machine.
    """
    if num_clients < 1:
        raise ConfigError(f"The number of clients must be at least 1, not {num_clients}.")
    spec = parse_partition(cfg.partition)
    test_mode = parse_test_mode(cfg.test_mode)
    shift = check_feature_shift(cfg, num_clients)
    train, test = load_dataset(cfg, seed)
    partition_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    test_rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
    num_classes = train.num_classes

    def partition(labels: np.ndarray, groups: np.ndarray | None = None) -> list[np.ndarray]:
        return partition_indices(labels, num_clients, spec, partition_rng, num_classes, cfg, groups=groups)

    build = load_ref(TEST_MODES.get(test_mode.kind).build)
    pool, ptest, client_train, client_test = build(train, test, test_mode.param, partition, test_rng)
    del train  # where the mode pooled a copy, the official train set can go
    data = FederatedData(pool, test, ptest, tuple(client_train), tuple(client_test))

    if cfg.val_fraction > 0:  # each client's validation part: a seeded share of its training data
        val_rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
        kept, held = [], []
        for part in data.client_train:
            shuffled = val_rng.permutation(part)
            n_val = split_test_size(len(part), cfg.val_fraction)
            held.append(np.sort(shuffled[:n_val]))
            kept.append(np.sort(shuffled[n_val:]))
        data = FederatedData(data.train, data.gtest, data.ptest, tuple(kept), data.client_test, tuple(held))

    data = apply_feature_shift(data, shift, seed)  # the same data when there is none
    if quiet:
        return data
    sizes = np.array([len(i) for i in data.client_train])
    logger.info(
        "%s split over %d clients by %s (test mode %s): %d to %d training samples per client, "
        "mean label entropy %.3f nats.",
        data.train.name,
        num_clients,
        spec,
        cfg.test_mode,
        sizes.min(),
        sizes.max(),
        float(label_entropy(data.train_label_counts()).mean()),
    )
    if shift.shifts:
        logger.info(describe_shift(data, shift))
    return data


def apply_feature_shift(data: FederatedData, shift: FeatureShift, seed: int) -> FederatedData:
    """``data`` with every client's samples in its domain and G-Test the K domains' copies of the
    official test set (:mod:`raysim.data.feature_shift`); ``data`` itself when the shift is ``none``.

    Where the P-Tests index G-Test (``matched``, ``natural``) each client's indices move into its
    domain's copy; where they index the pool (``split``) each pooled sample is transformed by its
    owner's domain. Either way a client's training samples and validation part are transformed by
    its domain, and a sample that no client owns stays as it is.
    """
    if not shift.shifts:
        return data
    k = shift.domains
    check_images(shift, data.train.input_shape, data.train.name)
    client_domains = assign_domains(data.num_clients, k, seed)
    rng = noise_generator(seed)
    pooled = data.ptest is data.train  # split: the P-Tests index the pool
    if not pooled and data.ptest is not data.gtest:
        raise ValueError("A feature shift needs the clients' P-Tests to index either the pool or G-Test.")
    owner = np.full(len(data.train), -1, dtype=np.int64)  # each training-side sample's domain
    for i, d in enumerate(client_domains):
        for idx in (data.client_train[i], data.client_val[i], *((data.client_test[i],) if pooled else ())):
            if np.any((owner[idx] >= 0) & (owner[idx] != d)):
                raise ValueError(f"Client {i} shares training samples with a client of another domain.")
            owner[idx] = d
    train = dataclasses.replace(data.train, x=shift_by_owner(data.train.x, owner, shift, rng))
    n = len(data.gtest)
    gtest = domain_copies(data.gtest, shift, rng)
    if pooled:
        ptest, client_test = train, data.client_test
    else:
        ptest = gtest
        client_test = tuple(idx + d * n for idx, d in zip(data.client_test, client_domains, strict=True))
    return dataclasses.replace(
        data,
        train=train,
        gtest=gtest,
        ptest=ptest,
        client_test=client_test,
        client_domains=client_domains,
        gtest_domains=np.repeat(np.arange(k, dtype=np.int64), n),
    )


def describe_shift(data: FederatedData, shift: FeatureShift) -> str:
    """The build's line on a feature shift: each domain's clients and training samples."""
    assert data.client_domains is not None
    k, sizes = shift.domains, np.array([len(i) for i in data.client_train])
    parts = [
        f"{d} ({shift.domain_name(d)}): {int((data.client_domains == d).sum())} clients, "
        f"{int(sizes[data.client_domains == d].sum())} training samples"
        for d in range(k)
    ]
    return (
        f"Feature shift {shift} over {k} domains: "
        + "; ".join(parts)
        + f"; G-Test is their {k} copies of the test set, {len(data.gtest)} samples."
    )


TestSets = tuple[ArrayDataset, ArrayDataset, list[np.ndarray], list[np.ndarray]]


def matched_test_sets(
    train: ArrayDataset, test: ArrayDataset, param: None, partition: Partition, rng: np.random.Generator
) -> TestSets:
    """The ``matched`` test mode (Fed3+2p, FedDr+): the official train set is partitioned, and each
    client's P-Test is drawn from the official test set to follow its training labels."""
    client_train = partition(train.y, train.groups)
    client_test = matched_test_indices(
        [train.y[idx] for idx in client_train], test.y, train.num_classes, len(test) / len(train), rng
    )
    return train, test, client_train, client_test


def split_test_sets(
    train: ArrayDataset, test: ArrayDataset, fraction: float, partition: Partition, rng: np.random.Generator
) -> TestSets:
    """The ``split:F`` test mode (FedFCD, as PFLlib does it): train and test are pooled, the pool
    is partitioned, and F of each client's samples become its P-Test."""
    if train.mean != test.mean or train.std != test.std or train.x.dtype != test.x.dtype:
        raise ValueError(
            f"The train and test sets of {train.name} cannot be pooled: they differ in dtype "
            f"({train.x.dtype}, {test.x.dtype}) or normalisation (mean {train.mean} and "
            f"{test.mean}, std {train.std} and {test.std})."
        )
    pooled = ArrayDataset(
        np.concatenate([train.x, test.x]),
        np.concatenate([train.y, test.y]),
        train.num_classes,
        train.name,
        train.mean,
        train.std,
        np.concatenate([train.groups, test.groups]) if train.groups is not None and test.groups is not None else None,
    )
    client_train, client_test = [], []
    for part in partition(pooled.y, pooled.groups):
        shuffled = rng.permutation(part)
        n_test = split_test_size(len(part), fraction)
        client_test.append(np.sort(shuffled[:n_test]))
        client_train.append(np.sort(shuffled[n_test:]))
    return pooled, pooled, client_train, client_test


def natural_test_sets(
    train: ArrayDataset, test: ArrayDataset, param: None, partition: Partition, rng: np.random.Generator
) -> TestSets:
    """The ``natural`` test mode (LEAF's FEMNIST): each client is one of the data's own clients
    (``--partition natural``), and its P-Test is that client's own test samples; G-Test is the
    whole test set."""
    if train.groups is None or test.groups is None:
        raise ConfigError(f"The natural test mode needs data with clients of its own; {train.name} has none.")
    client_train = partition(train.y, train.groups)
    client_test = []
    for idx in client_train:
        owners = np.unique(train.groups[idx])
        if len(owners) != 1:
            raise ConfigError("The natural test mode needs the natural partition (--partition natural).")
        client_test.append(np.flatnonzero(test.groups == owners[0]))
    return train, test, client_train, client_test


def split_test_size(n: int, fraction: float) -> int:
    """How many of a client's ``n`` samples are its test set in split mode: ``round(fraction * n)``,
    at least 1 and at most ``n - 1`` when ``n >= 2`` (FedFCD's 75/25 split per client)."""
    if n < 2:
        return 0
    return min(n - 1, max(1, int(np.floor(fraction * n + 0.5))))
