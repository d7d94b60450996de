#!/usr/bin/env python3
"""How long raysim's data preparation takes at full size: a client's sample slice and the partitions.

Two figures, each the median of ``--repeats`` timings after one warm-up:

- ``features``: ``ArrayDataset.features`` of 4,000 sorted indices (a large client's samples) of a
  CIFAR-sized uint8 set (60,000 x 3 x 32 x 32), normalised to float32: what a client does when it
  gathers its data at the start of a run. Target: under 0.5 s.
- ``partition:P``: ``build_federated_data`` for 100 clients of an FMNIST-sized label set (60,000
  training and 10,000 test labels, 10 classes) under each partition P: Dir(0.1), two classes a
  client, and the dominant split at s = 20. The pixels are not loaded (one float a sample): this is
  the partitioner's and the test-set matching's own time. Target: under 1 s each.

The last line is one JSON object: each figure in seconds and whether it meets its target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = ("dirichlet:0.1", "pathological:2", "dominant:20")
TARGETS = {"features": 0.5, **{f"partition:{p}": 1.0 for p in PARTITIONS}}


def timed(fn: Any, repeats: int) -> float:
    fn()  # warm-up: first-touch pages and imports are not the steady cost
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    if a.repeats < 1:
        raise SystemExit("--repeats must be at least 1.")
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from raysim.config import DataConfig
    from raysim.data import federated
    from raysim.data.datasets import CIFAR10_MEAN, CIFAR10_STD, ArrayDataset

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(60000, 3, 32, 32), dtype=np.uint8)
    cifar = ArrayDataset(x, rng.integers(0, 10, size=60000), 10, "cifar-like", CIFAR10_MEAN, CIFAR10_STD)
    idx = np.sort(rng.choice(60000, 4000, replace=False))
    figures = {"features": timed(lambda: cifar.features(idx), a.repeats)}

    train_y = np.repeat(np.arange(10), 6000)
    rng.shuffle(train_y)
    train = ArrayDataset(np.zeros((60000, 1), np.float32), train_y, 10, "fmnist-like")
    test = ArrayDataset(np.zeros((10000, 1), np.float32), np.repeat(np.arange(10), 1000), 10, "fmnist-like")
    federated.load_dataset = lambda cfg, seed: (train, test)  # labels only: the partitioner's own time
    for p in PARTITIONS:
        cfg = DataConfig(partition=p)
        figures[f"partition:{p}"] = timed(lambda cfg=cfg: federated.build_federated_data(cfg, 100, seed=0), a.repeats)

    for name, seconds in figures.items():
        print(f"{name:26s} {seconds:8.3f} s  (target {TARGETS[name]} s)")
    print(json.dumps({name: {"s": round(s, 4), "meets": s < TARGETS[name]} for name, s in figures.items()}))


if __name__ == "__main__":
    main()
