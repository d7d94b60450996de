#!/usr/bin/env python3
"""The cross-device regime: many clients of a few samples, hundreds a round.

Workload: FedAvg on Fashion-MNIST split IID into 3,000 clients of 20 samples, E = 1, B = 40 (so a
client is one SGD step), 3 rounds, at 200 and at 1,000 clients a round, with ``cnn3p2_fmnist`` and
``mlp_fcd``. For each workload, ``--repeats`` interleaved runs of each program, each in its own
process:

- ``plain``: the arithmetic alone, the same steps in one plain PyTorch loop with every core as
  intra-op threads (:mod:`plain`, which ``overhead.py`` runs too);
- raysim's layouts, each ``scripts/run.py`` on local Ray: ``1w`` (1 client worker with a job slot per
  core), ``2w`` (2 workers of one core) and ``2w_batched`` (the same with ``--batch-clients K``: each
  worker trains K clients at once as one batched computation);
- ``serial``: ``scripts/run.py`` with ``--set ray.executor=serial``: raysim's serial executor, the
  same jobs one at a time in the run's own process with every core as intra-op threads, no Ray
  started (the same numbers as the layouts above); not one of the layouts whose best is reported;
- ``pfl`` with ``--peer pfl``: Apple's pfl-research (``pfl`` on PyPI) on the same clients and
  cohorts (``cross_device_pfl.py``), in a virtual environment of its own that this script creates
  under ``.bench-venvs/pfl`` (or ``--pfl-python``). A comparison, not a dependency of raysim.

Reported per program: the rounds' wall time (training only), client updates per second (rounds x
clients a round over it), the rounds' time over the plain loop's, and the whole process's wall time.
The last line is one JSON object: per workload (``MODEL/K``), ``plain_updates_per_s``,
``raysim_updates_per_s`` (per layout), ``raysim_best_updates_per_s``, ``batched_over_one_by_one``
(the batched layout's rounds time over ``2w``'s), ``serial_updates_per_s`` and, when the peer ran,
``pfl_updates_per_s``, ``best_over_pfl``, ``process_over_pfl`` (per layout) and
``serial_process_over_pfl``, with each program's medians under ``runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from measure import run_measured  # noqa: E402

WORKLOAD: dict[str, Any] = dict(clients=3000, rounds=3, epochs=1, batch=40, lr=0.01, seed=0, partition="iid")
PFL_VENV = ROOT / ".bench-venvs" / "pfl"


def plain_child(model: str, per_round: int) -> None:
    t_start = time.perf_counter()
    from plain import plain_fedavg

    print(json.dumps(plain_fedavg({**WORKLOAD, "model": model, "per_round": per_round}, t_start)), flush=True)


def raysim_cmd(model: str, per_round: int, workers: int, out: str, batch_clients: int = 1) -> list[str]:
    w = WORKLOAD
    cpus = (os.cpu_count() or 1) // workers
    return [
        sys.executable, str(ROOT / "scripts" / "run.py"), "--algo", "fedavg", "--dataset", "fmnist",
        "--model", model, "--partition", str(w["partition"]), "--clients", str(w["clients"]),
        "--participation", repr(per_round / int(w["clients"])), "--rounds", str(w["rounds"]),
        "--local-epochs", str(w["epochs"]), "--batch-size", str(w["batch"]), "--lr", str(w["lr"]),
        "--seed", str(w["seed"]), "--eval-every", "0", "--workers", str(workers),
        "--cpus-per-worker", str(cpus), "--threads", "1", "--batch-clients", str(batch_clients),
        "--no-progress", "--no-tensorboard", "-q", "--out", out,
    ]  # fmt: skip


def serial_cmd(model: str, per_round: int, out: str) -> list[str]:
    """``raysim_cmd`` on the serial executor: no Ray, the run's process trains with every core."""
    cmd = raysim_cmd(model, per_round, 1, out)
    cmd[cmd.index("--threads") + 1] = str(os.cpu_count() or 1)
    return [*cmd, "--set", "ray.executor=serial"]


def pfl_python(given: str | None) -> str:
    """The peer's interpreter: ``given``, or that of ``.bench-venvs/pfl``, made (pfl 0.6 and this
    process's torch version, from the package index) if it is not there."""
    if given:
        return given
    python = PFL_VENV / "bin" / "python"
    if not python.exists():
        import torch

        version = torch.__version__.split("+")[0]
        print(f"creating {PFL_VENV} (pfl 0.6.0, torch {version}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PFL_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "pfl==0.6.0", f"torch=={version}"], check=True)
    return str(python)


def write_pfl_workload(path: Path, per_round: int) -> None:
    """The clients (raysim's IID split) and each round's cohort (raysim's sampling), for the peer."""
    import numpy as np

    from raysim import rng
    from raysim.config import DataConfig
    from raysim.data import build_federated_data

    w = WORKLOAD
    data = build_federated_data(DataConfig(dataset="fmnist", partition=str(w["partition"])), w["clients"], w["seed"])
    sizes = [len(ix) for ix in data.client_train]
    np.savez(
        path,
        x=data.train.features(np.arange(len(data.train))),
        y=data.train.y.astype(np.int64),
        client_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        client_index=np.concatenate(data.client_train).astype(np.int64),
        cohorts=np.array(
            [rng.sample_clients(w["seed"], r, w["clients"], per_round) for r in range(1, w["rounds"] + 1)],
            dtype=np.int64,
        ),
        x_test=data.gtest.features(),
        y_test=data.gtest.y.astype(np.int64),
    )


def measure(cmd: list[str], updates: int) -> dict[str, float]:
    wall, last, _ = run_measured(cmd, sample_memory=False)
    rounds = float(last.get("rounds_s", last.get("train_time_s")))
    out = {"rounds_s": rounds, "process_s": wall, "updates_per_s": updates / rounds}
    acc = last.get("gm_gtest", (last.get("final") or {}).get("gm_gtest"))
    out["gm_gtest"] = float(acc)
    if "startup_s" in last:
        out["startup_s"] = float(last["startup_s"])
    return out


def bench_workload(model: str, per_round: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    updates = per_round * int(WORKLOAD["rounds"])
    programs: dict[str, Callable[[str], list[str]]] = {
        "plain": lambda out: [sys.executable, __file__, "--plain-child", model, str(per_round)],
        "1w": lambda out: raysim_cmd(model, per_round, 1, out),
        "2w": lambda out: raysim_cmd(model, per_round, 2, out),
        "2w_batched": lambda out: raysim_cmd(model, per_round, 2, out, args.batch_clients),
        "serial": lambda out: serial_cmd(model, per_round, out),
    }
    if args.peer == "pfl":
        npz = tmp / f"pfl-{per_round}.npz"
        if not npz.exists():
            write_pfl_workload(npz, per_round)
        python = pfl_python(args.pfl_python)
        programs["pfl"] = lambda out: [
            python, str(HERE / "cross_device_pfl.py"), "--data", str(npz), "--model", model,
            "--rounds", str(WORKLOAD["rounds"]), "--per-round", str(per_round), "--epochs", str(WORKLOAD["epochs"]),
            "--batch", str(WORKLOAD["batch"]), "--lr", str(WORKLOAD["lr"]), "--seed", str(WORKLOAD["seed"]),
            "--momentum", "0.9", "--weight-decay", "1e-5",
        ]  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in programs}
    for i in range(args.repeats):
        for name, cmd in programs.items():  # interleaved, so drift in the machine hits every program
            r = measure(cmd(str(tmp / f"{model}-{per_round}-{name}-{i}")), updates)
            runs[name].append(r)
            print(
                f"{model}/{per_round} {name:10s} run {i + 1}: rounds {r['rounds_s']:6.2f} s "
                f"({r['updates_per_s']:7.1f} updates/s)  process {r['process_s']:6.2f} s  gm_gtest {r['gm_gtest']:.4f}",
                flush=True,
            )
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    layouts = ("1w", "2w", "2w_batched")
    out: dict[str, Any] = {
        "plain_updates_per_s": round(med["plain"]["updates_per_s"], 1),
        "raysim_updates_per_s": {k: round(med[k]["updates_per_s"], 1) for k in layouts},
        "raysim_best_updates_per_s": round(max(med[k]["updates_per_s"] for k in layouts), 1),
        "batched_over_one_by_one": round(med["2w_batched"]["rounds_s"] / med["2w"]["rounds_s"], 3),
        "serial_updates_per_s": round(med["serial"]["updates_per_s"], 1),
        "rounds_over_plain": {k: round(med[k]["rounds_s"] / med["plain"]["rounds_s"], 3) for k in (*layouts, "serial")},
        "runs": {name: {k: round(v, 4) for k, v in m.items()} for name, m in med.items()},
    }
    if "pfl" in med:
        out["pfl_updates_per_s"] = round(med["pfl"]["updates_per_s"], 1)
        out["best_over_pfl"] = round(out["raysim_best_updates_per_s"] / out["pfl_updates_per_s"], 3)
        out["process_over_pfl"] = {k: round(med[k]["process_s"] / med["pfl"]["process_s"], 3) for k in layouts}
        out["serial_process_over_pfl"] = round(med["serial"]["process_s"] / med["pfl"]["process_s"], 3)
    return out


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad input before any run, in one sentence (argparse's error)."""
    from raysim.registry import MODELS

    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, not {args.repeats}")
    if args.batch_clients < 2:
        ap.error(f"--batch-clients must be at least 2 (the batched layout), not {args.batch_clients}")
    for model in args.models.split(","):
        if model not in MODELS.names():
            ap.error(f"--models: unknown model {model!r}; one of {', '.join(sorted(MODELS.names()))}")
    for k in args.per_round.split(","):
        if not k.strip().isdigit() or not 1 <= int(k) <= int(WORKLOAD["clients"]):
            ap.error(f"--per-round: {k!r} is not a number of clients from 1 to {WORKLOAD['clients']}")
    if args.pfl_python and not Path(args.pfl_python).is_file():
        ap.error(f"--pfl-python: no such file {args.pfl_python}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each program (medians reported)")
    ap.add_argument("--models", default="cnn3p2_fmnist,mlp_fcd", help="comma-separated")
    ap.add_argument("--per-round", default="200,1000", help="clients a round, comma-separated")
    ap.add_argument(
        "--batch-clients", type=int, default=16,
        help="K of the batched layout (a multiple of 8: each batch's worker then sums its uploads)",
    )  # fmt: skip
    ap.add_argument("--peer", choices=["pfl"], help="run pfl-research on the same workload too")
    ap.add_argument("--pfl-python", help="the peer's Python (default: .bench-venvs/pfl, made if missing)")
    ap.add_argument("--plain-child", nargs=2, metavar=("MODEL", "K"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_child:
        plain_child(args.plain_child[0], int(args.plain_child[1]))
        return
    check_args(ap, args)
    result: dict[str, Any] = {"cores": os.cpu_count(), "repeats": args.repeats, **WORKLOAD}
    workloads: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for per_round in (int(k) for k in args.per_round.split(",")):
            for model in args.models.split(","):
                workloads[f"{model}/{per_round}"] = bench_workload(model, per_round, args, Path(tmp))
    for key in ("plain_updates_per_s", "raysim_updates_per_s", "raysim_best_updates_per_s",
                "batched_over_one_by_one", "serial_updates_per_s", "pfl_updates_per_s",
                "best_over_pfl", "serial_process_over_pfl"):  # fmt: skip
        if any(key in w for w in workloads.values()):
            result[key] = {name: w[key] for name, w in workloads.items() if key in w}
    result["workloads"] = workloads
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
