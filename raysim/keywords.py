"""The settings' short names, as a table the Python API, the suites and the commands share: a
keyword (``local_epochs=`` in ``raysim.run``; the flag ``--local-epochs``) and the dotted setting it
sets (``train.local_epochs``)."""

from __future__ import annotations

from typing import Any

# flag -> dotted config key
FLAGS: dict[str, tuple[str, Any, str]] = {
    "algo": ("algo", str, "the algorithm: {algorithms}, or package.module:Class"),
    "model": ("model", str, "the model: {models}"),
    "dataset": ("data.dataset", str, "the dataset: {datasets}"),
    "data_dir": ("data.data_dir", str, "directory holding (or receiving) the dataset files"),
    "partition": ("data.partition", str, "how the data is split over the clients: {partitions}"),
    "test_mode": ("data.test_mode", str, "the clients' local test sets: {test_modes}"),
    "feature_shift": ("data.feature_shift", str, "features that differ between clients: {feature_shifts}"),
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
    "new_clients": (
        "eval.new_clients",
        float,
        "hold out this share of the clients from training, evaluated as newcomers (new_gm_ptest, new_lm_ptest)",
    ),
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
    "deployment": (
        "deployment.preset",
        str,
        "a simulated deployment: a YAML file of deployment.* settings, or one of {deployments}",
    ),
    "sim_time": (
        "deployment.time_budget_s",
        float,
        "stop once the simulated clock reaches this many seconds (deployment.time_budget_s; --rounds is then a cap)",
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


def help_texts() -> dict[str, str]:
    """Each flag's help, with the registries' names filled in (so that a new entry shows up)."""
    from raysim.registry import (
        ALGORITHMS,
        DATASETS,
        DEPLOYMENTS,
        EXECUTORS,
        FEATURE_SHIFTS,
        MODELS,
        PARTITIONS,
        TEST_MODES,
        usages,
    )

    choices = {
        "algorithms": ", ".join(ALGORITHMS.names()),
        "models": ", ".join(MODELS.names()),
        "datasets": DATASETS.choices(),
        "partitions": usages(PARTITIONS),
        "test_modes": usages(TEST_MODES),
        "feature_shifts": usages(FEATURE_SHIFTS),
        "executors": EXECUTORS.choices(),
        "deployments": ", ".join(DEPLOYMENTS.names()),
    }
    return {name: help_.format(**choices) for name, (_, _, help_) in FLAGS.items()}


def flag_keys() -> dict[str, str]:
    """Keyword (a flag with underscores, or a switch) -> dotted setting."""
    return {**{name: key for name, (key, _, _) in FLAGS.items()}, **SWITCHES}


__all__ = ["FLAGS", "SWITCHES", "flag_keys", "help_texts"]
