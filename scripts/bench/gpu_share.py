#!/usr/bin/env python3
"""Round time of Fed3+2p with client workers sharing one GPU through fractional ``num_gpus``.

Workload: the paper's FMNIST setup (``--algo fed3p2``: 100 clients, participation 0.2, 5 local
epochs, batch 40, ``cnn3p2_fmnist``, Dir(0.1)) for ``--rounds`` rounds, the first half phase 1
(five Type-A coordinators training their clients one after another) and the rest phase 2 (filters
and P-heads on the clients' home workers). Each layout runs in its own process with its own local
Ray, one after another, never side by side:

- ``cpu:W``: W client workers, one CPU each, no GPU;
- ``gpu:W``: W client workers sharing the machine's one GPU, each asking for ``1/W`` of it
  (``--gpus-per-worker``) and ``--cpus-per-worker`` CPUs.

For each layout it prints the median round time of each phase (the first round of each phase is
left out: it carries CUDA's and Ray's first-call costs), the start-up time and the GPU memory the
whole machine held at its peak (``nvidia-smi`` sampled every 0.5 s while the layout ran). The last line is one JSON object.

Example (on a machine with one GPU): ``python scripts/bench/gpu_share.py --layouts cpu:16 gpu:1 gpu:5 gpu:10``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def child(layout: str, rounds: int, cpus: float, out: str) -> None:
    """One layout, in this process: the run, with each round's wall time kept."""
    from raysim.commands.run import config_from_args
    from raysim.engine.runner import run_experiment
    from raysim.results.output import BaseCallback

    kind, workers = layout.split(":")
    w = int(workers)
    gpus = 1.0 / w if kind == "gpu" else 0.0
    args = [
        "--algo", "fed3p2", "--clients", "100", "--rounds", str(rounds), "--eval-every", "0",
        "--workers", str(w), "--cpus-per-worker", str(cpus if kind == "gpu" else 1),
        "--gpus-per-worker", str(gpus), "--out", out, "--no-tensorboard", "--no-progress", "-q",
        "--set", f"algo.phase1_rounds={rounds // 2}",
    ]  # fmt: skip
    cfg = config_from_args(args)

    class Times(BaseCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_round(self, stats: Any, round_time: float) -> None:
            self.times.append(round_time)

    times = Times()
    t0 = time.perf_counter()
    result = run_experiment(cfg, [times])
    t1 = rounds // 2
    print(
        "RESULT "
        + json.dumps(
            {
                "layout": layout,
                "gpus_per_worker": round(gpus, 4),
                "phase1_round_s": round(statistics.median(times.times[1:t1]), 3),
                "phase2_round_s": round(statistics.median(times.times[t1 + 1 :]), 3),
                "setup_s": round(result.setup_time_s, 2),
                "process_s": round(time.perf_counter() - t0, 2),
                "gm_gtest": result.final.get("gm_gtest"),
                "lm_ptest": result.final.get("lm_ptest"),
            }
        ),
        flush=True,
    )


def gpu_memory_mb() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return int(out.split()[0])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", nargs="+", default=["cpu:16", "gpu:1", "gpu:5", "gpu:10"])
    ap.add_argument("--rounds", type=int, default=8, help="rounds per layout; half in each phase (>= 6)")
    ap.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs of each GPU-sharing worker")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rounds < 6:
        ap.error("--rounds must be at least 6 (three per phase, the first of each left out)")
    if a.child:
        child(a.child, a.rounds, a.cpus_per_worker, a.out)
        return
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in a.layouts:
            cmd = [sys.executable, __file__, "--child", layout, "--rounds", str(a.rounds),
                   "--cpus-per-worker", str(a.cpus_per_worker), "--out", f"{tmp}/{layout.replace(':', '_')}"]  # fmt: skip
            proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            peak = [0]

            def sample(proc: subprocess.Popen[str] = proc, peak: list[int] = peak) -> None:
                while proc.poll() is None:
                    peak[0] = max(peak[0], gpu_memory_mb() or 0)
                    time.sleep(0.5)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            line = ""
            assert proc.stdout is not None
            for text in proc.stdout:
                if text.startswith("RESULT "):
                    line = text[len("RESULT ") :]
            sampler.join()
            if proc.wait() != 0 or not line:
                print(f"{layout}: failed (exit {proc.returncode})", flush=True)
                continue
            row = json.loads(line)
            row["gpu_memory_peak_mb"] = peak[0] if layout.startswith("gpu") else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({r["layout"]: r for r in rows}))


if __name__ == "__main__":
    main()
