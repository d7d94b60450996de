"""data.feature_shift: clients in K domains of rotated or corrupted images, checked on the pixels."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from raysim.config import DataConfig, SyntheticConfig
from raysim.data import ArrayDataset, FederatedData, build_federated_data
from raysim.data.feature_shift import (
    CORRUPTIONS,
    FeatureShift,
    assign_domains,
    parse_shift,
    rotate,
)
from raysim.data.federated import apply_feature_shift, natural_test_sets
from raysim.data.partition import partition_indices
from raysim.errors import ConfigError
from raysim.registry import FEATURE_SHIFTS, parse_partition

from .cifar_fixture import write_cifar10

SYNTH = SyntheticConfig(train_samples=600, test_samples=120, num_classes=4, shape=(1, 6, 6))


def synthetic(shift: str, test_mode: str = "matched", partition: str = "dirichlet:0.5", **kw) -> DataConfig:
    return DataConfig(
        dataset="synthetic",
        partition=partition,
        test_mode=test_mode,
        synthetic=SYNTH,
        feature_shift=shift,
        **kw,
    )


def cifar(tmp_path, shift: str, **kw) -> tuple[DataConfig, np.ndarray, np.ndarray]:
    """A tiny CIFAR-10 on disk (40 train, 10 test uint8 images), its config and its images."""
    train, _, test, _ = write_cifar10(tmp_path)
    cfg = DataConfig(
        dataset="cifar10", data_dir=str(tmp_path), download=False, partition="iid", feature_shift=shift, **kw
    )
    return cfg, train.reshape(-1, 3, 32, 32), test.reshape(-1, 3, 32, 32)


# --------------------------------------------------------------------------------------------------
# rotations


def test_rotations_are_quarter_turns_of_the_pixels(tmp_path):
    cfg, train, test = cifar(tmp_path, "rotate:4")
    data = build_federated_data(cfg, 8, seed=1)
    n = len(test)
    assert data.train.x.dtype == data.gtest.x.dtype == np.uint8 and data.ptest is data.gtest
    assert data.client_domains is not None and np.bincount(data.client_domains).tolist() == [2, 2, 2, 2]
    for i, d in enumerate(data.client_domains):
        idx = data.client_train[i]
        np.testing.assert_array_equal(data.train.x[idx], np.rot90(train[idx], d, axes=(2, 3)))
        local = data.client_test[i]
        assert np.all((local >= d * n) & (local < (d + 1) * n))  # its P-Test in its domain's copy
        np.testing.assert_array_equal(data.ptest.x[local], np.rot90(test[local - d * n], d, axes=(2, 3)))
    # G-Test: the four rotated copies of the test set, in domain order
    assert len(data.gtest) == 4 * n
    for d in range(4):
        np.testing.assert_array_equal(data.gtest.x[d * n : (d + 1) * n], np.rot90(test, d, axes=(2, 3)))
    np.testing.assert_array_equal(data.gtest.y, np.tile(data.gtest.y[:n], 4))
    np.testing.assert_array_equal(data.gtest_domains, np.repeat(np.arange(4), n))
    assert data.gtest.mean == data.train.mean  # the normalisation stays the dataset's


def test_an_angle_between_quarters_is_scipys_bilinear_rotation():
    from scipy.ndimage import rotate as scipy_rotate

    data = build_federated_data(synthetic("rotate:3"), 6, seed=0)
    plain = build_federated_data(synthetic("none"), 6, seed=0)
    n = len(plain.gtest)
    for d, angle in ((0, 0), (1, 120), (2, 240)):
        copy = data.gtest.x[d * n : (d + 1) * n]
        want = (
            plain.gtest.x
            if d == 0
            else scipy_rotate(plain.gtest.x, angle, axes=(2, 3), reshape=False, order=1)
        )
        np.testing.assert_allclose(copy, want, rtol=0, atol=1e-5)
    # the direction, by hand: a dot right of the centre turns counter-clockwise, as np.rot90 does
    # (45 degrees up: its row above the centre, its column still right of it)
    dot = np.zeros((1, 1, 9, 9), np.float32)
    dot[0, 0, 4, 7] = 1.0
    assert np.array_equal(rotate(dot, 2, 8, np.random.default_rng(0), False), np.rot90(dot, 1, axes=(2, 3)))
    turned = rotate(dot, 1, 8, np.random.default_rng(0), False)[0, 0]
    rows, cols = np.indices(turned.shape)
    row, col = (rows * turned).sum() / turned.sum(), (cols * turned).sum() / turned.sum()
    np.testing.assert_allclose([row, col], [4 - 3 / np.sqrt(2), 4 + 3 / np.sqrt(2)], atol=0.2)
    assert turned[4, 4] == 0 and turned.shape == (9, 9)


# --------------------------------------------------------------------------------------------------
# corruptions


def _blur_by_hand(image: np.ndarray, sigma: float) -> np.ndarray:
    """A separable Gaussian blur of a (H, W) float image, edges repeated, radius 4 sigma."""
    radius = int(4 * sigma + 0.5)
    taps = np.exp(-(np.arange(-radius, radius + 1) ** 2) / (2 * sigma**2))
    taps /= taps.sum()
    padded = np.pad(image, radius, mode="edge")
    rows = sum(t * padded[k : k + image.shape[0], :] for k, t in enumerate(taps))
    return sum(t * rows[:, k : k + image.shape[1]] for k, t in enumerate(taps))


def test_each_corruption_on_the_pixels(tmp_path):
    cfg, train, test = cifar(tmp_path, "corrupt:6")
    data = build_federated_data(cfg, 6, seed=0)
    assert data.client_domains is not None and sorted(data.client_domains.tolist()) == list(range(6))
    assert data.train.x.dtype == np.uint8
    got = {int(d): data.train.x[data.client_train[i]] for i, d in enumerate(data.client_domains)}
    orig = {int(d): train[data.client_train[i]] for i, d in enumerate(data.client_domains)}
    assert [c.name for c in CORRUPTIONS] == [
        "gaussian_noise",
        "gaussian_blur",
        "low_contrast",
        "inversion",
        "pixelation",
        "brightness",
    ]
    # 0: Gaussian noise of std 0.08 (20.4 levels), seen where it was not clipped
    x, y = orig[0].astype(np.float64), got[0].astype(np.float64)
    middle = (x > 80) & (x < 175)
    assert abs((y - x)[middle].std() / 255 - 0.08) < 0.004 and abs((y - x)[middle].mean()) < 1.0
    # 1: a Gaussian blur of sigma 0.7 pixels in each channel
    want = np.stack(
        [[_blur_by_hand(im / 255.0, 0.7) for im in sample] for sample in orig[1].astype(np.float64)]
    )
    assert np.abs(np.rint(want * 255) - got[1]).max() <= 1
    # 2: each channel moved toward its mean by the factor 0.4
    v = orig[2] / 255.0
    m = v.mean(axis=(2, 3), keepdims=True)
    assert np.abs(np.rint(((v - m) * 0.4 + m) * 255) - got[2]).max() <= 1
    assert np.all(got[2].std(axis=(2, 3)) < 0.41 * orig[2].std(axis=(2, 3)))
    # 3: inversion is 255 - x, exactly
    np.testing.assert_array_equal(got[3], 255 - orig[3])
    # 4: every 2x2 block is its mean
    blocks = got[4].reshape(-1, 3, 16, 2, 16, 2).astype(np.int64)
    assert np.all(blocks == blocks[:, :, :, :1, :, :1])
    means = orig[4].reshape(-1, 3, 16, 2, 16, 2).mean(axis=(3, 5))
    assert np.abs(blocks[:, :, :, 0, :, 0] - means).max() <= 0.5 + 1e-6
    # 5: brightness +0.15 (38.25 levels: +38 after rounding), clipped at white
    np.testing.assert_array_equal(got[5], np.minimum(orig[5].astype(np.int64) + 38, 255))
    # each client's P-Test and G-Test's copies carry the same corruptions
    n = len(test)
    for i, d in enumerate(data.client_domains):
        if d == 3:
            local = data.client_test[i]
            np.testing.assert_array_equal(data.ptest.x[local], 255 - test[local - 3 * n])
    np.testing.assert_array_equal(data.gtest.x[3 * n : 4 * n], 255 - test)
    np.testing.assert_array_equal(data.gtest.x[5 * n : 6 * n], np.minimum(test.astype(np.int64) + 38, 255))


def test_float_images_get_the_same_corruptions_unclipped():
    plain = build_federated_data(synthetic("none"), 6, seed=2)
    data = build_federated_data(synthetic("corrupt:6"), 6, seed=2)
    n = len(plain.gtest)
    x = plain.gtest.x
    copies = [data.gtest.x[d * n : (d + 1) * n] for d in range(6)]
    assert copies[0].dtype == np.float32
    assert abs(float((copies[0] - x).std()) - 0.08) < 0.005
    np.testing.assert_array_equal(copies[3], -x)  # inversion: the reflection about 0
    np.testing.assert_allclose(copies[5], x + np.float32(0.15), atol=1e-6)  # no clipping
    m = x.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(copies[2], (x - m) * 0.4 + m, atol=1e-5)
    np.testing.assert_allclose(copies[2].mean(axis=(2, 3)), m[:, :, 0, 0], atol=1e-5)


def test_the_noise_comes_from_the_seed():
    a, b, c = (build_federated_data(synthetic("corrupt:2"), 6, seed=s) for s in (3, 3, 4))
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.gtest.x, b.gtest.x)
    noise = [
        shifted.gtest.x[: len(shifted.gtest) // 2]
        - build_federated_data(synthetic("none"), 6, seed=s).gtest.x
        for shifted, s in ((a, 3), (c, 4))
    ]
    assert np.abs(noise[0] - noise[1]).mean() > 0.05  # another seed, other noise


# --------------------------------------------------------------------------------------------------
# domains and the test modes


def test_domains_are_seeded_and_balanced():
    a, b, c = assign_domains(10, 3, 7), assign_domains(10, 3, 7), assign_domains(10, 3, 8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.dtype == np.int64 and np.bincount(a).tolist() == np.bincount(c).tolist() == [4, 3, 3]
    order = np.random.default_rng(np.random.SeedSequence([7, 4])).permutation(10)
    np.testing.assert_array_equal(a[order], np.arange(10) % 3)  # position i in domain i mod K
    data = build_federated_data(synthetic("rotate:3"), 10, seed=7)
    np.testing.assert_array_equal(data.client_domains, a)


def test_matched_mode_keeps_the_split_and_moves_each_ptest_into_its_domain():
    cfg = synthetic("rotate:4", val_fraction=0.2)
    plain = build_federated_data(dataclasses.replace(cfg, feature_shift="none"), 8, seed=0)
    data = build_federated_data(cfg, 8, seed=0)
    n = len(plain.gtest)
    assert data.ptest is data.gtest and len(data.gtest) == 4 * n
    assert data.client_domains is not None
    for i, d in enumerate(data.client_domains):
        for mine, theirs in ((data.client_train, plain.client_train), (data.client_val, plain.client_val)):
            np.testing.assert_array_equal(mine[i], theirs[i])  # the same samples ...
            np.testing.assert_array_equal(  # ... in the client's domain
                data.train.x[mine[i]], np.rot90(plain.train.x[theirs[i]], d, axes=(2, 3))
            )
        np.testing.assert_array_equal(data.client_test[i], plain.client_test[i] + d * n)
        np.testing.assert_array_equal(data.ptest.y[data.client_test[i]], plain.ptest.y[plain.client_test[i]])
    np.testing.assert_array_equal(data.gtest_domains, np.repeat(np.arange(4), n))


def test_split_mode_transforms_each_pooled_sample_by_its_owner():
    cfg = synthetic("rotate:2", test_mode="split:0.25", partition="dominant:20", samples_per_client=60)
    plain = build_federated_data(dataclasses.replace(cfg, feature_shift="none"), 6, seed=0)
    data = build_federated_data(cfg, 6, seed=0)
    assert data.ptest is data.train and data.gtest is not data.train
    owned = np.zeros(len(plain.train), bool)
    assert data.client_domains is not None
    for i, d in enumerate(data.client_domains):
        for idx in (data.client_train[i], data.client_test[i]):
            np.testing.assert_array_equal(data.train.x[idx], np.rot90(plain.train.x[idx], 2 * d, axes=(2, 3)))
            owned[idx] = True
    assert 0 < owned.sum() < len(owned)
    np.testing.assert_array_equal(data.train.x[~owned], plain.train.x[~owned])  # nobody's: as it was
    n = len(plain.gtest)
    np.testing.assert_array_equal(data.gtest.x[:n], plain.gtest.x)
    np.testing.assert_array_equal(data.gtest.x[n:], np.rot90(plain.gtest.x, 2, axes=(2, 3)))
    np.testing.assert_array_equal(data.gtest_domains, np.repeat([0, 1], n))


def test_natural_mode_moves_each_writers_test_samples_into_its_domain():
    rng = np.random.default_rng(0)

    def writers(per: list[int]) -> ArrayDataset:
        groups = np.repeat(np.arange(len(per)), per)
        n = len(groups)
        x = rng.integers(0, 256, (n, 1, 4, 4), dtype=np.uint8)
        return ArrayDataset(x, rng.integers(0, 3, n), 3, "grouped", (0.5,), (0.25,), groups)

    train, test = writers([5, 4, 6, 3]), writers([2, 1, 3, 2])
    spec = parse_partition("natural")

    def partition(labels, groups=None):
        return partition_indices(labels, 4, spec, np.random.default_rng(1), 3, DataConfig(), groups=groups)

    pool, ptest, client_train, client_test = natural_test_sets(train, test, None, partition, rng)
    plain = FederatedData(pool, test, ptest, tuple(client_train), tuple(client_test))
    data = apply_feature_shift(plain, parse_shift("corrupt:4"), seed=0)
    assert data.ptest is data.gtest and data.client_domains is not None and data.gtest.groups is not None
    n, writer_of = len(test), train.groups
    assert writer_of is not None
    for i, d in enumerate(data.client_domains):
        np.testing.assert_array_equal(data.client_test[i], client_test[i] + d * n)
        assert np.all(
            data.gtest.groups[data.client_test[i]] == writer_of[client_train[i][0]]
        )  # its own writer
    inverted = data.client_domains.tolist().index(3)
    np.testing.assert_array_equal(
        data.ptest.x[data.client_test[inverted]], 255 - test.x[client_test[inverted]]
    )


def test_no_shift_keeps_every_object():
    data = build_federated_data(synthetic("none"), 6, seed=0)
    assert data.client_domains is None and data.gtest_domains is None and data.num_domains == 0
    assert apply_feature_shift(data, parse_shift("none"), seed=0) is data
    shifted = apply_feature_shift(data, FeatureShift("rotate", 2), seed=0)
    assert shifted.num_domains == 2 and data.gtest.x.shape[0] * 2 == shifted.gtest.x.shape[0]
    assert shifted.train.x is not data.train.x and not np.shares_memory(shifted.train.x, data.train.x)


# --------------------------------------------------------------------------------------------------
# refusals, the picture, a run


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("rotate", "needs its domains K"),
        ("rotate:1", "needs at least 2 domains, not 1"),
        ("rotate:x", "is not a number"),
        ("rotat:4", "Unknown feature shift"),
        ("corrupt:0", "must be a whole number of at least 1"),
        ("corrupt:99", "has 6 corruptions, so at most 6 domains, not 99"),
        ("rotate:2.5", "must be a whole number"),
        ("none:2", "takes no parameter"),
        ("rotate:7", "needs a client in each of its 7 domains, more than the 6 clients"),
    ],
)
def test_bad_values_are_refused_in_one_sentence(text: str, sentence: str) -> None:
    with pytest.raises(ConfigError, match=sentence) as err:
        build_federated_data(synthetic(text), 6, seed=0)
    assert re.search(r"\.\s+[A-Z]", str(err.value)) is None and str(err.value).endswith(".")  # one sentence


def test_data_that_cannot_be_shifted_is_refused() -> None:
    flat = dataclasses.replace(synthetic("corrupt:2"), synthetic=dataclasses.replace(SYNTH, shape=(36,)))
    with pytest.raises(
        ConfigError, match=r"transforms images \(C, H, W\), not the synthetic samples of shape \(36,\)"
    ):
        build_federated_data(flat, 6, seed=0)
    wide = dataclasses.replace(synthetic("rotate:4"), synthetic=dataclasses.replace(SYNTH, shape=(1, 4, 8)))
    with pytest.raises(ConfigError, match="only square ones whole"):
        build_federated_data(wide, 6, seed=0)
    with pytest.raises(ConfigError, match="rotate:5 needs a client in each"):
        build_federated_data(synthetic("rotate:5"), 4, seed=0)


def test_the_driver_refuses_before_any_run() -> None:
    from raysim.engine.experiment import resolve_config, validate

    with pytest.raises(ConfigError, match="needs at least 2 domains"):
        validate(
            resolve_config({"clients": 6, "data": {"dataset": "synthetic", "feature_shift": "corrupt:1"}})
        )
    assert FEATURE_SHIFTS.get("corrupt").most_domains == len(CORRUPTIONS)


def test_the_partition_picture_shows_each_clients_domain(tmp_path):
    from PIL import Image

    from raysim.results.partition_view import (
        BAND,
        DOMAIN_COLOURS,
        LEFT,
        cell_geometry,
        heat_top,
        write_partition,
    )

    data = build_federated_data(synthetic("corrupt:3"), 6, seed=0)
    title = write_partition(data, tmp_path / "partition.png", "dirichlet:0.5", "synthetic")
    assert title.endswith("; 3 feature domains")
    cw, ch = cell_geometry(6, 4)
    top = heat_top(title) + 4 * ch + 2 + BAND // 2  # the middle of the band below the map
    with Image.open(tmp_path / "partition.png") as im:
        pixels = np.asarray(im.convert("RGB"))
    assert data.client_domains is not None
    for c, d in enumerate(data.client_domains):
        assert tuple(pixels[top, LEFT + c * cw + cw // 2]) == DOMAIN_COLOURS[d]
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "partition.parquet")
    assert table.column("domain").to_pylist() == data.client_domains.tolist()


def test_a_rotated_run_learns_and_reports_gtest(tmp_path):
    from raysim.engine.runner import run_experiment
    from tests.conftest import tiny_config

    result = run_experiment(tiny_config(tmp_path, **{"data.feature_shift": "rotate:4", "rounds": 2}))
    assert result.final["gm_gtest"] is not None and 0.0 <= result.final["gm_gtest"] <= 1.0
    assert result.final["gm_ptest"] is not None
