"""Chain jobs: several clients trained one after another on one model (Fed3+2p's coordinators)."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from tests.conftest import tiny_config, without_times

TOY = "tests.engine.chain_toy:ChainToy"


def _final_weights(cfg):
    ex = SerialExecutor(cfg, prepare(cfg))
    ex.train_round(1, [0, 1, 2, 3])
    return ex.server.state.weights


def test_chain_trains_in_the_given_order_on_one_model(tmp_path):
    cfg = tiny_config(tmp_path, algo=TOY, rounds=2, participation=0.5)
    result = run_experiment(cfg)
    # 4 clients a round -> 3 links checked a round by the server (each started from the one before)
    assert [row["links_checked"] for row in result.rows] == [3.0, 6.0]
    forward = _final_weights(cfg)
    backward = _final_weights(tiny_config(tmp_path, algo=TOY, **{"algo.reverse": True}))
    assert not np.array_equal(forward.head, backward.head), "the order must change the result"


@pytest.mark.ray
def test_chain_across_ray_workers_equals_serial(tmp_path, ray_local):
    cfg = tiny_config(tmp_path / "s", algo=TOY, rounds=2)
    serial = run_experiment(cfg)
    from raysim.data import build_federated_data
    from raysim.engine.executors.placement import lpt_assign

    data = build_federated_data(cfg.data, cfg.clients, cfg.seed)
    homes = lpt_assign([float(len(i)) for i in data.client_train], 2)
    assert len(set(homes)) == 2  # the chain really crosses workers
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", algo=TOY, rounds=2, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)
