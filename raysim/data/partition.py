"""Splitting a dataset's samples over clients, and the clients' local test sets (docs/algorithms.md).

Every function takes its randomness from the ``numpy.random.Generator`` it is given and returns one
sorted int64 index array per client. All partitions but ``dominant`` use every sample exactly once;
``dominant`` gives every client the same number of samples and uses no sample twice.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from raysim.config import DataConfig
from raysim.errors import ConfigError
from raysim.registry import PartitionSpec

logger = logging.getLogger(__name__)

#: How many times the Dirichlet partition is redrawn to give every client ``min_samples``.
DIRICHLET_MAX_TRIES = 1000


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    spec: PartitionSpec,
    rng: np.random.Generator,
    num_classes: int,
    cfg: DataConfig | None = None,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split the samples with ``labels`` over ``num_clients`` clients as ``spec`` says, by the
    partition registered under ``spec.kind`` (:data:`raysim.registry.PARTITIONS`); ``groups``, each
    sample's client of the data's own, goes to a partition that follows them (``natural``)."""
    from raysim.registry import PARTITIONS, load_ref

    labels = _check_labels(labels, num_classes)
    if num_clients < 1:
        raise ConfigError(f"The number of clients must be at least 1, not {num_clients}.")
    entry = PARTITIONS.get(spec.kind)
    split = load_ref(entry.split)
    extra = {"groups": groups} if entry.uses_groups else {}
    parts: list[np.ndarray] = split(labels, num_clients, spec.param, rng, num_classes, cfg or DataConfig(), **extra)
    sizes = np.array([len(p) for p in parts])
    logger.debug(
        "Partition %s over %d clients: %d to %d samples per client (mean %.1f).",
        spec,
        num_clients,
        sizes.min(),
        sizes.max(),
        sizes.mean(),
    )
    return parts


# --------------------------------------------------------------------------------------------------
# the registered partitions: split_X(labels, num_clients, param, rng, num_classes, cfg) and
# check_X(param, num_clients, num_classes, num_samples, cfg), which the driver calls before any data
# is loaded and the split again on the real labels


def split_iid(
    labels: np.ndarray, n: int, param: Any, rng: np.random.Generator, c: int, cfg: DataConfig
) -> list[np.ndarray]:
    return iid_partition(labels, n, rng)


def split_natural(
    labels: np.ndarray,
    n: int,
    param: Any,
    rng: np.random.Generator,
    c: int,
    cfg: DataConfig,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Each client one of the data's own clients (``groups``: FEMNIST's writers), ``n`` of them
    drawn without replacement by the seed (all of them when ``n`` is their number), in id order."""
    if groups is None:
        raise ConfigError(f"The natural partition follows the data's own clients; {cfg.dataset} has none.")
    owners = np.unique(groups)
    if n > len(owners):
        raise ConfigError(f"The natural partition has {len(owners)} clients of the data's own, fewer than {n}.")
    chosen = owners if n == len(owners) else np.sort(rng.choice(owners, size=n, replace=False))
    order = np.argsort(groups, kind="stable")
    starts = np.searchsorted(groups[order], chosen)
    stops = np.searchsorted(groups[order], chosen, side="right")
    return [np.sort(order[a:b]) for a, b in zip(starts, stops, strict=True)]


def check_natural(param: Any, num_clients: int, num_classes: int, num_samples: int, cfg: DataConfig) -> None:
    from raysim.registry import DATASETS

    own = DATASETS.get(cfg.dataset).natural_clients if cfg.dataset in DATASETS else 0
    if own == 0:
        raise ConfigError(
            f"The natural partition follows the data's own clients; {cfg.dataset} has none (femnist has)."
        )
    if num_clients > own:
        raise ConfigError(f"The natural partition has at most {own} clients in {cfg.dataset}, not {num_clients}.")


def check_iid(param: Any, num_clients: int, num_classes: int, num_samples: int, cfg: DataConfig) -> None:
    if num_samples < num_clients:
        raise ConfigError(
            f"The iid partition cannot give {num_clients} clients a sample each from {num_samples}."
        )


def split_dirichlet(
    labels: np.ndarray, n: int, alpha: float, rng: np.random.Generator, c: int, cfg: DataConfig
) -> list[np.ndarray]:
    return dirichlet_partition(labels, n, alpha, rng, c, cfg.min_samples)


def check_dirichlet(
    alpha: float, num_clients: int, num_classes: int, num_samples: int, cfg: DataConfig
) -> None:
    _check_dirichlet(alpha, num_clients, num_samples, cfg.min_samples)


def _check_dirichlet(alpha: float, num_clients: int, num_samples: int, min_samples: int) -> None:
    if alpha <= 0:
        raise ConfigError(f"The Dirichlet concentration alpha must be positive, not {alpha}.")
    if num_clients * min_samples > num_samples:
        raise ConfigError(
            f"The Dirichlet partition cannot give {num_clients} clients {min_samples} samples each "
            f"from {num_samples} samples; use fewer clients or a smaller data.min_samples."
        )


def split_pathological(
    labels: np.ndarray, n: int, k: float, rng: np.random.Generator, c: int, cfg: DataConfig
) -> list[np.ndarray]:
    return pathological_partition(labels, n, int(k), rng, c, class_order=cfg.class_order, balance=cfg.balance)


def check_pathological(
    k: float, num_clients: int, num_classes: int, num_samples: int, cfg: DataConfig
) -> None:
    if k > num_classes:
        raise ConfigError(f"The pathological partition cannot give a client {k:g} classes of {num_classes}.")
    if num_clients * k < num_classes:
        raise ConfigError(
            f"The pathological partition with {num_clients} clients of {k:g} classes each leaves "
            f"some of the {num_classes} classes unused; use more clients or more classes each."
        )


def split_shard(
    labels: np.ndarray, n: int, s: float, rng: np.random.Generator, c: int, cfg: DataConfig
) -> list[np.ndarray]:
    return shard_partition(labels, n, int(s), rng)


def check_shard(s: float, num_clients: int, num_classes: int, num_samples: int, cfg: DataConfig) -> None:
    n_shards = num_clients * int(s)
    if num_samples < n_shards:
        raise ConfigError(
            f"The shard partition needs at least {n_shards} samples for {num_clients} clients of "
            f"{int(s)} shards, but there are {num_samples}."
        )


def split_dominant(
    labels: np.ndarray, n: int, pct: float, rng: np.random.Generator, c: int, cfg: DataConfig
) -> list[np.ndarray]:
    return dominant_partition(labels, n, pct, rng, c, cfg.samples_per_client)


def check_dominant(pct: float, num_clients: int, num_classes: int, num_samples: int, cfg: DataConfig) -> None:
    """The samples each class must supply are checked on the real labels; here, the total."""
    if cfg.samples_per_client < 1:
        raise ConfigError(f"data.samples_per_client must be at least 1, not {cfg.samples_per_client}.")
    if not 0 <= pct <= 100:
        raise ConfigError(f"The dominant partition's uniform share must be 0..100, not {pct}.")
    if num_clients * cfg.samples_per_client > num_samples:
        raise ConfigError(
            f"The dominant partition needs {num_clients * cfg.samples_per_client} samples for "
            f"{num_clients} clients of {cfg.samples_per_client} samples but the dataset has "
            f"{num_samples}; use fewer clients or a smaller data.samples_per_client."
        )


def _check_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError("labels must be a 1-D integer array.")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels fall outside [0, {num_classes}).")
    return labels.astype(np.int64, copy=False)


def _sorted_parts(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _class_pools(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's sample indices, shuffled."""
    order = np.argsort(labels, kind="stable")
    bounds = np.cumsum(np.bincount(labels, minlength=num_classes))[:-1]
    return [rng.permutation(pool) for pool in np.split(order, bounds)]


# --------------------------------------------------------------------------------------------------
# partitions


def iid_partition(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle the samples and split them into ``num_clients`` near-equal parts."""
    n = len(labels)
    check_iid(None, num_clients, 0, n, DataConfig())
    return _sorted_parts(np.array_split(rng.permutation(n), num_clients))


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    num_classes: int,
    min_samples: int = 10,
) -> list[np.ndarray]:
    """Label-skewed partition of Hsu et al. 2019 ("Measuring the effects of non-identical data
    distribution for federated visual classification"), the "LDA" / "practical" setting of
    Fed3+2p, FedFCD and FedDr+.

    For each class r draw ``q_r ~ Dir(alpha * 1_N)`` and cut that class's shuffled samples at the
    cumulative sums of ``q_r``. The whole draw is repeated until every client has at least
    ``min_samples`` samples (our choice, as in FedLab and NIID-Bench).
    """
    labels = _check_labels(labels, num_classes)
    _check_dirichlet(alpha, num_clients, len(labels), min_samples)
    pools = _class_pools(labels, num_classes, rng)
    class_sizes = np.array([len(p) for p in pools])
    tries = 0
    while True:
        tries += 1
        q = rng.dirichlet(np.full(num_clients, alpha), size=num_classes)  # (C, N)
        cuts = np.floor(np.cumsum(q, axis=1) * class_sizes[:, None]).astype(np.int64)
        cuts[:, -1] = class_sizes  # a cumulative sum of 0.9999... must still reach the end
        cuts = np.minimum(cuts, class_sizes[:, None])
        counts = np.diff(cuts, axis=1, prepend=0)  # (C, N)
        if counts.sum(axis=0).min() >= min_samples:
            break
        if tries == DIRICHLET_MAX_TRIES:
            raise ConfigError(
                f"The Dirichlet partition with alpha={alpha:g} left some client with fewer than "
                f"{min_samples} samples in {DIRICHLET_MAX_TRIES} draws; alpha is too small or "
                "there are too many clients for data.min_samples."
            )
    logger.debug("Dirichlet partition (alpha=%g) drawn in %d tries.", alpha, tries)
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, pool in enumerate(pools):
        for client, part in enumerate(np.split(pool, cuts[c, :-1])):
            pieces[client].append(part)
    return _sorted_parts([np.concatenate(p) for p in pieces])


def pathological_partition(
    labels: np.ndarray,
    num_clients: int,
    k: int,
    rng: np.random.Generator,
    num_classes: int,
    *,
    class_order: str = "shuffled",
    balance: bool = True,
) -> list[np.ndarray]:
    """Each client holds ``k`` classes (FedFCD's "Pat"; McMahan et al. 2017's pathological non-IID).

    Which classes (``class_order``):

    - ``shuffled``: after a seeded permutation ``perm`` of the classes, client i holds
      ``perm[(i*k + j) % C]`` for ``j < k``: fixed groups of consecutive classes;
    - ``sequential``: the same with ``perm`` the identity, as PFLlib's "pat" split assigns them
      (client i holds classes ik .. ik+k-1 mod C);
    - ``random``: each client, in turn, draws ``k`` distinct classes at random from those held by
      the fewest clients so far, so that any two clients may share one class, both or none (FedFCD
      Sec. 4.1.1: "each client is randomly assigned 2 class labels").

    Every class is held by ``floor`` or ``ceil`` of ``N*k/C`` clients. A class's shuffled samples
    are split among its holders evenly (``balance``) or, with ``balance=False``, as PFLlib's
    unbalanced "pat" split does (``utils/dataset_utils.py``, ``separate_data``): every holder but
    the last gets a uniform draw from ``[n/(10h), n/h)`` of the class's ``n`` samples over its
    ``h`` holders, and the last gets the rest.
    """
    labels = _check_labels(labels, num_classes)
    check_pathological(k, num_clients, num_classes, len(labels), DataConfig())
    pools = _class_pools(labels, num_classes, rng)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    if class_order == "random":
        for i in range(num_clients):
            held = np.array([len(h) for h in holders])
            # fewest holders first, ties broken at random
            for c in np.lexsort((rng.random(num_classes), held))[:k]:
                holders[int(c)].append(i)
    else:
        perm = rng.permutation(num_classes) if class_order == "shuffled" else np.arange(num_classes)
        for i in range(num_clients):
            for j in range(k):
                holders[int(perm[(i * k + j) % num_classes])].append(i)
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, pool in enumerate(pools):
        if len(pool) and len(pool) < len(holders[c]):
            logger.warning(
                "Class %d has %d samples for %d clients; some hold fewer than %d classes.",
                c,
                len(pool),
                len(holders[c]),
                k,
            )
        if balance or len(holders[c]) < 2:
            parts = np.array_split(pool, len(holders[c]))
        else:
            h = len(holders[c])
            share = len(pool) / h
            low = max(int(share / 10), 1)
            counts = rng.integers(low, max(int(share), low + 1), size=h - 1)
            parts = np.split(pool, np.cumsum(counts))
        for client, part in zip(holders[c], parts, strict=True):
            pieces[client].append(part)
    return _sorted_parts([np.concatenate(p) for p in pieces])


def shard_partition(
    labels: np.ndarray,
    num_clients: int,
    shards_per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Shards of McMahan et al. 2017 ("Communication-efficient learning of deep networks from
    decentralized data"), as used by FedDr+.

    Sort the (seeded-shuffled) samples by label, cut them into ``N * s`` equal shards and give each
    client ``s`` random shards.
    """
    labels = np.asarray(labels)
    check_shard(shards_per_client, num_clients, 0, len(labels), DataConfig())
    n_shards = num_clients * shards_per_client
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    shards = np.array_split(order, n_shards)
    assignment = rng.permutation(n_shards).reshape(num_clients, shards_per_client)
    return _sorted_parts([np.concatenate([shards[s] for s in row]) for row in assignment])


def dominant_partition(
    labels: np.ndarray,
    num_clients: int,
    uniform_pct: float,
    rng: np.random.Generator,
    num_classes: int,
    samples_per_client: int = 600,
) -> list[np.ndarray]:
    """Dominant-class partition of FedPAC (Xu et al. 2023, "Personalized federated learning with
    feature alignment and classifier collaboration").

    Every client gets ``samples_per_client`` samples: ``uniform_pct`` % of them spread evenly over
    all classes, the rest over the dominant classes of its group. Clients are dealt round-robin into
    ``C // 2`` groups and group g dominates classes ``perm[2g], perm[2g + 1]`` (a seeded class
    permutation), so groups have disjoint dominant classes. Samples are drawn without replacement:
    no sample is used twice, and samples left over are not used.
    """
    labels = _check_labels(labels, num_classes)
    check_dominant(
        uniform_pct, num_clients, num_classes, len(labels), DataConfig(samples_per_client=samples_per_client)
    )
    pools = _class_pools(labels, num_classes, rng)
    perm = rng.permutation(num_classes)
    per_group = min(2, num_classes)
    num_groups = max(1, num_classes // 2)
    n_uniform = int(np.floor(uniform_pct / 100 * samples_per_client + 0.5))
    n_dominant = samples_per_client - n_uniform

    def spread(total: int, classes: np.ndarray) -> np.ndarray:
        """``total`` samples over ``classes`` as evenly as possible, the remainder at random."""
        demand = np.zeros(num_classes, dtype=np.int64)
        base, extra = divmod(total, len(classes))
        demand[classes] = base
        demand[rng.choice(classes, size=extra, replace=False)] += 1
        return demand

    demand = np.zeros((num_clients, num_classes), dtype=np.int64)
    for i in range(num_clients):
        g = i % num_groups
        dominant = perm[g * per_group : (g + 1) * per_group]
        demand[i] = spread(n_uniform, np.arange(num_classes)) + spread(n_dominant, dominant)
    need = demand.sum(axis=0)
    have = np.array([len(p) for p in pools])
    short = np.flatnonzero(need > have)
    if len(short):
        c = int(short[0])
        raise ConfigError(
            f"The dominant partition needs {need[c]} samples of class {c} for {num_clients} "
            f"clients of {samples_per_client} samples but the dataset has {have[c]}; use fewer "
            "clients or a smaller data.samples_per_client."
        )
    ends = np.cumsum(demand, axis=0)  # (N, C): where each client's share of each class ends
    starts = ends - demand
    return _sorted_parts(
        [
            np.concatenate([pools[c][starts[i, c] : ends[i, c]] for c in range(num_classes)])
            for i in range(num_clients)
        ]
    )


# --------------------------------------------------------------------------------------------------
# local test sets and statistics


def matched_test_indices(
    client_train_labels: list[np.ndarray],
    test_labels: np.ndarray,
    num_classes: int,
    ratio: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Local test sets drawn from the official test set to follow each client's training label
    distribution (Fed3+2p, FedDr+).

    Client i gets ``round(ratio * n_train_i(c))`` test samples of each class c, drawn without
    replacement and capped by what the test set holds of c; different clients may share samples.
    A client whose counts all round to zero still gets one sample of its most frequent class, so
    that no client with training data has an empty test set.
    """
    test_labels = _check_labels(test_labels, num_classes)
    order = np.argsort(test_labels, kind="stable")
    bounds = np.cumsum(np.bincount(test_labels, minlength=num_classes))[:-1]
    pools = np.split(order, bounds)
    have = np.array([len(p) for p in pools])
    out = []
    for train_labels in client_train_labels:
        counts = np.bincount(np.asarray(train_labels, dtype=np.int64), minlength=num_classes)
        want = np.minimum(np.floor(ratio * counts + 0.5).astype(np.int64), have)
        if want.sum() == 0 and counts.sum() > 0:
            available = np.where(have > 0, counts, -1)
            if available.max() > 0:
                want[int(np.argmax(available))] = 1
        picks = [rng.choice(pools[c], size=int(want[c]), replace=False) for c in np.flatnonzero(want)]
        out.append(np.sort(np.concatenate(picks)) if picks else np.empty(0, dtype=np.int64))
    return [p.astype(np.int64, copy=False) for p in out]


def label_entropy(counts: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row of label counts; a row of zeros has entropy 0."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=-1, keepdims=True)
    p = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    result: np.ndarray = -(p * logs).sum(axis=-1)
    return result
