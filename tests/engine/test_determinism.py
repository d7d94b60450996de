"""Serial and Ray executors give identical numbers (docs/design.md: seeds keyed by round, client and
purpose; the same thread count in every executor)."""

from __future__ import annotations

import pytest

from raysim.engine.runner import run_experiment
from tests.conftest import tiny_config, without_times


@pytest.mark.ray
def test_fedavg_serial_equals_ray_with_one_and_two_workers(tmp_path, ray_local):
    cfg = tiny_config(tmp_path / "serial", model="cnn3p2_fmnist", **{"data.synthetic.shape": (1, 16, 16)})
    serial = run_experiment(cfg)
    assert serial.final["gm_gtest"] is not None
    for workers in (1, 2):
        ray_cfg = tiny_config(
            tmp_path / f"ray{workers}",
            model="cnn3p2_fmnist",
            **{"data.synthetic.shape": (1, 16, 16), "ray.executor": "ray", "ray.workers": workers},
        )
        ray_run = run_experiment(ray_cfg)
        assert without_times(ray_run.rows) == without_times(serial.rows), f"{workers} workers"


@pytest.mark.ray
def test_local_serial_equals_ray(tmp_path, ray_local):
    """Local keeps each client's model on its home worker between rounds."""
    cfg = tiny_config(tmp_path / "s", algo="local", rounds=3)
    serial = run_experiment(cfg)
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", algo="local", rounds=3, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)


def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path):
    a = run_experiment(tiny_config(tmp_path / "a"))
    b = run_experiment(tiny_config(tmp_path / "b"))
    c = run_experiment(tiny_config(tmp_path / "c", seed=4))
    assert without_times(a.rows) == without_times(b.rows)
    assert without_times(a.rows) != without_times(c.rows)


@pytest.mark.ray
def test_fed3p2_serial_equals_ray(tmp_path, ray_local):
    """Chains inside coordinators (phase 1, unpinned) and P-heads on their home workers (phase 2)."""
    setup = {
        "algo": "fed3p2",
        "model": "cnn3p2_fmnist",
        "data.synthetic.shape": (1, 16, 16),
        "clients": 10,
        "rounds": 4,
        "algo.num_type_a": 3,
        "algo.num_type_b": 3,
        "train.lr": 0.01,
    }
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert [r["phase"] for r in serial.rows] == [1, 1, 2, 2]
    assert without_times(ray_run.rows) == without_times(serial.rows)


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["fedfcd", "fedpac", "fedproto", "fedgh"])
def test_prototype_family_serial_equals_ray(tmp_path, ray_local, algo):
    """Personal state on home workers, prototypes and heads through the object store, a head trained
    (FedFCD, FedGH) or QPs solved (FedPAC) in the server actor."""
    setup = {"algo": algo, "rounds": 3, "participation": 0.75, "eval.every": 1}
    if algo == "fedpac":
        setup.update({"model": "cnn_pac", "data.synthetic.shape": (1, 16, 16)})
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert serial.final["lm_ptest"] is not None
    assert without_times(ray_run.rows) == without_times(serial.rows)


@pytest.mark.ray
@pytest.mark.parametrize(
    "algo", ["feddrplus", "dotreg", "fedbabu", "fedper", "fedrep", "fedrod", "ditto", "scaffold", "fedprox"]
)
def test_personalisation_baselines_serial_equal_ray(tmp_path, ray_local, algo):
    """Personal heads, personal models and SCAFFOLD's control variates on home workers; FT at the end;
    FedProx's proximal anchor (which once read whatever the worker's model held before the job)."""
    setup = {"algo": algo, "rounds": 2, "participation": 0.75, "eval.every": 1, "train.local_epochs": 1}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert serial.final["lm_ptest"] is not None or serial.final["gm_gtest"] is not None
    assert without_times(ray_run.rows) == without_times(serial.rows)


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["fedavg", "fed3p2"])
def test_one_worker_training_two_jobs_at_once_equals_serial(tmp_path, ray_local, algo):
    """A worker of 2 CPUs trains two one-thread jobs at once (raysim.engine.executors.slots): the numbers
    of the serial executor, for unpinned jobs (FedAvg), and for chains and personal heads kept in the
    memory its job slots share (Fed3+2p)."""
    setup = {"algo": algo, "model": "cnn3p2_fmnist", "data.synthetic.shape": (1, 16, 16), "ray.cpus_per_worker": 2}
    if algo == "fed3p2":
        setup.update({"clients": 10, "rounds": 4, "algo.num_type_a": 3, "algo.num_type_b": 3, "train.lr": 0.01})
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 1}))
    assert tiny_config(**setup).worker_jobs == 2
    assert without_times(ray_run.rows) == without_times(serial.rows)
