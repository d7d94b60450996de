"""Loading the real datasets from their own formats, and the synthetic one (data/datasets.py)."""

from __future__ import annotations

import gzip
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from raysim.config import DataConfig, SyntheticConfig
from raysim.data import ArrayDataset, datasets, load_dataset
from raysim.data.datasets import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    FMNIST_MEAN,
    FMNIST_STD,
    normalise_images,
    read_idx,
)
from raysim.errors import ConfigError

from .cifar_fixture import write_cifar10, write_cifar100


def reference_normalise(images: np.ndarray, mean, std) -> np.ndarray:
    """``(v / 255 - mean_c) / std_c`` in float64, rounded to float32 once: the values images had when
    they were normalised at load time."""
    shape = (len(mean),) + (1,) * (images.ndim - 2)
    m, s = np.array(mean).reshape(shape), np.array(std).reshape(shape)
    return ((images / 255.0 - m) / s).astype(np.float32)


def assert_fresh_float(a: np.ndarray) -> None:
    assert a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable and a.flags.owndata


def assert_one_sentence(message: str) -> None:
    assert message.endswith(".")
    assert ". " not in message and "\n" not in message


def write_idx(path: Path, array: np.ndarray, code: int, compress: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    body = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(body))
    else:
        path.write_bytes(body)


def write_fmnist(folder: Path, n_train: int = 12, n_test: int = 5, compress: bool = True):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, 0x08, compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, 0x08, compress)
        arrays[prefix] = (images, labels)
    return arrays


@pytest.fixture
def no_debian_fmnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "DEBIAN_FMNIST_DIR", tmp_path / "no-debian")


# --------------------------------------------------------------------------------------------------
# idx files and Fashion-MNIST


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize(
    ("dtype", "code"), [(np.uint8, 0x08), (np.int16, 0x0B), (np.int32, 0x0C), (np.float32, 0x0D)]
)
def test_read_idx(tmp_path: Path, compress: bool, dtype: type, code: int) -> None:
    array: np.ndarray = (np.arange(2 * 3 * 4) * 7 % 101).reshape(2, 3, 4).astype(dtype)
    write_idx(tmp_path / "x-idx3", array, code, compress)
    got = read_idx(tmp_path / ("x-idx3.gz" if compress else "x-idx3"))
    assert got.dtype == np.dtype(dtype) and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, array)


def test_read_idx_keeps_gzipped_files_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gzipped idx file is decoded once; its next reads load the decoded copy, until it changes."""
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    array = np.arange(60, dtype=np.uint8).reshape(3, 4, 5)
    write_idx(tmp_path / "x-idx3", array, 0x08, True)
    np.testing.assert_array_equal(read_idx(tmp_path / "x-idx3.gz"), array)
    (copy,) = (tmp_path / "cache" / "idx").iterdir()
    np.testing.assert_array_equal(np.load(copy), array)
    np.save(copy, array + 1)  # what is in the cache is what the next read returns
    np.testing.assert_array_equal(read_idx(tmp_path / "x-idx3.gz"), array + 1)
    time.sleep(0.01)
    write_idx(tmp_path / "x-idx3", array[:2], 0x08, True)  # a changed file is decoded anew
    np.testing.assert_array_equal(read_idx(tmp_path / "x-idx3.gz"), array[:2])
    write_idx(tmp_path / "y-idx3", array, 0x08, False)  # a plain file needs no copy
    read_idx(tmp_path / "y-idx3")
    assert len(list((tmp_path / "cache" / "idx").iterdir())) == 2
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "file"))  # no cache can be written there
    np.testing.assert_array_equal(read_idx(tmp_path / "x-idx3.gz"), array[:2])


def test_read_idx_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"\x12\x34\x08\x01abcd")
    with pytest.raises(ConfigError, match="not an idx file"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((5, 5), np.uint8), 0x08, False)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-3])
    with pytest.raises(ConfigError, match="truncated"):
        read_idx(tmp_path / "short")


@pytest.mark.parametrize(("layout", "compress"), [("", True), ("", False), ("FashionMNIST/raw", True)])
def test_fmnist_from_data_dir(tmp_path: Path, layout: str, compress: bool, no_debian_fmnist) -> None:
    arrays = write_fmnist(tmp_path / layout, compress=compress)
    train, test = load_dataset(DataConfig(dataset="fmnist", data_dir=str(tmp_path), download=False), 0)
    assert (len(train), len(test)) == (12, 5)
    assert train.input_shape == (1, 28, 28) and train.num_classes == 10 and train.name == "fmnist"
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64 and train.x.flags.c_contiguous
    assert (train.mean, train.std) == (test.mean, test.std) == (FMNIST_MEAN, FMNIST_STD)
    images, labels = arrays["train"]
    np.testing.assert_array_equal(train.x[:, 0], images)
    np.testing.assert_array_equal(train.y, labels)
    features = train.features()
    assert_fresh_float(features)
    expected = (images[:, None] / 255.0 - FMNIST_MEAN[0]) / FMNIST_STD[0]
    np.testing.assert_allclose(features, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(features, expected.astype(np.float32))  # rounded once, as before
    np.testing.assert_array_equal(test.y, arrays["t10k"][1])


@pytest.mark.skipif(
    not datasets.DEBIAN_FMNIST_DIR.is_dir(),
    reason="Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist "
    "(Debian package dataset-fashion-mnist)",
)
def test_fmnist_from_debian(tmp_path: Path) -> None:
    train, test = load_dataset(DataConfig(dataset="fmnist", data_dir=str(tmp_path), download=False), 0)
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.x.dtype == test.x.dtype == np.uint8  # raw images: a quarter of float32's memory
    assert train.x.nbytes == 60000 * 784 and test.x.nbytes == 10000 * 784
    assert train.num_classes == 10
    np.testing.assert_array_equal(np.bincount(train.y), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(test.y), [1000] * 10)
    features = train.features()
    assert features.shape == (60000, 1, 28, 28) and features.dtype == np.float32
    assert abs(float(features.mean())) < 0.01 and abs(float(features.std()) - 1.0) < 0.01
    assert float(features.min()) == pytest.approx(-FMNIST_MEAN[0] / FMNIST_STD[0], rel=1e-5)
    idx = np.random.default_rng(0).choice(60000, 3000, replace=False)
    np.testing.assert_array_equal(
        train.features(idx), reference_normalise(train.x[idx], FMNIST_MEAN, FMNIST_STD)
    )


def test_fmnist_missing_raises_one_sentence(tmp_path: Path, no_debian_fmnist) -> None:
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(dataset="fmnist", data_dir=str(tmp_path), download=False), 0)
    message = str(err.value)
    assert_one_sentence(message)
    assert "Fashion-MNIST" in message and str(tmp_path) in message and "no-debian" in message


def test_fmnist_download_failure_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_debian_fmnist
) -> None:
    import torchvision

    def offline(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz. Network is unreachable.")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(dataset="fmnist", data_dir=str(tmp_path), download=True), 0)
    assert_one_sentence(str(err.value))
    assert "download failed" in str(err.value) and "Network is unreachable" in str(err.value)


def test_fmnist_download_is_read_from_torchvisions_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_debian_fmnist
) -> None:
    import torchvision

    calls = []

    def fake_download(root: str, train: bool, download: bool) -> None:
        calls.append((root, train, download))
        if len(calls) == 1:
            write_fmnist(Path(root) / "FashionMNIST" / "raw", compress=False)

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", fake_download)
    train, _ = load_dataset(DataConfig(dataset="fmnist", data_dir=str(tmp_path)), 0)
    assert len(train) == 12 and calls[0] == (str(tmp_path), True, True)


# --------------------------------------------------------------------------------------------------
# CIFAR


@pytest.mark.parametrize(
    ("name", "writer", "classes", "mean", "std", "n_train"),
    [
        ("cifar10", write_cifar10, 10, CIFAR10_MEAN, CIFAR10_STD, 40),
        ("cifar100", write_cifar100, 100, CIFAR100_MEAN, CIFAR100_STD, 30),
    ],
)
def test_cifar_from_pickles(tmp_path: Path, name, writer, classes, mean, std, n_train) -> None:
    train_data, train_labels, test_data, test_labels = writer(tmp_path)
    train, test = load_dataset(DataConfig(dataset=name, data_dir=str(tmp_path), download=False), 0)
    assert train.x.shape == (n_train, 3, 32, 32) and test.x.shape == (10, 3, 32, 32)
    assert train.num_classes == classes and train.name == name
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64 and train.x.flags.c_contiguous
    assert train.x.nbytes == n_train * 3072
    assert (train.mean, train.std) == (test.mean, test.std) == (mean, std)
    np.testing.assert_array_equal(train.y, train_labels)
    np.testing.assert_array_equal(test.y, test_labels)
    # CIFAR rows are the R, G, B planes of 32x32, one after another
    np.testing.assert_array_equal(train.x, train_data.reshape(-1, 3, 32, 32))
    planes = train_data.reshape(-1, 3, 32, 32) / 255.0
    expected = (planes - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    features = train.features()
    assert_fresh_float(features)
    np.testing.assert_allclose(features, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(features, expected.astype(np.float32))  # rounded once, as before
    one = train.features(np.array([3]))
    assert one.shape == (1, 3, 32, 32)
    assert one[0, 1, 5, 7] == pytest.approx((train_data[3, 1024 + 5 * 32 + 7] / 255 - mean[1]) / std[1])


@pytest.mark.parametrize(("name", "title"), [("cifar10", "CIFAR-10"), ("cifar100", "CIFAR-100")])
def test_cifar_missing_raises_one_sentence(tmp_path: Path, name: str, title: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(dataset=name, data_dir=str(tmp_path), download=False), 0)
    assert_one_sentence(str(err.value))
    assert title in str(err.value) and str(tmp_path) in str(err.value)


def test_cifar_download_failure_and_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(ConfigError) as err:
        load_dataset(DataConfig(dataset="cifar10", data_dir=str(tmp_path), download=True), 0)
    assert_one_sentence(str(err.value))
    assert "download failed" in str(err.value)

    def fake_download(root: str, train: bool, download: bool) -> None:
        write_cifar10(Path(root))

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", fake_download)
    train, test = load_dataset(DataConfig(dataset="cifar10", data_dir=str(tmp_path)), 0)
    assert (len(train), len(test)) == (40, 10)


# --------------------------------------------------------------------------------------------------
# synthetic and the rest


def test_synthetic_is_deterministic_per_seed() -> None:
    cfg = DataConfig(dataset="synthetic", synthetic=SyntheticConfig(300, 100, 4, (1, 6, 6), 1.0))
    a_train, a_test = load_dataset(cfg, 3)
    b_train, b_test = load_dataset(cfg, 3)
    c_train, _ = load_dataset(cfg, 4)
    np.testing.assert_array_equal(a_train.features(), b_train.features())
    np.testing.assert_array_equal(a_test.y, b_test.y)
    assert not np.array_equal(a_train.features(), c_train.features())
    assert a_train.x.shape == (300, 1, 6, 6) and a_test.x.shape == (100, 1, 6, 6)
    assert a_train.x.dtype == np.float32 and a_train.y.dtype == np.int64
    assert a_train.mean is None and a_train.std is None
    np.testing.assert_array_equal(a_train.features(), a_train.x)  # features are used as they are
    assert a_train.name == "synthetic" and a_train.num_classes == 4
    assert set(np.unique(a_train.y)) == {0, 1, 2, 3}


def test_synthetic_train_and_test_share_class_means() -> None:
    cfg = DataConfig(dataset="synthetic", synthetic=SyntheticConfig(2000, 500, 5, (2, 4, 4), 2.0))
    train, test = load_dataset(cfg, 0)
    flat_train = train.features().reshape(len(train), -1)
    flat_test = test.features().reshape(len(test), -1)
    centroids = np.stack([flat_train[train.y == c].mean(axis=0) for c in range(5)])
    nearest = np.argmin(((flat_test[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (nearest == test.y).mean() > 0.95


def test_synthetic_rejects_nonsense() -> None:
    with pytest.raises(ConfigError):
        load_dataset(DataConfig(dataset="synthetic", synthetic=SyntheticConfig(0, 10)), 0)


def test_unknown_dataset() -> None:
    with pytest.raises(ConfigError, match="Unknown dataset"):
        load_dataset(DataConfig(dataset="imagenet_21k"), 0)


def test_array_dataset_basics() -> None:
    ds = ArrayDataset(np.zeros((3, 2, 5), np.float64), np.array([0, 1, 1]), 2, "t")
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    assert ds.input_shape == (2, 5) and len(ds) == 3
    assert ds.mean is None and ds.std is None
    with pytest.raises(ValueError):
        ArrayDataset(np.zeros((3, 2)), np.array([0, 1, 2]), 2, "t")


def test_array_dataset_normalisation_belongs_to_uint8_images() -> None:
    y = np.array([0, 1, 1])
    images = np.zeros((3, 2, 4, 4), np.uint8)
    ds = ArrayDataset(images, y, 2, "t", [0.5, 0.25], np.array([0.5, 2.0]))  # type: ignore[arg-type]  # coerced
    assert ds.x.dtype == np.uint8 and ds.input_shape == (2, 4, 4)
    assert ds.mean == (0.5, 0.25) and ds.std == (0.5, 2.0)  # stored as tuples of floats
    with pytest.raises(ValueError, match="need a per-channel mean and std"):
        ArrayDataset(images, y, 2, "t")
    with pytest.raises(ValueError, match="need a per-channel mean and std"):
        ArrayDataset(images, y, 2, "t", mean=(0.5, 0.5))
    with pytest.raises(ValueError, match="one mean and std per channel"):
        ArrayDataset(images, y, 2, "t", (0.5,), (0.5,))
    with pytest.raises(ValueError, match="std > 0"):
        ArrayDataset(images, y, 2, "t", (0.5, 0.5), (0.5, 0.0))
    for dtype in (np.float32, np.float64, np.int64):
        with pytest.raises(ValueError, match="uint8 images only"):
            ArrayDataset(np.zeros((3, 2, 4, 4), dtype), y, 2, "t", (0.5, 0.5), (0.5, 0.5))
        with pytest.raises(ValueError, match="uint8 images only"):
            ArrayDataset(np.zeros((3, 2, 4, 4), dtype), y, 2, "t", std=(0.5, 0.5))


def old_normalise_images(images: np.ndarray, mean, std) -> np.ndarray:
    """normalise_images as it was when loaders normalised at load time: one table per channel."""
    out = np.empty(images.shape, dtype=np.float32)
    levels = np.arange(256, dtype=np.float64) / 255.0
    for c, (m, s) in enumerate(zip(mean, std, strict=True)):
        table = ((levels - m) / s).astype(np.float32)
        np.take(table, images[:, c], out=out[:, c], mode="clip")
    return out


@pytest.mark.parametrize("chunk", [1 << 16, 100, 1])
@pytest.mark.parametrize(
    ("shape", "mean", "std"),
    [
        ((37, 1, 28, 28), FMNIST_MEAN, FMNIST_STD),
        ((29, 3, 32, 32), CIFAR10_MEAN, CIFAR10_STD),
        ((5, 3), CIFAR100_MEAN, CIFAR100_STD),
    ],
)
def test_normalise_images_is_bit_identical(monkeypatch: pytest.MonkeyPatch, chunk, shape, mean, std) -> None:
    monkeypatch.setattr(datasets, "_NORMALISE_CHUNK", chunk)  # one step, several, one sample each
    images = np.random.default_rng(1).integers(0, 256, size=shape, dtype=np.uint8)
    images.flat[:256] = np.arange(256)  # every level
    got = normalise_images(images, mean, std)
    assert_fresh_float(got)
    np.testing.assert_array_equal(got, old_normalise_images(images, mean, std))
    np.testing.assert_array_equal(got, reference_normalise(images, mean, std))
    strided = images[::2]  # not contiguous
    np.testing.assert_array_equal(
        normalise_images(strided, mean, std), reference_normalise(strided, mean, std)
    )
    assert normalise_images(images[:0], mean, std).shape == (0,) + shape[1:]
    with pytest.raises(ValueError):
        normalise_images(images, mean + mean, std + std)
    with pytest.raises(ValueError):
        normalise_images(images.astype(np.float32), mean, std)


def image_dataset(n: int = 50, read_only: bool = False) -> ArrayDataset:
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(n, 3, 8, 8), dtype=np.uint8)
    if read_only:  # as x is in Ray's object store
        images.setflags(write=False)
    return ArrayDataset(images, rng.integers(0, 10, size=n), 10, "img", CIFAR10_MEAN, CIFAR10_STD)


def float_dataset(n: int = 50, read_only: bool = False) -> ArrayDataset:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 2, 3, 3), dtype=np.float32)
    if read_only:
        x.setflags(write=False)
    return ArrayDataset(x, rng.integers(0, 10, size=n), 10, "float")


def indices(n: int) -> list:
    rng = np.random.default_rng(4)
    mask = rng.random(n) < 0.5
    return [
        None,
        np.array([3]),
        np.sort(rng.choice(n, 20, replace=False)),
        rng.permutation(n)[:30],  # unsorted, as it comes
        np.array([7, 7, 0]),
        np.array([], dtype=np.int64),
        mask,
        slice(5, 25),
        slice(None, None, 3),
    ]


@pytest.mark.parametrize("read_only", [False, True])
def test_features_of_images(read_only: bool) -> None:
    ds = image_dataset(read_only=read_only)
    for idx in indices(len(ds)):
        sub = ds.x if idx is None else ds.x[idx]
        got = ds.features(idx)
        assert_fresh_float(got)
        assert got.shape == sub.shape and not np.shares_memory(got, ds.x)
        assert ds.mean is not None and ds.std is not None
        np.testing.assert_array_equal(got, normalise_images(sub, ds.mean, ds.std))
        np.testing.assert_array_equal(got, reference_normalise(sub, ds.mean, ds.std))
        got += 1  # writable, and x is untouched
    np.testing.assert_array_equal(ds.x, image_dataset().x)


@pytest.mark.parametrize("read_only", [False, True])
def test_features_of_float_data(read_only: bool) -> None:
    ds = float_dataset(read_only=read_only)
    for idx in indices(len(ds)):
        sub = ds.x if idx is None else ds.x[idx]
        got = ds.features(idx)
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.flags.writeable
        assert got.shape == sub.shape and not np.shares_memory(got, ds.x)
        np.testing.assert_array_equal(got, sub)
        got += 1
    np.testing.assert_array_equal(ds.x, float_dataset().x)


@pytest.mark.parametrize("make", [image_dataset, float_dataset])
def test_features_wants_sample_indices(make) -> None:
    ds = make()
    for idx in (3, np.int64(3), np.array(3)):
        with pytest.raises(IndexError, match="index array or a slice"):
            ds.features(idx)
    with pytest.raises(IndexError):
        ds.features(np.array([len(ds)]))


def test_features_of_a_large_clients_slice_of_cifar_sized_data() -> None:
    """A 4,000-sample client of a CIFAR-sized set gets its images normalised per channel, as float32
    and its own array (its time is scripts/bench/data_prep.py's)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(60000, 3, 32, 32), dtype=np.uint8)
    ds = ArrayDataset(x, rng.integers(0, 10, size=60000), 10, "cifar-like", CIFAR10_MEAN, CIFAR10_STD)
    idx = np.sort(rng.choice(60000, 4000, replace=False))  # a big client's samples
    got = ds.features(idx)
    assert got.shape == (4000, 3, 32, 32) and got.dtype == np.float32 and not np.may_share_memory(got, x)
    mean = np.asarray(CIFAR10_MEAN, np.float64).reshape(1, 3, 1, 1)
    std = np.asarray(CIFAR10_STD, np.float64).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(got, (x[idx] / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)
