"""data.augment=crop_flip: the crop and flip on a hand image, seeded per (round, client, stream,
epoch), the same on serial and Ray, with batched clients, and refused where it cannot be."""

from __future__ import annotations

import pytest
import torch

from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError
from raysim.toolkit.augment import crop_flip
from tests.conftest import tiny_config, without_times


def test_the_crop_and_flip_on_a_hand_image():
    x = torch.arange(1, 10, dtype=torch.float32).reshape(1, 1, 3, 3)  # [[1 2 3] [4 5 6] [7 8 9]]
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))[0, 0]
    seen = set()
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        dy, dx = torch.randint(0, 9, (1,), generator=g), torch.randint(0, 9, (1,), generator=g)
        flip = bool(torch.rand(1, generator=g) < 0.5)
        want = padded[dy : dy + 3, dx : dx + 3]
        want = want.flip(1) if flip else want
        got = crop_flip(x, torch.Generator().manual_seed(seed))[0, 0]
        assert torch.equal(got, want), seed
        seen.add((int(dy), int(dx), flip))
    # every offset in 0..8 both ways, flipped and not, over the draws
    assert {d for d, _, _ in seen} == set(range(9)) and {f for _, _, f in seen} == {True, False}
    # the centre crop unflipped is the image itself
    centre = torch.nn.functional.pad(x, (4, 4, 4, 4))[:, :, 4:7, 4:7]
    assert torch.equal(centre, x)


def test_each_image_of_a_batch_draws_its_own_and_channels_move_together():
    x = torch.randn(32, 3, 8, 8)
    out = crop_flip(x, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    draws = []
    for i in range(32):  # each output is one crop (all channels alike) of its own padded image
        options = [
            (dy, dx, f)
            for dy in range(9)
            for dx in range(9)
            for f in (False, True)
            if torch.equal(out[i], (lambda c: c.flip(2) if f else c)(padded[i, :, dy : dy + 8, dx : dx + 8]))
        ]
        assert len(options) >= 1, i
        draws.append(options[0])
    assert len(set(draws)) > 16  # the images drew their own
    assert torch.equal(crop_flip(x, torch.Generator().manual_seed(0)), out)  # seeded


def test_augmented_runs_differ_from_plain_ones_and_repeat_themselves(tmp_path):
    plain = run_experiment(tiny_config(tmp_path / "p"))
    aug = run_experiment(tiny_config(tmp_path / "a", **{"data.augment": "crop_flip"}))
    again = run_experiment(tiny_config(tmp_path / "b", **{"data.augment": "crop_flip"}))
    assert without_times(aug.rows) == without_times(again.rows)
    assert [r["train_loss"] for r in aug.rows] != [r["train_loss"] for r in plain.rows]


def test_batched_clients_are_augmented_as_one_by_one(tmp_path):
    setup = {"data.augment": "crop_flip", "train.channels_last": False}
    one = run_experiment(tiny_config(tmp_path / "one", **setup))
    batched = run_experiment(tiny_config(tmp_path / "batched", **setup, **{"train.batch_clients": 4}))
    for a, b in zip(one.rows, batched.rows, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
        assert b["gm_gtest"] == pytest.approx(a["gm_gtest"], abs=0.02)


@pytest.mark.ray
def test_serial_equals_ray_with_augmentation(tmp_path, ray_local):
    setup = {"data.augment": "crop_flip", "algo": "fedper"}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("crop", "data.augment is 'none' or 'crop_flip'"),
        ("flip", "data.augment is 'none' or 'crop_flip'"),
        ("Crop_Flip", "data.augment is 'none' or 'crop_flip'"),
    ],
)
def test_a_mistyped_augmentation_is_refused(value, needle):
    from raysim.api import checked_experiment

    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={"data.dataset": "synthetic", "model": "mlp_fcd", "clients": 8, "data.augment": value})
    assert needle in str(e.value)


def test_augmentation_of_samples_that_are_not_images_is_refused():
    from raysim.api import checked_experiment

    with pytest.raises(ConfigError, match=r"crops and flips images \(channels, height, width\)"):
        checked_experiment(
            None,
            set={
                "data.dataset": "synthetic",
                "data.synthetic.shape": [64],
                "model": "mlp_fcd",
                "clients": 8,
                "data.augment": "crop_flip",
            },
        )


@pytest.mark.parametrize(
    ("dataset", "classes", "shape", "augment"),
    [
        ("cifar10", 10, (3, 32, 32), "crop_flip"),
        ("cifar100", 100, (3, 32, 32), "crop_flip"),
        ("fmnist", 10, (1, 28, 28), None),
    ],
)
def test_feddrplus_setups_augment_colour_images_as_their_base_code(dataset, classes, shape, augment):
    from algorithms.feddrplus import FedDrPlus
    from algorithms.fedfcd import FedFCD
    from raysim.registry import DatasetInfo

    info = DatasetInfo(dataset, classes, shape, 50_000, 10_000)
    assert FedDrPlus.paper_setup(info).get("data.augment") == augment
    assert FedFCD.paper_setup(info)["data.augment"] == "none"  # PFLlib's setup, which FedFCD's follows
