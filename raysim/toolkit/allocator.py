"""The C allocator of a process that trains: freed memory kept for the next step.

A training step allocates and frees the same activation and gradient buffers, megabytes each, every
step. glibc's ``malloc`` serves a block above its mmap threshold (128 KiB at start, raised to the
largest block freed so far) with a fresh ``mmap``, and gives the top of its heap back to the system
when more than its trim threshold is free there: so, until those thresholds have grown past what a
step uses, every step's buffers are new pages that the kernel faults in and zeroes. A serial FedAvg
run of ``cnn3p2_fmnist`` on one thread spent about a third of its rounds so (``scripts/bench/
allocator.py``, figures in docs/benchmarks.md); an evaluation between rounds, whose larger batches
raise the thresholds, hid part of it.

:func:`keep_freed_memory` sets both thresholds once, in every process that trains (a client worker,
the driver of a serial run): blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap,
and up to 256 MiB of freed heap stays with the process. Where the C library is not glibc (or the
platform has none), nothing changes, and ``RAYSIM_KEEP_FREED_MEMORY=0`` in the environment leaves
glibc's defaults (e.g. where memory is tighter than time). Numbers do not change: only where buffers
live.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's HEAP_MAX / 2 on 64-bit: the largest it accepts
TRIM_THRESHOLD = 256 * 1024 * 1024

_done = False


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (once); whether they were set."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or os.environ.get("RAYSIM_KEEP_FREED_MEMORY") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; musl's stub returns 0 and changes nothing
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done


__all__ = ["keep_freed_memory"]
