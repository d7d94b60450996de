"""raysim.toolkit.allocator: a process that trains serves a step's megabyte buffers from its heap.

(That it changes no number is the golden test's: its cases were recorded before the setting, and a
serial run's ClientRuntime sets it.)"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import ctypes, json, sys
from raysim.toolkit.allocator import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
set_ = keep_freed_memory()
before = libc.mallinfo2().hblkhd
block = libc.malloc(8 * 1024 * 1024)  # a conv layer's activations at B = 40
mapped = libc.mallinfo2().hblkhd - before
libc.free(block)
print(json.dumps({"set": set_, "mapped": mapped}))
"""


def _probe(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


def test_an_8_mib_block_comes_from_the_heap_not_a_new_mapping():
    try:
        ctypes.CDLL("libc.so.6").mallinfo2  # noqa: B018 - glibc 2.33 or later
    except (OSError, AttributeError):
        pytest.skip("needs glibc's mallinfo2")
    env = {k: v for k, v in os.environ.items() if k != "RAYSIM_KEEP_FREED_MEMORY"}
    assert _probe(env) == {"set": True, "mapped": 0}
    defaults = _probe({**env, "RAYSIM_KEEP_FREED_MEMORY": "0"})
    assert defaults["set"] is False and defaults["mapped"] >= 8 * 1024 * 1024  # glibc's own mmap
