"""raysim's SGD is torch.optim.SGD to the bit, and training does not import TorchDynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from raysim.toolkit.sgd import SGD


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3), torch.nn.Linear(3, 3))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize(("momentum", "wd"), [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3), (0.0, 1e-2)])
def test_matches_torch_optim_sgd_to_the_bit(foreach: bool, momentum: float, wd: float) -> None:
    ours, theirs = _model(0), _model(0)
    # the last layer gets no gradient in steps 2 and 3: both must skip it and keep its buffer
    opt = SGD(ours.parameters(), 0.1, momentum, wd)
    opt.foreach = foreach  # the accelerator path, run on the CPU: the same operations
    ref = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=momentum, weight_decay=wd)
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        for model, o in ((ours, opt), (theirs, ref)):
            o.zero_grad(set_to_none=True) if o is ref else o.zero_grad()
            body = model[:3](x)
            out = model[3](body) if step not in (1, 2) else body
            torch.nn.functional.cross_entropy(out, y).backward()
            o.step()
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(a, b)
    if momentum:
        want = [ref.state[p]["momentum_buffer"] for p in theirs.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(opt.momentum_buffers(), want, strict=True))
    else:
        assert opt.momentum_buffers() == ()


def test_buffers_carried_in_continue_the_momentum() -> None:
    """Starting from another optimizer's buffers equals one optimizer run on (a chain's carry)."""
    one, two = _model(0), _model(0)
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(4)]

    def run(model: torch.nn.Module, opt: SGD, batches: list) -> None:
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    whole = SGD(one.parameters(), 0.05, 0.9, 1e-4)
    run(one, whole, data)
    first = SGD(two.parameters(), 0.05, 0.9, 1e-4)
    run(two, first, data[:2])
    second = SGD(two.parameters(), 0.05, 0.9, 1e-4, buffers=first.momentum_buffers())
    run(two, second, data[2:])
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), two.parameters(), strict=True))
    with pytest.raises(ValueError, match="momentum buffers"):
        SGD(two.parameters(), 0.05, 0.9, buffers=first.momentum_buffers()[:1])


def test_a_client_job_imports_no_dynamo() -> None:
    """Local training (the warm-up a worker does at start-up) leaves torch._dynamo unimported: its
    import is about a second of every worker's start-up, for a compiler raysim does not use."""
    code = (
        "import sys, torch\n"
        "from raysim.models import build_model\n"
        "from raysim.toolkit.train import SGDConfig, local_train\n"
        "from raysim.weights import PARTS\n"
        "m = build_model('cnn3p2_fmnist', (1, 28, 28), 10, 0)\n"
        "x, y = torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.long)\n"
        "local_train(m, lambda e: [(x, y)], epochs=1, parts=PARTS, sgd=SGDConfig(0.1, 0.9, 1e-5))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
