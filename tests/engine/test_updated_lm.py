"""``eval.updated_lm``: the LM column of an algorithm without personal models (Fed3+2p's Table 1
reads FedAvg's, FedProx's and FedDyn's LM so): each client's model as its local update in the
evaluated round left it, on its own P-Test, for the clients trained in that round."""

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


def test_an_algorithm_with_personal_models_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="fedrep has its own"):
        raysim.make_config(**TINY, algo="fedrep", clients=6, participation=0.5, set={**DATA, "eval.updated_lm": True})
