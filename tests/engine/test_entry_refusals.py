"""Every entry point refuses bad input before any work: ``raysim run|sweep|report|
partition``, ``scripts/*.py`` and the Python API, for the suites' search settings, plugins that do not
import, and datasets that are not there. Each case runs the real command in a fresh interpreter and
asserts exit status 2 (the API: a ConfigError), one sentence on stderr, no traceback, no Ray started
(not imported, and no session directory under the process's temporary folder) and an answer within
3 s. A corrupt dataset, found only while Ray starts, stops the run with its sentence and leaves no
Ray process behind."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from raysim.suite import SEARCHERS

ROOT = Path(__file__).resolve().parents[2]
#: the command's own main, then which heavy modules it imported (ray's import would start nothing,
#: but a refusal needs none of it)
PROBE = (
    "import json, sys\n"
    "from raysim.commands.console import main\n"
    "try:\n"
    "    rc = main(sys.argv[1:])\n"
    "except SystemExit as e:\n"
    "    rc = e.code\n"
    "print(json.dumps({'rc': rc, 'ray': 'ray' in sys.modules}))\n"
)
API_PROBE = (
    "import json, sys, raysim\n"
    "from raysim.errors import ConfigError\n"
    "try:\n"
    "    {call}\n"
    "    out = {{'error': None}}\n"
    "except ConfigError as e:\n"
    "    out = {{'error': str(e)}}\n"
    "out['ray'] = 'ray' in sys.modules\n"
    "print(json.dumps(out))\n"
)
LIMIT_S = 3.0


def ray_tmp(tmp: Path) -> Path:
    """The temporary folder a command run for the test ``tmp`` is given: where a Ray session it
    started would make its directory (short: Ray's socket paths must fit in 107 bytes)."""
    short = Path(tempfile.gettempdir()) / f"rs-{hashlib.sha1(str(tmp).encode()).hexdigest()[:10]}"
    short.mkdir(exist_ok=True)
    return short


def environment(tmp: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp)),
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAYSIM_CACHE_DIR": str(tmp / "cache"),
        "TMPDIR": str(ray_tmp(tmp)),  # where a Ray session would make its directory
    }


def run(cmd: list[str], tmp: Path, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp, env=environment(tmp))
    return proc, time.perf_counter() - t0


def assert_one_sentence(err: str, needle: str) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, err  # the sentence, and a hint line at most
    sentence = next(line for line in lines if "error:" in line)
    assert sentence.rstrip().endswith("."), sentence
    assert needle in sentence, sentence


def assert_no_ray(tmp: Path) -> None:
    assert not (ray_tmp(tmp) / "ray").exists(), "a Ray session was started"


def refused(args: list[str], needle: str, tmp: Path) -> None:
    """``raysim ARGS`` (its main, in a fresh interpreter) is refused as the module docstring says."""
    proc, took = run([sys.executable, "-c", PROBE, *args], tmp)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"rc": 2, "ray": False}, (out, proc.stderr)
    assert_one_sentence(proc.stderr, needle)
    assert_no_ray(tmp)
    assert took < LIMIT_S, f"refused after {took:.2f} s"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Suite files, plugins and data folders a user could get wrong."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "empty").mkdir()
    suites = {
        "empty.yaml": "",
        "noconfigs.yaml": "name: x\nbase: {dataset: synthetic}\nconfigs: []\n",
        "broken.yaml": "name: x\nconfigs: [{name: a, set: {algo: fedavg}\n",
        "badalgo.yaml": "name: x\nbase: {dataset: synthetic}\nconfigs: [{name: a, set: {algo: fedavgg}}]\n",
        "badsearch.yaml": (
            "name: x\nbase: {dataset: synthetic}\nconfigs: [{name: a, set: {algo: fedavg}}]\n"
            "search: {space: {train.lr: 'loguniform(0.1, 0.01)'}, algorithm: random}\n"
        ),
        "ok.yaml": "name: x\nbase: {dataset: synthetic, clients: 4, rounds: 1}\nconfigs: [{name: a, set: {algo: fedavg}}]\n",
    }
    for name, text in suites.items():
        (d / name).write_text(text)
    (d / "syntax_plugin.py").write_text("import raysim\ndef broken(:\n    pass\n")
    (d / "raising_plugin.py").write_text("import raysim\n\nRATE = 1 / 0\n")
    return {"dir": d, **{Path(n).stem: d / n for n in suites}}


SEARCH = ["sweep", "--algo", "fedavg", "--dataset", "synthetic", "--clients", "4", "--rounds", "1"]
LR_RANGE = ["--set", "train.lr=loguniform(0.001,0.1)"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # the search algorithm, scheduler, metric and mode
        ([*SEARCH, *LR_RANGE, "--search", "nosuch"], "Unknown search algorithm 'nosuch' (known: random"),
        ([*SEARCH, *LR_RANGE, "--search", "random", "--scheduler", "nosuch"], "Unknown scheduler 'nosuch'"),
        ([*SEARCH, *LR_RANGE, "--search", "random", "--scheduler", "pbt"], "needs trials that save Tune checkpoints"),
        ([*SEARCH, *LR_RANGE, "--search", "random", "--scheduler", "hb_bohb"], "goes with the search algorithm bohb"),
        ([*SEARCH, *LR_RANGE, "--search", "random", "--metric", "accuracy"], "Unknown metric 'accuracy'"),
        ([*SEARCH, *LR_RANGE, "--search", "random", "--metric", "lm_ptest"], "fedavg has no personal models"),
        ([*SEARCH, *LR_RANGE, "--search", "random", "--mode", "maximum"], "invalid choice: 'maximum'"),
        ([*SEARCH, *LR_RANGE, "--search", "random", "--samples", "0"], "at least 1 sample, not 0"),
        # the ranges: their syntax, their bounds, and the settings at their ends
        ([*SEARCH, "--set", "train.lr=loguniform(0,1)", "--search", "random"], "its bounds must be above 0"),
        ([*SEARCH, "--set", "train.lr=loguniform(1e-3)", "--search", "random"], "takes 2 numbers: loguniform(a, b)"),
        ([*SEARCH, "--set", "train.lr=uniform(0.1,0.01)", "--search", "random"], "low bound below its high bound"),
        ([*SEARCH, "--set", "train.lr=uniform(0.01,fast)", "--search", "random"], "takes numbers, not 'fast'"),
        ([*SEARCH, "--set", "rounds=randint(1.5,4)", "--search", "random"], "takes whole numbers, not '1.5'"),
        ([*SEARCH, "--set", "rounds=qrandint(1,4,0)", "--search", "random"], "needs a step q above 0"),
        ([*SEARCH, "--set", "train.lr=choice()", "--search", "random"], "chooses from nothing"),
        ([*SEARCH, "--set", "train.lr=uniform(-0.5,0.1)", "--search", "random"], "train.lr must be above 0, not -0.5"),
        ([*SEARCH, "--set", "train.lr=loguniform(0.001,0.1)"], "name a search with --search"),
        ([*SEARCH, "--search", "random"], "--search needs a range"),
        # the concurrency, seeds, a trial's own settings and the flags
        ([*SEARCH, "--max-concurrent", "0"], "--max-concurrent must be at least 1"),
        ([*SEARCH, "--max-concurrent", "-2"], "--max-concurrent must be at least 1"),
        ([*SEARCH, "--max-concurrent", "two"], "invalid int value: 'two'"),
        ([*SEARCH, "--driver-cpus", "-1"], "driver_cpus must be at least 0"),
        ([*SEARCH, "--seeds", "a-b"], "Seeds are numbers and ranges"),
        ([*SEARCH, "--set", "train.lr"], "--set takes KEY=VALUE"),
        ([*SEARCH, "--set", "train.nosuch=1"], "nosuch"),
        (["sweep", "--algo", "fedavg", "--dataset", "synthetic", "--clients", "4,0"], "clients"),
        (["sweep", "--algo", "fedavg,fedavgg", "--dataset", "synthetic"], "Unknown algorithm 'fedavgg'"),
        (["sweep", "--resume", "/nonexistent/suite"], "is not a suite directory"),
        (["sweep", "--algo", "fedavg", "--roudns", "3"], "Unrecognized arguments: --roudns"),
        # the report and partition commands
        (["report", "/nonexistent/run"], "/nonexistent/run does not exist"),
        (["report"], "The following arguments are required: RUN_DIR"),
        (["partition", "--partition", "nosuch:1"], "Unknown partition 'nosuch:1'"),
        (["partition", "--clients", "0"], "clients"),
        (["partition", "--set", "data.nosuch=1"], "nosuch"),
        (["partition", "--set", "data.min_samples"], "KEY=VALUE"),
        (["partition", "--dataset", "synthetic", "--out", "/nonexistent/folder/p.png"], "does not exist"),
        # run, through the raysim command
        (["run", "--algo", "fedavgg"], "Unknown algorithm 'fedavgg'"),
        (["run", "--clients", "1o0"], "1o0"),
        (["run", "--resume", "/nonexistent/run"], "is not a run directory"),
        (["runn", "--algo", "fedavg"], "unknown command 'runn'"),
    ],
    ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None,
)
def test_bad_input_is_refused_before_any_work(args, needle, tmp_path):
    refused(args, needle, tmp_path)


def test_a_search_whose_package_is_missing_is_refused(tmp_path):
    missing = next(
        (name for name, pkgs in SEARCHERS.items() if pkgs and importlib.util.find_spec(pkgs[0]) is None), None
    )
    if missing is None:
        pytest.skip("every search algorithm's package is installed here")
    refused([*SEARCH, *LR_RANGE, "--search", missing], f"The search algorithm {missing} needs the package", tmp_path)


def test_raysims_search_and_scheduler_names_are_tunes():
    from ray.tune.schedulers import SCHEDULER_IMPORT
    from ray.tune.search import SEARCH_ALG_IMPORT

    from raysim.suite import SCHEDULERS, UNSCHEDULABLE

    assert set(SEARCHERS) == set(SEARCH_ALG_IMPORT)
    assert set(SCHEDULERS) - {"asha"} | set(UNSCHEDULABLE) == set(SCHEDULER_IMPORT)
    assert set(SCHEDULERS.values()) <= set(SCHEDULER_IMPORT)


@pytest.mark.parametrize(
    ("suite", "needle"),
    [
        ("empty", "lists no configurations"),
        ("noconfigs", "lists no configurations"),
        ("broken", "does not parse"),
        ("badalgo", "Unknown algorithm 'fedavgg'"),
        ("badsearch", "low bound below its high bound"),
        ("missing", "does not exist"),
    ],
)
def test_bad_suite_files_are_refused(files, suite, needle, tmp_path):
    refused(["sweep", str(files["dir"] / f"{suite}.yaml")], needle, tmp_path)


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize(
    ("plugin", "needle"),
    [
        ("syntax_plugin.py", "does not compile (SyntaxError: "),
        ("raising_plugin.py", "failed on import (ZeroDivisionError: division by zero; "),
        ("no_plugin.py", "does not exist"),
        ("nosuch_module", "The plugin 'nosuch_module' cannot be imported"),
    ],
)
def test_plugins_that_do_not_import_are_refused_naming_file_and_line(files, command, plugin, needle, tmp_path):
    spec = str(files["dir"] / plugin) if plugin.endswith(".py") else plugin
    args = [command, "--algo", "fedavg", "--dataset", "synthetic", "--set", f"plugins=[{spec}]"]
    refused(args, needle, tmp_path)
    if plugin == "syntax_plugin.py":
        refused(args, f"{spec}, line 2)", tmp_path)
    if plugin == "raising_plugin.py":
        refused(args, f"{spec}, line 3)", tmp_path)


#: datasets read from files, and where a folder holding none of them leaves each
DATASETS = ["mnist", "emnist", "svhn", "cinic10", "tinyimagenet", "femnist", "cifar10", "cifar100"]


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_missing_dataset_is_refused_before_ray_starts(files, dataset, tmp_path):
    empty = str(files["dir"] / "empty")
    args = ["--dataset", dataset, "--data-dir", empty, "--no-download", "--clients", "10", "--rounds", "1"]
    refused(["run", *args], empty, tmp_path)
    refused(["sweep", *args], empty, tmp_path)


def test_natural_clients_need_a_dataset_with_writers(tmp_path):
    refused(["run", "--dataset", "fmnist", "--test-mode", "natural"], "natural", tmp_path)
    refused(["run", "--dataset", "fmnist", "--partition", "natural"], "natural", tmp_path)


@pytest.mark.parametrize("script", ["run.py", "sweep.py", "report.py"])
def test_the_scripts_refuse_as_the_command_does(script, tmp_path):
    args = {"run.py": ["--algo", "fedavgg"], "sweep.py": ["--algo", "fedavgg"], "report.py": ["/nonexistent/run"]}
    proc, took = run([sys.executable, str(ROOT / "scripts" / script), *args[script]], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert_one_sentence(proc.stderr, "fedavgg" if script != "report.py" else "/nonexistent/run")
    assert_no_ray(tmp_path)
    assert took < LIMIT_S


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        ("raysim.run(set=['nosuch.key=1'])", "nosuch"),
        ("raysim.run(set=['train.lr'])", "set= takes KEY=VALUE texts, not 'train.lr'"),
        ("raysim.run(set='train.lr=0.1')", "set= takes a mapping of settings"),
        ("raysim.run(algo='fedavgg')", "Unknown algorithm 'fedavgg'"),
        ("raysim.run(cliets=10)", "Unknown setting 'cliets'"),
        ("raysim.run(rounds='ten')", "ten"),
        (
            "raysim.run(dataset='mnist', data_dir='{empty}', download=False, executor='ray')",
            "MNIST was not found",
        ),
        (
            "raysim.sweep(algo='fedavg', dataset='synthetic', search='nosuch', set={{'train.lr': 'loguniform(0.001,0.1)'}})",
            "Unknown search algorithm 'nosuch'",
        ),
        ("raysim.sweep(algo='fedavg', dataset='synthetic', max_concurrent=0)", "--max-concurrent must be at least 1"),
        ("raysim.sweep('/nonexistent/suite.yaml')", "does not exist"),
        ("raysim.sweep(algo='fedavg', dataset='synthetic', set=['train.lr=uniform(0.1,0.01)'], search='random')", "low bound"),
    ],
)
def test_the_api_raises_the_same_sentence(files, call, needle, tmp_path):
    code = API_PROBE.format(call=call.format(empty=files["dir"] / "empty"))
    proc, took = run([sys.executable, "-c", code], tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and needle in out["error"] and out["error"].endswith("."), out
    assert out["ray"] is False
    assert_no_ray(tmp_path)
    assert took < LIMIT_S


def test_a_corrupt_dataset_stops_the_run(tmp_path):
    """The files are there, so Ray may start beside their reading; the reading finds one truncated:
    one sentence, exit 2, and none of the Ray processes started for the run left."""
    data = tmp_path / "mnist"
    data.mkdir()
    header = {"images-idx3": b"\x00\x00\x08\x03" + (1000).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2}
    header["labels-idx1"] = b"\x00\x00\x08\x01" + (1000).to_bytes(4, "big")
    for split in ("train", "t10k"):
        for kind, head in header.items():
            (data / f"{split}-{kind}-ubyte").write_bytes(head + bytes(100))  # 1000 samples declared, 100 bytes
    args = ["--dataset", "mnist", "--data-dir", str(data), "--no-download", "--clients", "4", "--rounds", "1"]
    proc, _ = run([sys.executable, str(ROOT / "scripts" / "run.py"), *args, "--out", str(tmp_path / "run")], tmp_path, 120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("raysim: error: The idx file"), proc.stderr
    assert "is truncated" in proc.stderr
    assert_no_ray_left(tmp_path)


def assert_no_ray_left(tmp: Path) -> None:
    left = subprocess.run(["pgrep", "-f", str(ray_tmp(tmp) / "ray")], capture_output=True, text=True)
    assert left.stdout.strip() == "", "Ray processes outlived the run"


SLOW_CORRUPT = """
import time

from raysim.data.datasets import files_found
from raysim.errors import ConfigError
from raysim.registry import DATASETS, image_dataset


def load(cfg, seed):
    files_found("a corrupt set", "/data/corrupt")
    time.sleep(2)  # Ray's start is under way by now
    raise ConfigError("The file /data/corrupt/x.bin is corrupt.")


DATASETS.register("corruptset", image_dataset(f"{__name__}:load", 10, (1, 8, 8), 1000, 100, "found, then corrupt"))
"""


@pytest.mark.ray
def test_a_dataset_found_corrupt_while_ray_starts_stops_that_ray(tmp_path):
    plugin = tmp_path / "corrupt_dataset.py"
    plugin.write_text(SLOW_CORRUPT)
    args = ["--dataset", "corruptset", "--model", "mlp_fcd", "--clients", "4", "--rounds", "1", "--no-progress"]
    args += ["--set", f"plugins=[{plugin}]", "--out", str(tmp_path / "run")]
    proc, _ = run([sys.executable, str(ROOT / "scripts" / "run.py"), *args], tmp_path, 120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "raysim: error: The file /data/corrupt/x.bin is corrupt."
    assert any((ray_tmp(tmp_path) / "ray").glob("session_*/logs/raylet.out"))  # Ray had started
    assert_no_ray_left(tmp_path)


@pytest.mark.ray
@pytest.mark.integration
def test_a_trial_refused_by_its_data_ends_the_suite_with_its_sentence(tmp_path):
    """What only the data can tell (files found, then corrupt) is found in the trial; the suite then
    ends with that sentence and exit status 2, not a failure of Tune's, and no traceback."""
    plugin = tmp_path / "corrupt_dataset.py"
    plugin.write_text(SLOW_CORRUPT)
    args = ["--dataset", "corruptset", "--model", "mlp_fcd", "--clients", "4", "--rounds", "1", "--no-progress"]
    args += ["--set", f"plugins=[{plugin}]", "--out", str(tmp_path / "s")]
    proc, _ = run([sys.executable, str(ROOT / "scripts" / "sweep.py"), *args], tmp_path, 180)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == "raysim: error: The file /data/corrupt/x.bin is corrupt."
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert any((tmp_path / "s" / "runs").glob("*/refused.txt"))  # refused in the trial, not before it
    assert_no_ray_left(tmp_path)


def test_a_generated_dataset_its_split_cannot_fit_is_refused_before_ray_starts(tmp_path):
    """A synthetic set too small for its split (100 clients at Dirichlet 0.1 with 10 samples each
    from 2,000) is made and split as the driver checks it: one sentence before Ray, run or suite."""
    args = ["--algo", "fedavg", "--dataset", "synthetic", "--clients", "100", "--rounds", "1", "--no-progress"]
    args += ["--set", "data.synthetic.train_samples=2000"]
    for script in ("run.py", "sweep.py"):
        proc, _ = run([sys.executable, str(ROOT / "scripts" / script), *args, "--out", str(tmp_path / script)], tmp_path)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert_one_sentence(proc.stderr, "The Dirichlet partition with alpha=0.1 left some client with fewer than 10")
        assert not any((ray_tmp(tmp_path) / "ray").glob("session_*")), script  # Ray never started
