"""The command line's flags, as a table the run command, the sweep command and the Python API share:
a flag's name (``--local-epochs``; ``local_epochs=`` in ``raysim.run``) and the dotted setting it
sets (``train.local_epochs``)."""

from __future__ import annotations

import argparse
from typing import Any

from raysim.errors import ConfigError

# flag -> dotted config key
FLAGS: dict[str, tuple[str, Any, str]] = {
    "algo": ("algo", str, "the algorithm: {algorithms}, or package.module:Class"),
    "model": ("model", str, "the model: {models}"),
    "dataset": ("data.dataset", str, "the dataset: {datasets}"),
    "data_dir": ("data.data_dir", str, "directory holding (or receiving) the dataset files"),
    "partition": ("data.partition", str, "how the data is split over the clients: {partitions}"),
    "test_mode": ("data.test_mode", str, "the clients' local test sets: {test_modes}"),
    "clients": ("clients", int, "number of clients N"),
    "participation": ("participation", float, "fraction of clients sampled per round, in (0, 1]"),
    "rounds": ("rounds", int, "communication rounds T"),
    "local_epochs": ("train.local_epochs", int, "local epochs E"),
    "batch_size": ("train.batch_size", int, "local batch size B"),
    "lr": ("train.lr", float, "initial learning rate"),
    "threads": (
        "train.threads",
        int,
        "intra-op threads per training job (default: 1 on a CPU worker, cpus per worker on a GPU worker)",
    ),
    "batch_clients": (
        "train.batch_clients",
        int,
        "train up to this many of a round's clients at once as one batched computation (default 1)",
    ),
    "seed": ("seed", int, "random seed"),
    "out": ("output.out", str, "run directory (default runs/<algo>-<dataset>-<time>)"),
    "eval_every": ("eval.every", int, "evaluate every k rounds (0: only after the last)"),
    "executor": ("ray.executor", str, "{executors}"),
    "address": (
        "ray.address",
        str,
        "Ray cluster address to join (default: RAY_ADDRESS, else local Ray; local: Ray started here)",
    ),
    "workers": ("ray.workers", int, "client-worker actors (default: as many as resources allow)"),
    "cpus_per_worker": ("ray.cpus_per_worker", float, "CPUs each client worker asks for"),
    "gpus_per_worker": ("ray.gpus_per_worker", float, "fraction of a GPU each client worker asks for"),
    "jobs_per_worker": (
        "ray.jobs_per_worker",
        int,
        "training jobs a client worker runs at once, each on --threads threads "
        "(default: cpus per worker / threads on a CPU worker, 1 on a GPU worker)",
    ),
    "checkpoint_every": (
        "output.checkpoint_every",
        int,
        "write RUN_DIR/checkpoint.pkl every k rounds (0: only on Ctrl-C or a failure)",
    ),
}

#: keyword switches of the Python API beside the flags' settings (the command line's --no-download,
#: --no-tensorboard, --no-progress): name -> dotted key
SWITCHES = {"download": "data.download", "tensorboard": "output.tensorboard", "progress": "output.progress"}


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
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set takes KEY=VALUE, not {item!r}.")
        given.append((key.strip(), value.strip()))
    return given


def help_texts() -> dict[str, str]:
    """Each flag's help, with the registries' names filled in (so that a new entry shows up)."""
    from raysim.registry import ALGORITHMS, DATASETS, EXECUTORS, MODELS, PARTITIONS, TEST_MODES, usages

    choices = {
        "algorithms": ", ".join(ALGORITHMS.names()),
        "models": ", ".join(MODELS.names()),
        "datasets": DATASETS.choices(),
        "partitions": usages(PARTITIONS),
        "test_modes": usages(TEST_MODES),
        "executors": EXECUTORS.choices(),
    }
    return {name: help_.format(**choices) for name, (_, _, help_) in FLAGS.items()}


def flag_keys() -> dict[str, str]:
    """Keyword (a flag with underscores, or a switch) -> dotted setting."""
    return {**{name: key for name, (key, _, _) in FLAGS.items()}, **SWITCHES}


__all__ = ["FLAGS", "SWITCHES", "Parser", "add_setting_flags", "flag_keys", "given_settings", "help_texts"]
