"""raysim's data layer: datasets as arrays, partitions over clients, and local test sets."""

from raysim.data.datasets import ArrayDataset, load_dataset
from raysim.data.federated import FederatedData, build_federated_data
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

__all__ = [
    "ArrayDataset",
    "FederatedData",
    "build_federated_data",
    "dirichlet_partition",
    "dominant_partition",
    "iid_partition",
    "label_entropy",
    "load_dataset",
    "matched_test_indices",
    "partition_indices",
    "pathological_partition",
    "shard_partition",
]
