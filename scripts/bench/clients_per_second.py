#!/usr/bin/env python3
"""Client updates per second on one worker: one by one against batched (``train.batch_clients``).

Workload: FedAvg's local update, ``cnn3p2_fmnist`` at batch 40, one local epoch, on
Fashion-MNIST Dir(0.1) over 100 clients (``--partition``, ``--federation``: e.g. ``--partition iid
--federation 3000`` for the cross-device regime's one-step clients of 20 samples, as
``cross_device.py``; ``--dataset synthetic`` for a machine without it: Gaussian images in
Fashion-MNIST's shape and sizes). One client runtime (what a worker hosts) trains
the same ``--clients`` clients from the same global model, ``--repeats`` times for each setting:
one by one (``run_chain``, as ``batch_clients=1``) and in batches of K (``run_batch``) for each K of
``--batch``. On the CPU (``--device cpu``, threads ``--threads``) or a GPU (``--device cuda``: the
worker asks for one whole GPU).

Each setting prints its median seconds and client updates per second; the last line is one JSON
object with them and ``speedup`` (batched over one by one) per K.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--model", default="cnn3p2_fmnist")
    parser.add_argument("--clients", type=int, default=20, help="client updates per timed pass")
    parser.add_argument("--partition", default="dirichlet:0.1", help="how the data is split (data.partition)")
    parser.add_argument("--federation", type=int, default=100, help="clients the data is split over")
    parser.add_argument("--batch", type=int, nargs="+", default=[5, 10, 20], help="the K to time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.federation < 1:
        parser.error(f"--federation must be at least 1, not {args.federation}")
    if not 1 <= args.clients <= args.federation:
        parser.error(f"--clients must be from 1 to --federation ({args.federation}), not {args.clients}")
    if any(k < 2 for k in args.batch):
        parser.error(f"--batch takes batch sizes of at least 2, not {min(args.batch)}")
    if args.repeats < 1 or args.threads < 1:
        parser.error(f"--repeats and --threads must be at least 1, not {args.repeats} and {args.threads}")

    import torch

    from raysim.config import ExperimentConfig, RayConfig
    from raysim.engine.client import ClientRuntime
    from raysim.engine.runner import prepare
    from raysim.errors import ConfigError
    from raysim.wire import WeightsPayload

    cfg = ExperimentConfig()
    cfg = replace(
        cfg,
        algo="fedavg",
        model=args.model,
        clients=args.federation,
        data=replace(
            cfg.data,
            dataset=args.dataset,
            partition=args.partition,
            # synthetic data in Fashion-MNIST's shape and sizes, so that the same model and
            # partition fit it (its default 2000 samples leave Dir(0.1) clients under min_samples)
            synthetic=replace(cfg.data.synthetic, train_samples=60000, test_samples=10000, shape=(1, 28, 28)),
        ),
        train=replace(cfg.train, local_epochs=1, batch_size=40, lr=0.01, threads=args.threads),
        ray=RayConfig(executor="serial", gpus_per_worker=1.0 if args.device == "cuda" else 0.0),
    )
    try:
        data = prepare(cfg)  # checks the settings, then the data
    except ConfigError as e:
        parser.error(str(e))
    torch.set_num_threads(args.threads)
    runtime = ClientRuntime(cfg, data)
    runtime.warm_up()
    payload = WeightsPayload(runtime.initial_weights.select(("extractor", "filter", "head")), cfg.train.lr)
    clients = list(range(args.clients))

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def one_by_one() -> None:
        for c in clients:
            runtime.run_chain(1, [c], payload, None)

    def batched(k: int) -> None:
        for i in range(0, len(clients), k):
            runtime.run_batch(1, [[c] for c in clients[i : i + k]], payload)  # k one-client jobs

    settings = {"one_by_one": one_by_one, **{f"batched_{k}": (lambda k=k: batched(k)) for k in args.batch}}
    times: dict[str, list[float]] = {name: [] for name in settings}
    for fn in settings.values():  # a warm pass each, untimed (kernel choice, allocator)
        fn()
    for _ in range(args.repeats):
        for name, fn in settings.items():  # interleaved, so drift in the machine hits all
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t)
    result: dict[str, object] = {
        "device": str(runtime.device) if args.device == "cpu" else torch.cuda.get_device_name(),
        "threads": args.threads,
        "clients": len(clients),
        "samples": int(sum(data.client_train[c].size for c in clients)),
    }
    base = statistics.median(times["one_by_one"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:12s} {med:7.3f} s  {len(clients) / med:7.2f} client updates/s", flush=True)
        result[f"{name}_s"] = round(med, 4)
        result[f"{name}_per_s"] = round(len(clients) / med, 3)
        if name != "one_by_one":
            result[f"speedup_{name.split('_')[1]}"] = round(base / med, 3)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
