"""Data whose features differ between clients: ``data.feature_shift`` (docs/usage.md, "Data").

The clients are split into K domains, and every image a client trains, validates or tests on is
in its domain:

- ``rotate:K``: domain d's images are rotated (counter-clockwise) by 360/K * d degrees; domain 0
  keeps them upright. This is IFCA's rotated MNIST and CIFAR (Ghosh, Chung, Yin and Ramchandran,
  "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020, Sec. 5: K = 4 for MNIST,
  rotations of 0, 90, 180 and 270 degrees; K = 2 for CIFAR, 0 and 180). A multiple of 90 degrees is
  the exact ``np.rot90``; any other angle (K = 3, 5, 6, ...) is a bilinear rotation about the
  image's centre that keeps its size, what falls outside filled with 0 (black; 0 for float features)
  (``scipy.ndimage.rotate(order=1, reshape=False)``; scipy comes with scikit-learn).
- ``corrupt:K``: domain d's images carry the d-th corruption of :data:`CORRUPTIONS`, each at one
  fixed strength, after Hendrycks and Dietterich's ImageNet-C ("Benchmarking Neural Network
  Robustness to Common Corruptions and Perturbations", ICLR 2019), at the strengths of its CIFAR-10-C
  severity 3 (their make_cifar_c.py) where it has the corruption. On values v in [0, 1] (a uint8
  image / 255):

  0. ``gaussian_noise``: v + 0.08 * N(0, 1) per pixel (CIFAR-10-C's severity 3);
  1. ``gaussian_blur``: a Gaussian blur of sigma 0.7 pixels per channel, edges repeated
     (CIFAR-10-C's severity 3; skimage's ``gaussian`` defaults: ``mode="nearest"``, 4 sigma);
  2. ``low_contrast``: (v - m) * 0.4 + m, m the image's mean in each channel (CIFAR-10-C's
     ``contrast`` at severity 3);
  3. ``inversion``: 1 - v (255 - x on the uint8 pixels; not an ImageNet-C corruption: the
     negative images of domain-shift studies);
  4. ``pixelation``: every 2x2 block of pixels replaced by its mean (the last, partial block of an
     odd size by the mean of its pixels): ImageNet-C's ``pixelate`` (a box-filtered downscale by a
     factor, then a box-filtered upscale, which at 0.5 repeats each pixel) at the factor 0.5 of
     its severity 2, coarser than CIFAR-10-C's 0.85 at severity 3, so that the blocks are whole
     pixels of a 28x28 or 32x32 image;
  5. ``brightness``: v + 0.15 on every channel (CIFAR-10-C's severity 3, which adds it to the HSV
     value: the same on a grey image; on a colour one ImageNet-C's step scales the channels by
     their brightest, here each gets the same +0.15).

  ``corrupt:K`` takes the first K (K up to 6). uint8 images stay uint8: a corrupted image is clipped
  to [0, 1] and rounded to the nearest of the 256 levels. The noise is drawn once, when the data
  is built, from ``SeedSequence([seed, 5])``, so a seed gives the same images on every executor.

Float32 images (the synthetic dataset) get the same operations on their values as they are, with
neither clipping nor rounding, inversion being -v (their reflection about 0, the synthetic data's
centre). Data that is not images ``(C, H, W)`` is refused, as is a rotation of images that are
not square.

Domains: a seeded permutation of the client ids (``SeedSequence([seed, 4])``; the partition, the
test sets and the validation parts draw from streams 1, 2 and 3), the client at position i in
domain i mod K, so every domain has floor or ceil of N/K clients. Each client's training samples
and validation part are transformed by its domain, and its P-Test is in it too: G-Test becomes the
K domains' copies of the official test set, domain d's at ``[d * n, (d + 1) * n)``. Where the
clients' P-Tests index G-Test (the ``matched`` and ``natural`` test modes) a client's indices move
into its domain's copy (two clients of different domains may share a test image: each sees its own
domain's copy); where they index the pool of train and test (``split``), every pooled sample is
transformed by its owner's domain (one that no client owns stays as it is).
:func:`raysim.data.federated.apply_feature_shift` does so; this module holds the transforms, the
check of the setting and the domains' draw. ``FederatedData.client_domains`` and ``gtest_domains``
say who and what is in which domain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from raysim.config import DataConfig, ExperimentConfig
from raysim.data.datasets import ArrayDataset
from raysim.errors import ConfigError
from raysim.registry import FEATURE_SHIFTS, dataset_info, load_ref, parse_feature_shift

#: the SeedSequence streams ``[seed, DOMAIN_STREAM]`` (who is in which domain) and
#: ``[seed, NOISE_STREAM]`` (the corruptions' noise); build_federated_data uses 1 to 3
DOMAIN_STREAM, NOISE_STREAM = 4, 5
#: images transformed at a time (a float32 copy of this many, not of the whole set)
CHUNK = 2048


# --------------------------------------------------------------------------------------------------
# the corruptions


def _gaussian_noise(x: np.ndarray, sigma: float, rng: np.random.Generator, bounded: bool) -> np.ndarray:
    return x + np.float32(sigma) * rng.standard_normal(x.shape, dtype=np.float32)


def _gaussian_blur(x: np.ndarray, sigma: float, rng: np.random.Generator, bounded: bool) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    out: np.ndarray = gaussian_filter(x, sigma=(0, 0, sigma, sigma), mode="nearest", truncate=4.0)
    return out


def _low_contrast(x: np.ndarray, factor: float, rng: np.random.Generator, bounded: bool) -> np.ndarray:
    mean = x.mean(axis=(2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    return (x - mean) * np.float32(factor) + mean


def _inversion(x: np.ndarray, strength: float, rng: np.random.Generator, bounded: bool) -> np.ndarray:
    return np.float32(1.0) - x if bounded else -x


def _pixelation(x: np.ndarray, block: float, rng: np.random.Generator, bounded: bool) -> np.ndarray:
    b = int(block)
    h, w = x.shape[2:]
    rows, cols = np.arange(0, h, b), np.arange(0, w, b)
    sums = np.add.reduceat(np.add.reduceat(x.astype(np.float64), rows, axis=2), cols, axis=3)
    counts = np.outer(np.diff(np.append(rows, h)), np.diff(np.append(cols, w)))
    means = (sums / counts).astype(np.float32)
    return np.repeat(np.repeat(means, b, axis=2)[:, :, :h], b, axis=3)[:, :, :, :w]


def _brightness(x: np.ndarray, shift: float, rng: np.random.Generator, bounded: bool) -> np.ndarray:
    return x + np.float32(shift)


@dataclass(frozen=True)
class Corruption:
    """One corruption at one strength: ``apply(x, strength, rng, bounded)`` on float32
    ``(n, C, H, W)`` values (``bounded``: in [0, 1], a uint8 image's scale; else float features)."""

    name: str
    strength: float
    what: str  # what it does, with its strength, for the log and the docs
    apply: Callable[[np.ndarray, float, np.random.Generator, bool], np.ndarray]


#: ``corrupt:K``'s domains, in order (the module's docstring says where each strength comes from)
CORRUPTIONS: tuple[Corruption, ...] = (
    Corruption("gaussian_noise", 0.08, "Gaussian noise of std 0.08", _gaussian_noise),
    Corruption("gaussian_blur", 0.7, "Gaussian blur of sigma 0.7 px", _gaussian_blur),
    Corruption("low_contrast", 0.4, "contrast x0.4", _low_contrast),
    Corruption("inversion", 1.0, "inversion", _inversion),
    Corruption("pixelation", 2.0, "2x2 pixelation", _pixelation),
    Corruption("brightness", 0.15, "brightness +0.15", _brightness),
)


# --------------------------------------------------------------------------------------------------
# the registered transforms: transform(x, domain, num_domains, rng, bounded) on float32 (n, C, H, W)


def rotation_angle(domain: int, num_domains: int) -> float:
    """Domain ``domain``'s rotation in degrees, counter-clockwise: 360 / K * d."""
    return 360.0 * domain / num_domains


def rotate(
    x: np.ndarray, domain: int, num_domains: int, rng: np.random.Generator, bounded: bool
) -> np.ndarray:
    """``x`` rotated by :func:`rotation_angle`: ``np.rot90`` for a multiple of 90 degrees, else
    scipy's bilinear rotation about the centre, the size kept and the corners filled with 0."""
    quarter, rest = divmod(360 * domain, 90 * num_domains)
    if rest == 0:
        return np.rot90(x, quarter, axes=(2, 3))
    from scipy.ndimage import rotate as rotated

    out: np.ndarray = rotated(
        x, rotation_angle(domain, num_domains), axes=(2, 3), reshape=False, order=1, mode="constant", cval=0.0
    )
    return out


def corrupt(
    x: np.ndarray, domain: int, num_domains: int, rng: np.random.Generator, bounded: bool
) -> np.ndarray:
    """``x`` under :data:`CORRUPTIONS` ``[domain]``."""
    c = CORRUPTIONS[domain]
    return c.apply(x, c.strength, rng, bounded)


# --------------------------------------------------------------------------------------------------
# the setting


@dataclass(frozen=True)
class FeatureShift:
    """A parsed ``data.feature_shift``: its kind and its number of domains (0 for ``none``)."""

    kind: str
    domains: int = 0

    def __str__(self) -> str:
        return self.kind if self.kind == "none" else f"{self.kind}:{self.domains}"

    @property
    def shifts(self) -> bool:
        return self.kind != "none"

    def domain_name(self, d: int) -> str:
        """What domain ``d`` is, for the log: ``rotated 90 deg``, ``Gaussian blur of sigma 0.7 px``."""
        if self.kind == "rotate":
            return f"rotated {rotation_angle(d, self.domains):g} deg"
        if self.kind == "corrupt":
            return CORRUPTIONS[d].what
        return "as it is"

    def transform(self, x: np.ndarray, domain: int, rng: np.random.Generator) -> np.ndarray:
        """Images ``x`` (uint8 or float32 ``(n, C, H, W)``) as domain ``domain`` has them, a new
        array of the same dtype and shape, made :data:`CHUNK` images at a time."""
        entry = FEATURE_SHIFTS.get(self.kind)
        if entry.transform is None:
            return x
        fn = load_ref(entry.transform)
        bounded = x.dtype == np.uint8
        out = np.empty_like(x)
        for start in range(0, len(x), CHUNK):
            part = x[start : start + CHUNK].astype(np.float32)
            if bounded:
                part /= np.float32(255.0)
            done = fn(part, domain, self.domains, rng, bounded)
            if bounded:
                done = np.rint(np.clip(done, 0.0, 1.0) * np.float32(255.0))
            out[start : start + CHUNK] = done
        return out


def parse_shift(text: str) -> FeatureShift:
    """``data.feature_shift`` checked on its own: a known kind, and K from 2 to the kind's most."""
    spec = parse_feature_shift(text)
    if spec.param is None:
        return FeatureShift(spec.kind)
    assert isinstance(spec.param, float)
    k = int(spec.param)
    if k < 2:
        raise ConfigError(
            f"The {spec.kind} feature shift needs at least 2 domains, not {k} (e.g. {spec.kind}:4)."
        )
    most = FEATURE_SHIFTS.get(spec.kind).most_domains
    if most and k > most:
        raise ConfigError(
            f"The {spec.kind} feature shift has {most} corruptions, so at most {most} domains, not {k}."
        )
    return FeatureShift(spec.kind, k)


def check_feature_shift(cfg: DataConfig, num_clients: int) -> FeatureShift:
    """``cfg.feature_shift`` checked against the federation and the dataset's sample shape, before
    any data is loaded: the parsed shift, or a ConfigError of one sentence."""
    shift = parse_shift(cfg.feature_shift)
    if not shift.shifts:
        return shift
    if shift.domains > num_clients:
        raise ConfigError(
            f"The feature shift {shift} needs a client in each of its {shift.domains} domains, more than the "
            f"{num_clients} clients."
        )
    check_images(shift, dataset_info(cfg).input_shape, cfg.dataset)
    return shift


def check_images(shift: FeatureShift, shape: tuple[int, ...], dataset: str) -> None:
    """ConfigError unless samples of ``shape`` are images ``(C, H, W)`` the shift can transform."""
    if len(shape) != 3:
        raise ConfigError(
            f"The feature shift {shift} transforms images (C, H, W), not the {dataset} samples of shape {shape}."
        )
    if (
        shift.kind == "rotate"
        and shape[1] != shape[2]
        and any(
            (360 * d) % (90 * shift.domains) == 0 and (360 * d // (90 * shift.domains)) % 2
            for d in range(shift.domains)
        )
    ):
        raise ConfigError(
            f"The feature shift {shift} turns images by a quarter, which keeps only square ones "
            f"whole, not the {dataset} images of {shape[1]}x{shape[2]} pixels."
        )


def assign_domains(num_clients: int, num_domains: int, seed: int) -> np.ndarray:
    """Each client's domain (int64): a seeded permutation of the client ids, the client at position
    i in domain i mod K, so the domains' sizes differ by at most one."""
    order = np.random.default_rng(np.random.SeedSequence([seed, DOMAIN_STREAM])).permutation(num_clients)
    domains = np.empty(num_clients, dtype=np.int64)
    domains[order] = np.arange(num_clients, dtype=np.int64) % num_domains
    return domains


def cluster_purity(cfg: ExperimentConfig, clusters: Sequence[Sequence[int]]) -> float | None:
    """How well ``clusters`` (each a list of client ids) follow the clients' domains under
    ``cfg.data.feature_shift``: the share of the clustered training clients (held-out ones left
    out) whose cluster's most common domain is their own (1: every cluster within one domain);
    None without a shift or without a clustered training client. IFCA's claim that it recovers the
    rotations, read on any clustered algorithm (its ``cluster_purity`` each round)."""
    shift = parse_shift(cfg.data.feature_shift)
    if not shift.shifts:
        return None
    domains = assign_domains(cfg.clients, shift.domains, cfg.seed)
    training = set(cfg.training_clients)
    hit = total = 0
    for members in clusters:
        own = [c for c in members if c in training]
        if own:
            hit += int(np.bincount(domains[own], minlength=shift.domains).max())
            total += len(own)
    return hit / total if total else None


def noise_generator(seed: int) -> np.random.Generator:
    """The corruptions' randomness, ``SeedSequence([seed, NOISE_STREAM])``."""
    return np.random.default_rng(np.random.SeedSequence([seed, NOISE_STREAM]))


def shift_by_owner(
    x: np.ndarray, owner: np.ndarray, shift: FeatureShift, rng: np.random.Generator
) -> np.ndarray:
    """A copy of the samples ``x`` with each one whose ``owner`` (its domain, -1: nobody's) is d
    transformed into domain d, domain after domain; nobody's stay as they are."""
    out = x.copy()
    for d in range(shift.domains):
        rows = np.flatnonzero(owner == d)
        out[rows] = shift.transform(x[rows], d, rng)
    return out


def domain_copies(test: ArrayDataset, shift: FeatureShift, rng: np.random.Generator) -> ArrayDataset:
    """The K domains' copies of ``test``, domain d's at ``[d * n, (d + 1) * n)``: the G-Test of a
    shifted federation."""
    k = shift.domains
    return ArrayDataset(
        np.concatenate([shift.transform(test.x, d, rng) for d in range(k)]),
        np.tile(test.y, k),
        test.num_classes,
        test.name,
        test.mean,
        test.std,
        None if test.groups is None else np.tile(test.groups, k),
    )


__all__ = [
    "CORRUPTIONS",
    "Corruption",
    "FeatureShift",
    "assign_domains",
    "check_feature_shift",
    "check_images",
    "corrupt",
    "domain_copies",
    "noise_generator",
    "parse_shift",
    "rotate",
    "rotation_angle",
    "shift_by_owner",
]
