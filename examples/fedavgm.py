"""A user's own algorithm in one file, run against FedAvg on two seeds with raysim's Python API.

FedAvgM (Hsu, Qi and Brown 2019, "Measuring the Effects of Non-Identical Data Distribution for
Federated Visual Classification", Sec. 3): the clients train as in FedAvg; the server treats the
change of the average, Delta = w - avg_k(w_k), as a gradient and steps with momentum,
v <- beta v + Delta, w <- w - eta v (beta = 0.9 and eta = 1 by default; beta = 0 is FedAvg).

Nothing in raysim changes for it: the class registers itself under a name, and ``raysim.run`` ships
this file to the Ray workers (``raysim.plugins``), so it runs on every executor::

    python examples/fedavgm.py                       # FMNIST, 20 clients, 10 rounds, local Ray
    python examples/fedavgm.py --dataset synthetic --clients 6 --rounds 2 --executor serial

It prints a table: the final global-model accuracy of each algorithm on each seed, then the mean and
standard deviation over the seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # raysim from a checkout, not installed

import raysim  # noqa: E402
from algorithms.base import register  # noqa: E402
from algorithms.fedavg import FedAvg  # noqa: E402
from raysim.toolkit.aggregate import average_uploads  # noqa: E402
from raysim.weights import ModelWeights, map_parts  # noqa: E402


@dataclass(frozen=True)
class FedAvgMConfig:
    server_momentum: float = 0.9  # beta
    server_lr: float = 1.0  # eta


@dataclass(frozen=True)
class FedAvgMState:
    weights: ModelWeights  # w, what the clients receive and the evaluation reads
    momentum: ModelWeights | None = None  # v (None before the first round)


@register("fedavgm")
class FedAvgM(FedAvg):
    Config = FedAvgMConfig

    def init(self, ctx):  # type: ignore[no-untyped-def]
        return FedAvgMState(super().init(ctx).weights)

    def aggregate(self, state, rnd, results):  # type: ignore[no-untyped-def]
        beta, eta = self.params.server_momentum, self.params.server_lr
        delta = map_parts(lambda w, a: w - a, state.weights, average_uploads(results))
        v = delta if state.momentum is None else map_parts(lambda m, d: beta * m + d, state.momentum, delta)
        return FedAvgMState(map_parts(lambda w, m: w - eta * m, state.weights, v), v)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="FedAvgM against FedAvg on two seeds.")
    p.add_argument("--dataset", default="fmnist")
    p.add_argument("--model", default=None, help="default: the dataset's (cnn3p2_fmnist; mlp_fcd on synthetic)")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--executor", default="ray")
    p.add_argument("--out", default="runs/example-fedavgm")
    args = p.parse_args(argv)
    model = args.model or ("mlp_fcd" if args.dataset == "synthetic" else "cnn3p2_fmnist")
    seeds = [int(s) for s in args.seeds.split(",")]
    finals: dict[str, list[float]] = {}
    print(f"{'algorithm':10s} {'seed':>4s} {'gm_gtest':>9s}")
    for algo in ("fedavg", "fedavgm"):
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
