"""Checkpoints: everything a run needs to go on from a round boundary as if it had never stopped.

A checkpoint is one file, ``RUN_DIR/checkpoint.pkl``, replaced atomically (written beside it, then
renamed: :func:`raysim.results.output.replaced_atomically`, as the run's tables are) so that a run killed
while writing one still has the previous one. It holds

- the executor's :class:`~raysim.records.Snapshot`: the round it was taken after (0: after the
  prologue of an algorithm that has one), the server state (``init``/``aggregate``'s state: global
  weights, heads, groupings, prototypes, phase bookkeeping) and every client's memory (what
  ``ClientContext.keep`` and ``store`` keep on its home worker),
- the metric rows so far (per round and per client) and the run's totals (time spent training and
  evaluating, samples trained: :class:`~raysim.records.RunTotals`).

The random-number positions are the round number itself: every random draw in raysim comes from
(seed, round, client, purpose) (``raysim/rng.py``), never from a generator that advances, so a run
resumed after round r draws in round r + 1 exactly what an uninterrupted run draws there.
"""

from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError
from raysim.files import replaced_atomically
from raysim.records import RunTotals, Snapshot

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pkl"
FORMAT_VERSION = 2  # 2: the states as a Snapshot, client memories as ClientMemory, RunTotals


@dataclass
class Checkpoint:
    snapshot: Snapshot
    rows: list[dict[str, Any]] = field(default_factory=list)
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    totals: RunTotals = field(default_factory=RunTotals)
    algo: str = ""
    version: int = FORMAT_VERSION

    @property
    def round(self) -> int:
        return self.snapshot.round


def checkpoint_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / CHECKPOINT_FILE


def save(run_dir: str | os.PathLike[str], ckpt: Checkpoint) -> int:
    """Write ``ckpt`` atomically into ``run_dir``; returns its size in bytes."""
    path = checkpoint_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as tmp, open(tmp, "wb") as f:
        pickle.dump(ckpt, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    size = path.stat().st_size
    log.info("checkpoint of round %d written (%.2f MB)", ckpt.round, size / 1e6)
    return size


def load(run_dir: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint in ``run_dir``; a ConfigError (one sentence) if there is none or it is not one."""
    path = checkpoint_path(run_dir)
    if not path.is_file():
        raise ConfigError(f"{run_dir} holds no checkpoint ({CHECKPOINT_FILE}) to resume from.")
    try:
        with open(path, "rb") as f:
            ckpt = pickle.load(f)
    except Exception as e:  # truncated or from an incompatible version of the code
        raise ConfigError(f"The checkpoint {path} cannot be read ({type(e).__name__}: {e}).") from None
    if not isinstance(ckpt, Checkpoint) or ckpt.version != FORMAT_VERSION:
        raise ConfigError(f"{path} is not a checkpoint of this version of raysim.")
    return ckpt

