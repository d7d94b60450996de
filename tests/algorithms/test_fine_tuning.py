""" "-FT": every method with a global model fine-tunes it on each client's data after the last
round, through one mechanism (the ``FineTune`` capability, ``algo.ft_epochs``, ``algo.ft_lr``)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from raysim.capabilities.finetune import FineTune
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import algorithm_class, validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from tests.conftest import tiny_config, without_times

FINE_TUNED = [
    "fedavg", "fedprox", "fedntd", "fedexp", "scaffold", "feddyn", "fedbabu", "feddrplus", "dotreg",
    "spherefed", "fedetf",
]  # fmt: skip
#: FedDr+'s ETF head needs a feature size of at least the class count, and FedDr+ a larger rate
SETTINGS = {
    "feddrplus": {"train.lr": 0.3},
    "dotreg": {"train.lr": 0.3},
    "spherefed": {"train.lr": 0.5},
    "fedetf": {"train.lr": 0.1, "algo.ft_alternations": 1},
}


def _config(tmp_path, algo, **changes):
    return tiny_config(
        tmp_path,
        algo=algo,
        rounds=2,
        participation=0.5,
        **{"eval.every": 1, **SETTINGS.get(algo, {}), **changes},
    )


@pytest.mark.parametrize("algo", FINE_TUNED)
def test_ft_reports_the_fine_tuned_models_at_the_last_round_and_leaves_the_global_model(tmp_path, algo):
    ft = run_experiment(_config(tmp_path / "ft", algo, **{"algo.ft_epochs": 1}))
    plain = run_experiment(_config(tmp_path / "plain", algo, **{"algo.ft_epochs": 0}))
    assert [r["lm_ptest"] is None for r in ft.rows] == [True, False]
    assert all(r["lm_ptest"] is None for r in plain.rows)
    # the global model and its training are the same with and without FT, to the bit
    for a, b in zip(without_times(ft.rows), without_times(plain.rows), strict=True):
        assert {k: v for k, v in a.items() if not k.startswith("lm_")} == {
            k: v for k, v in b.items() if not k.startswith("lm_")
        }
    assert ft.rows[-1]["lm_ptest"] > 0.3


@pytest.mark.parametrize(
    ("algo", "head_moves"),
    [("fedavg", True), ("scaffold", True), ("fedbabu", True), ("feddrplus", False), ("spherefed", True), ("fedetf", True)],
)
def test_ft_trains_a_local_copy_of_the_parts_its_method_names(tmp_path, algo, head_moves):
    """FedAvg-FT, SCAFFOLD-FT, FedBABU-FT and SphereFed-FT fine-tune the whole model; FedDr+ FT the
    body under its frozen ETF; FedETF-FT the body, then its ETF and projection in turn. The server's
    state and what the client keeps are as they were."""
    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    cfg = _config(tmp_path, algo, **{"algo.ft_epochs": 2})
    ex = SerialExecutor(cfg, prepare(cfg))
    ex.train_round(1, [0, 1, 2, 3])
    ex.train_round(2, [1, 2, 3, 4])
    state = copy.deepcopy(ex.server.state)
    memory = copy.deepcopy(ex.runtime.memory)
    evaluation = ex.server.evaluation()
    algo_obj = ex.runtime.algo
    assert evaluation.personal_model(algo_obj, ClientContext(ex.runtime, 3, 1)) is None  # not the last round
    model = evaluation.personal_model(algo_obj, ClientContext(ex.runtime, 3, 2))
    gm = FineTune.weights(algo_obj, evaluation.payload)
    tuned = get_weights(model, ("extractor", "head"))
    assert not np.array_equal(tuned.extractor, gm.extractor)
    assert np.array_equal(tuned.head, gm.head) != head_moves
    assert FineTune.weights(algo_obj, ex.server.evaluation().payload).equals(gm)  # the global model is untouched
    for name, value in vars(ex.server.state).items():
        before = vars(state)[name]
        if hasattr(value, "equals"):
            assert value.equals(before), name
    assert ex.runtime.memory.keys() == memory.keys()
    for c, mem in memory.items():
        assert ex.runtime.memory[c].weights.equals(mem.weights), c


def test_ft_goes_on_at_the_last_rounds_rate_unless_given_one(tmp_path):
    """``algo.ft_lr`` defaults to the rate the schedule ended at (FedBABU's code fine-tunes at its
    current, decayed rate): 0.1 x 0.5^3 after four rounds decayed by 0.5, x0.1 past the milestone."""
    schedule = {"rounds": 4, "train.lr": 0.1, "train.lr_decay": 0.5, "train.lr_milestones": (0.5,)}
    cfg = tiny_config(tmp_path / "default", algo="fedbabu", **schedule)
    finetune = FineTune.of(algorithm_class("fedbabu"))
    assert finetune.declared
    assert finetune.setting(cfg) == (1, pytest.approx(0.1 * 0.5**3 * 0.1))
    given = tiny_config(tmp_path / "given", algo="fedbabu", **schedule, **{"algo.ft_lr": 0.1 * 0.5**3 * 0.1})
    assert finetune.setting(given)[1] == finetune.setting(cfg)[1]
    first = tiny_config(tmp_path / "first", algo="fedbabu", **schedule, **{"algo.ft_lr": 0.1})
    last = [run_experiment(c).rows[-1]["lm_ptest"] for c in (cfg, given, first)]
    assert last[0] == last[1] != last[2]


def test_ft_settings_are_checked(tmp_path):
    validate(tiny_config(tmp_path, algo="fedavg", **{"algo.ft_epochs": 3, "algo.ft_lr": 0.01}))
    with pytest.raises(ConfigError, match="ft_epochs"):
        validate(tiny_config(tmp_path, algo="fedavg", **{"algo.ft_epochs": -1}))
    with pytest.raises(ConfigError, match="ft_lr"):
        validate(tiny_config(tmp_path, algo="fedbabu", **{"algo.ft_lr": 0}))
    with pytest.raises(ConfigError, match="ft_epochs"):  # FedPer has personal models of its own
        validate(tiny_config(tmp_path, algo="fedper", **{"algo.ft_epochs": 1}))


@pytest.mark.ray
def test_ft_is_the_same_on_serial_and_ray(tmp_path, ray_local):
    changes = {"algo.ft_epochs": 1}
    serial = run_experiment(_config(tmp_path / "s", "fedavg", **changes))
    ray_run = run_experiment(
        _config(tmp_path / "r", "fedavg", **changes, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["lm_ptest"] is not None
