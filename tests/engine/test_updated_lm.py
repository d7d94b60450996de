"""``eval.updated_lm``: ``updated_lm_ptest``, each client's model as its local update in the
evaluated round left it, on its own P-Test, for the clients trained in that round; for any
algorithm. For one without personal models it is also the LM column (Fed3+2p's Table 1 reads
FedAvg's, FedProx's and FedDyn's LM so); for a clustered one it is the LM that PACFL's authors
report for their baselines."""

from __future__ import annotations

import pandas as pd
import pytest

import raysim
from raysim.errors import ConfigError

TINY = dict(
    dataset="synthetic", model="mlp_fcd", rounds=2, local_epochs=1, batch_size=20, lr=0.05,
    partition="dirichlet:0.5", executor="serial", progress=False, tensorboard=False,
)  # fmt: skip
DATA = {"data.synthetic.train_samples": 600, "data.synthetic.test_samples": 300, "data.synthetic.shape": (1, 8, 8)}


def test_one_clients_updated_model_is_the_new_global_model(tmp_path):
    """With one client, FedAvg's new global model is that client's updated model: the two P-Test
    accuracies agree exactly, every round."""
    res = raysim.run(**TINY, algo="fedavg", clients=1, participation=1.0, out=str(tmp_path / "one"),
                     set={**DATA, "eval.updated_lm": True})  # fmt: skip
    assert res.metrics["lm_ptest"].notna().all()
    assert list(res.metrics["lm_ptest"]) == list(res.metrics["gm_ptest"])
    assert list(res.metrics["updated_lm_ptest"].iloc[1:]) == list(res.metrics["lm_ptest"].iloc[1:])


@pytest.mark.parametrize("algo", ["fedavg", "fedprox", "feddyn"])
def test_only_the_rounds_trained_clients_have_an_updated_model(tmp_path, algo):
    res = raysim.run(**TINY, algo=algo, clients=6, participation=0.5, out=str(tmp_path / algo),
                     set={**DATA, "eval.updated_lm": True})  # fmt: skip
    clients = pd.read_parquet(tmp_path / algo / "clients.parquet")
    for rnd, rows in clients.groupby("round"):
        trained = rows[rows["lm_ptest"].notna()]
        assert len(trained) == 3  # 0.5 of 6 clients a round
        assert res.metrics.set_index("round").loc[rnd, "lm_ptest"] == pytest.approx(trained["lm_ptest"].mean())
    # the updated local models fit their own clients better than the average does, here
    assert (res.metrics["lm_ptest"] > res.metrics["gm_ptest"]).all()
    off = raysim.run(**TINY, algo=algo, clients=6, participation=0.5, out=str(tmp_path / f"{algo}-off"), set=DATA)
    assert off.metrics["lm_ptest"].isna().all()
    cols = ["gm_gtest", "gm_ptest", "train_loss"]
    assert off.metrics[cols].equals(res.metrics[cols])  # reading the local models changes nothing


@pytest.mark.parametrize("algo", ["fedrep", "cfl", "pacfl", "fedclust"])
def test_one_clients_personal_model_is_its_updated_model(tmp_path, algo):
    """With one client, its personal model after the round (the server's shared parts, from it
    alone, and its own; or its cluster's model) is the model its local update left: the two
    columns agree exactly. ``lm_ptest`` stays the algorithm's own."""
    res = raysim.run(**TINY, algo=algo, clients=1, participation=1.0, out=str(tmp_path / "one"),
                     set={**DATA, "eval.updated_lm": True})  # fmt: skip
    assert res.metrics["updated_lm_ptest"].iloc[1:].notna().all()
    assert list(res.metrics["updated_lm_ptest"].iloc[1:]) == list(res.metrics["lm_ptest"].iloc[1:])


@pytest.mark.parametrize("algo", ["fedrep", "cfl"])
def test_a_personal_algorithms_lm_is_its_own_and_the_updated_one_is_beside_it(tmp_path, algo):
    res = raysim.run(**TINY, algo=algo, clients=6, participation=0.5, out=str(tmp_path / algo),
                     set={**DATA, "eval.updated_lm": True})  # fmt: skip
    off = raysim.run(**TINY, algo=algo, clients=6, participation=0.5, out=str(tmp_path / f"{algo}-off"), set=DATA)
    cols = ["gm_gtest", "gm_ptest", "lm_ptest", "train_loss"]
    assert off.metrics[cols].equals(res.metrics[cols])  # lm_ptest is the personal models', unchanged
    assert "updated_lm_ptest" not in off.metrics
    clients = pd.read_parquet(tmp_path / algo / "clients.parquet")
    assert clients["lm_ptest"].notna().all()  # every client has its personal model
    for rnd, rows in clients[clients["round"] > 0].groupby("round"):
        trained = rows[rows["updated_lm_ptest"].notna()]
        assert len(trained) == 3
        assert res.metrics.set_index("round").loc[rnd, "updated_lm_ptest"] == pytest.approx(trained["updated_lm_ptest"].mean())
    assert res.summary["final"]["updated_lm_ptest"] == res.metrics["updated_lm_ptest"].iloc[-1]


def test_batched_personal_clients_are_refused(tmp_path):
    """Batched, a client's result carries only what it uploads; FedRep's heads stay behind."""
    with pytest.raises(ConfigError, match="fedrep keeps personal parts"):
        raysim.make_config(**TINY, algo="fedrep", clients=6, participation=0.5,
                           set={**DATA, "eval.updated_lm": True, "train.batch_clients": 2})  # fmt: skip
    raysim.make_config(**TINY, algo="fedavg", clients=6, participation=0.5,
                       set={**DATA, "eval.updated_lm": True, "train.batch_clients": 2})  # fmt: skip


def test_a_target_on_the_updated_models_needs_them(tmp_path):
    with pytest.raises(ConfigError, match="needs eval.updated_lm=true"):
        raysim.make_config(**TINY, algo="cfl", clients=6, set={**DATA, "eval.target": 0.5, "eval.target_metric": "updated_lm_ptest"})
    for bad in ("updated_lm", "updated_lm_ptest_weighted", 1):
        with pytest.raises(ConfigError, match="target_metric"):
            raysim.make_config(**TINY, algo="cfl", clients=6, set={**DATA, "eval.updated_lm": True, "eval.target_metric": bad})
    res = raysim.run(**TINY, algo="cfl", clients=2, participation=1.0, out=str(tmp_path / "t"),
                     set={**DATA, "eval.updated_lm": True, "eval.target": 0.01, "eval.target_metric": "updated_lm_ptest"})  # fmt: skip
    assert res.summary["rounds_to_target"] == 1  # the first evaluation after training reaches 1 %
