"""A suite's record: a slim copy of its directory that is still a suite directory.

A suite directory holds, per trial, its checkpoint, TensorBoard events, per-client tables and
partition pictures (megabytes a trial); its page and its claims need only each trial's settings,
per-round metrics and summary (kilobytes). The record keeps those, the suite file, the trials'
start times and, once collected, the suite's ``summary.json`` and ``metrics.parquet``. So it is

- a page's source: ``raysim report --publish RECORD docs/results/NAME`` draws and judges it again
  (every page keeps its record in ``docs/results/NAME/suite/``), and
- a suite to finish: ``scripts/sweep.py --resume RECORD`` runs only the trials it lacks (a trial
  with a ``summary.json`` is not run again; one left unfinished starts over, its checkpoint not
  being kept). A suite can so be carried between machines, or kept between sessions, in kilobytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from raysim.errors import ConfigError
from raysim.suite.spec import STARTS_FILE, SUITE_FILE, TRIAL_FILE

#: a trial's files the record keeps: what collect, publish and the claims read
TRIAL_RECORD = (TRIAL_FILE, "config.yaml", "summary.json", "metrics.parquet")
#: the suite's own files it keeps, where they exist
SUITE_RECORD = (SUITE_FILE, STARTS_FILE, "summary.json", "metrics.parquet")


def copy_record(suite_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> list[str]:
    """Write the record of the suite in ``suite_dir`` into ``dest`` (replaced whole, so a trial
    dropped from the suite leaves it too): the suite's own files and, for each trial that wrote
    metrics, its record files. ``dest`` may not be ``suite_dir`` nor hold anything but a record.
    Returns the names of the trials kept, sorted."""
    src, out = check_record(suite_dir, dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    kept: list[str] = []
    try:
        for name in SUITE_RECORD:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
        for trial in sorted((src / "runs").glob(f"*/{TRIAL_FILE}")):
            run = trial.parent
            if not (run / "metrics.parquet").is_file():
                continue  # begun, no evaluation written yet: nothing to keep
            (tmp / "runs" / run.name).mkdir(parents=True)
            for name in TRIAL_RECORD:
                if (run / name).is_file():
                    shutil.copy2(run / name, tmp / "runs" / run.name / name)
            kept.append(run.name)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return kept


def check_record(suite_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Refuse, in one sentence, a record ``copy_record`` cannot write or that would lose something:
    a source that is no suite directory, a destination inside it, or one that holds more than a
    record. Returns both paths resolved."""
    src, out = Path(suite_dir).resolve(), Path(dest).resolve()
    if not (src / SUITE_FILE).is_file():
        raise ConfigError(f"{src} is not a suite directory (it has no {SUITE_FILE}).")
    if out == src or src in out.parents:
        raise ConfigError(f"a suite's record goes outside its suite directory, not into {out}.")
    refuse_foreign(out)
    return src, out


def refuse_foreign(dest: str | os.PathLike[str]) -> None:
    """Refuse, in one sentence, a record's destination that exists and holds more than a record
    (which replacing it would lose)."""
    out = Path(dest)
    if out.exists() and (not out.is_dir() or _foreign(out)):
        raise ConfigError(f"{out} exists and is not a suite's record; give a new directory or a record to replace.")


def _foreign(path: Path) -> bool:
    """Whether ``path`` holds something a record would not: a replaced record loses nothing else."""
    allowed = {*SUITE_RECORD, "runs"}
    if any(p.name not in allowed for p in path.iterdir()):
        return True
    runs = path / "runs"
    if runs.is_dir():
        for run in runs.iterdir():
            if not run.is_dir() or any(f.name not in TRIAL_RECORD for f in run.iterdir()):
                return True
    return False


__all__ = ["SUITE_RECORD", "TRIAL_RECORD", "check_record", "copy_record", "refuse_foreign"]
