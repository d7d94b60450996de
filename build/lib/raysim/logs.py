"""Logging setup: the library logs through ``logging.getLogger(__name__)``; these set handlers."""

from __future__ import annotations

import logging
import os


def setup_logging(level: int = logging.INFO) -> None:
    """Driver logging: one line per record on stderr."""
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )


def setup_worker_logging() -> None:
    """Inside Ray actors: warnings and above, unless RAYSIM_LOG_LEVEL says otherwise."""
    level = os.environ.get("RAYSIM_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING), format="%(levelname)s %(name)s: %(message)s"
    )
