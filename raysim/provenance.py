"""What a result came from: the commit of the code that computed it."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path


@functools.cache
def source_commit() -> str | None:
    """The git commit of the code running (``+dirty`` when tracked files differed from it when it was
    first asked, as the code a process imported is that of its start), or None outside a git
    checkout: a run's summary and a published page name the code their numbers came from. Read once
    a process (two git calls, about 50 ms)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


__all__ = ["source_commit"]
