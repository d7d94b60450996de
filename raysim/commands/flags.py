"""The flag parser the commands share: the settings' flags from :data:`raysim.keywords.FLAGS`
(``--local-epochs``), ``--no-*`` switches, the trackers' ``--log`` and ``--tracking-uri``, and
``--set key=value``."""

from __future__ import annotations

import argparse
from typing import Any

from raysim.errors import ConfigError
from raysim.keywords import FLAGS, help_texts


class Parser(argparse.ArgumentParser):
    """The commands' argument parser: a bad flag is a ConfigError (one sentence, exit status 2, as
    for every bad input), not argparse's usage and exit."""

    def error(self, message: str) -> Any:
        raise ConfigError(message[0].upper() + message[1:] + ("" if message.endswith(".") else "."))


def add_setting_flags(p: argparse.ArgumentParser, *, skip: tuple[str, ...] = (), grid: bool = False) -> None:
    """The flags that set a run's settings (all of :data:`FLAGS` but ``skip``), ``--no-download``,
    ``--no-tensorboard`` and ``--set``: the run and sweep commands' one parser of them. ``grid``: a
    value may list several, separated by commas."""
    helps = help_texts()
    more = " (a,b: a grid over these values)" if grid else ""
    for name, (_, typ, _) in FLAGS.items():
        if name not in skip:
            p.add_argument(
                "--" + name.replace("_", "-"), dest=name, default=None, metavar=typ.__name__.upper(),
                help=helps[name] + more,
            )  # fmt: skip
    p.add_argument("--no-download", action="store_true", help="never download a dataset (offline)")
    p.add_argument("--no-tensorboard", action="store_true", help="write no TensorBoard events")
    p.add_argument(
        "--log", metavar="TRACKER[,TRACKER]", default=None,
        help="also log to these experiment trackers: mlflow, wandb (e.g. --log mlflow,wandb; "
        "pip install 'raysim[tracking]')",
    )  # fmt: skip
    p.add_argument(
        "--tracking-uri", metavar="URI", default=None,
        help="MLflow's tracking server (default: a store in the run directory, RUN_DIR/mlruns)",
    )  # fmt: skip
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE" + ("[,VALUE...]" if grid else ""),
        help="any setting, e.g. train.momentum=0.5 or algo.mu=0.1",
    )  # fmt: skip


def given_settings(args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """The (dotted setting, value) pairs the flags of :func:`add_setting_flags` gave, in order:
    the named flags, the ``--no-*`` switches, then each ``--set KEY=VALUE``."""
    given: list[tuple[str, Any]] = []
    for name, (key, _, _) in FLAGS.items():
        value = getattr(args, name, None)
        if value is not None and name not in skip:
            given.append((key, value))
    if args.no_download:
        given.append(("data.download", False))
    if args.no_tensorboard:
        given.append(("output.tensorboard", False))
    if args.log is not None:  # one value, a list (in a sweep too: the trackers are not a grid)
        given.append(("output.log", [] if not args.log.strip() else args.log.split(",")))
    if args.tracking_uri is not None:
        given.append(("output.tracking_uri", args.tracking_uri))
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set takes KEY=VALUE, not {item!r}.")
        given.append((key.strip(), value.strip()))
    return given


__all__ = ["Parser", "add_setting_flags", "given_settings"]
