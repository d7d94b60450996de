#!/usr/bin/env python3
"""A suite against the same runs one by one: 8 short Fashion-MNIST runs, FedAvg and
Fed3+2p x 4 seeds (100 clients, Dir(0.1), participation 0.2, 3 rounds of 1 epoch), as

- ``separate``: 8 ``scripts/run.py`` calls one after another, each starting its own local Ray with
  ``--workers`` client workers (default: one per CPU);
- ``suite``: one ``scripts/sweep.py``: one Ray start, the 8 trials packed onto the cluster, one
  client worker each (``--trial-workers``), as many at once as fit.

Every run trains with one thread a job, so both ways give the same numbers (checked). It reports
the wall time of each way, their ratio (suite over separate), and the peak memory (PSS) of each
way's process tree (for ``separate``, the largest of its runs'). With ``--gpu``, every worker asks for
a share of the one GPU instead of a CPU (``--gpu-share`` each). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import run_measured  # noqa: E402

RUN = [
    "--dataset", "fmnist", "--clients", "100", "--participation", "0.2", "--partition", "dirichlet:0.1",
    "--rounds", "3", "--local-epochs", "1", "--threads", "1", "--eval-every", "0", "--no-tensorboard",
]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--workers", type=int, help="client workers of each separate run (default: one per CPU)")
    ap.add_argument("--trial-workers", type=int, default=1, help="client workers of each suite trial")
    ap.add_argument("--gpu", action="store_true", help="workers on shares of one GPU")
    ap.add_argument("--gpu-share", type=float, default=0.25)
    a = ap.parse_args()
    device = ["--gpus-per-worker", str(a.gpu_share), "--cpus-per-worker", "1"] if a.gpu else []
    algos = ("fedavg", "fed3p2")
    with tempfile.TemporaryDirectory() as tmp:
        separate_s, separate_peak, separate = 0.0, 0.0, {}
        for algo in algos:
            for seed in range(a.seeds):
                cmd = [sys.executable, str(ROOT / "scripts" / "run.py"), "--algo", algo, "--seed", str(seed), *RUN,
                       *device, *(["--workers", str(a.workers)] if a.workers else []), "--no-progress", "-q",
                       "--out", f"{tmp}/{algo}{seed}"]  # fmt: skip
                wall, last, peak = run_measured(cmd, sample_memory=True)
                separate_s += wall
                separate_peak = max(separate_peak, peak)
                separate[(algo, seed)] = last["final"]
                print(f"separate {algo} seed {seed}: {wall:.1f} s, {peak:.0f} MB", file=sys.stderr, flush=True)
        cmd = [sys.executable, str(ROOT / "scripts" / "sweep.py"), "--algo", ",".join(algos),
               "--seeds", f"0-{a.seeds - 1}", *RUN, *device, "--workers", str(a.trial_workers),
               "--no-progress", "-q", "--out", f"{tmp}/suite"]  # fmt: skip
        suite_s, last, suite_peak = run_measured(cmd, sample_memory=True)
        print(f"suite: {suite_s:.1f} s, {suite_peak:.0f} MB", file=sys.stderr, flush=True)
        runs = {
            (algo, int(json.loads(p.read_text())["seed"])): json.loads((p.parent / "summary.json").read_text())["final"]
            for p in Path(f"{tmp}/suite/runs").glob("*/trial.json")
            for algo in algos
            if p.parent.name.startswith(f"{algo}-seed")
        }
    same = runs == separate
    print(
        json.dumps(
            {
                "runs": len(separate),
                "separate_s": round(separate_s, 1),
                "suite_s": round(suite_s, 1),
                "ratio": round(suite_s / separate_s, 3),
                "separate_peak_mb": round(separate_peak),
                "suite_peak_mb": round(suite_peak),
                "same_numbers": same,
            }
        )
    )


if __name__ == "__main__":
    main()
