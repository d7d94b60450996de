"""The commands: thin layers over the Python API (:mod:`raysim.api`) that parse text.

- ``run``: ``python scripts/run.py`` / ``raysim run``, one experiment;
- ``sweep``: ``python scripts/sweep.py`` / ``raysim sweep``, a suite on Ray Tune;
- ``report``: ``raysim report``, plots and tables of run or suite directories;
- ``partition``: ``raysim partition``, a partition's picture without training;
- ``console``: the ``raysim`` command, which dispatches to the others;
- ``flags``: the flag parser and ``--set`` handling they share.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """End a command-line process with ``code`` as soon as its work is written.

    For the end of a command run as a program (``scripts/run.py``, ``raysim run``), after its
    ``main`` has returned: everything the run keeps (results, TensorBoard events, checkpoints) is
    closed by then and Ray is stopped. It flushes the logs and the standard streams and ends the
    process without the interpreter's teardown. ``scripts/bench/exit.py`` measured that teardown at
    0.24 s of a Ray run's end (its driver does not import PyTorch) and 0.55 s of a serial one's
    (PyTorch's own is about 0.5 s: ``python -c "import torch"`` takes 1.35 s here, 0.85 s when it
    ends with ``os._exit``). W&B's service (``--log wandb``), which writes a run's files after the
    run is finished, is torn down first. ``RAYSIM_FAST_EXIT=0`` gives the interpreter's normal exit."""
    if os.environ.get("RAYSIM_FAST_EXIT", "1").lower() in ("0", "false", "no"):
        sys.exit(code)
    if "wandb" in sys.modules:  # --log wandb: its service writes the run's files until torn down
        sys.modules["wandb"].teardown()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe gone
            pass
    os._exit(code)


__all__ = ["exit_process"]
