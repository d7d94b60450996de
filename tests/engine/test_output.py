"""The run directory: TensorBoard events, metrics.parquet, clients.parquet, the resolved config and
the CLI's closing JSON line, read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_cli_run_writes_tables_tensorboard_and_json(tmp_path):
    """scripts/run.py ends its process without the interpreter's teardown
    (raysim.commands.exit_process): every file is complete all the same."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable, str(ROOT / "scripts" / "run.py"), "--algo", "fedavg", "--dataset", "synthetic",
            "--model", "mlp_fcd", "--clients", "6", "--participation", "0.5", "--rounds", "4",
            "--eval-every", "2", "--local-epochs", "1", "--executor", "serial", "--out", str(out),
            "--set", "data.synthetic.shape=1,8,8", "--set", "data.synthetic.train_samples=600",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["run_dir"] == str(out) and summary["rounds"] == 4
    assert set(summary["final"]) == {"gm_gtest", "gm_ptest", "lm_ptest", "updated_lm_ptest", "new_gm_ptest", "new_lm_ptest"}
    assert summary["final"]["new_lm_ptest"] is None  # no client held out (eval.new_clients)
    assert summary["final"]["updated_lm_ptest"] is None  # eval.updated_lm is off

    metrics = pq.read_table(out / "metrics.parquet").to_pylist()
    assert [r["round"] for r in metrics] == [2, 4]
    assert metrics[-1]["gm_gtest"] == summary["final"]["gm_gtest"]
    assert all(0 <= r["gm_ptest"] <= 1 and r["lm_ptest"] is None for r in metrics)
    assert all(r["bytes_down"] > 0 and r["bytes_up"] > 0 for r in metrics)

    clients = pq.read_table(out / "clients.parquet").to_pylist()
    assert len(clients) == 2 * 6
    assert {r["client"] for r in clients} == set(range(6))
    last = [r for r in clients if r["round"] == 4]
    assert abs(sum(r["gm_ptest"] for r in last) / 6 - metrics[-1]["gm_ptest"]) < 1e-12

    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["algo"] == "fedavg" and cfg["clients"] == 6 and cfg["data"]["synthetic"]["shape"] == [1, 8, 8]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "accuracy/gm_gtest",
        "accuracy/gm_ptest",
        "train/loss",
        "time/round_s",
        "comm/bytes_down",
        "comm/bytes_up",
    } <= tags
    gm = acc.Scalars("accuracy/gm_gtest")
    assert [e.step for e in gm] == [2, 4]
    assert abs(gm[-1].value - summary["final"]["gm_gtest"]) < 1e-6
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    hist = acc.Histograms("clients/gm_ptest")
    assert [h.step for h in hist] == [2, 4] and hist[-1].histogram_value.num == 6
    # the partition picture, drawn beside the start, reaches TensorBoard once, as the file it wrote
    import io

    import numpy as np
    from PIL import Image

    [image] = acc.Images("data/partition")
    with Image.open(io.BytesIO(image.encoded_image_string)) as logged, Image.open(out / "partition.png") as drawn:
        assert image.step == 0 and np.array_equal(np.asarray(logged.convert("RGB")), np.asarray(drawn.convert("RGB")))


@pytest.mark.parametrize("fast", ["1", "0"])
def test_a_command_ends_at_once_with_its_output_flushed(fast):
    """exit_process: buffered output and logs are written and the status kept; the interpreter's
    teardown (here, an atexit hook) is skipped unless RAYSIM_FAST_EXIT=0."""
    probe = (
        "import atexit, logging, sys\n"
        "from raysim.commands import exit_process\n"
        "atexit.register(lambda: print('teardown', flush=True))\n"
        "logging.basicConfig(stream=sys.stderr, format='%(message)s')\n"
        "logging.getLogger('x').warning('logged')\n"
        "print('buffered', end='')\n"
        "exit_process(3)\n"
    )
    env = {**os.environ, "RAYSIM_FAST_EXIT": fast, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3
    assert proc.stdout == ("buffered" if fast == "1" else "bufferedteardown\n")
    assert proc.stderr.strip() == "logged"


def test_runs_started_in_one_second_each_get_a_directory_of_their_own(tmp_path, monkeypatch):
    """Four runs at once, in threads of one process, with the clock stopped on one second: each
    writes its own directory, and each directory holds that run's config, tables and summary."""
    import threading
    import time

    from raysim.engine.runner import run_experiment
    from tests.conftest import tiny_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101-000000")
    results: dict[int, object] = {}

    def one(seed: int) -> None:
        results[seed] = run_experiment(tiny_config(None, seed=seed, rounds=1))

    threads = [threading.Thread(target=one, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dirs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    stem = "fedavg-synthetic-20260101-000000"
    assert dirs == [stem, f"{stem}-2", f"{stem}-3", f"{stem}-4"]
    assert sorted(str(r.run_dir) for r in results.values()) == [f"runs/{d}" for d in dirs]
    for seed, r in results.items():
        assert yaml.safe_load((r.run_dir / "config.yaml").read_text())["seed"] == seed
        summary = json.loads((r.run_dir / "summary.json").read_text())
        assert summary["run_dir"] == str(r.run_dir)
        rows = pq.read_table(r.run_dir / "metrics.parquet").to_pylist()
        assert [row["train_loss"] for row in rows] == [row["train_loss"] for row in r.rows]


def _claim(args: tuple[str, str]) -> str:
    from raysim.results.output import claim_run_dir

    return str(claim_run_dir(Path(args[0]), args[1]))


def test_processes_claiming_one_name_at_once_get_one_directory_each(tmp_path):
    """The claim across processes (as on machines sharing a folder): eight at once, eight names."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(8) as pool:
        got = pool.map(_claim, [(str(tmp_path), "run")] * 8)
    assert sorted(got) == sorted(str(tmp_path / n) for n in ["run", *(f"run-{i}" for i in range(2, 9))])


def test_a_run_directory_that_is_a_file_or_holds_a_finished_run_is_refused_before_any_work(tmp_path):
    """--out naming a file, or a folder under one, is refused by the driver's check; a new run into
    a finished run's directory is refused too (it would overwrite that run's tables), which is left
    as it was; --resume goes on with it."""
    from raysim.engine.experiment import validate
    from raysim.engine.runner import run_experiment
    from raysim.errors import ConfigError
    from tests.conftest import tiny_config

    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"^The run directory .*afile is a file, not a directory\.$"):
        validate(tiny_config(tmp_path / "afile"))
    with pytest.raises(ConfigError, match=r"^The run directory .*afile/run cannot be made: .*afile is a file"):
        validate(tiny_config(tmp_path / "afile" / "run"))
    done = run_experiment(tiny_config(tmp_path / "run", rounds=1))
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=r"holds a finished run; give another --out, or go on with it by --resume"):
        run_experiment(tiny_config(tmp_path / "run", rounds=1, seed=9))
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before
    assert done.rows


def test_the_summary_records_the_algorithms_settings_with_their_defaults(tmp_path):
    """Every setting the algorithm ran with, the defaults too, by the names a user sets them: a
    run's numbers name what they came from even where a default changes later. The engine's that
    apply to the algorithm ("-FT", the server optimiser's, the added regularisers') are resolved as
    the run used them (FedAdam's registered defaults; the last round's rate for ft_lr)."""
    from raysim.engine.runner import run_experiment
    from tests.conftest import tiny_config

    def recorded(name: str, **changes: object) -> dict:
        run_experiment(tiny_config(tmp_path / name, rounds=1, **changes))
        return json.loads((tmp_path / name / "summary.json").read_text())["algo_params"]

    ditto = recorded("ditto", algo="ditto", **{"algo.personal_epochs": 2})
    assert ditto["lambda"] == 1.0 and ditto["personal_epochs"] == 2 and "lam" not in ditto
    adam = recorded("fedadam", algo="fedadam", **{"algo.beta1": 0.5})
    assert adam["server_opt"] == "adam" and adam["beta1"] == 0.5
    assert adam["server_lr"] == pytest.approx(10**-2.5) and adam["tau"] == 1e-4
    babu = recorded("fedbabu", algo="fedbabu", **{"train.lr": 0.03, "train.local_epochs": 2})
    assert babu["ft_epochs"] == 2 and babu["ft_lr"] == 0.03  # E; the last round's rate
    moon = recorded("moon", algo="moon")  # MOON's own tau; the optimiser's is server_tau
    assert moon["tau"] == 0.5 and moon["server_tau"] == 1e-3
    scaffold = recorded("scaffold", algo="scaffold", **{"algo.server_lr": 0.5})  # its own Config's
    assert scaffold["server_lr"] == 0.5 and "server_opt" not in scaffold


def test_a_setting_json_has_no_type_for_is_recorded_as_its_text():
    from dataclasses import dataclass
    from pathlib import Path

    from raysim.engine.experiment import _json_value

    @dataclass(frozen=True)
    class Odd:
        where: Path = Path("/data/x")

    assert _json_value([Path("/a"), {"b": (1, 2)}, 0.5, None]) == ["/a", {"b": [1, 2]}, 0.5, None]
    assert json.loads(json.dumps(_json_value(Odd()))) == str(Odd())
