"""The GPU path: client workers share one GPU through fractional
``num_gpus`` and train on CUDA, with the same numbers as the serial executor on the same GPU.
Skipped where PyTorch sees no GPU; run on a GPU machine with ``pytest -m gpu``."""

from __future__ import annotations

import pytest

from raysim.engine.runner import run_experiment
from tests.conftest import tiny_config, without_times

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SETUP = {
    "algo": "fed3p2",
    "model": "cnn3p2_fmnist",
    "data.synthetic.shape": (1, 16, 16),
    "clients": 10,
    "rounds": 4,
    "algo.num_type_a": 3,
    "algo.num_type_b": 3,
    "algo.phase1_rounds": 2,
    "eval.every": 1,
}


def test_workers_sharing_one_gpu_train_on_cuda_and_match_serial(tmp_path, ray_local):
    import ray

    from raysim.engine.executors.ray_executor import RayExecutor
    from raysim.engine.runner import prepare

    assert ray.cluster_resources().get("GPU", 0) >= 1
    serial = run_experiment(tiny_config(tmp_path / "s", **SETUP, **{"ray.gpus_per_worker": 1.0}))
    shared = run_experiment(
        tiny_config(
            tmp_path / "r",
            **SETUP,
            **{"ray.executor": "ray", "ray.workers": 2, "ray.gpus_per_worker": 0.5},
        )
    )
    assert without_times(shared.rows) == without_times(serial.rows)
    assert serial.final["lm_ptest"] is not None

    # four workers, a quarter of the one GPU each, all placed at once and all on CUDA
    cfg = tiny_config(
        tmp_path / "w",
        **SETUP,
        **{"ray.executor": "ray", "ray.workers": 4, "ray.gpus_per_worker": 0.25, "ray.cpus_per_worker": 0.5},
    )
    executor = RayExecutor(cfg, prepare(cfg), 4)
    try:
        assert executor.devices == ["cuda"] * 4
    finally:
        executor.shutdown()


def test_dead_gpu_workers_are_replaced_and_a_stopped_run_resumes_on_cuda(tmp_path, ray_local, executors):
    """A worker on a share of the GPU killed after round 1 (phase 1) and again after round 3
    (phase 2, clients with personal state): the replacements start CUDA afresh, take their
    clients' state and give the serial GPU run's metrics; a run stopped by Ctrl-C after round 2
    and resumed on the GPU workers does too. (Kills in the middle of a round: test_fault_tolerance;
    these rounds are too short on a GPU to aim at.)"""
    from raysim import checkpoint
    from tests.engine.test_checkpoint import CtrlCAfter
    from tests.engine.test_fault_tolerance import Kill

    serial = run_experiment(tiny_config(tmp_path / "s", **SETUP, **{"ray.gpus_per_worker": 1.0}))
    on_gpu = {"ray.executor": "ray", "ray.workers": 2, "ray.gpus_per_worker": 0.5}
    killed = run_experiment(
        tiny_config(tmp_path / "k", **SETUP, **on_gpu),
        [Kill(executors, 1, "worker"), Kill(executors, 3, "worker")],
    )
    assert killed.worker_restarts == 2
    assert without_times(killed.rows) == without_times(serial.rows)
    cfg = tiny_config(tmp_path / "c", **SETUP, **on_gpu)
    stopped = run_experiment(cfg, [CtrlCAfter(2)])
    assert stopped.stopped and stopped.last_round == 2
    resumed = run_experiment(cfg, resume=checkpoint.load(tmp_path / "c"))
    assert without_times(resumed.rows) == without_times(serial.rows)
