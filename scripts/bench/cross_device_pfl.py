#!/usr/bin/env python3
"""FedAvg in Apple's pfl-research on a cross-device workload: the pfl peer of ``cross_device.py``.

A comparison, not a dependency: raysim never imports pfl. pfl-research (https://github.com/apple/pfl-research,
the ``pfl`` package, written for 0.6) simulates federated learning in one process (or several, with
Horovod or torchrun); this child runs it in one process, on the workload that ``cross_device.py`` writes
as a .npz file (the arrays are described at :func:`load`), with the model raysim builds, and prints one
JSON line as the last line of stdout::

    {"rounds_s": ..., "in_process_s": ..., "gm_gtest": ..., "updates": R*K}

``rounds_s``: the R rounds alone (``algorithm.run``); ``in_process_s``: this script from its start to the
end (imports, loading, building, the rounds, the test); ``gm_gtest``: the global model's accuracy on the
global test set; ``updates``: client updates trained. Everything else (pfl's logging) goes to stderr.
Run it with the Python of a virtual environment that has pfl and torch (not raysim: the model code is
imported from this checkout, and needs only numpy and torch)::

    /path/to/pflvenv/bin/python scripts/bench/cross_device_pfl.py --data workload.npz --model cnn3p2_fmnist \\
        --rounds 50 --per-round 100 --epochs 1 --batch 40 --lr 0.01 --threads 2

How pfl is set up, and where it differs from raysim's FedAvg on this workload:

- Cohorts: the .npz file's, in its order. pfl samples users with a ``user_sampler`` callable that a
  ``FederatedDataset`` calls once per user; in one process it calls it exactly K times a round, so a
  sampler that walks through the rows of ``cohorts`` gives pfl the same cohorts as raysim.
- Local training: pfl's ``FederatedAveraging`` with a fresh ``torch.optim.SGD`` per user (learning rate
  ``--lr``; momentum and weight decay 0 unless ``--momentum`` / ``--weight-decay`` are given, where
  raysim's defaults are 0.9 and 1e-5), E epochs of batches of B, the last one partial. The rate stays
  ``--lr`` in every round (raysim multiplies it by ``train.lr_decay``, 0.99, each round). pfl iterates a
  user's samples in the same order every epoch (its ``Dataset`` does not shuffle); raysim draws a new
  order each epoch.
- Aggregation: pfl averages the users' model differences by the statistics' weights, 1 per user by
  default (an unweighted mean); the ``WeightByDatapoints`` postprocessor used here weights each user by
  its number of samples, as raysim's FedAvg does. The central optimizer is SGD with learning rate 1, so
  the new global model is the weighted average of the local models. Only parameters are averaged
  (pfl leaves buffers such as BatchNorm statistics where they are; the FMNIST models have none).
- Evaluation: none during training. pfl's ``NNAlgorithmParams`` evaluates the cohort's users before and
  after local training in every round whose index is a multiple of ``evaluation_frequency``, round 0
  included, so ``FederatedAveraging`` is subclassed here to switch that off; the metrics that pfl would
  print to stdout after each round are not sent (``send_metrics_to_platform=False``).
- Device: pfl's choice, a GPU when torch sees one; set ``PFL_PYTORCH_DEVICE=cpu`` to keep it on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

INPUT_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
EVAL_BATCH = 500


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the workload's .npz file")
    p.add_argument("--model", required=True, help="a raysim model name, e.g. cnn3p2_fmnist")
    p.add_argument("--rounds", type=int, required=True, help="R: rounds (pfl's central iterations)")
    p.add_argument("--per-round", type=int, required=True, help="K: clients a round (the cohort size)")
    p.add_argument("--epochs", type=int, default=1, help="E: local epochs")
    p.add_argument("--batch", type=int, default=40, help="B: local batch size")
    p.add_argument("--lr", type=float, default=0.01, help="local learning rate")
    p.add_argument("--momentum", type=float, default=0.0, help="local SGD momentum")
    p.add_argument("--weight-decay", type=float, default=0.0, help="local SGD weight decay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    return p.parse_args()


def load(path: str, rounds: int, per_round: int) -> dict[str, np.ndarray]:
    """The workload: ``x`` (N, 1, 28, 28) float32, normalised, and ``y`` (N,) int64; client c's samples are
    ``client_index[client_offsets[c]:client_offsets[c + 1]]``; ``cohorts`` (R, K) the clients of each
    round; ``x_test`` and ``y_test`` the global test set. Checks the cohorts against R and K."""
    import numpy as np

    with np.load(path) as f:
        data = {k: f[k] for k in ("x", "y", "client_offsets", "client_index", "cohorts", "x_test", "y_test")}
    cohorts = data["cohorts"]
    if cohorts.ndim != 2 or cohorts.shape[0] < rounds or cohorts.shape[1] != per_round:
        raise SystemExit(
            f"cohorts has shape {cohorts.shape}; --rounds {rounds} --per-round {per_round} need "
            f"at least {rounds} rows of {per_round}"
        )
    data["cohorts"] = cohorts[:rounds]
    return data


def client_tensors(data: dict[str, np.ndarray], device: torch.device) -> dict[int, tuple[torch.Tensor, ...]]:
    """(x, y) on ``device`` for each client that a cohort holds, keyed by client id (pfl's user id)."""
    import numpy as np
    import torch

    x = torch.from_numpy(data["x"])
    y = torch.from_numpy(data["y"])
    offsets, index = data["client_offsets"], data["client_index"]
    users: dict[int, tuple[torch.Tensor, ...]] = {}
    for c in np.unique(data["cohorts"]).tolist():
        idx = torch.from_numpy(index[offsets[c] : offsets[c + 1]])
        users[c] = (x.index_select(0, idx).to(device), y.index_select(0, idx).to(device))
    return users


def fixed_cohorts(cohorts: np.ndarray) -> Callable[[], int]:
    """A pfl ``user_sampler``: each call the next client of ``cohorts``, row by row."""
    it: Iterator[int] = iter(cohorts.reshape(-1).tolist())
    return lambda: next(it)


def classifier(net: torch.nn.Module) -> torch.nn.Module:
    """``net`` (its forward returns logits) with the ``loss`` and ``metrics`` that pfl's PyTorchModel calls
    with a batch's tensors: mean cross-entropy in train mode, summed loss and correct predictions in eval."""
    import torch
    import torch.nn.functional as F
    from pfl.metrics import Weighted

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            self.train()
            return F.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
            self.eval()
            logits = self(x)
            n = int(y.shape[0])
            return {
                "loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), n),
                "accuracy": Weighted((logits.argmax(1) == y).sum().item(), n),
            }

    return Classifier()


def fedavg_without_evaluation() -> Any:
    """pfl's FederatedAveraging with its per-round evaluation of the cohort's users switched off."""
    import dataclasses

    from pfl.algorithm import FederatedAveraging

    class NoEvalFedAvg(FederatedAveraging):
        def get_next_central_contexts(self, *args: Any, **kwargs: Any) -> Any:
            contexts, model, metrics = super().get_next_central_contexts(*args, **kwargs)
            if contexts is not None:
                contexts = tuple(dataclasses.replace(c, do_evaluation=False) for c in contexts)
            return contexts, model, metrics

    return NoEvalFedAvg()


def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device) -> float:
    """The model's top-1 accuracy on (x, y) in eval mode, in batches of EVAL_BATCH."""
    import torch

    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(y), EVAL_BATCH):
            xb = torch.from_numpy(x[start : start + EVAL_BATCH]).to(device)
            yb = torch.from_numpy(y[start : start + EVAL_BATCH]).to(device)
            correct += int((model(xb).argmax(1) == yb).sum())
    return correct / max(len(y), 1)


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> dict[str, float | int]:
    import numpy as np
    import torch
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import NNAlgorithmParams
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.model.pytorch import PyTorchModel

    from raysim.models import build_model

    torch.set_num_threads(args.threads)
    np.random.seed(args.seed)  # pfl's algorithm, backend and dataset draw their random states from it
    torch.manual_seed(args.seed)
    data = load(args.data, args.rounds, args.per_round)

    net = classifier(build_model(args.model, INPUT_SHAPE, NUM_CLASSES, args.seed))
    model = PyTorchModel(
        model=net,
        local_optimizer_create=lambda params, lr: torch.optim.SGD(
            params, lr=lr, momentum=args.momentum, weight_decay=args.weight_decay
        ),
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    device = next(model.pytorch_model.parameters()).device
    users = client_tensors(data, device)
    train = FederatedDataset.from_slices(users, fixed_cohorts(data["cohorts"]))
    backend = SimulatedBackend(training_data=train, val_data=None, postprocessors=[WeightByDatapoints()])
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=args.rounds,
        evaluation_frequency=args.rounds + 1,
        train_cohort_size=args.per_round,
        val_cohort_size=None,
    )
    train_params = NNTrainHyperParams(
        local_num_epochs=args.epochs, local_learning_rate=args.lr, local_batch_size=args.batch
    )
    algorithm = fedavg_without_evaluation()

    synchronize(device)
    t = time.perf_counter()
    algorithm.run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        send_metrics_to_platform=False,
    )
    synchronize(device)
    rounds_s = time.perf_counter() - t

    gm_gtest = accuracy(model.pytorch_model, data["x_test"], data["y_test"], device)
    return {"rounds_s": rounds_s, "gm_gtest": gm_gtest, "updates": args.rounds * args.per_round}


def main() -> None:
    args = parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON line alone
        result = run(args)
    result["in_process_s"] = time.perf_counter() - T0
    keys = ("rounds_s", "in_process_s", "gm_gtest", "updates")
    print(json.dumps({k: result[k] for k in keys}), flush=True)


if __name__ == "__main__":
    main()
