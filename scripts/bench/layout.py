#!/usr/bin/env python3
"""The memory layout of the convolutional models on CPU: NCHW against channels-last (``train.channels_last``).

Two measurements, each layout in turn, one intra-op thread (a CPU job's default):

- ``step``: one SGD step (forward, cross-entropy, backward) of each convolutional model on a random
  batch of its paper's size, the median of ``--steps`` steps after 5 warm-up steps;
- ``run``: a serial FedAvg run on Fashion-MNIST (100 clients, Dir(0.1), 10 a round, E = 1, B = 40,
  ``--rounds`` rounds, ``cnn3p2_fmnist``), its rounds' training time (``train_time_s``) and its
  final ``gm_gtest`` (the layouts agree to float rounding, not to the bit).

The last line is one JSON object: per model the two step times (ms) and their ratio, and the two
runs' training times and their ratio (NCHW over channels-last: above 1 is channels-last faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: model -> (input shape, batch size) of its paper setup
MODELS = {
    "cnn3p2_fmnist": ((1, 28, 28), 40),
    "cnn3p2_cifar": ((3, 32, 32), 40),
    "cnn_pac": ((1, 28, 28), 50),
    "cnn_pac_cifar": ((3, 32, 32), 50),
    "cnn_fcd": ((1, 28, 28), 10),
}


def step_ms(name: str, channels_last: bool, steps: int) -> float:
    import torch

    from raysim.models import build_model

    shape, batch = MODELS[name]
    model = build_model(name, shape, 10, 0, channels_last=channels_last)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, *shape, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    times = []
    for i in range(steps + 5):
        t = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if i >= 5:
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def run(channels_last: bool, rounds: int, out: str) -> dict[str, float]:
    import raysim.api as api

    result = api.run(
        algo="fedavg", dataset="fmnist", model="cnn3p2_fmnist", partition="dirichlet:0.1", clients=100,
        participation=0.1, rounds=rounds, local_epochs=1, batch_size=40, eval_every=0,
        set=["ray.executor=serial", "output.tensorboard=false", "output.progress=false",
             f"train.channels_last={str(channels_last).lower()}", f"output.out={out}"],
    )  # fmt: skip
    return {"train_time_s": float(result.summary["train_time_s"]), "gm_gtest": float(result.final["gm_gtest"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.steps < 1 or a.rounds < 1:
        raise SystemExit("--steps and --rounds must be at least 1.")
    import torch

    torch.set_num_threads(1)
    result: dict[str, object] = {"threads": 1}
    for name in MODELS:
        nchw, cl = step_ms(name, False, a.steps), step_ms(name, True, a.steps)
        print(f"{name:14s} step: NCHW {nchw:6.2f} ms  channels-last {cl:6.2f} ms  ({nchw / cl:.2f}x)", flush=True)
        result[name] = {"nchw_ms": round(nchw, 3), "channels_last_ms": round(cl, 3), "ratio": round(nchw / cl, 3)}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {cl: run(cl, a.rounds, f"{tmp}/{cl}") for cl in (False, True)}
    nchw, cl = runs[False]["train_time_s"], runs[True]["train_time_s"]
    print(f"serial FedAvg, {a.rounds} rounds: NCHW {nchw:.2f} s  channels-last {cl:.2f} s  ({nchw / cl:.2f}x); "
          f"gm_gtest {runs[False]['gm_gtest']:.4f} / {runs[True]['gm_gtest']:.4f}", flush=True)  # fmt: skip
    result["run"] = {"nchw": runs[False], "channels_last": runs[True], "ratio": round(nchw / cl, 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
