"""``python scripts/sweep.py``: a suite of experiments (configurations x seeds) on one Ray cluster.

    python scripts/sweep.py suites/fed3p2_table1.yaml --seeds 0-2 -- --rounds 30
    python scripts/sweep.py --algo fedavg,fed3p2 --seeds 0-4 --set algo.num_type_a=3,5,10 --rounds 50
    python scripts/sweep.py --algo fedavg --set "train.lr=loguniform(0.001,0.1)" --search random \\
        --samples 8 --scheduler asha --metric gm_gtest
    python scripts/sweep.py suites/feddrplus_table1.yaml --scheduler asha --metric gm_gtest
    python scripts/sweep.py --resume runs/suite-fed3p2_table1-20261122-120000
    python scripts/sweep.py suites/pfl_benchmark.yaml --publish docs/results/pfl_benchmark

Settings are run.py's flags and ``--set KEY=VALUE``; a flag or setting with values separated by
commas is a grid (``--algo fedavg,fed3p2``), one in brackets a single list value
(``--set train.lr_milestones=[0.5,0.75]``), and ``loguniform(a,b)``, ``uniform(a,b)``,
``randint(a,b)`` or ``choice(x,y)`` a range for ``--search``. A suite file's settings go beneath the
flags'; anything after ``--`` is read as flags too (for a suite file: ``-- --rounds 30``). The last
line on stdout is one JSON object: ``suite_dir`` and, per configuration, its settings, seeds and
the ``mean`` and ``std`` over seeds of each final metric. ``--publish PAGE_DIR`` writes, once every
trial has finished, the suite's record into ``PAGE_DIR/suite`` and its page into ``PAGE_DIR``
(``raysim report --record`` then ``--publish``, judged by the suite file given), so that one command
regenerates a results page; its ``notes.md`` stays.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError

log = logging.getLogger("raysim")

#: a trial's own run directory and seed, and its executor (always Ray): no flags of a suite's
TRIALS_OWN = ("out", "seed", "executor")



def build_parser() -> argparse.ArgumentParser:
    from raysim.commands.flags import Parser, add_setting_flags

    p = Parser(prog="sweep.py", description="Run a suite of raysim experiments on Ray Tune.")
    p.add_argument("suite_file", nargs="?", help="a suite file (YAML or TOML): base, configs, grid, seeds")
    p.add_argument("--resume", metavar="SUITE_DIR", help="finish the interrupted suite in SUITE_DIR")
    p.add_argument("--seeds", help="seeds, e.g. 0-4 or 0,2,7 (default: the suite file's, else 0)")
    p.add_argument("--name", help="the suite's name (default: the suite file's, else 'sweep')")
    p.add_argument("--out", help="the suite directory (default runs/suite-NAME-TIME)")
    p.add_argument("--search", help="a Tune search algorithm for the ranges given (random, optuna, ...)")
    p.add_argument("--samples", type=int, default=4, help="with --search: samples of the ranges (default 4)")
    p.add_argument(
        "--scheduler",
        help="a Tune trial scheduler, e.g. asha: early stopping on --metric, of the search's trials or, "
        "without --search, of the grid's and seeds'",
    )
    p.add_argument("--metric", help="what --search and --scheduler optimise (default gm_gtest)")
    p.add_argument("--mode", choices=("max", "min"), help="--metric's better direction (default max)")
    p.add_argument("--driver-cpus", type=float, help="CPUs reserved for each trial's driver and server (default 0)")
    p.add_argument("--max-concurrent", type=int, help="trials at once at most (default: as many as fit)")
    p.add_argument(
        "--publish",
        metavar="PAGE_DIR",
        help="once every trial has finished, write the suite's record and results page there (e.g. docs/results/NAME)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    add_setting_flags(p, skip=TRIALS_OWN, grid=True)
    return p


def _split(text: str) -> list[str]:
    """``a,b`` -> [a, b]; ``[a,b]`` and ``f(a,b)`` stay one value."""
    text = text.strip()
    if text.startswith("[") or "(" in text:
        return [text]
    return [v.strip() for v in text.split(",") if v.strip()]


def suite_from_args(argv: Sequence[str]) -> tuple[Any, Path | None, argparse.Namespace]:
    """The suite the command line asks for and, with ``--resume``, its directory: the flags read
    as settings (a value with commas a grid, a range for a search) and given to the same
    :func:`raysim.suite.spec.suite_of` that ``raysim.sweep`` calls."""
    from raysim.commands.flags import given_settings
    from raysim.suite import RANGE, load_suite, setting_key, suite_of

    argv = list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = build_parser().parse_args([*argv, *extra])
    if args.resume:
        given = [f for f in ("search", "scheduler", "metric", "mode") if getattr(args, f) is not None]
        if given:
            raise ConfigError(
                f"--resume finishes a suite as it was begun, so it takes no --{given[0]} "
                "(the suite's own is in its suite.yaml)."
            )
        suite_dir = Path(args.resume)
        if not (suite_dir / "suite.yaml").is_file():
            raise ConfigError(f"{suite_dir} is not a suite directory (it has no suite.yaml).")
        return load_suite(suite_dir / "suite.yaml"), suite_dir, args
    base: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    space: dict[str, str] = {}
    for key, value in given_settings(args, skip=("address",)):  # --address: the suite's cluster
        key = setting_key(key)
        if not isinstance(value, str):  # a --no-* switch
            base[key] = value
            continue
        if RANGE.match(value):
            space[key] = value
            continue
        values = _split(value)
        if len(values) > 1:
            grid[key] = values
        else:
            base[key] = values[0] if values else value
    suite = suite_of(
        args.suite_file, base=base, grid=grid, space=space, seeds=args.seeds, name=args.name,
        search=args.search, samples=args.samples, scheduler=args.scheduler, metric=args.metric,
        mode=args.mode, driver_cpus=args.driver_cpus,
    )  # fmt: skip
    return suite, None, args


def suite_dir_of(suite: Any, resume_dir: Path | None, args: argparse.Namespace) -> Path:
    """Where the suite's directory is: the resumed one, ``--out``, or runs/suite-NAME-TIME."""
    from raysim.suite import default_suite_dir

    return resume_dir or (Path(args.out) if args.out else default_suite_dir(suite))


def run_from_args(suite: Any, resume_dir: Path | None, args: argparse.Namespace, suite_dir: Path) -> dict[str, Any]:
    """Run (or finish) the suite the command line gave in ``suite_dir``; its summary
    (raysim.suite.run_suite)."""
    from raysim.suite import run_suite

    return run_suite(
        suite,
        suite_dir,
        resume=resume_dir is not None,
        address=args.address,
        progress=not args.no_progress,
        max_concurrent=args.max_concurrent,
    )


def check_page(page: str | None, suite_dir: Path) -> Path | None:
    """``--publish``'s directory, refused in one sentence before anything runs: a file, a place
    inside the suite directory, or one whose ``suite/`` holds more than a record."""
    if page is None:
        return None
    from raysim.suite.publish import RECORD
    from raysim.suite.records import refuse_foreign

    out, src = Path(page).resolve(), suite_dir.resolve()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--publish takes the page's directory; {page} is a file.")
    if out == src or src in out.parents:
        raise ConfigError(f"--publish writes the page outside the suite directory {suite_dir}, not into {page}.")
    refuse_foreign(out / RECORD)
    return out


def publish_page(suite_dir: Path, page: Path, suite_file: str | None) -> Path:
    """The suite's record into ``page/suite`` and its page into ``page`` (raysim.suite.publish)."""
    from raysim.suite.publish import RECORD, publish
    from raysim.suite.records import copy_record

    copy_record(suite_dir, page / RECORD)
    return publish(page / RECORD, page, suite_file=suite_file)[0]


def main(argv: Sequence[str] | None = None) -> int:
    from raysim.logs import setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging(logging.WARNING if ("-q" in argv or "--quiet" in argv) else logging.INFO)
    suite_dir: Path | str = "the suite directory"
    again = ""  # what --resume needs besides the directory to end as this command would
    try:
        suite, resume_dir, args = suite_from_args(argv)
        again = f" --publish {args.publish}" if args.publish else ""
        suite_dir = suite_dir_of(suite, resume_dir, args)
        page = check_page(args.publish, suite_dir)
        summary = run_from_args(suite, resume_dir, args, suite_dir)
    except ConfigError as e:
        print(f"raysim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"raysim: interrupted; go on with: python scripts/sweep.py --resume {suite_dir}{again}", file=sys.stderr)
        return 130
    if summary["unfinished"]:
        print(
            f"raysim: {summary['unfinished']} trial(s) unfinished (the suite was stopped); go on with: "
            f"python scripts/sweep.py --resume {suite_dir}{again}",
            file=sys.stderr,
        )
        return 130
    try:
        written = publish_page(Path(summary["suite_dir"]), page, args.suite_file) if page is not None else None
    except ConfigError as e:
        print(f"raysim: error: the suite finished, its page was not written: {e}", file=sys.stderr)
        return 2
    out = {
        "suite_dir": summary["suite_dir"],
        **({"page": str(written)} if written is not None else {}),
        "trials": summary["trials"],
        "base": dict(suite.base),
        "configs": [
            {
                k: c[k]
                for k in ("config", "settings", "seeds", "mean", "std", "last_mean", "last_std", "equal_compute")
            }
            for c in summary["configs"]
        ],
    }
    print(json.dumps(out), flush=True)
    return 0


__all__ = ["build_parser", "check_page", "main", "publish_page", "run_from_args", "suite_dir_of", "suite_from_args"]
