#!/usr/bin/env python3
"""The order of activation and max-pool in the convolutional models built by ``_conv_stack``
(``cnn3p2_fmnist``, ``cnn3p2_cifar``, ``cnn3p2_fmnist_bn``, ``cnn_fcd``): raysim pools first and
activates after, the papers' nets activate first. For ReLU the two give the same numbers to the bit,
forward and backward; pooling first leaves the activation a quarter of the values.

For each model, one intra-op thread (a CPU job's default), its layers as raysim builds them and the
same layers with each activation moved back before its pool (the papers' order, the same
parameters): ``--steps`` SGD steps (forward, cross-entropy, backward, update) on a random batch of
its paper's size, timed in ``--rounds`` interleaved pairs; the minimum and the median of the pairs'
per-step times. Before timing, both copies take 10 steps from the same weights, and their weights
must then be equal to the bit (``bit_identical``).

The last line is one JSON object: per model the two orders' minimum and median step times (ms),
the median over the minimum's ratio (papers' order over raysim's: above 1 is raysim's faster), and
``bit_identical``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: model -> (input shape, batch size) of its paper setup
MODELS = {
    "cnn3p2_fmnist": ((1, 28, 28), 32),
    "cnn3p2_fmnist_bn": ((1, 28, 28), 32),
    "cnn3p2_cifar": ((3, 32, 32), 40),
    "cnn_fcd": ((1, 28, 28), 10),
}


def steps(model, x, y, n: int) -> float:  # type: ignore[no-untyped-def]
    """Mean ms of ``n`` SGD steps of ``model`` on (x, y)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t = time.perf_counter()
    for _ in range(n):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    if a.steps < 1 or a.rounds < 1:
        raise SystemExit("--steps and --rounds must be at least 1.")
    import torch

    from raysim.models import activation_before_pool, build_model

    torch.set_num_threads(1)
    result: dict[str, object] = {"threads": 1, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    for name, (shape, batch) in MODELS.items():
        ours = build_model(name, shape, 10, 0)
        theirs = activation_before_pool(ours)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(batch, *shape, generator=gen).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (batch,), generator=gen)
        a_, b_ = copy.deepcopy(ours), copy.deepcopy(theirs)
        steps(a_, x, y, 10)
        steps(b_, x, y, 10)
        same = all(torch.equal(p, q) for p, q in zip(a_.state_dict().values(), b_.state_dict().values(), strict=True))
        mine, paper = [], []
        for _ in range(a.rounds):
            mine.append(steps(copy.deepcopy(ours), x, y, a.steps))
            paper.append(steps(copy.deepcopy(theirs), x, y, a.steps))
        row = {
            "pool_first_min_ms": round(min(mine), 3), "pool_first_median_ms": round(statistics.median(mine), 3),
            "act_first_min_ms": round(min(paper), 3), "act_first_median_ms": round(statistics.median(paper), 3),
            "ratio_min": round(min(paper) / min(mine), 3),
            "ratio_median": round(statistics.median(paper) / statistics.median(mine), 3),
            "bit_identical": same,
        }  # fmt: skip
        result[name] = row
        print(
            f"{name:16s} B={batch:3d} pool-first {row['pool_first_min_ms']:6.2f} ms (median {row['pool_first_median_ms']:6.2f})"
            f"  act-first {row['act_first_min_ms']:6.2f} ms (median {row['act_first_median_ms']:6.2f})"
            f"  ratio {row['ratio_min']:.2f} / {row['ratio_median']:.2f}  bit-identical {same}",
            flush=True,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
