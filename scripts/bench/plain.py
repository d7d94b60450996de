"""The arithmetic alone: FedAvg as a plain single-process PyTorch loop (no raysim engine, no Ray).

The benchmarks' baseline (``overhead.py``, ``cross_device.py``): the same clients, batches, model,
momentum SGD, learning-rate decay and size-weighted averaging raysim's FedAvg runs, written as one
loop with every core as intra-op threads, in the model layout and with the allocator setting of
raysim's workers (both raysim's defaults). :func:`plain_fedavg` prints nothing; its caller prints
the JSON line a benchmark reads.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Mapping
from typing import Any


def plain_fedavg(w: Mapping[str, Any], t_start: float) -> dict[str, float]:
    """Run FedAvg on workload ``w`` (keys: model, clients, per_round, rounds, epochs, batch, lr, seed,
    partition, ``channels_last``, default True as raysim's, and ``threads``, intra-op threads,
    default every core); returns ``rounds_s`` (the rounds alone), ``gm_gtest`` and ``in_process_s`` (since
    ``t_start``, the child's first line)."""
    import torch
    import torch.nn.functional as F

    from raysim import rng
    from raysim.config import DataConfig
    from raysim.data import build_federated_data
    from raysim.models import build_model
    from raysim.toolkit.allocator import keep_freed_memory

    # the same memory as raysim's workers: freed buffers kept for the next step (an allocator
    # setting, not a step; raysim.toolkit.allocator), so that the ratios measure raysim's overhead
    keep_freed_memory()
    seed, batch = int(w["seed"]), int(w["batch"])
    torch.set_num_threads(int(w.get("threads") or os.cpu_count() or 1))
    data = build_federated_data(DataConfig(dataset="fmnist", partition=str(w["partition"])), int(w["clients"]), seed)
    y_all = torch.from_numpy(data.train.y)
    model = build_model(str(w.get("model", "cnn3p2_fmnist")), data.train.input_shape, data.num_classes,
                        rng.int_seed(seed, "init"), channels_last=bool(w.get("channels_last", True)))  # fmt: skip
    params = [p for part in (model.extractor, model.filter, model.head) for p in part.parameters()]
    global_state = [p.detach().clone() for p in params]
    # the same warm-up raysim's workers do at start-up: one throwaway step on a copy of the model
    warm = copy.deepcopy(model)
    warm_opt = torch.optim.SGD(warm.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
    F.cross_entropy(
        warm(torch.zeros(batch, *data.train.input_shape)), torch.zeros(batch, dtype=torch.long)
    ).backward()
    warm_opt.step()
    t_rounds = time.perf_counter()
    for rnd in range(1, int(w["rounds"]) + 1):
        sampled = rng.sample_clients(seed, rnd, int(w["clients"]), int(w["per_round"]))
        lr = float(w["lr"]) * 0.99 ** (rnd - 1)
        sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        total = 0
        for c in sampled:
            idx = torch.from_numpy(data.client_train[c])
            x, y = torch.from_numpy(data.train.features(data.client_train[c])), y_all[idx]
            with torch.no_grad():
                for p, g in zip(params, global_state, strict=True):
                    p.copy_(g)
            opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-5)
            for epoch in range(int(w["epochs"])):
                g = torch.Generator().manual_seed(rng.int_seed(seed, f"shuffle/{epoch}", rnd, c))
                order = torch.randperm(x.shape[0], generator=g)
                for s in range(0, x.shape[0], batch):
                    b = order[s : s + batch]
                    opt.zero_grad()
                    F.cross_entropy(model(x[b]), y[b]).backward()
                    opt.step()
            n = x.shape[0]
            total += n
            for acc, p in zip(sums, params, strict=True):
                acc += n * p.detach().double()
        global_state = [(acc / total).float() for acc in sums]
        if os.environ.get("BENCH_VERBOSE"):
            print(f"round {rnd}: {time.perf_counter() - t_rounds:.3f}", file=sys.stderr)
    rounds_s = time.perf_counter() - t_rounds
    with torch.no_grad():
        for p, g in zip(params, global_state, strict=True):
            p.copy_(g)
        model.eval()
        x_test = torch.from_numpy(data.gtest.features())
        pred = torch.cat([model(x_test[i : i + 500]).argmax(1) for i in range(0, len(data.gtest), 500)])
    acc = float((pred.numpy() == data.gtest.y).mean())
    return {"rounds_s": rounds_s, "gm_gtest": acc, "in_process_s": time.perf_counter() - t_start}
