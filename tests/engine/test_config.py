"""The config tree: files, overrides, validation."""

from __future__ import annotations

import pytest

from raysim.commands.run import config_from_args
from raysim.config import ExperimentConfig, from_dict, replace, to_dict
from raysim.engine.experiment import validate
from raysim.errors import ConfigError
from raysim.registry import parse_partition


def test_yaml_and_toml_files_then_flags_then_set(tmp_path):
    (tmp_path / "a.yaml").write_text(
        "algo: fedprox\nclients: 30\ntrain:\n  lr: 0.2\nalgo_params:\n  mu: 0.5\n"
    )
    (tmp_path / "a.toml").write_text(
        'algo = "fedprox"\nclients = 30\n[train]\nlr = 0.2\n[algo_params]\nmu = 0.5\n'
    )
    for name in ("a.yaml", "a.toml"):
        cfg = config_from_args(["--config", str(tmp_path / name), "--clients", "40", "--set", "train.lr=0.3"])
        assert cfg.algo == "fedprox" and cfg.clients == 40 and cfg.train.lr == 0.3
        assert cfg.algo_params == {"mu": 0.5}
    cfg = config_from_args(
        ["--algo", "fedprox", "--set", "algo.mu=0.7", "--partition", "shard:3", "--gpus-per-worker", "0.25"]
    )
    assert (
        cfg.algo_params == {"mu": "0.7"}
        and cfg.data.partition == "shard:3"
        and cfg.ray.gpus_per_worker == 0.25
    )


def test_round_trip_and_frozen():
    cfg = replace(
        ExperimentConfig(), **{"train.lr_milestones": (0.5, 0.75), "data.synthetic.shape": (3, 8, 8)}
    )
    again = from_dict(ExperimentConfig, to_dict(cfg))
    assert again == cfg
    with pytest.raises(AttributeError):
        cfg.clients = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes",
    [
        {"clients": 0},
        {"participation": 0.0},
        {"rounds": 0},
        {"train.batch_size": 0},
        {"ray.executor": "dask"},
        {"data.test_mode": "nope"},
    ],
)
def test_validate_rejects(changes):
    with pytest.raises(ConfigError):
        validate(replace(ExperimentConfig(), **changes))


def test_partition_specs():
    assert (parse_partition("dirichlet:0.3").kind, parse_partition("dirichlet:0.3").param) == (
        "dirichlet",
        0.3,
    )
    assert parse_partition("pathological").param == 2
    for bad in ("dirichlet", "dirichlet:0", "shard:1.5", "iid:3", "zipf:2"):
        with pytest.raises(ConfigError):
            parse_partition(bad)


def test_paper_setup_goes_beneath_the_given_settings():
    cfg = config_from_args(["--algo", "fed3p2"])
    assert (cfg.clients, cfg.participation, cfg.rounds, cfg.train.lr, cfg.model) == (
        100,
        0.2,
        100,
        0.01,
        "cnn3p2_fmnist",
    )
    cifar = config_from_args(["--algo", "fed3p2", "--dataset", "cifar10", "--rounds", "7"])
    assert (cifar.clients, cifar.participation, cifar.rounds, cifar.train.lr, cifar.model) == (
        20,
        0.4,
        7,
        0.001,
        "cnn3p2_cifar",
    )
    common = config_from_args(["--algo", "fed3p2", "--set", "paper_setup=false"])
    assert (common.participation, common.rounds) == (
        ExperimentConfig().participation,
        ExperimentConfig().rounds,
    )
    assert config_from_args(["--algo", "fedavg"]) == replace(ExperimentConfig(), algo="fedavg")


@pytest.mark.parametrize("text", ["[0.5, 0.75]", "(0.5,0.75)", "0.5, 0.75"])
def test_set_takes_a_list_in_brackets_parentheses_or_bare(text):
    from raysim.commands.run import config_from_args

    cfg = config_from_args(["--algo", "fedavg", "--set", f"train.lr_milestones={text}"])
    assert cfg.train.lr_milestones == (0.5, 0.75)


def test_a_dataset_brings_a_model_that_fits_and_fedpac_takes_1000_emnist_samples_a_client():
    from raysim.engine.experiment import resolve_config

    assert resolve_config({"data": {"dataset": "svhn"}}).model == "cnn_pac_cifar"
    assert resolve_config({"data": {"dataset": "tinyimagenet"}, "paper_setup": False}).model == "resnet18"
    assert resolve_config({"data": {"dataset": "cifar10"}, "model": "vgg11"}).model == "vgg11"  # named: kept
    emnist = resolve_config({"algo": "fedpac", "data": {"dataset": "emnist"}})
    assert (emnist.data.samples_per_client, emnist.model, emnist.data.partition) == (1000, "cnn_pac", "dominant:20")
    assert resolve_config({"algo": "fedpac", "data": {"dataset": "fmnist"}}).data.samples_per_client == 600


@pytest.mark.parametrize(
    ("key", "value", "sentence"),
    [
        ("train.batch_size", 0, "train.batch_size must be at least 1, not 0."),
        ("train.lr", 0, "train.lr must be above 0, not 0.0."),
        ("train.lr_decay", 1.5, "train.lr_decay must be at most 1, not 1.5."),
        ("ray.jobs_per_worker", 0, "ray.jobs_per_worker must be at least 1, not 0."),
        ("output.checkpoint_every", -1, "output.checkpoint_every must be at least 0, not -1."),
        ("data.class_order", "randomly", "data.class_order is one of 'shuffled', 'sequential', 'random', not 'randomly'."),
        ("algo.variant", "so", "algo.variant is 'fo' or 'hf', not 'so'."),
    ],
)
def test_declared_ranges_and_words_are_enforced_by_one_checker(key, value, sentence):
    """A setting's allowed values are declared where it is defined (``setting(...,
    at_least=1)``, ``Literal[...]``) and checked as the config is built, in one sentence."""
    algo = {"algo": "perfedavg"} if key.startswith("algo.") else {}
    with pytest.raises(ConfigError) as info:
        validate(replace(ExperimentConfig(), **algo, **{key: value}))
    assert str(info.value) == sentence
    assert replace(ExperimentConfig(), **{"train.threads": None}).train.threads is None  # optional: unset


def test_no_setting_is_checked_against_a_list_of_words_by_hand():
    """Allowed words are a Literal type on the setting, not ``if x not in ("a", "b")`` in a check."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # a setting (self.x, params.x, cfg.x, ...) against a tuple of words, or a constant of them
    by_hand = re.compile(r"\b(self|params|p|cfg|d|t|r)\.\w+ not in (\(\s*\"|[A-Z_]+S\b)")
    places = [*sorted((root / "algorithms").glob("*.py")), root / "raysim" / "engine" / "experiment.py"]
    found = [f"{p.name}:{i}" for p in places for i, line in enumerate(p.read_text().splitlines(), 1) if by_hand.search(line)]
    assert found == []
