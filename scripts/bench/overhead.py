#!/usr/bin/env python3
"""raysim's overhead against a plain single-process PyTorch loop doing the same training.

Workload: FedAvg on Fashion-MNIST, Dir(0.1), ``cnn3p2_fmnist``, 100 clients, 10 per round,
1 local epoch, batch 40, 5 rounds. These programs, each in its own process, ``--repeats`` times:

- ``plain``: one PyTorch process, every core as intra-op threads, the same clients, batches, model
  and averaging written as a plain loop (no raysim engine, no Ray), in raysim's model layout and
  allocator setting (channels-last, freed buffers kept: :mod:`plain`), so that the ratios measure
  raysim's overhead over the same arithmetic;
- ``plain_pytorch_defaults``: the same loop as one writes it, NCHW and glibc's allocator defaults
  (raysim's before commits 2c34127 and 055a7d4), for ``ratio_1w_vs_pytorch_defaults`` and
  ``ratio_2w_vs_pytorch_defaults``;
- ``floor``: as many one-thread ``plain`` loops at once as there are cores, each the whole
  workload; their mean rounds time over their count is the time of the workload's steps split
  evenly over one-thread jobs, one per core, with nothing else to do: the floor of raysim's rounds
  on this machine (its job slots and its one-core workers are such jobs), whatever its overhead.
  ``floor_1w`` is that time over the plain loop's: the lowest ``ratio_1w`` and ``ratio_2w`` this
  machine allows, which is the two-thread plain loop's own inefficiency; ``ratio_1w_over_floor``
  and ``ratio_2w_over_floor`` are raysim's rounds over it (its overhead and its rounds' imbalance);
- ``raysim_1w``: ``scripts/run.py`` on local Ray, 1 client worker using every core (by default one
  job slot per core, each job on one thread: ``raysim.engine.executors.slots``);
- ``raysim_2w``: ``scripts/run.py`` on local Ray, 2 client workers with one core each;
- ``raysim_2w_batched``: the same with ``--batch-clients K`` (``--batch-clients``, default 5): each
  worker trains its clients K at a time as one batched computation.

Each reports the wall time of its 5 rounds (training only); this script also times the whole process,
and raysim's summary gives its start-up (process start to the first round) and shutdown (last round
to the executor stopped) phases, whose medians the last line carries too.
With ``--attached`` (default on), start-up is also measured attached to a running head: a
``ray start --head --block`` this script starts on a loopback port (token authentication on, as
Ray has it by default) and stops at the end, ``raysim_1w`` run against it with ``--address``
(after one that is not counted: the head's first job starts its workers' processes cold, and each run
leaves the next one processes started, ``ray.prestart_s``): ``--repeats`` runs each started as the
last one ended, ``attached_startup_s``, then ``--repeats`` runs each started 5 s after the last one
ended, on an idle head, ``attached_idle_startup_s``. Then the same against a head started with
``RAY_preload_python_modules=torch``, whose workers import PyTorch before they wait for work (as
``cluster/README.md`` advises for runs joined one after another): ``attached_preload_startup_s`` and
``attached_preload_idle_startup_s``. The local runs' start-up is ``raysim_1w_startup_s``.
Memory is measured in one more run of each program but ``floor`` (a bound, whose processes' memory
is no run's), apart from the timed ones (reading every process's memory map costs CPU that would
otherwise slow the timed runs): the peak proportional set
size (PSS, shared pages split between the processes that map them) of the whole process tree, Ray's
daemons and workers included, sampled every 0.2 s. The last line is one JSON object with the medians and the ratios ``ratio_1w``,
``ratio_2w``, ``ratio_2w_batched`` and ``ratio`` (the best of them), rounds time over the plain loop's,
and ``floor_rounds_s``, ``floor_1w``, ``ratio_1w_over_floor`` and ``ratio_2w_over_floor``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import run_measured  # noqa: E402

WORKLOAD = dict(
    clients=100, per_round=10, rounds=5, epochs=1, batch=40, lr=0.01, seed=0, partition="dirichlet:0.1"
)


def plain_loop(channels_last: bool = True, threads: int | None = None) -> None:
    """The baseline, run in a child process: FedAvg as a plain PyTorch loop (:mod:`plain`) on
    ``threads`` intra-op threads (default every core)."""
    t_start = time.perf_counter()
    from plain import plain_fedavg

    w = {**WORKLOAD, "model": "cnn3p2_fmnist", "channels_last": channels_last, "threads": threads}
    print(json.dumps(plain_fedavg(w, t_start)), flush=True)


def plain_floor(copies: int) -> None:
    """The ``floor`` program, run in a child process: ``copies`` one-thread plain loops started at
    once, each in its own process; prints their mean rounds time over ``copies``."""
    import subprocess

    cmd = [sys.executable, __file__, "--plain-child", "--threads", "1"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(copies)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"a one-thread plain loop failed (exit codes {[p.returncode for p in procs]})")
    runs = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    rounds = statistics.mean(r["rounds_s"] for r in runs) / copies
    print(json.dumps({"rounds_s": rounds, "gm_gtest": runs[0]["gm_gtest"]}), flush=True)


def raysim_cmd(workers: int, out: str, batch_clients: int = 1) -> list[str]:
    w = WORKLOAD
    cpus = (os.cpu_count() or 1) // workers
    return [
        sys.executable, str(ROOT / "scripts" / "run.py"), "--algo", "fedavg", "--dataset", "fmnist",
        "--model", "cnn3p2_fmnist", "--partition", str(w["partition"]), "--clients", str(w["clients"]),
        "--participation", str(int(w["per_round"]) / int(w["clients"])), "--rounds", str(w["rounds"]),
        "--local-epochs", str(w["epochs"]), "--batch-size", str(w["batch"]), "--lr", str(w["lr"]),
        "--seed", str(w["seed"]), "--eval-every", "0", "--workers", str(workers),
        "--cpus-per-worker", str(cpus), "--no-progress", "--no-tensorboard", "-q", "--out", out,
        "--batch-clients", str(batch_clients),
    ]  # fmt: skip


def measure(cmd: list[str], sample_memory: bool, extra_env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``cmd``; its wall time, its rounds' time and accuracy, and (if asked) the peak PSS of its tree."""
    wall, last, peak_mb = run_measured(cmd, sample_memory, extra_env)
    rounds = last.get("rounds_s", last.get("train_time_s"))
    acc = last.get("gm_gtest", (last.get("final") or {}).get("gm_gtest"))
    out = {"rounds_s": float(rounds), "process_s": wall, "peak_mb": peak_mb, "gm_gtest": float(acc)}
    for phase in ("startup_s", "shutdown_s"):  # raysim's summary: process start to round 1, last round to shutdown
        if phase in last:
            out[phase] = float(last[phase])
    return out


#: a node for runs joined one after another (cluster/README.md): the worker processes that a run
#: leaves started for the next one import PyTorch while they wait
PRELOAD_ENV = {"RAY_preload_python_modules": "torch"}


#: how long an idle head is left between runs (``attached_idle_*``): enough for the worker processes
#: that a run leaves started to finish starting
IDLE_S = 5.0


def attached_startups(repeats: int, tmp: str, preload: bool = False) -> tuple[list[float], list[float]]:
    """Start-up (process start to the first round's dispatch) of ``raysim_1w`` joined to a head
    started here (``preload``: with :data:`PRELOAD_ENV`): ``repeats`` runs each started as the last
    one ended (after one that is not counted), then ``repeats`` runs each started :data:`IDLE_S`
    after the last one ended."""
    import socket
    import subprocess

    from raysim.engine.executors.session import check_reachable

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token")
    if preload:
        env.update(PRELOAD_ENV)
    label = "attached-preload" if preload else "attached"
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen(
        [ray_cli, "start", "--head", f"--port={port}", f"--num-cpus={os.cpu_count()}", "--block",
         "--disable-usage-stats", "--include-dashboard=false"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while True:
            try:
                check_reachable(f"127.0.0.1:{port}", timeout=1)
                break
            except Exception:
                if time.time() > deadline or head.poll() is not None:
                    raise SystemExit("the Ray head did not start") from None
                time.sleep(0.5)
        time.sleep(3)  # the head's agents up
        back_to_back: list[float] = []
        idle: list[float] = []
        for i in range(2 * repeats + 1):
            if i > repeats:
                time.sleep(IDLE_S)
            cmd = [*raysim_cmd(1, str(Path(tmp) / f"{label}-{i}")), "--address", f"127.0.0.1:{port}"]
            startup = measure(cmd, sample_memory=False, extra_env={"RAY_AUTH_MODE": "token"})["startup_s"]
            how = "(not counted)" if i == 0 else "(back to back)" if i <= repeats else f"({IDLE_S:g} s after the last)"
            print(f"{label} run {i}: start-up {startup:5.2f} s {how}", flush=True)
            if i:
                (back_to_back if i <= repeats else idle).append(startup)
        return back_to_back, idle
    finally:
        head.terminate()
        head.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each program (medians reported)")
    parser.add_argument("--batch-clients", type=int, default=5, help="K of the batched program")
    parser.add_argument("--no-attached", dest="attached", action="store_false", help="skip the attached start-up")
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nchw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plain-floor", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, not {args.threads}")
    if args.plain_child:
        plain_loop(channels_last=not args.nchw, threads=args.threads)
        return
    if args.plain_floor:
        plain_floor(os.cpu_count() or 1)
        return
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, not {args.repeats}")
    if args.batch_clients < 2:
        parser.error(f"--batch-clients must be at least 2 (the batched program), not {args.batch_clients}")
    programs = {
        "plain": lambda out: [sys.executable, __file__, "--plain-child"],
        "raysim_1w": lambda out: raysim_cmd(1, out),
        "raysim_2w": lambda out: raysim_cmd(2, out),
        "raysim_2w_batched": lambda out: raysim_cmd(2, out, args.batch_clients),
        "plain_pytorch_defaults": lambda out: [sys.executable, __file__, "--plain-child", "--nchw"],
        "floor": lambda out: [sys.executable, __file__, "--plain-floor"],
    }
    envs = {"plain_pytorch_defaults": {"RAYSIM_KEEP_FREED_MEMORY": "0"}}  # glibc's own thresholds
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in programs}
    peaks: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in programs.items():
            if name == "floor":  # a bound on the rounds' time: its processes' memory is nobody's
                continue
            peaks[name] = measure(cmd(str(Path(tmp) / f"{name}-mem")), True, envs.get(name))["peak_mb"]
            print(f"{name:10s} memory run: peak PSS of the process tree {peaks[name]:7.0f} MB", flush=True)
        for i in range(args.repeats):
            for name, cmd in programs.items():  # interleaved, so drift in the machine hits them all
                r = measure(cmd(str(Path(tmp) / f"{name}-{i}")), False, envs.get(name))
                runs[name].append(r)
                print(
                    f"{name:10s} run {i + 1}: rounds {r['rounds_s']:6.2f} s  process {r['process_s']:6.2f} s  gm_gtest {r['gm_gtest']:.4f}",
                    flush=True,
                )
        attached = attached_startups(args.repeats, tmp) if args.attached else None
        preloaded = attached_startups(args.repeats, tmp, preload=True) if args.attached else None
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name in peaks:
        med[name]["peak_mb"] = peaks[name]
    plain = med["plain"]
    result = {
        "repeats": args.repeats,
        "cores": os.cpu_count(),
        "plain_rounds_s": round(plain["rounds_s"], 3),
        "plain_process_s": round(plain["process_s"], 3),
        "plain_peak_mb": round(plain["peak_mb"]),
    }
    for name in ("raysim_1w", "raysim_2w", "raysim_2w_batched"):
        m = med[name]
        result[f"{name}_rounds_s"] = round(m["rounds_s"], 3)
        result[f"{name}_process_s"] = round(m["process_s"], 3)
        result[f"{name}_peak_mb"] = round(m["peak_mb"])
        result[f"{name}_process_ratio"] = round(m["process_s"] / plain["process_s"], 3)
        for phase in ("startup_s", "shutdown_s"):
            if phase in m:
                result[f"{name}_{phase}"] = round(m[phase], 3)
    result["ratio_1w"] = round(med["raysim_1w"]["rounds_s"] / plain["rounds_s"], 3)
    result["ratio_2w"] = round(med["raysim_2w"]["rounds_s"] / plain["rounds_s"], 3)
    result["ratio_2w_batched"] = round(med["raysim_2w_batched"]["rounds_s"] / plain["rounds_s"], 3)
    result["ratio"] = min(result["ratio_1w"], result["ratio_2w"], result["ratio_2w_batched"])
    # against a plain loop as one writes it: NCHW and glibc's allocator defaults (not raysim's)
    defaults = med["plain_pytorch_defaults"]
    result["plain_pytorch_defaults_rounds_s"] = round(defaults["rounds_s"], 3)
    for w in ("1w", "2w"):
        result[f"ratio_{w}_vs_pytorch_defaults"] = round(med[f"raysim_{w}"]["rounds_s"] / defaults["rounds_s"], 3)
    # the floor: the steps split evenly over one-thread jobs, one per core, and nothing else
    floor = med["floor"]["rounds_s"]
    result["floor_rounds_s"] = round(floor, 3)
    result["floor_1w"] = round(floor / plain["rounds_s"], 3)
    for w in ("1w", "2w"):
        result[f"ratio_{w}_over_floor"] = round(med[f"raysim_{w}"]["rounds_s"] / floor, 3)
    result["gm_gtest"] = {name: round(m["gm_gtest"], 4) for name, m in med.items()}
    if attached and preloaded:
        for key, (back_to_back, idle) in (("attached", attached), ("attached_preload", preloaded)):
            result[f"{key}_startup_s"] = round(statistics.median(back_to_back), 3)
            result[f"{key}_idle_startup_s"] = round(statistics.median(idle), 3)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
