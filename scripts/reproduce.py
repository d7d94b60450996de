#!/usr/bin/env python3
"""Reproduce the papers' tables with raysim: one suite of runs per paper, all on the same partition.

``python scripts/reproduce.py SUITE`` runs each of the suite's runs with ``scripts/run.py`` (same seed,
so the same partition) and prints a markdown table of the final and best accuracies beside the
paper's numbers (also written to ``OUT/table.md``). Suites:

- ``fed3p2`` (seed 002, Tables 1-2; Fashion-MNIST, Dir(0.1), 100 clients, participation 0.2,
  100 rounds, E = 5, B = 40, lr 0.01 x 0.99 a round, momentum 0.9, weight decay 1e-5): ``fedavg`` with
  the same training settings, ``fed3p2``, the progressive ablations ``no_filter_shared``,
  ``no_coordinators`` and ``no_two_phase``, ``eq4_all_data`` (Eq. 4 with |D| as every client's data)
  and ``auto_switch`` (the phase switch when the GM's smoothed validation accuracy stalls).
- ``fedfcd`` (seeds 003/000, Tables 1 and 3; Fashion-MNIST, 20 clients all taking part, train and
  test pooled and split 75/25 per client, ``mlp_fcd``): FedFCD and FedAvg with ``pathological:2`` and
  ``dirichlet:0.1``, and the Table 3 ablations (``lambda=0``, ``fusion=false``, ``alternate=false``)
  on ``pathological:2``.
- ``fedpac`` (seed 001, Tables 1-2; Fashion-MNIST, ``dominant:20``, 600 samples a client, 20
  clients all taking part, ``cnn_pac``): FedPAC, its ablations (no FA, no CC, neither) and FedAvg.
- ``feddrplus`` (seed 004's setup on Fashion-MNIST, whose numbers are on CIFAR: compare the order):
  100 clients, participation 0.1, B = 50, E = 5, momentum 0.9, weight decay 1e-5, lr x0.1 at 50% and
  75% of the rounds, matched test sets, ``cnn_pac``; FedDr+, dotreg, FedBABU, FedAvg (``gm_gtest``)
  and FedPer, FedRep, FedRoD, Ditto (``lm_ptest``, beside FedDr+ FT's), with ``shard:2`` and
  ``dirichlet:0.1``.

``--only`` picks runs; ``--parallel`` runs that many at once (each with its own local Ray); anything
after ``--`` goes to every run (e.g. ``-- --rounds 40`` or ``-- --gpus-per-worker 0.5``). Runs
already finished in ``OUT`` (a ``summary.json``) are not rerun; ``--table`` runs nothing and prints
the table of what is there.
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
FED3P2_FEDAVG = [
    "--algo", "fedavg", "--clients", "100", "--participation", "0.2", "--rounds", "100",
    "--local-epochs", "5", "--batch-size", "40", "--lr", "0.01", "--partition", "dirichlet:0.1",
    "--test-mode", "matched", "--set", "train.momentum=0.9", "--set", "train.weight_decay=1e-5",
    "--set", "train.lr_decay=0.99",
]  # fmt: skip
FCD_FEDAVG = [
    "--algo", "fedavg", "--clients", "20", "--participation", "1", "--rounds", "500", "--model", "mlp_fcd",
    "--local-epochs", "1", "--batch-size", "10", "--lr", "0.01", "--test-mode", "split:0.25",
    "--set", "train.momentum=0", "--set", "train.weight_decay=0", "--set", "data.class_order=sequential",
]  # fmt: skip
PAC_FEDAVG = [
    "--algo", "fedavg", "--clients", "20", "--participation", "1", "--rounds", "200", "--model", "cnn_pac",
    "--local-epochs", "5", "--batch-size", "50", "--lr", "0.01", "--partition", "dominant:20",
    "--test-mode", "matched", "--set", "data.samples_per_client=600", "--set", "train.momentum=0.5",
    "--set", "train.weight_decay=5e-4",
]  # fmt: skip
PAT, DIR = ["--partition", "pathological:2"], ["--partition", "dirichlet:0.1"]
DRPLUS_SETUP = [
    "--clients", "100", "--participation", "0.1", "--rounds", "320", "--model", "cnn_pac",
    "--local-epochs", "5", "--batch-size", "50", "--test-mode", "matched", "--set", "train.momentum=0.9",
    "--set", "train.weight_decay=1e-5", "--set", "train.lr_decay=1.0", "--set", "train.lr_milestones=0.5,0.75",
]  # fmt: skip
#: FedDr+'s Table 6 rates: feature-normalised methods large, cross-entropy ones 0.01
DRPLUS_RUNS = {
    "feddrplus": ["--algo", "feddrplus", "--lr", "0.35"],
    "dotreg": ["--algo", "dotreg", "--lr", "0.35"],
    "fedbabu": ["--algo", "fedbabu", "--lr", "0.01"],
    "fedavg": ["--algo", "fedavg", "--lr", "0.01"],
    "fedper": ["--algo", "fedper", "--lr", "0.01"],
    "fedrep": ["--algo", "fedrep", "--lr", "0.01"],
    "fedrod": ["--algo", "fedrod", "--lr", "0.01"],
    "ditto": ["--algo", "ditto", "--lr", "0.01"],
}


def drplus_suite() -> dict[str, tuple[list[str], str]]:
    out = {}
    for part, tag in (("shard:2", "shard2"), ("dirichlet:0.1", "dir0.1")):
        for name, args in DRPLUS_RUNS.items():
            out[f"{name}_{tag}"] = (
                [*args, *DRPLUS_SETUP, "--partition", part],
                "ordering (CIFAR in the paper)",
            )
    return out


#: suite -> run -> (run.py arguments, the paper's figure for comparison)
SUITES: dict[str, dict[str, tuple[list[str], str]]] = {
    "fed3p2": {
        "fedavg": (FED3P2_FEDAVG, "GM 81.1 / 81.3, LM 91.5"),
        "fed3p2": (["--algo", "fed3p2"], "87.5 / 87.4 / 91.9"),
        "no_filter_shared": (["--algo", "fed3p2", "--set", "algo.filter_shared=false"], "- / - / 91.6"),
        "no_coordinators": (["--algo", "fed3p2", "--set", "algo.coordinators=false"], "82.7 / - / 89.8"),
        "no_two_phase": (["--algo", "fed3p2", "--set", "algo.two_phase=false"], "82.7 / - / 89.2"),
        "eq4_all_data": (["--algo", "fed3p2", "--set", "algo.server_denominator=all"], "-"),
        "auto_switch": (
            ["--algo", "fed3p2", "--set", "algo.phase_switch=auto", "--set", "data.val_fraction=0.1"],
            "-",
        ),
    },
    "fedfcd": {
        "fedfcd_pat": (["--algo", "fedfcd", *PAT], "99.17 (best)"),
        "fedfcd_dir": (["--algo", "fedfcd", *DIR], "96.57 (best)"),
        "fedavg_pat": ([*FCD_FEDAVG, *PAT], "78.44 (GM)"),
        "fedavg_dir": ([*FCD_FEDAVG, *DIR], "84.56 (GM)"),
        "fedfcd_pat_no_fa": (["--algo", "fedfcd", *PAT, "--set", "algo.lambda=0"], "Table 3"),
        "fedfcd_pat_no_fd": (["--algo", "fedfcd", *PAT, "--set", "algo.fusion=false"], "Table 3"),
        "fedfcd_pat_no_ho": (["--algo", "fedfcd", *PAT, "--set", "algo.alternate=false"], "Table 3"),
    },
    "fedpac": {
        "fedpac": (["--algo", "fedpac"], "91.73 (both)"),
        "fedpac_fa_only": (["--algo", "fedpac", "--set", "algo.combine=false"], "91.54"),
        "fedpac_cc_only": (["--algo", "fedpac", "--set", "algo.lambda=0"], "90.18"),
        "fedpac_none": (
            ["--algo", "fedpac", "--set", "algo.lambda=0", "--set", "algo.combine=false"],
            "88.02",
        ),
        "fedavg": (PAC_FEDAVG, "-"),
    },
    "feddrplus": drplus_suite(),
}
METRICS = ("gm_gtest", "gm_ptest", "lm_ptest")


def last_std(run_dir: Path, metric: str) -> float | None:
    """The std across clients of ``metric`` in the run's last evaluated round."""
    import pyarrow.parquet as pq

    path = run_dir / "metrics.parquet"
    if not path.exists():
        return None
    col = pq.read_table(path, columns=[f"{metric}_std"]).column(0).to_pylist()
    return col[-1] if col else None


def table(out: Path, suite: dict[str, tuple[list[str], str]], names: list[str]) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}"

    lines = [
        "| run | rounds | "
        + " | ".join(f"{m} final (best)" for m in METRICS)
        + " | lm_ptest final ± std | paper |",
        "|---|---|" + "---|" * len(METRICS) + "---|---|",
    ]
    for name in names:
        path = out / name / "summary.json"
        if not path.exists():
            lines.append(f"| {name} | not finished |" + " |" * (len(METRICS) + 1) + f" {suite[name][1]} |")
            continue
        s = json.loads(path.read_text())
        cells = [f"{pct(s['final'].get(m))} ({pct(s['best'].get(m))})" for m in METRICS]
        lm, std = s["final"].get("lm_ptest"), last_std(out / name, "lm_ptest")
        spread = f"{pct(lm)} ± {pct(std)}" if lm is not None and std is not None else "-"
        lines.append(f"| {name} | {s['rounds']} | " + " | ".join(cells) + f" | {spread} | {suite[name][1]} |")
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("suite", choices=list(SUITES))
    ap.add_argument("--out", help="directory for the runs (default runs/reproduce-SUITE)")
    ap.add_argument("--only", nargs="+", help="these runs of the suite only")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once")
    ap.add_argument("--table", action="store_true", help="only print the table of the runs already done")
    a = ap.parse_args(argv)
    suite = SUITES[a.suite]
    only = a.only or list(suite)
    unknown = [n for n in only if n not in suite]
    if unknown:
        ap.error(f"unknown runs {unknown} (the suite has {list(suite)})")
    out = Path(a.out or f"runs/reproduce-{a.suite}")
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    todo = [] if a.table else [n for n in only if not (out / n / "summary.json").exists()]
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    while todo or running:
        while todo and len(running) < a.parallel:
            name = todo.pop(0)
            cmd = [sys.executable, str(ROOT / "scripts" / "run.py"), *suite[name][0], "--eval-every", "5",
                   "--out", str(out / name), "--no-progress", "-q", *extra]  # fmt: skip
            log = open(out / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
            running[name] = (subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log), time.time())
            print(f"started {name}", flush=True)
        time.sleep(2)
        for name, (proc, t0) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                print(f"{name}: exit {proc.returncode} after {time.time() - t0:.0f} s", flush=True)
    text = table(out, suite, only)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
