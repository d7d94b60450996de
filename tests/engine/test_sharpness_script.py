"""``scripts/sharpness.py``: its power iteration against the exact Hessian of a tiny model, the script
on a seconds-long Per-FedAvg run, and its refusals (one sentence, exit status 2, before any data)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from raysim import checkpoint
from raysim.engine.buffered import Saved
from raysim.engine.runner import run_experiment
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sharpness.py"


def load_script():
    spec = importlib.util.spec_from_file_location("sharpness_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


sharpness = load_script()


def exact_eigenvalues(loss_of_flat, n: int) -> torch.Tensor:
    """The Hessian's eigenvalues, ascending, of ``loss_of_flat`` at the flat parameters ``n``."""
    hessian = torch.autograd.functional.hessian(loss_of_flat, n)
    return torch.linalg.eigvalsh((hessian + hessian.T) / 2)


def tiny_mlp_problem(seed: int):
    """A 4 -> 4 (tanh) -> 3 MLP (35 parameters) and cross-entropy on a fixed batch of 16, in float64:
    the module's loss closure and the same loss as a function of the flat parameter vector."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()
    x = torch.randn(16, 4, dtype=torch.float64) * 2
    y = torch.randint(0, 3, (16,))
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    names = [name for name, _ in model.named_parameters()]

    def loss_of_flat(w: torch.Tensor) -> torch.Tensor:
        pieces, i = {}, 0
        for name, p in zip(names, params, strict=True):
            pieces[name] = w[i : i + p.numel()].reshape(p.shape)
            i += p.numel()
        return F.cross_entropy(torch.func.functional_call(model, pieces, (x,)), y)

    return model, (lambda: F.cross_entropy(model(x), y)), params, flat, loss_of_flat


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_power_iteration_finds_the_exact_top_eigenvalue_of_a_tiny_mlp(seed):
    model, loss_fn, params, flat, loss_of_flat = tiny_mlp_problem(seed)
    assert flat.numel() == 35
    eig = exact_eigenvalues(loss_of_flat, flat)
    top = float(eig[-1])
    assert top > 0 and abs(top) >= abs(float(eig[0]))  # the usual case: the top is the largest magnitude
    got = sharpness.top_hessian_eigenvalue(loss_fn, params, 300, torch.Generator().manual_seed(seed))
    assert got == pytest.approx(top, rel=1e-3), eig
    # a Rayleigh quotient: never above the top eigenvalue, even after few iterations
    few = sharpness.top_hessian_eigenvalue(loss_fn, params, 3, torch.Generator().manual_seed(seed))
    assert few <= top * (1 + 1e-9)
    # seeded: the same start gives the same number
    again = sharpness.top_hessian_eigenvalue(loss_fn, params, 300, torch.Generator().manual_seed(seed))
    assert again == got


def test_power_iteration_returns_the_largest_eigenvalue_not_the_most_negative_one():
    """Eigenvalues -5, 2, 1, 0.5: power iteration alone finds -5 (the largest magnitude); the
    function then iterates on H + 5 I and returns 2."""
    a = torch.diag(torch.tensor([-5.0, 2.0, 1.0, 0.5], dtype=torch.float64))
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    h = q @ a @ q.T
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    got = sharpness.top_hessian_eigenvalue(
        lambda: 0.5 * w @ h @ w, [w], 200, torch.Generator().manual_seed(1)
    )
    assert got == pytest.approx(2.0, rel=1e-6)
    assert float(torch.linalg.eigvalsh(h)[-1]) == pytest.approx(2.0, rel=1e-9)


def test_the_script_on_a_short_perfedavg_run(tmp_path, capsys):
    cfg = tiny_config(tmp_path / "run", algo="perfedavg", rounds=2, **{"output.checkpoint_every": 1})
    result = run_experiment(cfg)
    capsys.readouterr()
    assert sharpness.main([str(result.run_dir), "--clients", "3", "--iterations", "10"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index("client lambda_max alpha*lambda_max")
    assert "alpha = 0.01 (the run's algo.alpha)" in out
    assert any("after round 2 of 2" in line for line in out)
    rows = [line.split() for line in out[head + 1 : head + 4]]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    for _, lam, step in rows:
        assert math.isfinite(float(lam)) and float(lam) > 0
        assert float(step) == pytest.approx(0.01 * float(lam), rel=1e-4)
    assert out[head + 4].startswith("summary over 3 clients: lambda_max min ")
    hist = out[-1]
    assert hist.startswith("G-Test predicted-class histogram (400 samples, class:count): ")
    counts = dict(item.split(":") for item in hist.split(": ", 1)[1].split())
    assert list(counts) == [str(c) for c in range(10)]
    assert sum(int(n) for n in counts.values()) == 400  # the synthetic test set's size

    # fedavg has no algo.alpha: its learning rate is the step, said so; in a timed deployment the
    # checkpoint keeps the algorithm's state with the clock (Saved), which the script unwraps
    timed = {"output.checkpoint_every": 1, "deployment.devices": "lognormal:1"}
    fedavg = run_experiment(tiny_config(tmp_path / "fedavg", rounds=1, **timed))
    assert isinstance(checkpoint.load(fedavg.run_dir).snapshot.server_state, Saved)
    capsys.readouterr()
    assert sharpness.main([str(fedavg.run_dir), "--clients", "1", "--iterations", "2"]) == 0
    assert "alpha = 0.05 (the run's train.lr; fedavg has no algo.alpha)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["{missing}"], "No such run directory: {missing}."),
        (["{tmp}"], "{tmp} is not a run directory (it has no config.yaml)."),
        (["{tmp}", "--clients", "0"], "--clients must be at least 1, not 0."),
        (["{tmp}", "--iterations", "0"], "--iterations must be at least 1, not 0."),
        (["{tmp}", "--alpha", "-0.1"], "--alpha must be a positive number, not -0.1."),
        (["{tmp}", "--alpha", "0"], "--alpha must be a positive number, not 0."),
    ],
)
def test_bad_input_is_refused_in_one_sentence(args, says, tmp_path, capsys):
    where = {"missing": str(tmp_path / "nowhere"), "tmp": str(tmp_path)}
    assert sharpness.main([a.format(**where) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "sharpness.py: error: " + says.format(**where)


def test_a_run_without_a_checkpoint_or_global_weights_is_refused(tmp_path, capsys):
    run_experiment(tiny_config(tmp_path / "none", rounds=1, **{"output.checkpoint_every": 0}))
    assert sharpness.main([str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"sharpness.py: error: {tmp_path / 'none'} holds no checkpoint (checkpoint.pkl): "
        "run it with output.checkpoint_every > 0."
    )
    run_experiment(tiny_config(tmp_path / "local", algo="local", rounds=1, **{"output.checkpoint_every": 1}))
    capsys.readouterr()
    assert sharpness.main([str(tmp_path / "local")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sharpness.py: error: The local run's server state (") and err.endswith(
        "holds no global weights of the whole global path (extractor, filter and head), so it has no one model to measure."
    )
    assert sharpness.main([str(tmp_path / "local"), "--clients", "9"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "sharpness.py: error: --clients 9 is more than the run's 8 clients."
    )
