"""How sharp a run's global model is on its clients' mini-batches, against the inner step alpha.

    python scripts/sharpness.py RUN_DIR [--clients N] [--iterations K] [--alpha A]

Reads the run's settings (``RUN_DIR/config.yaml``) and its checkpoint (``RUN_DIR/checkpoint.pkl``,
the server state after the round it names, in a timed deployment beside the clock; the global
weights of a FedAvg-like algorithm such as FedAvg or Per-FedAvg), rebuilds the run's federated data
and model with raysim's own functions, and for each of the first N clients (default 10, or all the
run has if fewer) estimates lambda_max, the largest eigenvalue of the Hessian of the mean
cross-entropy of one of its training mini-batches at the global weights, by power iteration with
Hessian-vector products (:func:`top_hessian_eigenvalue`, K iterations, default 30). A plain
gradient step of size alpha overshoots along the sharpest direction, as on a quadratic, where
alpha * lambda_max > 2.

- The mini-batch: the first mini-batch of epoch 0 of the client's local shuffle in the round after
  the checkpoint (``ClientContext.batches``, with the run's ``train.batch_size`` and its
  ``data.augment``): what the client trains on first if sampled in that round (Per-FedAvg: the D of
  its first inner step). A client with fewer samples than the batch size gives a smaller batch.
- The parameters: those of the global path (extractor, filter, head), all that a FedAvg-like
  algorithm trains; the loss is their mean cross-entropy on the batch, as Per-FedAvg's step takes it.
- The mode: train mode, as training sees the model; dropout layers, if any, are turned off so that
  every Hessian-vector product is of the same function, and BatchNorm layers, if any, normalise by
  the batch's own statistics. A model with neither (``cnn3p2_fmnist``, ``mlp_fcd``) computes the
  same function in either mode. The output says which applied.
- alpha: ``--alpha``, else the run's ``algo.alpha`` if its algorithm has one (Per-FedAvg's inner
  step, 0.01 by default), else the run's learning rate ``train.lr`` (a FedAvg step's size).

It prints one line per client (``client lambda_max alpha*lambda_max``), a summary line (min, median
and max of both), and the global model's predicted-class histogram on G-Test (the count of each
class among the argmax predictions over the whole official test set, in eval mode as the run
evaluates it): a model that predicts one class shows it there. Bad input ends in one sentence,
``sharpness.py: error: ...``, and exit status 2, before any data is loaded.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raysim.commands.flags import Parser  # noqa: E402
from raysim.errors import ConfigError  # noqa: E402

if TYPE_CHECKING:
    import torch

    from raysim.checkpoint import Checkpoint
    from raysim.engine.experiment import Experiment
    from raysim.weights import ModelWeights

PROG = "sharpness.py"
DEFAULT_CLIENTS = 10


def top_hessian_eigenvalue(
    loss_fn: Callable[[], torch.Tensor],
    params: Sequence[torch.Tensor],
    iterations: int,
    generator: torch.Generator,
) -> float:
    """The largest (algebraic) eigenvalue of the Hessian of ``loss_fn()`` in ``params``, by power
    iteration with Hessian-vector products from a random start drawn from ``generator`` (a CPU
    generator; the start moves to the parameters' device).

    The loss and its gradient g are computed once, with ``create_graph=True``; each iteration is one
    Hessian-vector product H v, the gradient of g . v, and the estimate is the Rayleigh quotient
    v . H v of the unit vector v. Power iteration converges to the eigenvalue of largest magnitude.
    When that estimate is negative (the Hessian's most negative eigenvalue outweighs its largest),
    ``iterations`` more run on the shifted H - s I, s the first estimate, whose eigenvalues are all
    about >= 0 and whose largest belongs to the largest eigenvalue of H; the result is then that
    pass's v . H v. So the result is the largest eigenvalue, never the most negative one; being a
    Rayleigh quotient, it is at most that eigenvalue (a lower bound until converged). The
    convergence goes as the ratio of the two largest magnitudes to the power 2 * ``iterations``.
    ``iterations`` >= 1; a Hessian of zero gives 0.0."""
    import torch

    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, not {iterations}")
    params = list(params)
    grads = torch.autograd.grad(loss_fn(), params, create_graph=True)

    def hvp(v: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True))

    def dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
        return sum((x * y).sum() for x, y in zip(a, b, strict=True))  # type: ignore[return-value]

    def unit(v: list[torch.Tensor]) -> list[torch.Tensor] | None:
        norm = float(torch.sqrt(dot(v, v)))
        return None if norm == 0 or not math.isfinite(norm) else [x / norm for x in v]

    start = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p in params]
    v0 = unit(start)
    if v0 is None:  # no parameters to speak of
        return 0.0

    def power(v: list[torch.Tensor], shift: float) -> float:
        estimate = 0.0
        for _ in range(iterations):
            hv = [h.detach() for h in hvp(v)]
            estimate = float(dot(v, hv))  # v . H v, v a unit vector
            w = unit([h - shift * x for h, x in zip(hv, v, strict=True)] if shift else hv)
            if w is None:  # (H - shift I) v = 0: v is an eigenvector of eigenvalue ``shift``
                return estimate
            v = w
        return estimate

    first = power(v0, 0.0)
    if first >= 0:
        return first
    return power(v0, first)


# ---- the run


@dataclass(frozen=True)
class Run:
    """What the script reads of a run directory before any heavy work."""

    path: Path
    exp: Experiment
    ckpt: Checkpoint
    weights: ModelWeights
    alpha: float
    alpha_source: str
    clients: int


def read_run(run_dir: str, clients: int | None, alpha: float | None) -> Run:
    """The run in ``run_dir``: its experiment, its checkpoint's global weights, the step alpha and
    the number of clients to measure (``clients``, else 10 or all the run has if fewer); a
    ConfigError (one sentence) for anything missing or unfit."""
    from raysim.checkpoint import CHECKPOINT_FILE, checkpoint_path
    from raysim.checkpoint import load as load_checkpoint
    from raysim.config import load_config_file
    from raysim.engine.buffered import Saved
    from raysim.engine.experiment import resolve_config, validate
    from raysim.weights import GLOBAL_PARTS, ModelWeights

    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"No such run directory: {run_dir}.")
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a run directory (it has no config.yaml).")
    if not checkpoint_path(path).is_file():
        raise ConfigError(
            f"{run_dir} holds no checkpoint ({CHECKPOINT_FILE}): run it with output.checkpoint_every > 0."
        )
    saved = load_config_file(path / "config.yaml")
    # the saved config is already resolved: no paper setup goes beneath it again (as --resume reads it)
    exp = validate(resolve_config({**saved, "paper_setup": False}))
    cfg = exp.cfg
    if clients is None:
        clients = min(DEFAULT_CLIENTS, cfg.clients)
    elif clients > cfg.clients:
        raise ConfigError(f"--clients {clients} is more than the run's {cfg.clients} clients.")
    ckpt = load_checkpoint(path)
    state = ckpt.snapshot.server_state
    if isinstance(state, Saved):  # a timed deployment's server: the algorithm's state with its clock
        state = state.state
    weights = getattr(state, "weights", None)
    if not isinstance(weights, ModelWeights) or any(getattr(weights, p) is None for p in GLOBAL_PARTS):
        raise ConfigError(
            f"The {ckpt.algo or cfg.algo} run's server state ({type(state).__name__}) holds no global "
            "weights of the whole global path (extractor, filter and head), so it has no one model to measure."
        )
    source = "--alpha"
    if alpha is None:
        alpha = getattr(exp.params, "alpha", None)
        source = "the run's algo.alpha"
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
            alpha, source = cfg.train.lr, f"the run's train.lr; {cfg.algo} has no algo.alpha"
    return Run(path, exp, ckpt, weights.select(GLOBAL_PARTS), float(alpha), source, clients)


def training_mode(model: torch.nn.Module) -> str:
    """Put ``model`` in train mode with its dropout layers off; say what that means for it."""
    import torch

    model.train()
    dropout = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    for m in dropout:
        m.eval()
    norms = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if not dropout and not norms:
        return "train mode (the model has no BatchNorm or dropout: the same function as eval mode)"
    said = ["BatchNorm normalising by the batch's statistics" if norms else ""]
    said.append("dropout off" if dropout else "")
    return "train mode (" + ", ".join(s for s in said if s) + ")"


def histogram_line(counts: Sequence[int]) -> str:
    return " ".join(f"{c}:{n}" for c, n in enumerate(counts))


def measure(run: Run, iterations: int, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Load the data and the model, print the per-client lines, the summary and the G-Test
    histogram; return them (``lambdas``, ``histogram``)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from raysim import rng
    from raysim.data.federated import build_federated_data
    from raysim.models import parameters_of, set_weights
    from raysim.toolkit.context import ClientContext, ClientWorkspace
    from raysim.toolkit.train import predict
    from raysim.weights import GLOBAL_PARTS

    cfg, clients = run.exp.cfg, run.clients
    rnd = run.ckpt.round + 1  # the round after the checkpoint's: its shuffles
    data = build_federated_data(cfg.data, cfg.clients, cfg.seed, quiet=True)
    ws = ClientWorkspace(cfg, data, adapt=run.exp.algorithm.adapt_model)
    model = ws.model
    set_weights(model, run.weights)

    # the global model's predictions on G-Test, in eval mode as the run evaluates it
    model.eval()
    with torch.no_grad():
        x, _ = ws.gather(data.gtest, np.arange(len(data.gtest)))
        pred = predict(model, x, cfg.eval.batch_size).cpu().numpy()
    del x
    counts = [int(n) for n in np.bincount(pred, minlength=data.num_classes)]

    mode = training_mode(model)
    params = parameters_of(model, GLOBAL_PARTS)
    for p in params:
        p.requires_grad_(True)
    out(
        f"run {run.path}: {cfg.algo}, {cfg.model} on {cfg.data.dataset} ({cfg.data.partition}), "
        f"checkpoint after round {run.ckpt.round} of {cfg.rounds}"
    )
    out(
        f"batch: each client's first mini-batch (train.batch_size {cfg.train.batch_size}) of epoch 0 of its "
        f"round-{rnd} local shuffle; {mode}; {sum(p.numel() for p in params)} parameters"
    )
    out(f"lambda_max: power iteration, {iterations} Hessian-vector products from a seeded random start")
    out(f"alpha = {run.alpha:g} ({run.alpha_source})")
    out("client lambda_max alpha*lambda_max")
    lambdas: list[float] = []
    short: list[tuple[int, int]] = []
    for cid in range(clients):
        ctx = ClientContext(ws, cid, rnd)
        xb, yb = next(iter(ctx.batches(0)))
        if yb.shape[0] < cfg.train.batch_size:
            short.append((cid, int(yb.shape[0])))
        g = torch.Generator().manual_seed(rng.int_seed(cfg.seed, "sharpness", rnd, cid))

        def loss(xb: torch.Tensor = xb, yb: torch.Tensor = yb) -> torch.Tensor:
            return F.cross_entropy(model(xb), yb)

        lam = top_hessian_eigenvalue(loss, params, iterations, g)
        lambdas.append(lam)
        out(f"{cid} {lam:.6g} {run.alpha * lam:.6g}")
    if short:
        out("short batches (client: samples): " + ", ".join(f"{c}: {n}" for c, n in short))
    a = np.array(lambdas)
    out(
        f"summary over {clients} clients: lambda_max min {a.min():.6g} median {np.median(a):.6g} "
        f"max {a.max():.6g}; alpha*lambda_max min {run.alpha * a.min():.6g} "
        f"median {run.alpha * np.median(a):.6g} max {run.alpha * a.max():.6g}"
    )
    out(f"G-Test predicted-class histogram ({len(pred)} samples, class:count): {histogram_line(counts)}")
    return {"lambdas": lambdas, "histogram": counts}


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with config.yaml and checkpoint.pkl")
    p.add_argument(
        "--clients", type=int, default=None, metavar="N",
        help=f"the first N clients (default {DEFAULT_CLIENTS}, or all the run has if fewer)",
    )  # fmt: skip
    p.add_argument(
        "--iterations", type=int, default=30, metavar="K", help="power iterations per client (default 30)"
    )
    p.add_argument(
        "--alpha", type=float, default=None, metavar="A",
        help="the step alpha (default: the run's algo.alpha, else its train.lr)",
    )  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    t0 = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        if args.clients is not None and args.clients < 1:
            raise ConfigError(f"--clients must be at least 1, not {args.clients}.")
        if args.iterations < 1:
            raise ConfigError(f"--iterations must be at least 1, not {args.iterations}.")
        if args.alpha is not None and not (math.isfinite(args.alpha) and args.alpha > 0):
            raise ConfigError(f"--alpha must be a positive number, not {args.alpha:g}.")
        run = read_run(args.run_dir, args.clients, args.alpha)
        measure(run, args.iterations)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
