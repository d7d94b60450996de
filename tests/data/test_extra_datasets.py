"""MNIST, EMNIST, SVHN, CINIC-10 and Tiny ImageNet from their own formats (data/extra_datasets.py).

Every test writes a tiny fixture of random pixels in the dataset's real file format under tmp_path
(idx files, a MATLAB .mat, folders of PNG or JPEG images) and checks what the loader reads back.
"""

from __future__ import annotations

import gzip
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from raysim.config import DataConfig
from raysim.data import extra_datasets as extra
from raysim.errors import ConfigError


def assert_one_sentence(message: str) -> None:
    assert message.endswith(".")
    assert ". " not in message and "\n" not in message


def fake_torchvision(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A stand-in ``torchvision`` module (importing the real one takes seconds): set its
    ``datasets.MNIST`` etc. to what a download should do."""
    datasets = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "torchvision", types.SimpleNamespace(datasets=datasets))
    return datasets


def config(tmp_path: Path, download: bool = False) -> DataConfig:
    return DataConfig(data_dir=str(tmp_path), download=download)


def one_sentence_error(load, tmp_path: Path, download: bool = False) -> str:
    with pytest.raises(ConfigError) as err:
        load(config(tmp_path, download), 0)
    message = str(err.value)
    assert_one_sentence(message)
    return message


# --------------------------------------------------------------------------------------------------
# fixtures in each dataset's format


def write_idx(path: Path, array: np.ndarray, compress: bool) -> Path:
    """An idx file of uint8 ``array``: magic 0, 0, 0x08 (unsigned byte), ndim; big-endian u32 sizes."""
    body = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    body += np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(body))
    else:
        path.write_bytes(body)
    return path


def write_idx_set(
    folder: Path, prefix: dict[str, str], classes: int, sizes=(9, 4), compress: bool = False, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Four idx files named ``{prefix[part]}-images-idx3-ubyte`` / ``-labels-idx1-ubyte``; returns the
    (images (n, 28, 28) as stored, labels) of each part."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for part, n in zip(("train", "test"), sizes, strict=True):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, classes, size=n).astype(np.uint8)
        labels[:2] = (0, classes - 1)  # both ends of the label range
        write_idx(folder / f"{prefix[part]}-images-idx3-ubyte", images, compress)
        write_idx(folder / f"{prefix[part]}-labels-idx1-ubyte", labels, compress)
        written[part] = (images, labels)
    return written


MNIST_PREFIX = {"train": "train", "test": "t10k"}
EMNIST_PREFIX = {"train": "emnist-byclass-train", "test": "emnist-byclass-test"}


def write_svhn(folder: Path, sizes=(7, 3), seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``train_32x32.mat`` and ``test_32x32.mat``: X uint8 (32, 32, 3, n), y uint8 (n, 1) in 1..10, 10
    for the digit 0. Returns (X, y) of each as written."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for part, n in zip(("train", "test"), sizes, strict=True):
        x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
        y = rng.integers(1, 11, size=(n, 1)).astype(np.uint8)
        y[:2, 0] = (10, 1)
        scipy.io.savemat(folder / f"{part}_32x32.mat", {"X": x, "y": y})
        written[part] = (x, y)
    return written


def write_png(path: Path, pixels: np.ndarray) -> None:
    """``pixels`` (H, W, 3) RGB or (H, W) greyscale."""
    Image.fromarray(pixels, "RGB" if pixels.ndim == 3 else "L").save(path)


def write_cinic(folder: Path, per_class=(2, 1), seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``train/<class>/*.png`` and ``test/<class>/*.png`` (and an empty ``valid``); the first train
    image is greyscale. Returns (images (n, 3, 32, 32) in the loader's order, labels) of each split."""
    rng = np.random.default_rng(seed)
    written = {}
    for part, k in zip(("train", "test"), per_class, strict=True):
        images, labels = [], []
        for label, cls in enumerate(extra.CINIC10_CLASSES):
            (folder / part / cls).mkdir(parents=True)
            for j in range(k):
                if part == "train" and label == 0 and j == 0:
                    grey = rng.integers(0, 256, size=(32, 32), dtype=np.uint8)
                    write_png(folder / part / cls / f"fixture-{j}.png", grey)
                    images.append(np.repeat(grey[None], 3, axis=0))
                else:
                    rgb = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                    write_png(folder / part / cls / f"fixture-{j}.png", rgb)
                    images.append(rgb.transpose(2, 0, 1))
                labels.append(label)
        written[part] = (np.stack(images), np.array(labels))
    (folder / "valid" / "airplane").mkdir(parents=True)
    write_png(folder / "valid" / "airplane" / "fixture-0.png", np.zeros((32, 32, 3), np.uint8))
    return written


def smooth_image(rng: np.random.Generator, size: int = 64) -> np.ndarray:
    """A random colour gradient (H, W, 3): JPEG keeps it within a few levels, unlike noise."""
    ramp = np.linspace(0.0, 1.0, size)
    a, b, c = rng.uniform(20, 235, size=3), rng.uniform(-20, 20, size=3), rng.uniform(-20, 20, size=3)
    image = a + b * ramp[:, None, None] + c * ramp[None, :, None]
    return np.clip(image, 0, 255).astype(np.uint8)


def write_tiny(folder: Path, n_val: int = 5, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, list]]:
    """``wnids.txt`` (200 made-up ids), ``train/<wnid>/images/*.JPEG`` (one per class, class 1's
    greyscale) and ``val/images/*.JPEG`` with ``val/val_annotations.txt``. Returns (images
    (n, 3, 64, 64) as encoded, labels, paths) of train and val, in the loader's order."""
    rng = np.random.default_rng(seed)
    wnids = [f"fixture{i:03d}" for i in range(200)]
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (folder / "test" / "images").mkdir(parents=True)  # unlabelled: never read
    images, paths = [], []
    for label, wnid in enumerate(wnids):
        (folder / "train" / wnid / "images").mkdir(parents=True)
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text(f"{wnid}_0.JPEG\t0\t0\t63\t63\n")
        path = folder / "train" / wnid / "images" / f"{wnid}_0.JPEG"
        image = smooth_image(rng)
        if label == 1:
            grey = image[:, :, 0]
            Image.fromarray(grey, "L").save(path, quality=95)
            images.append(np.repeat(grey[None], 3, axis=0))
        else:
            Image.fromarray(image, "RGB").save(path, quality=95)
            images.append(image.transpose(2, 0, 1))
        paths.append(path)
    written = {"train": (np.stack(images), np.arange(200), paths)}
    (folder / "val" / "images").mkdir(parents=True)
    labels = rng.integers(0, 200, size=n_val)
    images, paths, lines = [], [], []
    for i, label in enumerate(labels):
        image = smooth_image(rng)
        path = folder / "val" / "images" / f"val_{i}.JPEG"
        Image.fromarray(image, "RGB").save(path, quality=95)
        images.append(image.transpose(2, 0, 1))
        paths.append(path)
        lines.append(f"val_{i}.JPEG\t{wnids[label]}\t1\t2\t60\t61")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    written["val"] = (np.stack(images), labels, paths)
    return written


def decoded(path: Path) -> np.ndarray:
    """What Pillow decodes from ``path``, as (3, H, W) RGB."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).transpose(2, 0, 1)


def check_dataset(ds, n: int, shape: tuple, classes: int, name: str, mean, std) -> None:
    assert len(ds) == n and ds.input_shape == shape
    assert ds.x.dtype == np.uint8 and ds.x.flags.c_contiguous and ds.y.dtype == np.int64
    assert ds.num_classes == classes and ds.name == name
    assert (ds.mean, ds.std) == (mean, std)
    assert len(mean) == len(std) == shape[0]


# --------------------------------------------------------------------------------------------------
# MNIST and EMNIST


@pytest.mark.parametrize(("layout", "compress"), [("", False), ("", True), ("MNIST/raw", True)])
def test_mnist_from_idx_files(tmp_path: Path, layout: str, compress: bool) -> None:
    written = write_idx_set(tmp_path / layout, MNIST_PREFIX, 10, compress=compress)
    train, test = extra.mnist(config(tmp_path), 0)
    for ds, part, n in ((train, "train", 9), (test, "test", 4)):
        check_dataset(ds, n, (1, 28, 28), 10, "mnist", extra.MNIST_MEAN, extra.MNIST_STD)
        images, labels = written[part]
        np.testing.assert_array_equal(ds.x[:, 0], images)
        np.testing.assert_array_equal(ds.y, labels)
    features = train.features(np.array([1]))
    expected = (written["train"][0][1] / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(features[0, 0], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("layout", "compress"), [("EMNIST/raw", False), ("", True)])
def test_emnist_byclass_is_turned_upright(tmp_path: Path, layout: str, compress: bool) -> None:
    written = write_idx_set(tmp_path / layout, EMNIST_PREFIX, 62, sizes=(6, 3), compress=compress)
    train, test = extra.load_emnist(str(tmp_path), download=False)
    for ds, part, n in ((train, "train", 6), (test, "test", 3)):
        check_dataset(ds, n, (1, 28, 28), 62, "emnist", extra.EMNIST_MEAN, extra.EMNIST_STD)
        stored, labels = written[part]
        np.testing.assert_array_equal(ds.x[:, 0], stored.transpose(0, 2, 1))  # EMNIST stores them transposed
        np.testing.assert_array_equal(ds.y, labels)
    assert train.y.max() == 61


@pytest.mark.parametrize(("load", "title"), [(extra.mnist, "MNIST"), (extra.emnist, "EMNIST")])
def test_idx_datasets_missing(tmp_path: Path, load, title: str) -> None:
    message = one_sentence_error(load, tmp_path)
    assert title in message and str(tmp_path) in message and "download was off" in message


def test_mnist_refuses_corrupt_idx_files(tmp_path: Path) -> None:
    write_idx_set(tmp_path, MNIST_PREFIX, 10)
    images = tmp_path / "t10k-images-idx3-ubyte"
    original = images.read_bytes()

    images.write_bytes(original[:-5])  # truncated
    message = one_sentence_error(extra.mnist, tmp_path)
    assert "truncated" in message and str(images) in message

    images.write_bytes(b"\x12\x34" + original[2:])  # bad magic
    assert "not an idx file" in one_sentence_error(extra.mnist, tmp_path)

    write_idx(images, np.zeros((4, 28, 27), np.uint8), compress=False)  # wrong image size
    assert "not uint8 28x28 images" in one_sentence_error(extra.mnist, tmp_path)

    images.write_bytes(original)
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    write_idx(labels, np.zeros(3, np.uint8), compress=False)  # 3 labels for 4 images
    message = one_sentence_error(extra.mnist, tmp_path)
    assert "3 labels for 4 images" in message and str(labels) in message

    write_idx(labels, np.array([0, 1, 10, 2], np.uint8), compress=False)
    assert "labels outside 0..9" in one_sentence_error(extra.mnist, tmp_path)

    labels.unlink()
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\0" * 40)[:-6])  # a cut gzip
    assert "cannot be read" in one_sentence_error(extra.mnist, tmp_path)


def test_emnist_refuses_labels_beyond_byclass(tmp_path: Path) -> None:
    write_idx_set(tmp_path, EMNIST_PREFIX, 62)
    write_idx(tmp_path / "emnist-byclass-train-labels-idx1-ubyte", np.full(9, 62, np.uint8), compress=False)
    assert "labels outside 0..61" in one_sentence_error(extra.emnist, tmp_path)


@pytest.mark.parametrize(
    ("load", "tv_name", "folder", "prefix", "classes"),
    [
        (extra.mnist, "MNIST", "MNIST/raw", MNIST_PREFIX, 10),
        (extra.emnist, "EMNIST", "EMNIST/raw", EMNIST_PREFIX, 62),
    ],
)
def test_idx_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load, tv_name, folder, prefix, classes
) -> None:
    datasets = fake_torchvision(monkeypatch)

    def offline(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error downloading gzip.zip. Network is unreachable.")

    setattr(datasets, tv_name, offline)
    message = one_sentence_error(load, tmp_path, download=True)
    assert "download failed" in message and "Network is unreachable" in message

    calls = []

    def fake_download(root: str, train: bool, download: bool, **kwargs: object) -> None:
        calls.append((root, train, download, kwargs))
        if len(calls) == 1:  # torchvision's layout: uncompressed idx files in <root>/<NAME>/raw
            write_idx_set(Path(root) / folder, prefix, classes)

    setattr(datasets, tv_name, fake_download)
    train, test = load(config(tmp_path, download=True), 0)
    assert (len(train), len(test)) == (9, 4)
    assert calls[0][:3] == (str(tmp_path), True, True)
    if tv_name == "EMNIST":
        assert calls[0][3] == {"split": "byclass"}

    setattr(datasets, tv_name, lambda **kwargs: None)  # downloads nothing
    message = one_sentence_error(load, tmp_path / "elsewhere", download=True)
    assert "left no idx files" in message


# --------------------------------------------------------------------------------------------------
# SVHN


@pytest.mark.parametrize("layout", ["", "svhn"])
def test_svhn_from_mat_files(tmp_path: Path, layout: str) -> None:
    written = write_svhn(tmp_path / layout)
    train, test = extra.svhn(config(tmp_path), 0)
    for ds, part, n in ((train, "train", 7), (test, "test", 3)):
        check_dataset(ds, n, (3, 32, 32), 10, "svhn", extra.SVHN_MEAN, extra.SVHN_STD)
        x, y = written[part]
        np.testing.assert_array_equal(ds.x, x.transpose(3, 2, 0, 1))  # (H, W, C, n) -> (n, C, H, W)
        assert ds.x[0, 2, 5, 7] == x[5, 7, 2, 0]  # row 5, column 7, blue
        np.testing.assert_array_equal(ds.y, np.where(y[:, 0] == 10, 0, y[:, 0]))
        assert ds.y[0] == 0 and ds.y[1] == 1  # the file's 10 is the digit 0
        assert ds.y.min() >= 0 and ds.y.max() <= 9


def test_svhn_refuses_wrong_mat_files(tmp_path: Path) -> None:
    write_svhn(tmp_path)
    test_mat = tmp_path / "test_32x32.mat"

    scipy.io.savemat(test_mat, {"X": np.zeros((3, 32, 32, 4), np.uint8), "y": np.ones((4, 1), np.uint8)})
    message = one_sentence_error(extra.svhn, tmp_path)
    assert str(test_mat) in message and "(32, 32, 3, n)" in message

    scipy.io.savemat(test_mat, {"X": np.zeros((32, 32, 3, 4), np.uint8), "y": np.ones((3, 1), np.uint8)})
    assert "one integer label for each of its 4 images" in one_sentence_error(extra.svhn, tmp_path)

    scipy.io.savemat(test_mat, {"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[0], [3]], np.uint8)})
    assert "labels outside 1..10" in one_sentence_error(extra.svhn, tmp_path)

    scipy.io.savemat(test_mat, {"images": np.zeros((32, 32, 3, 2), np.uint8)})
    assert "does not hold the arrays X and y" in one_sentence_error(extra.svhn, tmp_path)

    test_mat.write_bytes(test_mat.read_bytes()[:100])  # truncated
    assert "not a readable MATLAB file" in one_sentence_error(extra.svhn, tmp_path)


def test_svhn_missing_and_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = one_sentence_error(extra.svhn, tmp_path)
    assert "SVHN" in message and str(tmp_path / "svhn") in message and "train_32x32.mat" in message

    datasets = fake_torchvision(monkeypatch)
    calls = []

    def fake_download(root: str, split: str, download: bool) -> None:
        calls.append(split)
        if split == "test":  # torchvision puts each .mat in root itself
            write_svhn(Path(root))

    datasets.SVHN = fake_download
    train, test = extra.svhn(config(tmp_path, download=True), 0)
    assert calls == ["train", "test"] and (len(train), len(test)) == (7, 3)

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("[Errno 101] Network is unreachable")

    datasets.SVHN = offline
    assert "download failed" in one_sentence_error(extra.svhn, tmp_path / "elsewhere", download=True)


# --------------------------------------------------------------------------------------------------
# CINIC-10


@pytest.mark.parametrize("layout", ["cinic10", "CINIC-10", ""])
def test_cinic10_from_png_folders(tmp_path: Path, layout: str) -> None:
    written = write_cinic(tmp_path / layout)
    train, test = extra.cinic10(config(tmp_path), 0)
    for ds, part, n in ((train, "train", 20), (test, "test", 10)):
        check_dataset(ds, n, (3, 32, 32), 10, "cinic10", extra.CINIC10_MEAN, extra.CINIC10_STD)
        images, labels = written[part]
        np.testing.assert_array_equal(ds.x, images)
        np.testing.assert_array_equal(ds.y, labels)
    np.testing.assert_array_equal(train.y[:4], [0, 0, 1, 1])  # sorted classes, airplane first
    assert (train.x[0, 0] == train.x[0, 1]).all() and (train.x[0, 0] == train.x[0, 2]).all()  # grey


def test_cinic10_refuses_wrong_folders(tmp_path: Path) -> None:
    write_cinic(tmp_path / "cinic10")
    cat = tmp_path / "cinic10" / "test" / "cat"

    wrong = cat / "fixture-9.png"
    write_png(wrong, np.zeros((32, 31, 3), np.uint8))  # 31 wide
    message = one_sentence_error(extra.cinic10, tmp_path)
    assert str(wrong) in message and "31x32 pixels, not 32x32" in message

    wrong.write_bytes(b"\x89PNG\r\n\x1a\n not really")  # unreadable
    message = one_sentence_error(extra.cinic10, tmp_path)
    assert str(wrong) in message and "cannot be read" in message
    wrong.unlink()

    (tmp_path / "cinic10" / "test" / "unicorn").mkdir()
    message = one_sentence_error(extra.cinic10, tmp_path)
    assert "unknown class folder 'unicorn'" in message
    (tmp_path / "cinic10" / "test" / "unicorn").rmdir()

    for png in cat.iterdir():
        png.unlink()
    cat.rmdir()
    assert "lacks the class folders cat" in one_sentence_error(extra.cinic10, tmp_path)


def test_cinic10_missing_names_the_download(tmp_path: Path) -> None:
    (tmp_path / "cinic10" / "train").mkdir(parents=True)  # no test folder
    message = one_sentence_error(extra.cinic10, tmp_path, download=True)
    assert "CINIC-10 was not found" in message and extra.CINIC10_URL in message
    assert str(tmp_path / "cinic10") in message


# --------------------------------------------------------------------------------------------------
# Tiny ImageNet


@pytest.mark.parametrize("nested", [True, False])
def test_tinyimagenet_from_jpeg_folders(tmp_path: Path, nested: bool) -> None:
    written = write_tiny(tmp_path / "tiny-imagenet-200" if nested else tmp_path / "data")
    train, test = extra.tinyimagenet(config(tmp_path if nested else tmp_path / "data"), 0)
    mean, std = extra.TINYIMAGENET_MEAN, extra.TINYIMAGENET_STD
    check_dataset(train, 200, (3, 64, 64), 200, "tinyimagenet", mean, std)
    check_dataset(test, 5, (3, 64, 64), 200, "tinyimagenet", mean, std)
    for ds, part in ((train, "train"), (test, "val")):
        images, labels, paths = written[part]
        np.testing.assert_array_equal(ds.y, labels)
        np.testing.assert_array_equal(ds.x, np.stack([decoded(p) for p in paths]))  # Pillow's decoding
        error = np.abs(ds.x.astype(np.int16) - images).mean()
        assert error < 3.0, f"JPEG changed {part}'s pixels by {error:.2f} levels on average"
    grey = train.x[1]  # class 1's image is greyscale: three equal channels
    assert (grey[0] == grey[1]).all() and (grey[0] == grey[2]).all()


def test_tinyimagenet_refuses_wrong_files(tmp_path: Path) -> None:
    root = tmp_path / "tiny-imagenet-200"
    write_tiny(root, n_val=3)
    annotations = root / "val" / "val_annotations.txt"
    lines = annotations.read_text().splitlines()

    annotations.write_text("\n".join(lines[:2]) + "\n")  # val_2.JPEG has no entry
    message = one_sentence_error(extra.tinyimagenet, tmp_path)
    assert str(root / "val" / "images" / "val_2.JPEG") in message and "no entry" in message

    annotations.write_text("\n".join(lines + ["val_9.JPEG\tfixture000\t0\t0\t1\t1"]) + "\n")
    assert "'val_9.JPEG', which is not a JPEG image" in one_sentence_error(extra.tinyimagenet, tmp_path)

    annotations.write_text("\n".join(lines[:2] + ["val_2.JPEG\tunknown0\t0\t0\t1\t1"]) + "\n")
    assert "Line 3" in one_sentence_error(extra.tinyimagenet, tmp_path)
    annotations.write_text("\n".join(lines) + "\n")

    wrong = root / "train" / "fixture007" / "images" / "fixture007_0.JPEG"
    Image.fromarray(np.zeros((64, 32, 3), np.uint8)).save(wrong)
    message = one_sentence_error(extra.tinyimagenet, tmp_path)
    assert str(wrong) in message and "32x64 pixels, not 64x64" in message

    (root / "train" / "intruder").mkdir()
    assert "'intruder', which is not in wnids.txt" in one_sentence_error(extra.tinyimagenet, tmp_path)
    (root / "train" / "intruder").rmdir()

    (root / "wnids.txt").write_text("fixture000\nfixture001\n")
    assert "lists 2 class ids" in one_sentence_error(extra.tinyimagenet, tmp_path)


def test_tinyimagenet_missing_names_the_download(tmp_path: Path) -> None:
    message = one_sentence_error(extra.tinyimagenet, tmp_path, download=True)
    assert "Tiny ImageNet was not found" in message and extra.TINYIMAGENET_URL in message
    assert str(tmp_path / "tiny-imagenet-200") in message
