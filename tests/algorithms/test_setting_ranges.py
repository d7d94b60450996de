"""An algorithm's settings declare their ranges with ``setting()`` (raysim/config.py), and the one
checker refuses a value out of range, in one sentence, when the config is validated: before any
work. ``check()`` keeps only what relates several settings."""

from __future__ import annotations

import dataclasses

import pytest

from raysim.engine.experiment import validate
from raysim.errors import ConfigError
from raysim.registry import ALGORITHMS
from tests.conftest import tiny_config

REFUSED = [
    ("cfl", "eps1", -0.1, "algo.eps1 must be at least 0, not -0.1."),
    ("cfl", "min_cluster_size", 0, "algo.min_cluster_size must be at least 1, not 0."),
    ("cfl", "start_round", 0, "algo.start_round must be at least 1, not 0."),
    ("ditto", "lambda", -1, "algo.lam must be at least 0, not -1.0 (set as algo.lambda)."),
    ("fed3p2", "num_type_a", 0, "algo.num_type_a must be at least 1, not 0."),
    ("fed3p2", "switch_smoothing", 1, "algo.switch_smoothing must be below 1, not 1.0."),
    ("fed3p2", "switch_patience", 0, "algo.switch_patience must be at least 1, not 0."),
    ("fed3p2", "phase1_rounds", -1, "algo.phase1_rounds must be at least 0, not -1."),
    ("fed3p2", "chain_epochs", -1, "algo.chain_epochs must be at least 0, not -1."),
    ("fedamp", "sigma", 0, "algo.sigma must be above 0, not 0.0."),
    ("fedclust", "threshold", -1, "algo.threshold must be at least 0, not -1.0."),
    ("feddrplus", "beta", 1.5, "algo.beta must be at most 1, not 1.5."),
    ("feddyn", "alpha", 0, "algo.alpha must be above 0, not 0.0."),
    ("fedetf", "temperature", 0, "algo.temperature must be above 0, not 0.0."),
    ("fedetf", "ft_alt_epochs", -1, "algo.ft_alt_epochs must be at least 0, not -1."),
    ("fedetf", "ft_proj_lr", 0, "algo.ft_proj_lr must be above 0, not 0.0."),
    ("fedexp", "epsilon", -1, "algo.epsilon must be at least 0, not -1.0."),
    ("fedfcd", "server_lr", 0, "algo.server_lr must be above 0, not 0.0."),
    ("fedgh", "server_epochs", -1, "algo.server_epochs must be at least 0, not -1."),
    ("fedntd", "tau", 0, "algo.tau must be above 0, not 0.0."),
    ("fedpac", "head_prox_mu", -1, "algo.head_prox_mu must be at least 0, not -1.0."),
    ("fedproto", "lambda", -1, "algo.lam must be at least 0, not -1.0 (set as algo.lambda)."),
    ("fedprox", "mu", float("nan"), "algo.mu must be a number, not nan."),
    ("fedrep", "body_epochs", -1, "algo.body_epochs must be at least 0, not -1."),
    ("gpfl", "mu", -1, "algo.mu must be at least 0, not -1.0."),
    ("pacfl", "basis", 0, "algo.basis must be at least 1, not 0."),
    ("perfedavg", "delta", 0, "algo.delta must be above 0, not 0.0."),
    ("pfedme", "k_steps", 0, "algo.k_steps must be at least 1, not 0."),
    ("pfedme", "lambda", 0, "algo.lam must be above 0, not 0.0 (set as algo.lambda)."),
    ("scaffold", "server_lr", 0, "algo.server_lr must be above 0, not 0.0."),
    ("spherefed", "calib_ridge", -1, "algo.calib_ridge must be at least 0, not -1.0."),
]


@pytest.mark.parametrize(("algo", "name", "value", "sentence"), REFUSED)
def test_a_value_out_of_range_is_refused_in_one_sentence(tmp_path, algo, name, value, sentence):
    with pytest.raises(ConfigError) as refused:
        validate(tiny_config(tmp_path, algo=algo, **{f"algo.{name}": value}))
    assert str(refused.value) == sentence


def test_no_algorithm_checks_a_range_when_its_config_is_built():
    """Ranges are declared with ``setting()``: a Config with a ``__post_init__`` would check a
    second way (and on every copy the engine makes)."""
    for name in ALGORITHMS.names():
        config = ALGORITHMS.get(name).Config
        if dataclasses.is_dataclass(config):
            assert "__post_init__" not in vars(config), name


def test_no_check_compares_one_setting_with_a_number():
    """An algorithm's ``check`` keeps what relates several settings (or the run's other settings);
    a setting against a fixed number is a range, declared with ``setting()``."""
    import ast
    from pathlib import Path

    ranges = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
    found = []
    for path in sorted((Path(__file__).resolve().parents[2] / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.FunctionDef) and node.name == "check"):
                continue
            for compare in (n for n in ast.walk(node) if isinstance(n, ast.Compare)):
                sides = [compare.left, *compare.comparators]
                numbers = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, (int, float))]
                settings = [s for s in sides if isinstance(s, ast.Attribute) and getattr(s.value, "id", "") == "params"]
                if numbers and settings and any(isinstance(op, ranges) for op in compare.ops):
                    found.append(f"{path.name}:{compare.lineno}")
    assert found == []
