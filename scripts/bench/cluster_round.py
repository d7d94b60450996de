#!/usr/bin/env python3
"""One node against a two-node local cluster: the wall time of a 100-client Fed3+2p round, and the
checkpoint size per round.

Workload: ``scripts/run.py --algo fed3p2`` with its paper setup on Fashion-MNIST (100 clients,
Dir(0.1), participation 0.2, batch 40), cut to ``--rounds`` rounds of ``--local-epochs`` epochs,
half of them in each phase, a checkpoint after every round. Two runs, one after the other, with the
same total resources (``--cpus`` CPUs, one client worker per CPU unless ``--workers``; with ``--gpu``
the workers share the machine's one GPU in both runs):

- ``one_node``: local Ray (one raylet with every CPU);
- ``two_nodes``: ``cluster/local_cluster.sh`` (``ray start``): a head and one worker node, each with
  half of the CPUs, so the client workers are split over two raylets and two object stores. The
  dataset is fetched by the second node from the first, coordinator chains pass weights node to
  node, and the server's payloads cross too.

It prints, per run, every round's training wall time (``round_time_s`` in metrics.parquet), the mean
per phase, and each round's checkpoint size; whether the two runs' metrics are equal; and, last,
one JSON object with the means.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT_LINE = re.compile(r"checkpoint of round (\d+) written \(([\d.]+) MB")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(args: list[str], out: Path, env: dict[str, str]) -> dict[str, Any]:
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run.py"), *args, "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"run failed:\n{proc.stderr[-3000:]}")
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "metrics.parquet").to_pylist()
    sizes = {int(r): float(mb) for r, mb in CHECKPOINT_LINE.findall(proc.stderr)}
    nodes = re.search(r"client workers ready on (\d+) node", proc.stderr)
    return {
        "rows": rows,
        "checkpoint_mb": sizes,
        "nodes": int(nodes.group(1)) if nodes else None,
        "process_s": wall,
        "final_bytes": (out / "checkpoint.pkl").stat().st_size,
    }


def summarize(name: str, result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    by_phase: dict[int, list[float]] = {}
    print(f"\n{name}: {result['nodes']} node(s), process {result['process_s']:.1f} s")
    print("round  phase  round_time_s  checkpoint_MB")
    for r in rows:
        phase = int(r.get("phase") or 0)
        by_phase.setdefault(phase, []).append(r["round_time_s"])
        print(f"{r['round']:5d}  {phase:5d}  {r['round_time_s']:12.2f}  {result['checkpoint_mb'].get(r['round'], 0):13.2f}")
    # the first round of each phase pays one-time costs (e.g. the first chain's data fetch)
    means = {f"phase{p}": statistics.mean(v[1:] if len(v) > 1 else v) for p, v in sorted(by_phase.items())}
    means["all"] = statistics.mean(r["round_time_s"] for r in rows)
    print("mean round time (s), each phase without its first round:", {k: round(v, 2) for k, v in means.items()})
    return means


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--cpus", type=int, default=2, help="CPUs in all (the two nodes get half each)")
    p.add_argument("--workers", type=int, default=None, help="client workers (default: one per CPU)")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="the workers share the machine's one GPU: 1/W of it each on one node; on two nodes each "
        "node offers the GPU as its own and its W/2 workers take 2/W of it each",
    )
    args = p.parse_args()
    workers = args.workers or args.cpus
    cpw = args.cpus / workers
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token")
    common = [
        "--algo", "fed3p2", "--dataset", "fmnist", "--clients", str(args.clients),
        "--rounds", str(args.rounds), "--local-epochs", str(args.local_epochs), "--no-progress",
        "--no-tensorboard", "--checkpoint-every", "1", "--workers", str(workers), "--cpus-per-worker", f"{cpw:g}",
    ]  # fmt: skip
    gpu_one = ["--gpus-per-worker", f"{1 / workers:g}"] if args.gpu else []
    gpu_two = ["--gpus-per-worker", f"{2 / workers:g}"] if args.gpu else []
    tmp = Path(tempfile.mkdtemp(prefix="raysim-bench-cluster-"))
    one = run([*common, *gpu_one], tmp / "one_node", env)
    state = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths live under it
    cluster_env = {**env, "RAYSIM_CLUSTER_DIR": str(state)}
    script = ["bash", str(ROOT / "cluster" / "local_cluster.sh")]
    port = free_port()
    half = str(max(1, args.cpus // 2))
    started = subprocess.run(
        [*script, "start", "--workers", "1", "--head-cpus", half, "--cpus-per-node", half,
         "--port", str(port), "--no-dashboard", *(["--gpus-per-node", "1"] if args.gpu else [])],
        env=cluster_env, capture_output=True, text=True,
    )  # fmt: skip
    if started.returncode != 0:
        sys.exit(f"the local cluster did not start:\n{started.stdout}{started.stderr[-3000:]}")
    try:
        two = run([*common, *gpu_two, "--address", f"127.0.0.1:{port}"], tmp / "two_nodes", env)
    finally:
        subprocess.run([*script, "stop"], env=cluster_env, capture_output=True)
    a, b = summarize("one_node", one), summarize("two_nodes", two)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rows]  # noqa: E731
    equal = strip(one["rows"]) == strip(two["rows"])
    print(f"\nmetrics equal on one and two nodes: {equal}")
    print(f"final checkpoint: {one['final_bytes'] / 1e6:.2f} MB ({args.clients} clients, round {args.rounds})")
    print(json.dumps({"one_node_s": a, "two_nodes_s": b, "metrics_equal": equal,
                      "checkpoint_mb": one["checkpoint_mb"], "out": str(tmp)}))  # fmt: skip


if __name__ == "__main__":
    main()
