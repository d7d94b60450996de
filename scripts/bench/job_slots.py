#!/usr/bin/env python3
"""The arithmetic's bound on job slots: how much faster N one-thread SGD steps at once are than one
N-thread step, on this machine.

``overhead.py``'s ``ratio_1w`` compares raysim with one worker of N job slots (N one-thread jobs at
once) against the plain loop (one job at a time on N intra-op threads). Without any overhead, that
ratio would be this script's ``bound``: the time of N concurrent one-thread steps, over N, divided
by the time of one N-thread step. Each step is one SGD step (momentum 0.9) of ``--model`` on a
random batch of ``--batch`` in raysim's layout and allocator setting (channels-last, freed memory
kept: ``raysim.toolkit.allocator``), each program in its own process, after 20 warm-up steps. The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def child(model: str, shape: tuple[int, ...], batch: int, threads: int, steps: int) -> None:
    from raysim.toolkit.allocator import keep_freed_memory

    keep_freed_memory()
    import torch

    from raysim.models import build_model

    torch.set_num_threads(threads)
    net = build_model(model, shape, 10, 0)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, *shape).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(20):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    print(json.dumps({"ms_per_step": (time.perf_counter() - t) / steps * 1000}), flush=True)


def timed(a: argparse.Namespace, threads: int, copies: int) -> list[float]:
    """ms a step of each of ``copies`` processes running at once."""
    cmd = [sys.executable, __file__, "--child", str(threads), "--model", a.model, "--shape", a.shape,
           "--batch", str(a.batch), "--steps", str(a.steps)]  # fmt: skip
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(copies)]
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a child failed: {' '.join(cmd)}")
        out.append(float(json.loads(stdout.strip().splitlines()[-1])["ms_per_step"]))
    return out


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse bad input before any step, in one sentence (argparse's error): an unknown model, a
    count below 1, a shape that is not positive integers or that the model does not take."""
    from raysim.errors import ConfigError
    from raysim.registry import MODELS

    for name in ("batch", "steps", "slots", "repeats"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1, not {getattr(a, name)}")
    if a.model not in MODELS.names():
        ap.error(f"--model: unknown model {a.model!r}; one of {', '.join(sorted(MODELS.names()))}")
    dims = a.shape.split(",")
    if not all(d.strip().isdigit() and int(d) > 0 for d in dims):
        ap.error(f"--shape must be positive whole numbers separated by commas (e.g. 1,28,28), not {a.shape!r}")
    try:
        MODELS.get(a.model).check_input(a.model, tuple(int(d) for d in dims))
    except ConfigError as e:
        ap.error(str(e))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="cnn3p2_fmnist")
    ap.add_argument("--shape", default="1,28,28", help="the input's shape (Fashion-MNIST's by default)")
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--slots", type=int, default=os.cpu_count() or 2, help="N (default: the CPUs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:  # one timed program, started by this script with checked arguments
        child(a.model, tuple(int(d) for d in a.shape.split(",")), a.batch, a.child, a.steps)
        return
    check_args(ap, a)
    n = a.slots
    alone, wide, together = [], [], []
    for i in range(a.repeats):  # interleaved, so drift in the machine hits every program
        alone += timed(a, 1, 1)
        wide += timed(a, n, 1)
        together.append(statistics.mean(timed(a, 1, n)))
        print(f"run {i + 1}: 1 thread {alone[-1]:.2f} ms, {n} threads {wide[-1]:.2f} ms, "
              f"{n} one-thread processes at once {together[-1]:.2f} ms a step each", file=sys.stderr, flush=True)  # fmt: skip
    result = {
        "model": a.model,
        "batch": a.batch,
        "slots": n,
        "one_thread_ms": round(statistics.median(alone), 3),
        "n_threads_ms": round(statistics.median(wide), 3),
        "n_at_once_ms": round(statistics.median(together), 3),
    }
    result["bound"] = round(result["n_at_once_ms"] / n / result["n_threads_ms"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
