"""The data picture (issue 17): how a partition spreads the labels over the clients.

Every run writes, before its first round, ``partition.png`` (each client's training-label counts as a
heat map: a column per client, a row per class) and ``partition.parquet`` (a row per client: its
training, validation and local-test sizes, how many classes it holds, the entropy of its labels in
nats, and its count of every class), and TensorBoard shows the picture under ``data/partition``.
``raysim partition --dataset fmnist --partition dirichlet:0.1 --clients 100`` draws it without running
anything (:mod:`raysim.partition_cli`). Matplotlib draws it (the figure module only, without pyplot's global state, so a thread
may draw it while Ray starts).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.data.partition import label_entropy

if TYPE_CHECKING:
    from raysim.data import FederatedData

PICTURE = "partition.png"
TABLE = "partition.parquet"


def partition_table(data: FederatedData, counts: np.ndarray) -> dict[str, list[Any]]:
    """The per-client table, as columns: client, train/val/test sizes, classes held, label entropy
    (nats), and ``count_<c>`` for every class c (``counts``: the training-label counts)."""
    table: dict[str, list[Any]] = {
        "client": list(range(data.num_clients)),
        "train_size": [int(n) for n in counts.sum(axis=1)],
        "val_size": [int(v.size) for v in data.client_val],
        "test_size": [int(t.size) for t in data.client_test],
        "classes": [int(n) for n in (counts > 0).sum(axis=1)],
        "label_entropy": [float(h) for h in label_entropy(counts)],
    }
    for c in range(counts.shape[1]):
        table[f"count_{c}"] = [int(n) for n in counts[:, c]]
    return table


def draw_counts(counts: np.ndarray, path: str | os.PathLike[str], title: str = "") -> Path:
    """``counts`` (clients x classes) as a heat map PNG at ``path``: a column per client, a row per
    class, the colour the number of samples on a square-root scale (white: none)."""
    from matplotlib.colors import LinearSegmentedColormap, PowerNorm
    from matplotlib.figure import Figure

    n_clients, n_classes = counts.shape
    width = min(16.0, max(6.0, 0.12 * n_clients + 2.0))
    height = min(12.0, max(3.0, 0.22 * n_classes + 1.5))
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot()
    cmap = LinearSegmentedColormap.from_list("counts", ["#ffffff", "#9ecae1", "#3182bd", "#08306b"])
    norm = PowerNorm(0.5, vmin=0, vmax=max(1, int(counts.max())))  # a square-root scale: a few samples show
    image = ax.imshow(counts.T, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm, origin="lower")
    ax.set_xlabel(f"client (0-{n_clients - 1})")
    ax.set_ylabel(f"class (0-{n_classes - 1})")
    if n_classes <= 20:
        ax.set_yticks(range(n_classes))
    fig.colorbar(image, ax=ax, label="training samples", fraction=0.04, pad=0.02)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    return out


def describe(counts: np.ndarray, partition: str, dataset: str) -> str:
    """The picture's title: dataset, partition, clients, sizes and mean label entropy."""
    sizes = counts.sum(axis=1)
    return (
        f"{dataset}, {partition}, {len(counts)} clients: {int(sizes.min())}-{int(sizes.max())} samples "
        f"a client, {float((counts > 0).sum(axis=1).mean()):.1f} classes and label entropy "
        f"{float(label_entropy(counts).mean()):.2f} nats on average"
    )


def write_partition(data: FederatedData, picture: str | os.PathLike[str], partition: str, dataset: str) -> str:
    """The picture at ``picture`` (a run's ``partition.png``) and the table beside it (``.parquet``);
    returns the picture's title."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(picture)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = data.train_label_counts()
    pq.write_table(pa.table(partition_table(data, counts)), out.with_suffix(".parquet"))
    title = describe(counts, partition, dataset)
    draw_counts(counts, out, title)
    return title


def read_picture(path: str | os.PathLike[str]) -> np.ndarray:
    """A PNG as an HxWx3 uint8 array (for TensorBoard)."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


__all__ = ["PICTURE", "TABLE", "describe", "draw_counts", "partition_table", "read_picture", "write_partition"]
