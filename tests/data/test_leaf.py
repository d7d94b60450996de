"""FEMNIST from LEAF's json files, with each sample's writer (data/leaf.py).

Every test writes a tiny LEAF-format FEMNIST under tmp_path: 5 writers with 3 to 12 samples each,
split per writer into train and test as LEAF's ``-t sample`` does, spread over 2 train and 2 test json
files (the writers grouped differently in the two splits), with random pixels in [0, 1].
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raysim.config import DataConfig
from raysim.data import leaf
from raysim.errors import ConfigError

#: Not in sorted order, so the writer index (sorted ids) differs from the order in the files.
WRITERS = ("f0042_07", "f0001_33", "f1234_00", "f0500_11", "f0003_02")
SORTED = sorted(WRITERS)
#: Which writers each json file holds, in its ``users`` order (files are read sorted by name).
FILES = {
    "train": {
        "all_data_0_niid_1_keep_0_train_9.json": ("f0042_07", "f0001_33", "f1234_00"),
        "all_data_1_niid_1_keep_0_train_9.json": ("f0500_11", "f0003_02"),
    },
    "test": {
        "all_data_0_niid_1_keep_0_test_9.json": ("f0500_11", "f0042_07"),
        "all_data_1_niid_1_keep_0_test_9.json": ("f0003_02", "f1234_00", "f0001_33"),
    },
}

Samples = dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]


def assert_one_sentence(message: str) -> None:
    assert message.endswith(".")
    assert ". " not in message and "\n" not in message


def make_samples(seed: int = 0) -> Samples:
    """Per split and writer: pixels (n, 784) float64 in [0, 1] and labels (n,) in 0..61."""
    rng = np.random.default_rng(seed)
    out: Samples = {"train": {}, "test": {}}
    for writer in WRITERS:
        n = int(rng.integers(3, 13))
        n_train = max(1, int(0.7 * n))
        x = rng.random((n, 784))
        y = rng.integers(0, 62, size=n)
        out["train"][writer] = (x[:n_train], y[:n_train])
        out["test"][writer] = (x[n_train:], y[n_train:])
    return out


def leaf_json(writers: tuple[str, ...], samples: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """One LEAF json object, with the extras LEAF writes: hierarchies, and an empty user_data entry
    for a writer its sample split dropped."""
    user_data = {w: {"x": samples[w][0].tolist(), "y": samples[w][1].tolist()} for w in writers}
    user_data["f9999_99"] = {"x": [], "y": []}
    return {
        "users": list(writers),
        "hierarchies": [w[:5] for w in writers],
        "num_samples": [len(samples[w][1]) for w in writers],
        "user_data": user_data,
    }


def write_leaf(base: Path, samples: Samples | None = None) -> Samples:
    """LEAF's ``train`` and ``test`` folders of json files in ``base``."""
    samples = samples or make_samples()
    for split, files in FILES.items():
        (base / split).mkdir(parents=True, exist_ok=True)
        for name, writers in files.items():
            (base / split / name).write_text(json.dumps(leaf_json(writers, samples[split])))
    return samples


def expected(samples: Samples, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixels, labels and writer index of ``split`` in the loader's order: files by name, writers in
    each file's ``users`` order."""
    order = [w for name in sorted(FILES[split]) for w in FILES[split][name]]
    x = np.concatenate([samples[split][w][0] for w in order])
    y = np.concatenate([samples[split][w][1] for w in order])
    groups = np.concatenate([np.full(len(samples[split][w][1]), SORTED.index(w)) for w in order])
    return x, y, groups


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def load_error(tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        leaf.load_femnist(str(tmp_path))
    message = str(err.value)
    assert_one_sentence(message)
    return message


TRAIN_0 = "all_data_0_niid_1_keep_0_train_9.json"
TEST_1 = "all_data_1_niid_1_keep_0_test_9.json"


# --------------------------------------------------------------------------------------------------
# reading


def test_femnist_reads_leaf_files_with_their_writers(tmp_path):
    samples = write_leaf(tmp_path / "femnist" / "data")
    train, test = leaf.femnist(DataConfig(dataset="femnist", data_dir=str(tmp_path)), 0)
    for ds, split in ((train, "train"), (test, "test")):
        x, y, groups = expected(samples, split)
        assert ds.name == "femnist" and ds.num_classes == leaf.FEMNIST_CLASSES == 62
        assert ds.x.dtype == np.uint8 and ds.x.shape == (len(y), 1, 28, 28) and ds.input_shape == (1, 28, 28)
        # within rounding: float32 parsing may move a value sitting on a .5 boundary by one level
        reference = np.rint(x * 255).reshape(-1, 1, 28, 28)
        diff = np.abs(ds.x.astype(np.int64) - reference)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.999
        assert ds.y.dtype == np.int64 and np.array_equal(ds.y, y)
        assert ds.groups is not None and ds.groups.dtype == np.int64
        assert np.array_equal(ds.groups, groups)
    assert train.num_groups == test.num_groups == 5
    # the same writer has the same id in both splits, and the ids follow the sorted writer ids
    for i, writer in enumerate(SORTED):
        assert np.array_equal(train.y[train.groups == i], samples["train"][writer][1])
        assert np.array_equal(test.y[test.groups == i], samples["test"][writer][1])


def test_femnist_normalises_with_the_training_pixels_statistics(tmp_path):
    write_leaf(tmp_path)
    train, test = leaf.load_femnist(str(tmp_path))
    pixels = train.x / 255.0  # float64
    assert train.mean == pytest.approx((pixels.mean(),), rel=1e-12)
    assert train.std == pytest.approx((pixels.std(),), rel=1e-12)
    assert test.mean == train.mean and test.std == train.std
    features = test.features(np.arange(3))
    assert features == pytest.approx((test.x[:3] / 255.0 - train.mean[0]) / train.std[0], abs=1e-5)


def test_femnist_keeps_leaf_values_exactly_and_clips(tmp_path):
    samples = make_samples()
    levels = np.arange(784) % 256
    x, y = samples["train"]["f0001_33"]
    x = x.copy()
    x[0] = levels / 255.0  # LEAF's values are k / 255
    x[1, :2] = (-0.25, 1.5)  # outside 0..1: clipped
    samples["train"]["f0001_33"] = (x, y)
    write_leaf(tmp_path, samples)
    train, _ = leaf.load_femnist(str(tmp_path))
    images = train.x[train.groups == SORTED.index("f0001_33")]
    assert np.array_equal(images[0].reshape(-1), levels)  # not inverted, not rescaled
    assert images[1].reshape(-1)[:2].tolist() == [0, 255]


@pytest.mark.parametrize("sub", ["femnist/data", "data", "."])
def test_femnist_looks_in_three_places(tmp_path, sub):
    write_leaf(tmp_path / sub)
    train, test = leaf.load_femnist(str(tmp_path))
    assert train.num_groups == 5 and len(test) > 0


def test_femnist_prefers_femnist_data(tmp_path):
    write_leaf(tmp_path / "femnist" / "data")
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()  # data_dir's own train and test (another dataset's) come last
    train, _ = leaf.load_femnist(str(tmp_path))
    assert train.num_groups == 5


# --------------------------------------------------------------------------------------------------
# refusals, one sentence naming the file


def test_femnist_missing_says_how_to_make_it(tmp_path):
    message = load_error(tmp_path)
    for place in (tmp_path / "femnist" / "data", tmp_path / "data", tmp_path):
        assert str(place) in message
    assert "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample" in message and "leaf/data/femnist" in message
    assert "https://github.com/TalwalkarLab/leaf" in message and "--data-dir" in message


def test_femnist_folder_without_json_files(tmp_path):
    write_leaf(tmp_path)
    for path in (tmp_path / "test").iterdir():
        path.unlink()
    assert str(tmp_path / "test") in load_error(tmp_path)


def test_femnist_refuses_a_file_that_is_not_json(tmp_path):
    write_leaf(tmp_path)
    bad = tmp_path / "train" / TRAIN_0
    bad.write_text('{"users": [')
    message = load_error(tmp_path)
    assert str(bad) in message and "JSON" in message


def test_femnist_refuses_a_file_without_users_or_user_data(tmp_path):
    write_leaf(tmp_path)
    bad = tmp_path / "train" / TRAIN_0
    edit(bad, lambda d: d.pop("user_data"))
    message = load_error(tmp_path)
    assert str(bad) in message and "user_data" in message
    bad.write_text("[1, 2]")
    assert "users" in load_error(tmp_path)


@pytest.mark.parametrize("all_images", [False, True])
def test_femnist_refuses_images_of_783_values(tmp_path, all_images):
    write_leaf(tmp_path)
    bad = tmp_path / "train" / TRAIN_0

    def shorten(d):
        images = d["user_data"]["f0001_33"]["x"]
        for image in images if all_images else images[:1]:
            image.pop()

    edit(bad, shorten)
    message = load_error(tmp_path)
    assert str(bad) in message and "f0001_33" in message and "784" in message and "783" in message


def test_femnist_refuses_x_and_y_of_different_lengths(tmp_path):
    write_leaf(tmp_path)
    bad = tmp_path / "test" / TEST_1
    edit(bad, lambda d: d["user_data"]["f1234_00"]["y"].append(3))
    message = load_error(tmp_path)
    assert str(bad) in message and "f1234_00" in message


def test_femnist_refuses_label_62(tmp_path):
    write_leaf(tmp_path)
    bad = tmp_path / "test" / TEST_1
    edit(bad, lambda d: d["user_data"]["f0003_02"]["y"].__setitem__(0, 62))
    message = load_error(tmp_path)
    assert str(bad) in message and "0..61" in message


def test_femnist_refuses_num_samples_disagreeing(tmp_path):
    write_leaf(tmp_path)
    bad = tmp_path / "train" / TRAIN_0
    edit(bad, lambda d: d["num_samples"].__setitem__(1, d["num_samples"][1] + 1))
    message = load_error(tmp_path)
    assert str(bad) in message and "num_samples" in message and "f0001_33" in message


def test_femnist_refuses_a_test_only_writer(tmp_path):
    samples = write_leaf(tmp_path)
    bad = tmp_path / "test" / TEST_1
    x, y = samples["test"]["f0003_02"]

    def add(d):
        d["users"].append("f7777_01")
        d["num_samples"].append(len(y))
        d["user_data"]["f7777_01"] = {"x": x.tolist(), "y": y.tolist()}

    edit(bad, add)
    message = load_error(tmp_path)
    assert str(bad) in message and "f7777_01" in message and "no training samples" in message


def test_femnist_refuses_a_writer_in_two_training_files(tmp_path):
    samples = write_leaf(tmp_path)
    extra = tmp_path / "train" / "all_data_0_niid_05_keep_0_train_9.json"
    extra.write_text(json.dumps(leaf_json(("f0500_11",), samples["train"])))
    message = load_error(tmp_path)
    assert "f0500_11" in message and str(extra) in message


def test_femnist_nominal_sizes():
    assert (leaf.FEMNIST_WRITERS, leaf.FEMNIST_SAMPLES) == (3550, 805263)
