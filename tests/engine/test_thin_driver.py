"""The driver stays thin: importing the CLI, the runner and every registered algorithm loads no
PyTorch (DESIGN.md: nothing big crosses or lives in the driver; PyTorch costs a process about
0.3 GB of private memory and 1.5 s)."""

from __future__ import annotations

import subprocess
import sys


def test_driver_imports_no_torch():
    code = (
        "import sys\n"
        "import raysim.cli, raysim.runner, raysim.executors, raysim.ray_env, raysim.output\n"
        "from algorithms.base import REGISTRY, algorithm_class\n"
        "for name in sorted(REGISTRY):\n"
        "    algorithm_class(name)\n"
        "assert REGISTRY, 'no algorithms registered'\n"
        "loaded = [m for m in ('torch', 'torchvision') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
