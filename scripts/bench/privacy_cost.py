#!/usr/bin/env python3
"""What differential privacy costs in time: seconds per round of a small FMNIST-shaped run without
DP, with sample-level DP-SGD (``privacy.example_clip``; raysim.privacy.dp_sgd) computing per-example
gradients by ``torch_func`` and by ``opacus``, and with client-level DP (a fixed and an adaptive clip).

    RAY_USAGE_STATS_ENABLED=0 python scripts/bench/privacy_cost.py [--rounds 6] [--repeats 2]

Each variant is one serial run (``ray.executor=serial``: the arithmetic, without Ray's scheduling)
of FedAvg on the CNN of Fed3+2p's FMNIST experiments (``cnn3p2_fmnist``) over synthetic data shaped
as FMNIST (``data.synthetic.shape`` (1, 28, 28)): ``--clients`` clients of ``--samples`` training
samples each (an IID split), ``--per-round`` of them a round, one local epoch of batches of
``--batch-size``, one intra-op thread (a CPU worker's job slot). A round's time is its
``round_time_s`` (training only; evaluation is timed apart); the first round (imports, warm-up) is
left out, and the table gives the median over the other rounds of ``--repeats`` runs, and its ratio
to the run without DP. The variants run one after another in one process, so a machine shared with
other work slows them alike only when its load holds still: run it on an idle machine for figures
to publish. A second table times one SGD step of the loop on one batch, the three ways taking turns
(``--step-repeats`` turns of 10 steps; the median), the fairer comparison of the ways on a busy
machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: name -> settings over the base run
VARIANTS: dict[str, dict[str, Any]] = {
    "no DP": {},
    "DP-SGD, torch_func": {
        "privacy.example_clip": 1.0,
        "privacy.example_noise_multiplier": 1.0,
        "privacy.per_example": "torch_func",
    },
    "DP-SGD, opacus": {
        "privacy.example_clip": 1.0,
        "privacy.example_noise_multiplier": 1.0,
        "privacy.per_example": "opacus",
    },
    # client-level DP (raysim.privacy.client_level): the server's clipping and noise, timed in the
    # round (a round's time runs to the end of its aggregation)
    "client-level DP": {"privacy.clip": "1.0", "privacy.noise_multiplier": 1.0},
    "client-level DP, adaptive clip": {
        "privacy.clip": "adaptive:0.5",
        "privacy.noise_multiplier": 1.0,
        "privacy.count_noise_multiplier": 5.0,
    },
}


def base_settings(args: argparse.Namespace, out: str) -> dict[str, Any]:
    return {
        "algo": "fedavg",
        "model": "cnn3p2_fmnist",
        "clients": args.clients,
        "participation": args.per_round / args.clients,
        "rounds": args.rounds,
        "seed": 0,
        "data.dataset": "synthetic",
        "data.partition": "iid",
        "data.synthetic.shape": (1, 28, 28),
        "data.synthetic.train_samples": args.clients * args.samples,
        "data.synthetic.test_samples": 1000,
        "train.local_epochs": 1,
        "train.batch_size": args.batch_size,
        "train.lr": 0.05,
        "train.threads": 1,
        "eval.every": 1,
        "ray.executor": "serial",
        "output.out": out,
        "output.progress": False,
        "output.tensorboard": False,
        "paper_setup": False,
    }


def round_times(settings: dict[str, Any]) -> list[float]:
    """The ``round_time_s`` of every round after the first, of one run."""
    from raysim.api import make_config
    from raysim.engine.runner import run_experiment

    cfg = make_config(None, set=settings)
    rows = run_experiment(cfg).rows
    return [float(r["round_time_s"]) for r in rows if r["round"] > 1]


def interleaved_steps(batch_size: int, steps: int, repeats: int) -> dict[str, float]:
    """Seconds per SGD step of the loop on one batch, the ways taking turns (``steps`` steps each,
    ``repeats`` turns): the medians, so that a load that changes during the measurement weighs on
    each way alike."""
    import time

    import torch

    from raysim.models import build_model
    from raysim.privacy.dp_sgd import DPSGD
    from raysim.toolkit.train import SGDConfig, local_train

    torch.set_num_threads(1)
    x, y = torch.randn(batch_size, 1, 28, 28), torch.randint(0, 10, (batch_size,))
    model = build_model("cnn3p2_fmnist", (1, 28, 28), 10, 0)
    parts = ("extractor", "filter", "head")
    ways: dict[str, DPSGD | None] = {"no DP": None}
    for way in ("torch_func", "opacus"):
        ways[f"DP-SGD, {way}"] = DPSGD(
            clip=1.0, noise_multiplier=1.0, expected_batch=batch_size, per_example=way
        )
    times: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(repeats + 1):
        for name, dp in ways.items():
            t = time.perf_counter()
            local_train(model, lambda e: [(x, y)] * steps, epochs=1, parts=parts, sgd=SGDConfig(0.01), dp=dp)
            if r > 0:  # the first turn warms up
                times[name].append((time.perf_counter() - t) / steps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--per-round", type=int, default=5)
    p.add_argument("--samples", type=int, default=300, help="training samples a client")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--only", nargs="*", help="variants to run (default all)")
    p.add_argument("--step-repeats", type=int, default=15, help="turns of the interleaved per-step timing")
    args = p.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    from raysim.toolkit.context import ClientContext

    if not hasattr(ClientContext, "dp_sgd"):
        sys.exit("The client context does not run DP-SGD yet (ClientContext.dp_sgd): nothing to measure.")
    per_step = interleaved_steps(args.batch_size, 10, args.step_repeats)
    names = [n for n in VARIANTS if not args.only or n in args.only]
    medians: dict[str, float] = {}
    spreads: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            times: list[float] = []
            for r in range(args.repeats):
                out = str(Path(tmp) / f"{len(medians)}-{r}")
                times += round_times({**base_settings(args, out), **VARIANTS[name]})
            medians[name] = statistics.median(times)
            spreads[name] = (min(times), max(times))
            print(f"{name}: {[round(t, 3) for t in times]}", file=sys.stderr, flush=True)
    steps = args.per_round * -(-args.samples // args.batch_size)
    print(f"FedAvg, cnn3p2_fmnist, synthetic (1, 28, 28); {args.per_round} of {args.clients} clients a round, "
          f"{args.samples} samples each, 1 epoch, batch {args.batch_size} ({steps} steps a round), 1 thread")  # fmt: skip
    print(f"{'variant':<24} {'s/round':>8} {'min':>7} {'max':>7} {'x no DP':>8}")
    ref = medians.get("no DP")
    for name in names:
        ratio = f"{medians[name] / ref:8.2f}" if ref else f"{'-':>8}"
        lo, hi = spreads[name]
        print(f"{name:<24} {medians[name]:8.3f} {lo:7.3f} {hi:7.3f} {ratio}")
    print(
        f"\none step on one batch of {args.batch_size}, the ways taking turns (median of {args.step_repeats} turns)"
    )
    print(f"{'variant':<24} {'ms/step':>8} {'x no DP':>8}")
    for name, t in per_step.items():
        print(f"{name:<24} {1000 * t:8.2f} {t / per_step['no DP']:8.2f}")


if __name__ == "__main__":
    main()
