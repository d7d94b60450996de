"""The driver stays thin: importing the CLI, the runner, the executors' driver side and every
registered algorithm, and reading every registry, loads no PyTorch (docs/design.md: nothing big crosses or
lives in the driver; PyTorch costs a process about 0.3 GB of private memory and 1.5 s)."""

from __future__ import annotations

import subprocess
import sys


def test_driver_imports_no_torch():
    code = (
        "import sys\n"
        "import raysim.commands.run, raysim.engine.runner, raysim.results.output, raysim.engine.experiment\n"
        "import raysim.engine.executors.ray_executor, raysim.engine.executors.session\n"
        "from raysim import registry\n"
        "from raysim.engine.experiment import algorithm_class\n"
        "names = registry.ALGORITHMS.names()\n"
        "assert len(names) >= 16, names\n"
        "for name in names:\n"
        "    algorithm_class(name)\n"
        "for reg in (registry.DATASETS, registry.MODELS, registry.PARTITIONS, registry.TEST_MODES,\n"
        "            registry.EXECUTORS):\n"
        "    assert reg.names()\n"
        "raysim.commands.run.build_parser().format_help()\n"
        "loaded = [m for m in ('torch', 'torchvision') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
