"""Fed3+2p's Fig. 3 for any run: the features of a fixed sample of test images under the global
model and under each client's personal model, and their t-SNE (``eval.features: N``).

After the last round the clients' workers compute f(x), the input of the global head
(:func:`raysim.toolkit.features.representation`), for the same N G-Test images (a sample drawn
from the seed alone, :func:`feature_sample`): once under the global model, and under each client's
personal model where the algorithm has one. The run directory gets

- ``features.parquet``: a row per (model, image): ``round``, ``model`` ("global" or
  "client_<c>"), ``sample`` (the index into G-Test), ``label`` and ``feature`` (a list of floats);
- ``features_tsne.png``: the t-SNE (scikit-learn, seeded) of the global model's features and, beside
  it, of every client's personal features, coloured by class, the picture TensorBoard also gets
  (``features/tsne``). The figure's panels (a)/(b) and (c)/(d) are two runs, without and with the
  coordinators (``algo.coordinators``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raysim import rng
from raysim.config import ExperimentConfig
from raysim.records import EvalReport
from raysim.results.output import BaseCallback, Reply

FEATURES_FILE = "features.parquet"
TSNE_FILE = "features_tsne.png"


def feature_sample(cfg: ExperimentConfig, gtest_size: int) -> np.ndarray:
    """The sorted G-Test indices whose features are exported: ``eval.features`` of them, drawn
    from the seed alone (the same on every worker and every run of the seed)."""
    n = min(cfg.eval.features, gtest_size)
    return np.sort(rng.generator(cfg.seed, "feature_sample").choice(gtest_size, size=n, replace=False))


def feature_rows(
    rnd: int, sample: np.ndarray, labels: np.ndarray, features: Sequence[tuple[str, np.ndarray]]
) -> list[dict[str, Any]]:
    """The rows of features.parquet for one round's features."""
    return [
        {"round": rnd, "model": name, "sample": int(i), "label": int(y), "feature": f.astype(float).tolist()}
        for name, matrix in features
        for i, y, f in zip(sample, labels, matrix, strict=True)
    ]


def tsne_input(rows: Sequence[dict[str, Any]], personal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of the global model's rows (``personal`` false) or of every client's
    (true), in the table's order: what the t-SNE embeds."""
    chosen = [r for r in rows if (r["model"] != "global") == personal]
    if not chosen:
        return np.zeros((0, 0), np.float32), np.zeros(0, np.int64)
    return np.array([r["feature"] for r in chosen], np.float32), np.array(
        [r["label"] for r in chosen], np.int64
    )


def tsne(x: np.ndarray, seed: int) -> np.ndarray:
    """The 2-D t-SNE of the rows of ``x`` (scikit-learn; PCA start, seeded)."""
    from sklearn.manifold import TSNE

    perplexity = float(min(30, max(1, x.shape[0] - 1)))
    out: np.ndarray = TSNE(2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x)
    return out


def write_features(run_dir: Path, rows: Sequence[dict[str, Any]], seed: int) -> np.ndarray:
    """features.parquet and features_tsne.png in ``run_dir``; returns the picture (uint8, H x W x 3)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from raysim.files import replaced_atomically

    with replaced_atomically(run_dir / FEATURES_FILE) as tmp:
        pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
    panels = [
        (title, *tsne_input(rows, personal))
        for title, personal in (("global model", False), ("personal models", True))
    ]
    panels = [p for p in panels if p[1].shape[0] > 1]
    fig = Figure(figsize=(5 * max(1, len(panels)), 4.6), dpi=100)
    canvas = FigureCanvasAgg(fig)
    for k, (title, x, y) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        z = tsne(x, seed)
        points = ax.scatter(z[:, 0], z[:, 1], c=y, cmap="tab10", s=6)
        ax.set_title(f"t-SNE of f(x): {title}")
        ax.set_xticks([])
        ax.set_yticks([])
        if k == len(panels) - 1:
            fig.colorbar(points, ax=ax, label="class")
    fig.tight_layout()
    canvas.draw()
    picture = np.asarray(canvas.buffer_rgba())[:, :, :3].copy()
    fig.savefig(run_dir / TSNE_FILE, format="png")
    return picture


class FeatureExport(BaseCallback):
    """``eval.features``: at the evaluation that carries features (after the last round), writes
    features.parquet and features_tsne.png, and replies the t-SNE as the image ``features/tsne``
    (TensorBoard's). ``labels()`` gives G-Test's labels, ``report()`` the round's evaluation (the
    round loop's)."""

    def __init__(self, labels: Callable[[], np.ndarray], report: Callable[[], EvalReport | None]) -> None:
        self.labels, self.report = labels, report
        self.cfg: ExperimentConfig | None = None
        self.run_dir = Path(".")

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> Reply | None:
        self.cfg, self.run_dir = cfg, run_dir
        return None

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply | None:
        report = self.report()
        if report is None or not report.features or self.cfg is None:
            return None
        labels = self.labels()
        sample = feature_sample(self.cfg, len(labels))
        rows = feature_rows(rnd, sample, labels[sample], report.features)
        return Reply(images={"features/tsne": write_features(self.run_dir, rows, self.cfg.seed)})


__all__ = [
    "FEATURES_FILE",
    "FeatureExport",
    "TSNE_FILE",
    "feature_rows",
    "feature_sample",
    "tsne",
    "tsne_input",
    "write_features",
]
