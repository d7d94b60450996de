"""Files written whole or not at all."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it replaces ``path`` in one rename,
    so a reader (a report, a resumed run, a test polling the tables) never sees a half-written file
    and a run killed while writing leaves the previous version."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["replaced_atomically"]
