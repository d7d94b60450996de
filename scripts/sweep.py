#!/usr/bin/env python3
"""Run a suite of raysim experiments (configurations x seeds) on Ray Tune; see raysim/commands/sweep.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raysim.commands.sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
