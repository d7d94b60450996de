"""FedDr+'s Table 1 regularisers: +Prox, +KD, +NTD, +LD, +FD added by name to an algorithm's
own loss (``algo.regularizers``), each one loss term on the shared training loop."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.capabilities.settings import REG_NAMES
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from tests.conftest import run_round, tiny_config, without_times


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _batch(ex, client=1):
    rt = ex.runtime
    return rt.gather(rt.data.train, rt.data.client_train[client])


def test_every_name_has_a_term_of_its_own():
    """The names are one list (``RegName``); ``term`` maps each to its term (mypy checks the match
    is exhaustive; this checks it at run time and that no two names share one)."""
    from raysim.capabilities.regularizers import term

    assert len({term(name) for name in REG_NAMES}) == len(REG_NAMES) == 5


def test_each_term_is_zero_at_the_global_model_and_its_formula_away_from_it(tmp_path):
    import torch
    import torch.nn.functional as F

    from raysim.capabilities.regularizers import term
    from raysim.models import set_weights
    from raysim.toolkit.distill import Outputs, RegContext
    from raysim.toolkit.features import representation
    from raysim.toolkit.train import proximal_anchor

    ex = _executor(tmp_path, "fedavg")
    model, sent = ex.runtime.model, ex.server.state.weights
    set_weights(model, sent)
    teacher = ex.runtime.scratch_model("t")
    set_weights(teacher, sent)
    x, y = _batch(ex)
    parts = ("extractor", "filter", "head")
    rc = RegContext(teacher, proximal_anchor(model, parts), parts, tau=2.0)

    def outputs():
        z, zg = representation(model, x), representation(teacher, x)
        return Outputs(x, y, z, model.head(z), zg, teacher.head(zg))

    with torch.no_grad():
        o = outputs()
        for name in REG_NAMES:
            assert float(term(name)(model, o, rc)) == pytest.approx(0.0, abs=1e-6), name  # float32
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        o = outputs()
        got = {name: float(term(name)(model, o, rc)) for name in REG_NAMES}
        z, zg, lg = o.features.double(), o.teacher_features.double(), o.teacher_logits.double()
        lz = o.logits.double()
        kd = 4.0 * float(
            (F.softmax(lg / 2, 1) * (F.log_softmax(lg / 2, 1) - F.log_softmax(lz / 2, 1))).sum(1).mean()
        )
        want = {
            "prox": sum(
                float(((p - a) ** 2).sum()) for p, a in zip(model.parameters(), rc.anchor, strict=False)
            ),
            "kd": kd,
            "ld": float(((lz - lg) ** 2).sum(1).mean()) / lz.shape[1],
            "fd": float(((z - zg) ** 2).sum(1).mean()) / z.shape[1],
        }
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-4), name
    assert all(v > 0 for v in got.values())


def test_the_loss_is_beta_own_plus_the_terms_and_the_terms_change_training(tmp_path):
    import torch
    import torch.nn.functional as F

    from raysim.toolkit.context import ClientContext
    from raysim.wire import WeightsPayload

    ex = _executor(tmp_path, "fedavg", **{"algo.regularizers": ["kd", "fd"], "algo.reg_beta": 0.8})
    algo, sent = ex.runtime.algo, ex.server.state.weights
    ctx = ClientContext(ex.runtime, 1, 1)
    ctx.load(sent)
    loss = algo.regularizers.wrap(
        algo.cfg, ctx, sent, ("extractor", "filter", "head"), algo.loss_fn(ctx, WeightsPayload(sent, 0.1))
    )
    x, y = _batch(ex)
    with torch.no_grad():
        assert float(loss(ctx.model, x, y)) == pytest.approx(
            0.8 * float(F.cross_entropy(ctx.model(x), y)), rel=1e-6
        )
    plain = run_round(_executor(tmp_path / "plain", "fedavg"), 1, [2])[0]
    for names in (["prox"], ["kd"], ["ntd"], ["ld"], ["fd"]):
        ex = _executor(tmp_path / names[0], "fedavg", **{"algo.regularizers": names})
        (res,) = run_round(ex, 1, [2])
        assert not res.weights.equals(plain.weights), names
    # none named: the algorithm's own loss, to the bit
    (none,) = run_round(_executor(tmp_path / "none", "fedavg", **{"algo.regularizers": []}), 1, [2])
    assert none.weights.equals(plain.weights)


def test_dot_regression_with_fd_is_feddrplus(tmp_path):
    """FedDr+'s loss is dot-regression + FD at beta = 0.9 (Eq. 4): the same update, up to the order
    in which autograd sums the two terms' gradients."""
    common = {"train.lr": 0.3}
    (drplus,) = run_round(_executor(tmp_path / "a", "feddrplus", **common), 1, [3])
    (dr_fd,) = run_round(
        _executor(tmp_path / "b", "dotreg", **{**common, "algo.regularizers": ["fd"]}), 1, [3]
    )
    (dr,) = run_round(_executor(tmp_path / "c", "dotreg", **common), 1, [3])
    for name, a in drplus.weights.items():
        np.testing.assert_allclose(dr_fd.weights.part(name), a, rtol=1e-4, atol=1e-6)
    assert not dr.weights.equals(drplus.weights)


def test_the_settings_are_checked(tmp_path):
    validate(
        tiny_config(tmp_path, algo="fedbabu", **{"algo.regularizers": ["prox", "ld"], "algo.reg_tau": 2})
    )
    validate(tiny_config(tmp_path, algo="dotreg", **{"algo.regularizers": "fd"}))
    for bad, match in (
        ({"algo.regularizers": ["l2"]}, "regularizers"),
        ({"algo.regularizers": ["fd", "fd"]}, "regularizers"),
        ({"algo.reg_beta": 1.0}, "reg_beta"),
        ({"algo.reg_tau": 0}, "reg_tau"),
    ):
        with pytest.raises(ConfigError, match=match):
            validate(tiny_config(tmp_path, algo="fedavg", **bad))
    with pytest.raises(ConfigError, match="regularizers"):  # FedPer does not take them
        validate(tiny_config(tmp_path, algo="fedper", **{"algo.regularizers": ["fd"]}))


@pytest.mark.ray
def test_a_regularised_combination_is_the_same_on_serial_and_ray(tmp_path, ray_local):
    setup = {"algo": "fedbabu", "rounds": 2, "participation": 0.75, "eval.every": 1}
    setup |= {"algo.regularizers": ["ntd", "fd"], "algo.ft_epochs": 1}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)


def test_settings_typed_on_the_command_line_are_read_as_their_types(tmp_path):
    """``--set`` gives strings: ``algo.ft_epochs=1`` and ``algo.regularizers=[ntd,fd]`` as a user types them."""
    from raysim.engine.experiment import algorithm_class

    cfg = tiny_config(
        tmp_path,
        algo="fedbabu",
        **{"algo.ft_epochs": "1", "algo.ft_lr": "0.02", "algo.regularizers": "[ntd,fd]", "algo.reg_beta": "0.8"},
    )
    validate(cfg)
    cls = algorithm_class("fedbabu")
    assert cls.finetune.setting(cfg) == (1, 0.02)
    assert cls.regularizers.setting(cfg) == (("ntd", "fd"), 0.8, 3.0)
