"""A user's own algorithm in one file, run against FedAvg on two seeds with raysim's Python API.

FedMedian (Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates", ICML 2018, Option I): the clients train as in FedAvg; the server takes
the coordinate-wise median of the uploads instead of their mean, so that a few arbitrary uploads
cannot move any coordinate past the honest ones.

Nothing in raysim changes for it: the class registers itself under a name, and ``raysim.run`` ships
this file to the Ray workers (``raysim.plugins``), so it runs on every executor::

    python examples/fedmedian.py                       # FMNIST, 20 clients, 10 rounds, local Ray
    python examples/fedmedian.py --dataset synthetic --clients 6 --rounds 2 --executor serial

It prints a table: the final global-model accuracy of each algorithm on each seed, then the mean and
standard deviation over the seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # raysim from a checkout, not installed

import raysim  # noqa: E402
from algorithms.base import register  # noqa: E402
from algorithms.fedavg import FedAvg, GlobalState  # noqa: E402
from raysim.weights import ModelWeights  # noqa: E402


@register("fedmedian")
class FedMedian(FedAvg):
    # its own aggregate: what FedAvg declares for its mean (uploads summed on the workers, server
    # optimisers) applies only to FedAvg's aggregate, so not here

    def aggregate(self, state, rnd, results):  # type: ignore[no-untyped-def]
        uploads = [jr.final.weights for jr in results if jr.final.weights is not None]
        median = {n: np.median(np.stack([w.part(n) for w in uploads]), axis=0).astype(np.float32) for n in state.weights.part_names}
        return GlobalState(ModelWeights(**median))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="FedMedian against FedAvg on two seeds.")
    p.add_argument("--dataset", default="fmnist")
    p.add_argument("--model", default=None, help="default: the dataset's (cnn3p2_fmnist; mlp_fcd on synthetic)")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--executor", default="ray")
    p.add_argument("--out", default="runs/example-fedmedian")
    args = p.parse_args(argv)
    model = args.model or ("mlp_fcd" if args.dataset == "synthetic" else "cnn3p2_fmnist")
    seeds = [int(s) for s in args.seeds.split(",")]
    finals: dict[str, list[float]] = {}
    print(f"{'algorithm':10s} {'seed':>4s} {'gm_gtest':>9s}")
    for algo in ("fedavg", "fedmedian"):
        for seed in seeds:
            result = raysim.run(
                algo=algo, dataset=args.dataset, model=model, clients=args.clients, participation=0.25,
                rounds=args.rounds, local_epochs=1, lr=0.01, partition="dirichlet:0.3", seed=seed,
                executor=args.executor, out=f"{args.out}/{algo}-seed{seed}", progress=False, tensorboard=False,
            )  # fmt: skip
            acc = float(result.metrics["gm_gtest"].iloc[-1])
            finals.setdefault(algo, []).append(acc)
            print(f"{algo:10s} {seed:4d} {acc:9.4f}", flush=True)
    for algo, accs in finals.items():
        std = statistics.pstdev(accs) if len(accs) > 1 else 0.0
        print(f"{algo:10s} mean {statistics.mean(accs):.4f} +- {std:.4f} over {len(accs)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
