"""Every bad input that does not need the data is refused by the driver before Ray starts or the
data loads, in well under 2 s, with one sentence on stderr and exit status 2. Each case
runs the CLI in a fresh interpreter and reports whether Ray or PyTorch were even imported."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import json, sys\n"
    "from raysim.commands.run import main\n"
    "rc = main(sys.argv[1:])\n"
    "print(json.dumps({'rc': rc, 'ray': 'ray' in sys.modules, 'torch': 'torch' in sys.modules}))\n"
)


def refuse(args: list[str], cwd: Path) -> tuple[dict, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args, "--out", str(cwd / "run")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"},
    )
    took = time.perf_counter() - t0
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr.strip(), took


def assert_refused(args: list[str], needle: str, cwd: Path) -> None:
    out, err, took = refuse(args, cwd)
    assert out == {"rc": 2, "ray": False, "torch": False}, (out, err)
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("raysim: error: ") and last.endswith("."), last
    assert needle in last, last
    assert took < 2.0, f"refused after {took:.2f} s"
    assert not (cwd / "run").exists(), "no work may start"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # a model and an input that do not fit (VGG-11's five max-pools need 32x32)
        (["--algo", "fedavg", "--model", "vgg11", "--dataset", "fmnist"], "vgg11 needs images of at least 32x32"),
        (
            ["--dataset", "synthetic", "--model", "cnn3p2_fmnist", "--set", "data.synthetic.shape=1,6,6"],
            "cnn3p2_fmnist needs images of at least 16x16 pixels, not inputs of shape (1, 6, 6)",
        ),
        # a partition impossible for the dataset's class count, or its size
        (["--dataset", "fmnist", "--partition", "pathological:11"], "cannot give a client 11 classes of 10"),
        (
            ["--dataset", "cifar100", "--model", "cnn3p2_cifar", "--clients", "5", "--partition", "pathological:2"],
            "leaves some of the 100 classes unused",
        ),
        (["--dataset", "fmnist", "--clients", "100", "--partition", "shard:700"], "needs at least 70000 samples"),
        (
            ["--algo", "fedpac", "--clients", "200", "--set", "data.samples_per_client=600"],
            "needs 120000 samples for 200 clients",
        ),
        # an ETF classifier wider than the model's features
        (
            ["--algo", "feddrplus", "--dataset", "cifar100", "--model", "cnn3p2_cifar"],
            "A simplex ETF classifier needs a feature size of at least the class count; the model gives 64 "
            "features for 100 classes",
        ),
        # names the registries do not know, and a parameter out of range
        (["--executor", "dask"], "Unknown executor 'dask' (known: ray, serial)"),
        (["--test-mode", "split:2"], "must be in (0, 1), not 2"),
        # a simulated deployment that cannot be
        (["--deployment", "nowhere.yaml"], "--deployment takes a YAML file or a registered deployment"),
        (["--set", "deployment.policy=deadline"], "The deadline policy needs devices that take time"),
    ],
)
def test_refused_before_ray_or_data(args, needle, tmp_path):
    assert_refused(args, needle, tmp_path)


SMALL = ["--dataset", "synthetic", "--clients", "4"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # a target on an accuracy the algorithm does not report: it could never be reached
        (
            ["--algo", "fedavg", "--set", "eval.target=0.8", "--set", "eval.target_metric=lm_ptest"],
            "raysim: error: eval.target_metric=lm_ptest can never be reached: fedavg reports no lm_ptest as this "
            "run is set (it has no personal models), only gm_gtest and gm_ptest; eval.updated_lm=true or "
            "algo.ft_epochs > 0 gives it one.",
        ),
        (
            ["--algo", "local", "--set", "eval.target=0.8", "--set", "eval.target_metric=gm_gtest"],
            "local reports no gm_gtest as this run is set (it has no global model), only lm_ptest.",
        ),
        (
            ["--algo", "fedavg", "--set", "eval.target=0.8", "--set", "eval.target_metric=updated_lm_ptest"],
            "eval.target_metric=updated_lm_ptest needs eval.updated_lm=true",
        ),
        # a target metric without a target, a misspelt metric, and a target that is not a fraction
        (
            ["--algo", "fedavg", "--set", "eval.target_metric=gm_gtest "],
            "eval.target_metric=gm_gtest is read only with eval.target (the accuracy to reach, a fraction: "
            "eval.target=0.8 for 80%).",
        ),
        (
            ["--set", "eval.target=0.8", "--set", "eval.target_metric=lm_ptst"],
            "eval.target_metric is one of 'auto', ",
        ),
        (
            ["--set", "eval.target=0.8", "--set", "eval.target_metric=gm_gtest_weighted"],
            "not 'gm_gtest_weighted'.",
        ),
        (
            ["--set", "eval.target=80"],
            "eval.target must be at most 1, not 80.0 (an accuracy is a fraction: 0.8 for 80%).",
        ),
        (["--set", "eval.target=80%"], "eval.target must be a number, not '80%'."),
        (["--set", "eval.target=nan"], "eval.target must be a number, not nan"),
        (["--set", "eval.traget=0.8"], "Unknown setting eval.traget (known: "),
    ],
    ids=lambda v: " ".join(v[-3:]) if isinstance(v, list) else None,
)
def test_a_target_that_could_never_be_reached_is_refused(args, needle, tmp_path):
    assert_refused([*SMALL, *args], needle, tmp_path)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (
            {"algo": "fedavg", "eval.target": 0.8, "eval.target_metric": "lm_ptest"},
            "fedavg reports no lm_ptest",
        ),
        ({"algo": "fedavg", "eval.target_metric": "gm_gtest "}, "eval.target_metric is one of"),
        ({"algo": "fedavg", "eval.target": "80%"}, "eval.target must be a number, not '80%'."),
        (
            {"algo": "local", "eval.target": 0.5, "eval.target_metric": "gm_ptest"},
            "local reports no gm_ptest",
        ),
    ],
)
def test_the_api_refuses_the_same_targets(settings, needle):
    from raysim.api import checked_experiment
    from raysim.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        checked_experiment(None, set={"data.dataset": "synthetic", "clients": 4, **settings})
    assert needle in str(e.value) and str(e.value).endswith(".")


def test_validate_refuses_a_config_object_whose_target_could_never_be_reached():
    from raysim.api import checked_experiment
    from raysim.config import replace
    from raysim.engine.experiment import validate
    from raysim.errors import ConfigError

    cfg = checked_experiment(None, set={"algo": "fedavg", "data.dataset": "synthetic", "clients": 4}).cfg
    with pytest.raises(ConfigError, match="fedavg reports no lm_ptest as this run is set"):
        validate(replace(cfg, **{"eval.target": 0.8, "eval.target_metric": "lm_ptest"}))


def test_a_target_the_run_reports_is_taken():
    from raysim.api import checked_experiment

    for algo, metric, more in [
        ("fedavg", "lm_ptest", {"eval.updated_lm": True}),
        ("fedavg", "lm_ptest", {"algo.ft_epochs": 1}),
        ("fedavg", "gm_ptest", {}),
        ("local", "lm_ptest", {}),
        ("local", "auto", {}),
    ]:
        settings = {"data.dataset": "synthetic", "clients": 4, "algo": algo, "eval.target": 0.5, **more}
        cfg = checked_experiment(None, set={**settings, "eval.target_metric": metric}).cfg
        assert cfg.eval.target_metric == metric


def test_a_data_dir_that_is_a_file(tmp_path):
    (tmp_path / "cifar.tar").write_bytes(b"not a directory")
    assert_refused(
        ["--dataset", "cifar10", "--data-dir", str(tmp_path / "cifar.tar")],
        f"The data directory {tmp_path / 'cifar.tar'} is a file, not a directory.",
        tmp_path,
    )


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("bad.yaml", "algo: fedavg\ntrain:\n  lr: [0.1, 0.2\nclients: 4\n", "on line 4"),
        ("bad.toml", 'algo = "fedavg"\nclients = \n', "at line 2"),
        ("bad.json", '{"algo": "fedavg",\n "clients": }\n', "on line 2"),
    ],
)
def test_a_config_file_that_does_not_parse(name, text, needle, tmp_path):
    (tmp_path / name).write_text(text)
    out, err, took = refuse(["--config", str(tmp_path / name)], tmp_path)
    assert out["rc"] == 2 and not out["ray"] and took < 2.0
    assert err.count("\n") == 0, err  # one line, not the parser's multi-line dump
    assert err.startswith(f"raysim: error: The config file {tmp_path / name} does not parse") and needle in err, err
