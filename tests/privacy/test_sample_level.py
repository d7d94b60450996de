"""Sample-level DP in a run (raysim/privacy/sample_level.py): each client accounted on its own rate
and its own DP-SGD steps, the run's example_epsilon the largest; the refusals of what DP-SGD does
not cover; the same numbers on every executor and after a resume."""

from __future__ import annotations

import json

import pytest

from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.privacy.accounting import dp_sgd_epsilon
from raysim.privacy.dp_sgd import sampling_rate
from raysim.toolkit.train import batches_per_epoch
from tests.conftest import tiny_config, without_times

#: (the RDP accountant: a fraction of PLD's time, and any accountant shows what is summed)
DPSGD = {"privacy.example_clip": 1.0, "privacy.example_noise_multiplier": 1.1, "privacy.accountant": "rdp"}


def test_each_client_is_accounted_on_its_rate_and_steps_and_the_largest_is_reported(tmp_path):
    """Everyone trains every round (participation 1, E = 1): client k takes the lots of one epoch,
    as many as its batches, at rate min(1, B / n_k); the run's epsilon after each round is the
    largest of the clients' own, computed here from the accountant directly."""
    cfg = tiny_config(tmp_path, participation=1.0, rounds=2, **DPSGD, **{"train.local_epochs": 1, "eval.every": 1})
    run = run_experiment(cfg)
    sizes = [int(i.size) for i in prepare(tiny_config(tmp_path / "d")).client_train]
    b = cfg.train.batch_size
    delta = 1 / max(sizes) ** 1.1
    for row in run.rows:
        want = max(
            dp_sgd_epsilon(1.1, sampling_rate(b, n), row["round"] * batches_per_epoch(n, b, False), delta, "rdp")
            for n in sizes
        )
        assert row["example_epsilon"] == pytest.approx(want, rel=1e-9)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["example_epsilon"] == run.rows[-1]["example_epsilon"] and summary["per_example"] == "torch_func"


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"algo": "apfl"}, "apfl cannot run under privacy.example_clip \\(DP-SGD\\): it steps"),
        ({"algo": "fedrod"}, "reads the client's class counts"),
        ({"algo": "perfedavg"}, "MAML steps"),
        ({"algo": "fedavg", "algo.ft_epochs": 1}, "set algo.ft_epochs=0"),
        ({"model": "cnn_pac_bn", "data.synthetic.shape": (1, 16, 16)}, "has BatchNorm layers"),
        ({"train.batch_clients": 2}, "set train.batch_clients to 1"),
        ({"algo": "fedbuff", "deployment.mode": "async"}, "run it synchronously"),
    ],
)
def test_what_dp_sgd_does_not_cover_is_refused_in_one_sentence(settings, words):
    with pytest.raises(ConfigError, match=words) as err:
        validate(tiny_config(**DPSGD, **settings))
    assert str(err.value).count(". ") == 0


@pytest.mark.ray
def test_serial_equals_ray_under_dp_sgd(tmp_path, ray_local):
    setup = {"algo": "fedrep", "rounds": 2, "eval.every": 1, **DPSGD, "algo.head_epochs": 1}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["example_epsilon"] > 0


def test_resume_equals_uninterrupted_under_dp_sgd(tmp_path):
    """The clients' steps are in the checkpoint: the resumed run reports the same epsilon."""
    from raysim import checkpoint
    from tests.engine.test_checkpoint import CtrlCAfter

    setup = {"rounds": 3, "eval.every": 1, **DPSGD}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    assert run_experiment(cfg, [CtrlCAfter(2)]).last_round == 2
    resumed = run_experiment(cfg, resume=checkpoint.load(tmp_path / "stopped"))
    assert without_times(resumed.rows) == without_times(full.rows)
