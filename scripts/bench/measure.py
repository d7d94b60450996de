"""Measuring a benchmark's child process: its wall time and the peak memory of its process tree."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any

import psutil


def pss_bytes(pid: int) -> int:
    """PSS of one process from /proc/PID/smaps_rollup (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_measured(
    cmd: list[str], sample_memory: bool, extra_env: dict[str, str] | None = None
) -> tuple[float, dict[str, Any], float]:
    """Run ``cmd`` (on loopback Ray, reporting nothing); its wall time, its last stdout line as
    JSON, and (if asked) the peak proportional set size of its whole process tree in MB, Ray's
    daemons and workers included, sampled every 0.2 s."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", **(extra_env or {}))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            peak[0] = max(peak[0], sum(pss_bytes(p.pid) for p in procs))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    if sample_memory:
        sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    if sample_memory:
        sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, json.loads(out.strip().splitlines()[-1]), peak[0] / 2**20
