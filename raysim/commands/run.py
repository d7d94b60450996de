"""``python scripts/run.py``: run one experiment from the command line.

Settings come, later ones winning, from the defaults, ``--config FILE`` (YAML or TOML), the named
flags, and ``--set section.key=value`` (``--set algo.mu=0.1`` for an algorithm parameter). Bad input
ends the run before any work with one sentence on stderr and exit status 2. The last line on stdout is
one JSON object with the final and best metrics and the run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raysim.commands.flags import Parser, add_setting_flags, given_settings
from raysim.config import ExperimentConfig, load_config_file, merge, set_dotted
from raysim.engine.experiment import Experiment, resolve_config, validate
from raysim.errors import ConfigError, RunAborted

log = logging.getLogger("raysim")

#: what a resumed run may change: where and how it runs (and where its data is), and how far; not
#: what it computes
RESUMABLE = (
    "ray.",
    "rounds",
    "data.data_dir",
    "data.download",
    "output.progress",
    "output.tensorboard",
    "output.checkpoint_every",
    "output.log",
    "output.tracking_uri",
)



def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="run.py", description="Run one federated-learning experiment with raysim.")
    p.add_argument("--config", help="YAML or TOML file with settings (an ExperimentConfig tree)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="go on with the stopped run in RUN_DIR from its checkpoint, to its configured rounds "
        "(only where and how it runs, and --rounds, may be changed)",
    )
    add_setting_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return p


def config_from_args(argv: Sequence[str]) -> ExperimentConfig:
    return parse_command(argv)[0].cfg


def parse_command(argv: Sequence[str]) -> tuple[Experiment, Path | None]:
    """The experiment the command line asks for, and the run directory to resume if ``--resume``
    (then the experiment is the stopped run's, with the changes a resumed run allows)."""
    args = build_parser().parse_args(argv)
    given = given_settings(args)
    if args.no_progress:
        given.append(("output.progress", False))
    if args.resume:
        if args.config:
            raise ConfigError("--resume takes the run's own config; --config cannot be given with it.")
        fixed = [k for k, _ in given if not k.startswith(RESUMABLE) or k == "output.out"]
        if fixed:
            raise ConfigError(
                f"A resumed run keeps its settings; {fixed[0]} cannot be changed (only "
                + ", ".join(k + "*" if k.endswith(".") else k for k in RESUMABLE)
                + " can)."
            )
        config_file = Path(args.resume) / "config.yaml"
        if not config_file.is_file():
            raise ConfigError(f"{args.resume} is not a run directory (it has no config.yaml).")
        given.append(("output.out", str(args.resume)))
    if args.resume:
        flags: dict[str, Any] = {}
        for key, value in given:
            set_dotted(flags, key, value)
        saved = load_config_file(Path(args.resume) / "config.yaml")
        # the saved config is already resolved: no paper setup goes beneath it again
        cfg = resolve_config(merge({**saved, "paper_setup": False}, flags))
        cfg = dataclasses.replace(cfg, paper_setup=bool(saved.get("paper_setup", True)))
        return validate(cfg), Path(args.resume)
    from raysim.api import checked_experiment  # the Python API's settings, given as text

    return checked_experiment(args.config, set=dict(given)), None


def main(argv: Sequence[str] | None = None) -> int:
    from raysim.logs import setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging(logging.WARNING if ("-q" in argv or "--quiet" in argv) else logging.INFO)
    try:
        exp, resume_dir = parse_command(argv)
        cfg = exp.cfg
        from raysim import checkpoint
        from raysim.engine.runner import run_experiment

        resume = checkpoint.load(resume_dir) if resume_dir is not None else None
        if resume is not None and resume.round >= cfg.rounds:
            raise ConfigError(
                f"The run in {cfg.output.out} has done its {cfg.rounds} rounds; give --rounds to go further."
            )
        from raysim.results.output import ProgressBar

        callbacks = [ProgressBar(max(resume.round, 0) if resume else 0)] if cfg.output.progress else []
        result = run_experiment(exp, callbacks, resume=resume)
    except ConfigError as e:
        print(f"raysim: error: {e}", file=sys.stderr)
        return 2
    except RunAborted as e:
        print(f"raysim: the run failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("raysim: interrupted.", file=sys.stderr)
        return 130
    out = {"algo": cfg.algo, **result.summary()}
    print(json.dumps(out), flush=True)
    if result.stopped:
        print(
            f"raysim: stopped after round {result.last_round}; go on with: "
            f"python scripts/run.py --resume {result.run_dir}",
            file=sys.stderr,
        )
        return 130
    return 0


def entry() -> None:
    """``raysim-run`` and ``scripts/run.py``: :func:`main`, then the process ends at once
    (:func:`raysim.commands.exit_process`)."""
    from raysim.commands import exit_process

    exit_process(main())


__all__ = ["build_parser", "config_from_args", "entry", "main", "parse_command"]
