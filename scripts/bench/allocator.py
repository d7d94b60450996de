#!/usr/bin/env python3
"""glibc's allocator thresholds in a training process (``raysim.toolkit.allocator``), off and on.

A serial FedAvg run (100 Fashion-MNIST clients, Dir(0.1), 10 a round, E = 1, B = 40,
``cnn3p2_fmnist``, ``--rounds`` rounds, no evaluation before the last) in a child process, once
with glibc's defaults (``RAYSIM_KEEP_FREED_MEMORY=0``) and once with raysim's setting, alternated
``--repeats`` times. Each child prints its rounds' times and the final ``gm_gtest`` (the same
either way: only where buffers live changes). The last line is one JSON object with the medians of
the rounds' total and their ratio (defaults over raysim's: above 1 is the setting faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(rounds: int, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    import raysim.api as api
    from raysim.results.output import BaseCallback

    class Times(BaseCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_round(self, stats: object, round_time: float) -> None:
            self.times.append(round_time)

    times = Times()
    result = api.run(
        algo="fedavg", dataset="fmnist", model="cnn3p2_fmnist", partition="dirichlet:0.1", clients=100,
        participation=0.1, rounds=rounds, local_epochs=1, batch_size=40, eval_every=0, callbacks=[times],
        set=["ray.executor=serial", "output.tensorboard=false", "output.progress=false", f"output.out={out}"],
    )  # fmt: skip
    print(json.dumps({"rounds": times.times, "gm_gtest": result.final["gm_gtest"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.rounds, a.child)
        return
    if a.rounds < 1 or a.repeats < 1:
        raise SystemExit("--rounds and --repeats must be at least 1.")
    totals: dict[str, list[float]] = {"defaults": [], "raysim": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for name in totals:
                env = dict(os.environ, RAYSIM_LOG_LEVEL="WARNING")
                if name == "defaults":
                    env["RAYSIM_KEEP_FREED_MEMORY"] = "0"
                out = subprocess.run(
                    [sys.executable, __file__, "--rounds", str(a.rounds), "--child", f"{tmp}/{name}{i}"],
                    env=env, capture_output=True, text=True, check=True,
                ).stdout.strip().splitlines()[-1]  # fmt: skip
                got = json.loads(out)
                totals[name].append(sum(got["rounds"]))
                rounds = " ".join(f"{t:.2f}" for t in got["rounds"])
                print(f"{name:8s} run {i}: rounds {rounds} s (total {sum(got['rounds']):.2f} s), "
                      f"gm_gtest {got['gm_gtest']:.4f}", flush=True)  # fmt: skip
    med = {k: statistics.median(v) for k, v in totals.items()}
    print(json.dumps({"rounds_s": {k: round(v, 3) for k, v in med.items()},
                      "ratio": round(med["defaults"] / med["raysim"], 3)}))  # fmt: skip


if __name__ == "__main__":
    main()
