#!/usr/bin/env python3
"""Reproduce the Fed3+2p paper's Fashion-MNIST rows (seed 002, Tables 1 and 2) with raysim.

Runs, each with ``scripts/run.py`` under the paper setup (100 clients, Dir(0.1), participation 0.2,
100 rounds, E = 5, B = 40, SGD lr 0.01 decayed 0.99 a round, momentum 0.9, weight decay 1e-5,
matched local test sets) and the same seed, so every run sees the same partition:

- ``fedavg``: FedAvg with the same training settings (Table 1's baseline row);
- ``fed3p2``: the full method (Table 1);
- ``no_filter_shared``, ``no_coordinators``, ``no_two_phase``: the Table 2 ablations;
- ``eq4_all_data``: Eq. 4 with |D| read as every client's data (``algo.server_denominator=all``);
- ``auto_switch``: the phase switch made when the GM's accuracy on held-out validation parts (10%
  of each client's training data) stalls (``algo.phase_switch=auto``).

``--only`` picks runs; ``--parallel`` runs that many at once (each with its own local Ray); anything
after ``--`` goes to every run (e.g. ``-- --rounds 40`` or ``-- --gpus-per-worker 0.5``). Each run's
directory is ``OUT/<name>``; at the end a markdown table of the final and best accuracies is printed
and written to ``OUT/table.md``. Runs already finished in ``OUT`` (a ``summary.json``) are not rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAPER = {  # Table 1 (GM/G, GM/P, LM/P) and Table 2 on FMNIST, in percent
    "fedavg": "81.1 (GM), 91.5 (LM)",
    "fed3p2": "87.5 / 87.4 / 91.9",
    "no_filter_shared": "Table 2",
    "no_coordinators": "Table 2",
    "no_two_phase": "Table 2",
    "eq4_all_data": "-",
    "auto_switch": "-",
}
FEDAVG = [
    "--algo", "fedavg", "--clients", "100", "--participation", "0.2", "--rounds", "100",
    "--local-epochs", "5", "--batch-size", "40", "--lr", "0.01", "--partition", "dirichlet:0.1",
    "--test-mode", "matched", "--set", "train.momentum=0.9", "--set", "train.weight_decay=1e-5",
    "--set", "train.lr_decay=0.99",
]  # fmt: skip
RUNS: dict[str, list[str]] = {
    "fedavg": FEDAVG,
    "fed3p2": ["--algo", "fed3p2"],
    "no_filter_shared": ["--algo", "fed3p2", "--set", "algo.filter_shared=false"],
    "no_coordinators": ["--algo", "fed3p2", "--set", "algo.coordinators=false"],
    "no_two_phase": ["--algo", "fed3p2", "--set", "algo.two_phase=false"],
    "eq4_all_data": ["--algo", "fed3p2", "--set", "algo.server_denominator=all"],
    "auto_switch": ["--algo", "fed3p2", "--set", "algo.phase_switch=auto", "--set", "data.val_fraction=0.1"],
}
METRICS = ("gm_gtest", "gm_ptest", "lm_ptest")


def table(out: Path, names: list[str]) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}"

    lines = [
        "| run | rounds | " + " | ".join(f"{m} final (best)" for m in METRICS) + " | paper |",
        "|---|---|" + "---|" * len(METRICS) + "---|",
    ]
    for name in names:
        path = out / name / "summary.json"
        if not path.exists():
            lines.append(f"| {name} | not finished |" + " |" * len(METRICS) + f" {PAPER[name]} |")
            continue
        s = json.loads(path.read_text())
        cells = [f"{pct(s['final'].get(m))} ({pct(s['best'].get(m))})" for m in METRICS]
        lines.append(f"| {name} | {s['rounds']} | " + " | ".join(cells) + f" | {PAPER[name]} |")
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/reproduce-fed3p2", help="directory for the runs")
    ap.add_argument("--only", nargs="+", choices=list(RUNS), default=list(RUNS))
    ap.add_argument("--parallel", type=int, default=1, help="runs at once")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    todo = [n for n in a.only if not (out / n / "summary.json").exists()]
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    while todo or running:
        while todo and len(running) < a.parallel:
            name = todo.pop(0)
            cmd = [sys.executable, str(ROOT / "scripts" / "run.py"), *RUNS[name], "--eval-every", "5",
                   "--out", str(out / name), "--no-progress", "-q", *extra]  # fmt: skip
            log = open(out / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
            running[name] = (subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log), time.time())
            print(f"started {name}", flush=True)
        time.sleep(2)
        for name, (proc, t0) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                print(f"{name}: exit {proc.returncode} after {time.time() - t0:.0f} s", flush=True)
    text = table(out, a.only)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
