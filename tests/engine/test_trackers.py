"""The experiment trackers (``--log mlflow,wandb``), run against the real libraries and read back
with their own readers: MLflow's client (the run's parameters, each metric's history by round,
its artifacts) and W&B's offline run (its .wandb file's records, parsed as wandb's own
protocol buffers: the run's config, history and summary; and the files kept with it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raysim.commands.run import main, parse_command
from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError

#: two rounds, serial, on small synthetic data (tests/conftest.py's tiny config, as flags)
FLAGS = [
    "--algo", "fedavg", "--model", "mlp_fcd", "--dataset", "synthetic", "--clients", "6",
    "--participation", "0.5", "--rounds", "2", "--local-epochs", "1", "--batch-size", "20", "--lr", "0.05",
    "--partition", "dirichlet:0.5", "--executor", "serial", "--seed", "3", "--no-progress",
    "--no-tensorboard", "-q",
    "--set", "data.synthetic.train_samples=600", "--set", "data.synthetic.test_samples=300",
    "--set", "data.synthetic.shape=[1,8,8]", "--set", "eval.every=1",
]  # fmt: skip


def run(tmp_path: Path, *more: str) -> Path:
    out = tmp_path / "run"
    assert main([*FLAGS, "--out", str(out), *more]) == 0
    return out


def test_mlflow_holds_the_runs_settings_metrics_by_round_and_files(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    out = run(tmp_path, "--log", "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("raysim")
    assert experiment is not None
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "run" and found.info.status == "FINISHED"
    assert found.info.run_id == (out / "mlflow_run_id").read_text().strip()
    params = found.data.params
    assert params["algo"] == "fedavg" and params["clients"] == "6" and params["train.lr"] == "0.05"
    assert params["data.synthetic.shape"] == "[1, 8, 8]"
    import pandas as pd

    rows = pd.read_parquet(out / "metrics.parquet")
    history = client.get_metric_history(found.info.run_id, "gm_gtest")
    assert [(m.step, m.value) for m in history] == list(zip(rows["round"], rows["gm_gtest"], strict=True))
    assert [m.step for m in client.get_metric_history(found.info.run_id, "train/loss")] == [1, 2]
    files = {f.path for f in client.list_artifacts(found.info.run_id)}
    assert {"metrics.parquet", "clients.parquet", "summary.json", "config.yaml"} <= files
    assert not any(f.startswith(("mlruns", "wandb")) for f in files)


def test_a_resumed_run_goes_on_in_its_mlflow_run(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    out = run(tmp_path, "--log", "mlflow", "--checkpoint-every", "1")
    assert main(["--resume", str(out), "--rounds", "3", "--no-progress", "-q"]) == 0
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns' / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
    assert found.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(found.info.run_id, "gm_gtest")] == [1, 2, 3]


def test_mlflow_groups_runs_by_log_group_and_takes_a_tracking_uri(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    run(tmp_path, "--log", "mlflow", "--tracking-uri", uri, "--set", "output.log_group=my-suite")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("my-suite")
    assert experiment is not None
    (found,) = client.search_runs([experiment.experiment_id])
    assert (tmp_path / "artifacts").is_dir(), "a given SQLite store keeps its artifacts beside it"
    assert not any(elsewhere.iterdir()), "nothing is left in the working directory"
    assert "summary.json" in {f.path for f in client.list_artifacts(found.info.run_id)}


def test_wandb_offline_run_holds_the_settings_metrics_and_files(tmp_path):
    pytest.importorskip("wandb")
    import pandas as pd

    out = run(tmp_path, "--log", "wandb")
    (offline,) = (out / "wandb").glob("offline-run-*")
    run_id = (out / "wandb_run_id").read_text().strip()
    assert offline.name.endswith(run_id)
    records = finished_records(offline / f"run-{run_id}.wandb")
    (header,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in header.config.update}
    assert config["algo"] == "fedavg" and config["train.lr"] == "0.05" and config["data.synthetic.shape"] == "[1, 8, 8]"
    assert header.display_name == "run" and header.run_id == run_id
    history = [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    rows = pd.read_parquet(out / "metrics.parquet")
    assert [h["_step"] for h in history] == [1, 2]
    assert [h["gm_gtest"] for h in history] == list(rows["gm_gtest"])
    assert [h["train/loss"] for h in history] == list(rows["train_loss"])
    summary: dict[str, object] = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    assert summary["rounds"] == 2 and summary["gm_gtest"] == rows["gm_gtest"].iloc[-1]
    kept = offline / "files" / "raysim"
    assert {"metrics.parquet", "clients.parquet", "summary.json", "config.yaml"} <= {p.name for p in kept.iterdir()}
    assert (kept / "metrics.parquet").read_bytes() == (out / "metrics.parquet").read_bytes()


def finished_records(path: Path, timeout_s: float = 60) -> list[object]:
    """The .wandb file's records once it is whole (its ``exit`` record written): W&B's service
    writes an offline run's file after ``finish`` returns."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(path) if path.is_file() else []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:  # type: ignore[attr-defined]
            return records
        time.sleep(0.2)


def _items(items: object) -> dict[str, object]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}  # type: ignore[attr-defined]


def wandb_records(path: Path) -> list[object]:
    """The records of a .wandb file, each parsed as wandb's own protocol buffer (``Record``). The
    file is a LevelDB log (the installed wandb reads it in its Go core only): a 7-byte header
    (``:W&B``, a magic number and the version), then 32 KiB blocks of chunks, each a checksum, a
    length and a kind (1 whole, 2 first, 3 middle, 4 last) before its bytes."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pos, block, pending = [], 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk's header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):  # still being written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


@pytest.mark.parametrize(
    "value, needle",
    [
        ("mlfow", r"^output.log is 'mlflow' or 'wandb', not 'mlfow'\.$"),
        ("mlflow,,wandb", r"^output.log has an empty item in .*; give names separated by single commas\.$"),
        ("wandb,wandb", r"^output.log names 'wandb' twice; give each once\.$"),
        ("mlflow,", r"^output.log has an empty item"),
        ("tensorboard", r"^output.log is 'mlflow' or 'wandb', not 'tensorboard'\.$"),
    ],
)
def test_a_log_that_cannot_be_is_refused_in_one_sentence(tmp_path, value, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_command([*FLAGS, "--out", str(tmp_path), "--log", value])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "more, needle",
    [
        (["--tracking-uri", "", "--log", "mlflow"], r"^output.tracking_uri '' is not a tracking URI MLflow reads"),
        (["--tracking-uri", "htp://host:5000", "--log", "mlflow"], r"^output.tracking_uri 'htp://host:5000' is not"),
        (["--tracking-uri", "localhost:5000", "--log", "mlflow"], r"^output.tracking_uri 'localhost:5000' is not"),
        (["--tracking-uri", "http://host:5000", "--log", "wandb"], r"^output.tracking_uri .* only with --log mlflow\.$"),
        (["--set", "output.log_group=x"], r"^output.log_group groups runs in a tracker, and output.log names none\.$"),
        (["--set", "output.log_group= ", "--log", "wandb"], r"^output.log_group is empty\.$"),
    ],
)
def test_tracking_settings_that_cannot_be_are_refused_before_any_work(tmp_path, more, needle):
    with pytest.raises(ConfigError, match=needle):
        run_experiment(parse_command([*FLAGS, "--out", str(tmp_path / "run"), *more])[0])
    assert not (tmp_path / "run").exists()


def test_log_is_one_value_in_a_sweep_not_a_grid(tmp_path):
    from raysim.commands.sweep import suite_from_args
    from raysim.suite.spec import trials

    suite, _, _ = suite_from_args(["--algo", "fedavg", "--dataset", "synthetic", "--log", "mlflow,wandb"])
    assert suite.base["output.log"] == ["mlflow", "wandb"] and len(suite.configs) == 1
    (trial,) = trials(suite)
    assert trial.settings["output.log"] == ["mlflow", "wandb"]


@pytest.mark.ray
@pytest.mark.integration
def test_a_suites_trials_log_to_one_mlflow_store_grouped_by_the_suite(tmp_path, ray_local):
    """Each trial of a suite logs to one MLflow store in the suite directory, under the suite's name
    as the experiment (two trials at once on the 2 CPUs, both writing the one SQLite store)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from raysim.commands.sweep import suite_from_args
    from raysim.suite import run_suite
    from tests.engine.test_suite import TINY

    suite, _, _ = suite_from_args(["--name", "tracked", "--algo", "fedavg,fedprox", "--seeds", "0", *TINY, "--log", "mlflow"])
    summary = run_suite(suite, tmp_path / "suite", progress=False)
    assert summary["trials"] == 2
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'suite' / 'mlruns' / 'mlflow.db').resolve()}")
    experiment = client.get_experiment_by_name("tracked")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["algo"] for r in runs) == ["fedavg", "fedprox"]
    assert all(r.info.status == "FINISHED" and r.data.metrics.get("gm_gtest") is not None for r in runs)
    assert not any((tmp_path / "suite" / "runs" / r / "mlruns").exists() for r in ("fedavg-seed0", "fedprox-seed0"))
