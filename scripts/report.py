#!/usr/bin/env python3
"""Compare raysim runs: ``python scripts/report.py runs/a runs/b --out /tmp/report``; see
raysim/commands/report.py (the same as ``raysim report``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raysim.commands.report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
