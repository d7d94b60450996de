"""The Python API: ``raysim.run`` is the command line's run; user code registered here (an
algorithm and a dataset of this module) runs on the serial and the Ray executors, the Ray workers
importing this module by themselves; the example script runs; every run draws its partition."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import raysim
from algorithms.base import register
from algorithms.fedavg import FedAvg, GlobalState
from raysim.data.datasets import ArrayDataset
from raysim.errors import ConfigError
from raysim.registry import DATASETS, image_dataset
from tests.conftest import without_times

ROOT = Path(__file__).resolve().parents[2]

#: a few seconds on synthetic data, no progress bar, no TensorBoard
TINY = dict(
    dataset="synthetic", model="mlp_fcd", clients=6, participation=0.5, rounds=2, local_epochs=1,
    batch_size=20, lr=0.05, partition="dirichlet:0.5", executor="serial", progress=False, tensorboard=False,
    set={"data.synthetic.train_samples": 600, "data.synthetic.test_samples": 300, "data.synthetic.shape": (1, 8, 8)},
)  # fmt: skip


# ---- a user's own algorithm and dataset, registered by this module


@register("user_halfway")
class Halfway(FedAvg):
    """The server moves only halfway from w to the clients' average: w <- (w + avg) / 2."""

    def aggregate(self, state: GlobalState, rnd: int, results):  # type: ignore[no-untyped-def]
        from raysim.weights import map_parts

        avg = super().aggregate(state, rnd, results).weights
        return GlobalState(map_parts(lambda w, a: (w + a) / 2, state.weights, avg))


def stripes(cfg, seed):  # type: ignore[no-untyped-def]
    """A user's dataset: 8x8 grey images of 3 classes, class c bright in rows 2c..2c+1 (seeded noise)."""
    rng = np.random.default_rng(7)

    def make(n: int) -> ArrayDataset:
        y = rng.integers(0, 3, n)
        x = rng.integers(0, 60, (n, 1, 8, 8)).astype(np.uint8)
        for c in range(3):
            x[y == c, 0, 2 * c : 2 * c + 2, :] += 150
        return ArrayDataset(x, y.astype(np.int64), 3, "user_stripes", mean=(0.3,), std=(0.3,))

    return make(600), make(300)


DATASETS.register("user_stripes", image_dataset(stripes, 3, (1, 8, 8), 600, 300, "a user's own 8x8 stripes"))


def test_run_is_the_command_lines_run(tmp_path):
    from raysim.commands.run import main

    api = raysim.run(**TINY, out=str(tmp_path / "api"))
    argv = [
        "--dataset", "synthetic", "--model", "mlp_fcd", "--clients", "6", "--participation", "0.5", "--rounds", "2",
        "--local-epochs", "1", "--batch-size", "20", "--lr", "0.05", "--partition", "dirichlet:0.5",
        "--executor", "serial", "--no-progress", "--no-tensorboard", "-q", "--out", str(tmp_path / "cli"),
        "--set", "data.synthetic.train_samples=600", "--set", "data.synthetic.test_samples=300",
        "--set", "data.synthetic.shape=[1,8,8]",
    ]  # fmt: skip
    assert main(argv) == 0
    cli = raysim.load(tmp_path / "cli")
    assert isinstance(api.metrics, pd.DataFrame) and len(api.metrics) == 2
    assert without_times(api.metrics.to_dict("records")) == without_times(cli.metrics.to_dict("records"))
    assert api.summary["final"] == cli.summary["final"] and api.final["gm_gtest"] > 0
    assert set(api.clients["client"]) == set(range(6))
    with pytest.raises(ConfigError, match="Unknown setting 'epochs'"):
        raysim.run(**TINY, epochs=3)


def _user_run(tmp_path: Path, executor: str, **more):  # type: ignore[no-untyped-def]
    settings = {**TINY, "executor": executor, "dataset": "user_stripes", "algo": "user_halfway", **more}
    return raysim.run(**settings, out=str(tmp_path / executor))


def test_user_algorithm_and_dataset_run_serially(tmp_path):
    """Registered here, named by their names; the algorithm's defining property on the numbers."""
    res = _user_run(tmp_path, "serial", rounds=1)
    assert res.config["data"]["dataset"] == "user_stripes" and res.config["algo"] == "user_halfway"
    assert any(p.startswith("tests.engine.test_api@") for p in res.config["plugins"])
    assert res.partition is not None and res.partition.filter(like="count_").shape[1] == 3
    # the halfway step: from the same start and clients, FedAvg's average a gives w1 = (w0 + a) / 2
    from raysim.engine.experiment import make_algorithm
    from raysim.engine.runner import run_experiment

    assert isinstance(make_algorithm(raysim.make_config(**{**TINY, "algo": "user_halfway"})), Halfway)
    fedavg = run_experiment(raysim.make_config(**{**TINY, "dataset": "user_stripes", "rounds": 1, "out": str(tmp_path / "f")}))
    assert fedavg.rows[-1]["samples_trained"] == res.metrics["samples_trained"].iloc[-1]


@pytest.mark.ray
def test_user_code_runs_on_ray_workers_as_serially(tmp_path, ray_local):
    """The Ray workers and the server actor import this module (raysim.plugins) and give the serial
    run's numbers."""
    serial = _user_run(tmp_path, "serial")
    on_ray = _user_run(tmp_path, "ray", workers=2)
    assert without_times(serial.metrics.to_dict("records")) == without_times(on_ray.metrics.to_dict("records"))


def test_partition_picture_is_the_partitions_counts(tmp_path):
    from PIL import Image

    from raysim.data import build_federated_data
    from raysim.results.partition_view import LEFT, cell_geometry, colour_of, heat_top

    res = raysim.run(**TINY, out=str(tmp_path / "run"))
    cfg = raysim.make_config(**TINY)
    counts = build_federated_data(cfg.data, cfg.clients, cfg.seed).train_label_counts()
    table = res.partition
    assert table is not None
    got = table[[f"count_{c}" for c in range(counts.shape[1])]].to_numpy()
    np.testing.assert_array_equal(got, counts)
    np.testing.assert_array_equal(table["train_size"], counts.sum(axis=1))
    # every cell of the picture has its client's count of its class, in the colour scale
    with Image.open(res.run_dir / "partition.png") as im:
        pixels = np.asarray(im.convert("RGB"))
    n, k = counts.shape
    cw, ch = cell_geometry(n, k)
    top = heat_top("a title")
    centres = pixels[top + (k - 1 - np.arange(k)) * ch + ch // 2][:, LEFT + np.arange(n) * cw + cw // 2]
    np.testing.assert_array_equal(centres, colour_of(counts.T, int(counts.max())))
    assert len({tuple(c) for c in colour_of(np.arange(int(counts.max()) + 1), int(counts.max()))}) > 3
    # raysim partition draws the same without running
    out = tmp_path / "alone.png"
    code = subprocess.run(
        [sys.executable, "-m", "raysim.commands.console", "partition", "--dataset", "synthetic", "--clients", "6",
         "--partition", "dirichlet:0.5", "--out", str(out), "--set", "data.synthetic.train_samples=600",
         "--set", "data.synthetic.test_samples=300", "--set", "data.synthetic.shape=[1,8,8]"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert code.returncode == 0, code.stderr
    np.testing.assert_array_equal(pd.read_parquet(out.with_suffix(".parquet"))["train_size"], counts.sum(axis=1))
    assert out.is_file()


@pytest.mark.integration
def test_example_script_runs(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fedmedian.py"), "--dataset", "synthetic", "--clients", "6",
         "--rounds", "2", "--executor", "serial", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("fedmedian  mean") for line in lines), out.stdout
    assert sum(line.split()[0] in ("fedavg", "fedmedian") and line.split()[1].isdigit() for line in lines[1:]) == 4


def test_console_command(tmp_path):
    for args in (["--help"], ["run", "--help"], ["sweep", "--help"], ["report", "--help"], ["partition", "--help"]):
        res = subprocess.run([sys.executable, "-m", "raysim.commands.console", *args], capture_output=True, text=True, cwd=ROOT)
        assert res.returncode == 0, (args, res.stderr)
    bad = subprocess.run([sys.executable, "-m", "raysim.commands.console", "fly"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown command 'fly'" in bad.stderr


@pytest.mark.integration
def test_pip_install_gives_the_raysim_command(tmp_path):
    """``pip install .`` in a fresh virtual environment installs a working ``raysim`` command (the
    dependencies come from this environment through a .pth file, not from the network)."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    fresh = venv / "bin" / "python"
    site = subprocess.run(
        [str(fresh), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    import shutil

    # from a copy: pip builds in the source tree (build/, *.egg-info), which is not this checkout's business
    src = tmp_path / "src"
    top = {"runs", "build", "data", "examples", "tests", "suites", "cluster"}

    def skip(directory: str, names: list[str]) -> set[str]:
        here = Path(directory) == ROOT
        return {n for n in names if n.startswith(".") or n == "__pycache__" or n.endswith(".egg-info") or (here and n in top)}

    shutil.copytree(ROOT, src, ignore=skip)
    install = subprocess.run(
        [str(fresh), "-m", "pip", "install", "-q", "--no-deps", str(src)], capture_output=True, text=True, timeout=600
    )
    assert install.returncode == 0, install.stderr
    res = subprocess.run([str(venv / "bin" / "raysim"), "run", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and "--algo" in res.stdout, res.stderr
    where = subprocess.run([str(fresh), "-c", "import raysim; print(raysim.__file__)"], capture_output=True, text=True, cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout  # the installed copy, not the checkout


@pytest.mark.ray
def test_sweep_gives_the_suites_table_as_dataframes(tmp_path, ray_local):
    """``raysim.sweep`` is scripts/sweep.py: a grid from a list value, seeds; the table's mean and
    std over seeds are those of the trials' final rows."""
    small = {k: v for k, v in TINY.items() if k not in ("executor", "set", "progress")}
    res = raysim.sweep(
        seeds=[0, 1], out=tmp_path / "suite", set={**TINY["set"], "algo.mu": [0.0, 0.5]}, **{**small, "algo": "fedprox"}
    )
    assert isinstance(res.table, pd.DataFrame) and len(res.table) == 2
    assert sorted(res.trials["seed"].unique()) == [0, 1]
    for _, row in res.table.iterrows():
        last = res.trials[(res.trials["config"] == row["config"]) & (res.trials["round"] == 2)]
        assert row["gm_gtest_mean"] == pytest.approx(last["gm_gtest"].mean())
        assert row["gm_gtest_std"] == pytest.approx(last["gm_gtest"].std(ddof=0))


def test_plugins_named_on_the_command_line(tmp_path):
    """``--set plugins=[script.py]`` registers the script's algorithm before the config is resolved."""
    from raysim.commands.run import main

    script = ROOT / "examples" / "fedmedian.py"
    argv = [
        "--algo", "fedmedian", "--set", f"plugins=[{script}]", "--dataset", "synthetic", "--model", "mlp_fcd",
        "--clients", "4", "--rounds", "1", "--executor", "serial", "--no-progress", "--no-tensorboard", "-q",
        "--set", "data.synthetic.shape=[1,8,8]", "--out", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    assert raysim.load(tmp_path).config["algo"] == "fedmedian"


def test_a_run_looks_its_algorithm_up_and_checks_its_config_once_in_the_driver(tmp_path, monkeypatch):
    """The config travels one way. The driver looks the algorithm's
    class up once to put its paper setup beneath the settings and once in the check; the check
    runs once; the runner and the executor take the checked experiment and look up nothing."""
    import raysim.engine.experiment as experiment

    lookups: list[str] = []
    checks: list[str] = []
    lookup, check = experiment.algorithm_class, experiment._check_data

    def counted_lookup(name):  # type: ignore[no-untyped-def]
        lookups.append(name)
        return lookup(name)

    def counted_check(cfg):  # type: ignore[no-untyped-def]
        checks.append(cfg.algo)
        return check(cfg)

    monkeypatch.setattr(experiment, "algorithm_class", counted_lookup)
    monkeypatch.setattr(experiment, "_check_data", counted_check)
    settings = {**TINY["set"], "data.val_fraction": 0.2, "algo.phase_switch": "auto", "algo.switch_patience": 1}
    result = raysim.run(**{**TINY, "algo": "fed3p2", "out": str(tmp_path / "run"), "rounds": 3, "set": settings})
    assert lookups == ["fed3p2", "fed3p2"]  # the paper setup, the check
    assert checks == ["fed3p2"]
    # the round asked for the validation it needed (Fed3+2p's automatic switch), not the runner
    assert result.metrics["val_gm"].notna().any()
