"""The FedDr+ paper's analyses (Sec. 2.3 and Figs. 2-5), for any algorithm: ``eval.analyses: true``.

They cost an extra forward pass over G-Test for every client trained in an evaluated round (the
global model's features come from its evaluation pass), so they are off by default. At every evaluated round:

- the global model: its accuracy on each class of G-Test (``gm_class_acc``, a list in
  metrics.parquet, ``classes/gm_acc/<c>`` in TensorBoard); and for each client, on G-Test's samples
  of the classes the client observed (O^i: present in its training data) and of those it did not
  (U^i): accuracy, feature-classifier alignment cos(f(x), v_y) and feature norm ||f(x)||
  (``gm_obs_acc``, ``gm_unobs_acc``, ``gm_obs_align``, ``gm_unobs_align``, ``gm_obs_norm``,
  ``gm_unobs_norm`` in clients.parquet; their means over the clients in metrics.parquet);
- the local models theta_r^i (as each sampled client's local training left them, before the
  server aggregates): the same six on G-Test split by the client's O^i and U^i (``local_*``, for
  the clients trained in the round; their means in metrics.parquet: FedDr+'s Figs. 2, 3 and 5 are
  these means, and its gaps are ``local_*`` at round r minus ``gm_*`` at round r - 1, with
  ``eval.every: 1``);
- FedDr+'s Fig. 4: for each trained client, from the global model it received (theta^g_{r-1}, as
  its local update first loaded it) to its local model theta^i_r, on the same G-Test inputs of its
  O^i and U^i: the feature distance ||f(x; theta^i_r) - f(x; theta^g_{r-1})||, the angle between
  the two features (degrees) and their norm difference (``local_obs_fdist``, ``local_unobs_fangle``,
  ``local_obs_fnormdiff``, ...; means over the round's clients in metrics.parquet). A batch of
  clients trained together (``train.batch_clients``) shares one received model, so an algorithm
  whose batches start each client from its own parts (pinned batching) has none of these.

f(x) is the input of the global head (:func:`raysim.toolkit.features.representation`) and v_y the head's
row for class y. A client with no unobserved class has no ``*_unobs_*`` values (null); the means
skip it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel

#: (obs | unobs) x (acc | align | norm): the per-client columns, each prefixed gm_ or local_
SPLIT_KEYS = tuple(f"{side}_{what}" for side in ("obs", "unobs") for what in ("acc", "align", "norm"))
#: FedDr+'s Fig. 4, (obs | unobs) x (feature distance, angle in degrees, norm difference) from the
#: received global model to the local model, on the same G-Test inputs; prefixed local_
DRIFT_KEYS = tuple(f"{side}_{what}" for side in ("obs", "unobs") for what in ("fdist", "fangle", "fnormdiff"))
#: every column the analyses add to metrics.parquet (besides ``gm_class_acc``) and clients.parquet
ANALYSIS_COLUMNS = (
    *(f"{who}_{k}" for who in ("gm", "local") for k in SPLIT_KEYS),
    *(f"local_{k}" for k in DRIFT_KEYS),
)


@dataclass(frozen=True)
class ClassStats:
    """Per class c of a test set: samples, correct predictions, and the sums of cos(f(x), v_y) and
    ||f(x)|| over its samples."""

    count: np.ndarray  # (C,) int64
    correct: np.ndarray  # (C,) int64
    align_sum: np.ndarray  # (C,) float64
    norm_sum: np.ndarray  # (C,) float64

    @classmethod
    def of(cls, y: np.ndarray, correct: np.ndarray, align: np.ndarray, norm: np.ndarray, num_classes: int) -> ClassStats:
        """From per-sample labels, correctness, alignment and norm."""
        return cls(
            np.bincount(y, minlength=num_classes).astype(np.int64),
            np.bincount(y, weights=correct.astype(np.float64), minlength=num_classes).round().astype(np.int64),
            np.bincount(y, weights=align.astype(np.float64), minlength=num_classes),
            np.bincount(y, weights=norm.astype(np.float64), minlength=num_classes),
        )

    def class_accuracy(self) -> list[float | None]:
        return [None if n == 0 else float(k / n) for k, n in zip(self.correct, self.count, strict=True)]

    def split(self, observed: np.ndarray) -> dict[str, float | None]:
        """The six values of :data:`SPLIT_KEYS` over the classes where ``observed`` is true (obs) and
        false (unobs)."""
        out: dict[str, float | None] = {}
        for side, mask in (("obs", observed), ("unobs", ~observed)):
            n = int(self.count[mask].sum())
            for what, total in (
                ("acc", self.correct[mask].sum()),
                ("align", self.align_sum[mask].sum()),
                ("norm", self.norm_sum[mask].sum()),
            ):
                out[f"{side}_{what}"] = None if n == 0 else float(total / n)
        return out


def sample_analysis(
    model: SplitModel, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: whether the global path head(f(x)) predicts y, cos(f(x), v_y) and ||f(x)||, f the
    head's input and v_y the head's row for y; in eval mode, without gradients."""
    from raysim.toolkit.features import extract_features

    return feature_analysis(model, extract_features(model, x, batch_size), y, batch_size)


def feature_analysis(
    model: SplitModel, f: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`sample_analysis` from the features f(x) already extracted (in batches of
    ``batch_size``, the head applied batch by batch as there)."""
    import torch
    import torch.nn.functional as F

    correct, align, norm = [], [], []
    with torch.inference_mode():
        for start in range(0, f.shape[0], batch_size):
            fb, yb = f[start : start + batch_size], y[start : start + batch_size]
            correct.append(model.head(fb).argmax(dim=1) == yb)
            align.append(F.cosine_similarity(fb, model.head.weight.index_select(0, yb), dim=1))
            norm.append(torch.linalg.vector_norm(fb, dim=1))
    if not correct:
        return np.zeros(0, bool), np.zeros(0, np.float32), np.zeros(0, np.float32)
    return (
        torch.cat(correct).cpu().numpy(),
        torch.cat(align).float().cpu().numpy(),
        torch.cat(norm).float().cpu().numpy(),
    )


def feature_drift(local: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample (rows of the two (n, d) feature matrices of the same inputs): the distance
    ||f_local - f_start||, the angle between them in degrees, and ||f_local|| - ||f_start||
    (FedDr+'s Fig. 4, from theta^g_{r-1} to theta^i_r)."""
    a, b = local.astype(np.float64), start.astype(np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cos = np.einsum("ij,ij->i", a, b) / np.maximum(na * nb, 1e-12)
    angle = np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))
    return np.linalg.norm(a - b, axis=1), angle, na - nb


def drift_split(
    y: np.ndarray, drift: tuple[np.ndarray, np.ndarray, np.ndarray], observed: np.ndarray
) -> dict[str, float | None]:
    """The means of :func:`feature_drift`'s three values over the samples of the classes where
    ``observed`` is true (obs_*) and false (unobs_*), as :data:`DRIFT_KEYS`; None for an empty side."""
    out: dict[str, float | None] = {}
    seen = observed[y]
    for side, mask in (("obs", seen), ("unobs", ~seen)):
        for what, values in zip(("fdist", "fangle", "fnormdiff"), drift, strict=True):
            out[f"{side}_{what}"] = float(values[mask].mean()) if mask.any() else None
    return out


def mean_over_clients(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float | None]:
    """The mean of each key over the rows that have a value for it (None where none has)."""
    out: dict[str, float | None] = {}
    for k in keys:
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = float(np.mean(vals)) if vals else None
    return out


__all__ = [
    "ANALYSIS_COLUMNS",
    "DRIFT_KEYS",
    "SPLIT_KEYS",
    "ClassStats",
    "drift_split",
    "feature_analysis",
    "feature_drift",
    "mean_over_clients",
    "sample_analysis",
]
