"""Compare raysim runs: ``raysim report runs/a runs/b --out /tmp/report`` (or ``python scripts/report.py``).

``raysim report --publish SUITE_DIR docs/results/NAME`` writes a suite's published page instead
(:mod:`raysim.suite.publish`), and ``raysim report --record SUITE_DIR DEST`` a suite's record, the
slim copy of its directory that a page is drawn from and a suite resumed from
(:mod:`raysim.suite.records`).

Writes ``accuracy_<metric>.png`` (accuracy in % against round, a line per run), ``train_loss.png`` and
``report.md`` (a table of each run's setting and best/final accuracies, then links to the plots) into
``--out`` (default: the first run directory), and prints the path of report.md and the table. A path
that is not a run directory, or other bad input, gives one sentence on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from raysim.commands.flags import Parser
from raysim.errors import ConfigError
from raysim.results.report import (
    DEFAULT_METRICS,
    available_metrics,
    check_metric_names,
    comparison_table,
    load_runs,
    write_report,
    write_suite_report,
)


def _split(text: str | None) -> list[str] | None:
    return None if text is None else [s.strip() for s in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="report.py", description="Plot and tabulate the metrics of raysim run directories.")
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories (with metrics.parquet), or one suite directory (scripts/sweep.py's)",
    )
    p.add_argument("--out", metavar="DIR", help="where to write the report (default: the first RUN_DIR)")
    p.add_argument(
        "--metrics",
        metavar="M1,M2",
        help=f"accuracy columns to plot and tabulate (default: {','.join(DEFAULT_METRICS)})",
    )
    p.add_argument("--labels", metavar="A,B", help="a label per run (default: the directory names)")
    p.add_argument(
        "--publish",
        action="store_true",
        help="SUITE_DIR OUT_DIR: write the suite's results page into OUT_DIR (e.g. docs/results/NAME) and "
        "the index beside it",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="SUITE_DIR DEST: copy the suite's record (its file, and each trial's settings, metrics and "
        "summary: kilobytes a trial) into DEST, a suite directory that --publish draws and "
        "scripts/sweep.py --resume finishes",
    )
    p.add_argument("--commit", help="with --publish: the code's commit, when the suite did not record it")
    p.add_argument(
        "--suite-file",
        metavar="FILE",
        help="with --publish: judge the claims and paper setting of this suite file (default: the suite directory's own)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from raysim.logs import setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging(logging.WARNING if ("-q" in argv or "--quiet" in argv) else logging.INFO)
    try:
        args = build_parser().parse_args(argv)
        if args.suite_file is not None and not args.publish:
            raise ConfigError("--suite-file goes with --publish: it names the claims a published page judges.")
        if args.record:
            if args.publish:
                raise ConfigError("--record and --publish are two commands: give one of them.")
            if len(args.runs) != 2:
                raise ConfigError("--record takes a suite directory and where its record goes: SUITE_DIR DEST.")
            from raysim.suite.records import copy_record

            kept = copy_record(args.runs[0], args.runs[1])
            print(f"{args.runs[1]}: the record of {len(kept)} trials")
            return 0
        if args.publish:
            if len(args.runs) != 2:
                raise ConfigError("--publish takes a suite directory and the page's directory: SUITE_DIR OUT_DIR.")
            from raysim.suite.publish import publish

            written = publish(args.runs[0], args.runs[1], args.commit, args.suite_file)
            print(written[0])
            return 0
        if len(args.runs) == 1 and (Path(args.runs[0]) / "suite.yaml").is_file():  # a suite: draw it again
            from raysim.suite.layout import suite_layout

            written = write_suite_report(args.runs[0], suite_layout(args.runs[0]), args.out)
            print(written[0])
            print()
            print(written[0].read_text(), end="", flush=True)
            return 0
        metrics = _split(args.metrics) or list(DEFAULT_METRICS)
        check_metric_names(metrics)
        runs = load_runs(args.runs, _split(args.labels))
        out = Path(args.out) if args.out else Path(args.runs[0])
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} exists and is not a directory.")
        written = write_report(runs, out, metrics)
    except ConfigError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    print(written[0])
    print()
    print(comparison_table(runs, available_metrics(runs, metrics)), end="", flush=True)
    return 0


__all__ = ["build_parser", "main"]
