"""IFCA (Ghosh et al., NeurIPS 2020): each client picks the cluster model of lowest loss on its
data, trains it, and each cluster's model becomes the size-weighted mean of its choosers' uploads;
the download is the k models; the choice separates planted groups; its settings and runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import GLOBAL_PARTS, ModelWeights, payload_nbytes
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import run_round, tiny_config, without_times

# two planted populations, interleaved: clients 0, 2, 4, 6 hold classes 0-2, clients 1, 3, 5, 7
# classes 5-7 (train and test alike)
GROUP_A, GROUP_B = (0, 2, 4, 6), (1, 3, 5, 7)


def _planted(cfg):
    fd = prepare(cfg)

    def deal(y, classes):
        return np.array_split(np.flatnonzero(np.isin(y, classes)), 4)

    a, b = deal(fd.train.y, [0, 1, 2]), deal(fd.train.y, [5, 6, 7])
    a_test, b_test = deal(fd.ptest.y, [0, 1, 2]), deal(fd.ptest.y, [5, 6, 7])
    train = tuple(a[i // 2] if i in GROUP_A else b[i // 2] for i in range(8))
    test = tuple(a_test[i // 2] if i in GROUP_A else b_test[i // 2] for i in range(8))
    return dataclasses.replace(fd, client_train=train, client_test=test, client_val=())


def _executor(tmp_path, k, seed=0, **changes):
    cfg = tiny_config(
        tmp_path, algo="ifca", participation=1.0, seed=seed, **{"algo.num_clusters": k, **changes}
    )
    return SerialExecutor(cfg, _planted(cfg))


def _losses(ex, client, models):
    """F_i(theta_j) computed here: the model built anew, each theta_j loaded, the mean
    cross-entropy over the client's whole training set in one batch."""
    import torch
    import torch.nn.functional as F

    from raysim.models import build_model, set_weights

    cfg, data = ex.cfg, ex.runtime.data
    model = build_model(cfg.model, data.train.input_shape, data.num_classes, 0).eval()
    x, y = ex.runtime.gather(data.train, data.client_train[client])
    out = []
    for w in models:
        set_weights(model, w)
        with torch.no_grad():
            out.append(float(F.cross_entropy(model(x).double(), y)))
    return np.array(out)


def test_each_client_picks_the_cluster_of_its_lowest_loss(tmp_path):
    ex = _executor(tmp_path, 3)
    run_round(ex, 1, list(range(8)))  # trained clusters: the losses differ between them
    sent = ex.server.state.models
    results = run_round(ex, 2, list(range(8)))
    assert {r.client for r in results} == set(range(8))
    picks = set()
    for r in results:
        losses = _losses(ex, r.client, sent)
        gaps = np.sort(losses)[1] - losses.min()
        assert gaps > 1e-4, losses  # no near-tie: the argmin is unambiguous
        assert r.extra.cluster == int(np.argmin(losses)), (r.client, losses)
        picks.add(r.extra.cluster)
    assert len(picks) >= 2  # not every client on one cluster: the choice is the client's own
    # the evaluation's personal model is picked by the same rule from the current models
    algo, now = ex.runtime.algo, ex.server.state.models
    from raysim.toolkit.context import ClientContext

    for c in range(8):
        ctx = ClientContext(ex.runtime, c, 2, evaluating=True)
        assert algo.choose(ctx, now) == int(np.argmin(_losses(ex, c, now)))


def test_ties_go_to_the_lowest_index():
    from algorithms.ifca import pick

    assert pick(np.array([0.5, 0.2, 0.2, 0.7])) == 1
    assert pick(np.array([1.0, 1.0])) == 0


def _upload(client, n, cluster, value):
    from algorithms.ifca import Chosen

    w = ModelWeights(head=np.full(3, value, np.float32))
    return JobResult(Job((client,), None), (ClientResult(client, n, 0.0, w, extra=Chosen(cluster)),))


def test_each_cluster_becomes_the_size_weighted_mean_of_its_uploads_and_an_unchosen_one_stays():
    from algorithms.ifca import IFCA, IFCAConfig, IFCAState

    algo = IFCA(tiny_config(clients=4), IFCAConfig(num_clusters=3))
    before = tuple(ModelWeights(head=np.full(3, v, np.float32)) for v in (-1.0, 7.0, 9.0))
    state = IFCAState(before, (2, -1, -1, 0))
    # clients 0 (10 samples, uploads 1) and 1 (30 samples, uploads 5) chose cluster 0, client 3
    # (20 samples, uploads 2) cluster 2; nobody chose cluster 1
    after = algo.aggregate(state, 1, [_upload(0, 10, 0, 1.0), _upload(1, 30, 0, 5.0), _upload(3, 20, 2, 2.0)])
    np.testing.assert_allclose(after.models[0].head, (10 * 1 + 30 * 5) / 40)  # 4.0, not the plain mean 3.0
    assert after.models[1] is before[1]
    np.testing.assert_array_equal(after.models[2].head, 2.0)
    assert after.chosen == (0, 0, -1, 2) and after.switched == 2  # client 0 left cluster 2, 3 left 0
    # the logged assignment: the clusters' members, and who has not chosen yet
    assert algo.round_scalars(after, 1) == {
        "clusters": 2.0,
        "cluster_size_max": 2.0,
        "cluster_size_min": 1.0,
        "ifca_unassigned": 1.0,
        "ifca_switched": 2.0,
    }
    text = algo.round_texts(after, 1)["clusters"]
    assert "- cluster 0 (2): 0, 1" in text and "- cluster 1 (0): " in text and "- cluster 2 (1): 3" in text
    assert text.endswith("- no choice yet (1): 2")


def test_a_run_averages_each_clusters_choosers_and_keeps_the_others(tmp_path):
    ex = _executor(tmp_path, 4, seed=1)
    before = ex.server.state.models
    results = run_round(ex, 1, list(range(8)))
    after = ex.server.state.models
    assert {r.extra.cluster for r in results} == {1, 2}  # clusters 0 and 3 unchosen (seed 1)
    for j in range(4):
        mine = [r for r in results if r.extra.cluster == j]
        if not mine:
            assert after[j] is before[j]
            continue
        sizes = np.array([r.num_samples for r in mine], np.float64)
        for part in GLOBAL_PARTS:
            want = sum(
                (s / sizes.sum()) * r.weights.part(part).astype(np.float64)
                for s, r in zip(sizes, mine, strict=True)
            )
            np.testing.assert_allclose(after[j].part(part), want, rtol=1e-5, atol=1e-7)


def test_the_k_models_start_from_seeds_of_their_own(tmp_path):
    ex = _executor(tmp_path, 3)
    models = ex.server.state.models
    # cluster 0 is the run's seeded initial model; the others differ from it and from each other
    assert models[0].equals(ex.runtime.initial_weights.select(GLOBAL_PARTS))
    assert not models[1].equals(models[0]) and not models[2].equals(models[1])
    again = _executor(tmp_path / "again", 3).server.state.models
    assert all(a.equals(b) for a, b in zip(models, again, strict=True))


def test_the_download_carries_the_k_models(tmp_path):
    k = 3
    ex = _executor(tmp_path, k)
    one = payload_nbytes(ex.server.state.models[0])
    results = run_round(ex, 1, [0, 3, 6])
    assert [r.bytes_down for r in results] == [k * one] * 3
    assert [r.bytes_up for r in results] == [one] * 3
    # the round's totals, as metrics.parquet counts them
    run = run_experiment(tiny_config(tmp_path / "run", algo="ifca", rounds=1, **{"algo.num_clusters": k}))
    per_round = run.rows[0]
    assert per_round["bytes_down"] == 4 * k * one and per_round["bytes_up"] == 4 * one  # 4 clients a round


def test_the_assignment_recovers_planted_groups(tmp_path):
    ex = _executor(tmp_path, 2, seed=3)
    for rnd in (1, 2, 3):
        run_round(ex, rnd, list(range(8)))
    chosen = ex.server.state.chosen
    groups = {tuple(c for c in range(8) if chosen[c] == j) for j in (0, 1)}
    assert groups == {GROUP_A, GROUP_B}
    # and the personal models at evaluation: each group on its own cluster
    from raysim.toolkit.context import ClientContext

    algo, models = ex.runtime.algo, ex.server.state.models
    picks = [algo.choose(ClientContext(ex.runtime, c, 3, evaluating=True), models) for c in range(8)]
    assert picks == list(chosen)


def test_clusters_show_in_the_metrics_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(
        tmp_path,
        algo="ifca",
        rounds=3,
        participation=1.0,
        seed=3,
        **{"algo.num_clusters": 2, "output.tensorboard": True},
    )
    result = run_experiment(cfg, data=_planted(cfg))
    assert [r["clusters"] for r in result.rows] == [2.0] * 3  # the groups from round 1 on, seed 3
    assert [r["cluster_size_max"] for r in result.rows] == [4.0] * 3
    assert result.final["gm_gtest"] is None and result.final["lm_ptest"] is not None
    acc = EventAccumulator(str(result.run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    shown = acc.Tensors("algo/clusters")
    assert [s.step for s in shown] == [1, 2, 3]  # every round
    text = shown[-1].tensor_proto.string_val[0]
    assert b"0, 2, 4, 6" in text and b"1, 3, 5, 7" in text


def test_one_cluster_is_fedavg(tmp_path):
    ifca = run_experiment(tiny_config(tmp_path / "i", algo="ifca", rounds=2, **{"algo.num_clusters": 1}))
    fedavg = run_experiment(tiny_config(tmp_path / "f", algo="fedavg", rounds=2))
    assert [r["lm_ptest"] for r in ifca.rows] == [r["gm_ptest"] for r in fedavg.rows]
    assert [r["train_loss"] for r in ifca.rows] == [r["train_loss"] for r in fedavg.rows]


def test_learns_and_reports_its_metrics(tmp_path):
    result = run_experiment(tiny_config(tmp_path, algo="ifca", rounds=3, **{"eval.every": 1}))
    rows = result.rows
    assert rows[-1]["lm_ptest"] > rows[0]["lm_ptest"] and rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert all(r["gm_gtest"] is None and r["gm_ptest"] is None for r in rows)
    assert all(r["clusters"] >= 1 and r["ifca_unassigned"] >= 0 for r in rows)
    assert rows[-1]["ifca_unassigned"] <= rows[0]["ifca_unassigned"]


def test_a_resumed_run_keeps_the_clusters_and_the_choices(tmp_path):
    from raysim import checkpoint
    from tests.engine.test_checkpoint import CtrlCAfter

    setup = {"algo": "ifca", "rounds": 4, "participation": 0.5, "eval.every": 1, "algo.num_clusters": 3}
    full = run_experiment(tiny_config(tmp_path / "full", **setup))
    cfg = tiny_config(tmp_path / "stopped", **setup)
    assert run_experiment(cfg, [CtrlCAfter(2)]).last_round == 2
    resumed = run_experiment(cfg, resume=checkpoint.load(tmp_path / "stopped"))
    # the same rows, ifca_unassigned too: the choices made before the stop were kept
    assert without_times(resumed.rows) == without_times(full.rows)


@pytest.mark.parametrize(
    ("value", "sentence"),
    [
        (0, "algo.num_clusters must be at least 1, not 0."),
        (-2, "algo.num_clusters must be at least 1, not -2."),
        ("four", "algo.num_clusters must be an integer, not 'four'."),
        (2.5, "algo.num_clusters must be an integer, not 2.5."),
        (9, "IFCA cannot have more clusters (algo.num_clusters=9) than clients that train (8)."),
    ],
)
def test_a_mistyped_number_of_clusters_is_refused_in_one_sentence(tmp_path, value, sentence):
    with pytest.raises(ConfigError) as refused:
        validate(tiny_config(tmp_path, algo="ifca", **{"algo.num_clusters": value}))
    assert str(refused.value) == sentence


def test_the_clusters_are_counted_against_the_clients_that_train(tmp_path):
    held_out = {"eval.new_clients": 0.25}  # 2 of the 8 clients never train
    validate(tiny_config(tmp_path, algo="ifca", **held_out, **{"algo.num_clusters": 6}))
    with pytest.raises(ConfigError, match=r"than clients that train \(6\)\.$"):
        validate(tiny_config(tmp_path, algo="ifca", **held_out, **{"algo.num_clusters": 7}))


@pytest.mark.ray
def test_serial_equals_ray(tmp_path, ray_local):
    setup = {"algo": "ifca", "rounds": 2, "participation": 0.75, "eval.every": 1, "algo.num_clusters": 3}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)


def test_a_newcomer_picks_its_cluster_as_a_client_does(tmp_path):
    from algorithms.ifca import IFCA, IFCAEvaluation
    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    ex = _executor(tmp_path, 2, seed=3)
    run_round(ex, 1, list(range(8)))
    evaluation = ex.server.evaluation()
    assert isinstance(evaluation, IFCAEvaluation)
    algo = ex.runtime.algo
    assert IFCA.evaluates_newcomers(tiny_config(**{"eval.new_clients": 0.25}))
    for c in (0, 1):
        newcomer = get_weights(
            evaluation.newcomer_model(algo, ClientContext(ex.runtime, c, 1, evaluating=True)), GLOBAL_PARTS
        )
        j = algo.choose(ClientContext(ex.runtime, c, 1, evaluating=True), evaluation.payload)
        assert newcomer.equals(evaluation.payload[j])  # the picked model itself, untrained
