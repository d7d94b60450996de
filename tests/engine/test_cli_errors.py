"""Bad input stops before any work with one clear sentence on stderr and exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYNTH = [
    "--dataset", "synthetic", "--model", "mlp_fcd", "--clients", "10", "--rounds", "1",
    "--executor", "serial", "--no-progress",
]  # fmt: skip


def run_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run.py"), *args, "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--algo", "nosuchalgo", *SYNTH], "Unknown algorithm 'nosuchalgo'"),
        ([*SYNTH, "--model", "nosuchmodel"], "Unknown model 'nosuchmodel'"),
        ([*SYNTH[2:], "--dataset", "nosuchdata"], "Unknown dataset 'nosuchdata'"),
        ([*SYNTH, "--clients", "0"], "clients must be at least 1, not 0"),
        ([*SYNTH, "--participation", "0"], "participation must be above 0, not 0.0"),
        ([*SYNTH, "--participation", "1.5"], "participation must be at most 1, not 1.5"),
        ([*SYNTH, "--partition", "dirichlet:0"], "alpha must be positive"),
        ([*SYNTH, "--partition", "dirichlet:-1"], "alpha must be positive"),
        ([*SYNTH, "--lr", "abc"], "must be a number"),
        ([*SYNTH, "--set", "train.nosuch=1"], "Unknown setting train.nosuch ("),
        ([*SYNTH, "--set", "algo.nosuch=1"], "Unknown setting algo.nosuch"),
        ([*SYNTH, "--bogus-flag"], "Unrecognized arguments"),
    ],
)
def test_bad_input_gives_one_sentence_and_exit_2(args, needle, tmp_path):
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("raysim: error: ") and last.endswith("."), last
    assert needle in last, last
    assert not (tmp_path / "run").exists(), "no work may start"


def test_dataset_missing_offline(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli(
        [
            "--dataset",
            "cifar10",
            "--model",
            "cnn3p2_cifar",
            "--data-dir",
            str(empty),
            "--no-download",
            "--executor",
            "serial",
        ],
        tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("raysim: error: ") and "CIFAR-10" in last and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_unreachable_ray_address(tmp_path):
    proc = run_cli([*SYNTH[:-3], "--no-progress", "--address", "127.0.0.1:1"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("raysim: error: The Ray cluster at 127.0.0.1:1 cannot be reached"), last
    assert "Traceback" not in proc.stderr


@pytest.mark.ray
def test_a_config_error_raised_in_an_actor_reaches_the_driver_as_itself(ray_local):
    """What only a worker or the server can find (the driver checks all it can know first) still
    ends the run with the worker's one sentence, not Ray's wrapped traceback."""
    import ray

    from raysim.engine.executors.actors import config_errors_first
    from raysim.errors import ConfigError

    @ray.remote(num_cpus=0)  # the session's CPUs may be held by actors a run left idle (ray.reuse_workers)
    def refuse() -> None:
        raise ConfigError("The model does not fit.")

    with pytest.raises(ConfigError, match="^The model does not fit.$"):
        config_errors_first([refuse.remote()])
