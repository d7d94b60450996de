"""The clustered baselines (CFL, PACFL, FedClust) and GPFL: each one's defining property
on the numbers; the clustering they share."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from algorithms.clustering import agglomerative, assignment, bipartition, cosine_similarity, nearest_cluster
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import run_round, tiny_config, without_times

# two planted populations, interleaved: clients 0, 2, 4, 6 and 1, 3, 5, 7
GROUP_A, GROUP_B = (0, 2, 4, 6), (1, 3, 5, 7)


# ---------------------------------------------------------------------------------------- clustering


def test_agglomerative_merges_by_linkage_until_the_threshold():
    # points on a line: 0, 1, 2.5 and 10, 11
    x = np.array([0.0, 1.0, 2.5, 10.0, 11.0])
    d = np.abs(x[:, None] - x[None, :])
    assert agglomerative(d, threshold=1.0, linkage="single") == ((0, 1), (2,), (3, 4))
    assert agglomerative(d, threshold=1.5, linkage="single") == ((0, 1, 2), (3, 4))
    # complete: {0,1} to 2 is max(2.5, 1.5) = 2.5 > 2; average (UPGMA) is 2.0, merged
    assert agglomerative(d, threshold=2.0, linkage="complete") == ((0, 1), (2,), (3, 4))
    assert agglomerative(d, threshold=2.0, linkage="average") == ((0, 1, 2), (3, 4))
    # weighted (WPGMA) vs average (UPGMA): {0,1,2} to {3,4} is the mean of its six distances,
    # 56/6 = 9.33, in UPGMA; in WPGMA the mean of {0,1}'s (10) and 2's (8) distances, 9
    assert agglomerative(d, threshold=9.1, linkage="weighted") == ((0, 1, 2, 3, 4),)
    assert agglomerative(d, threshold=9.1, linkage="average") == ((0, 1, 2), (3, 4))
    assert agglomerative(d, num_clusters=2) == ((0, 1, 2), (3, 4))
    np.testing.assert_array_equal(assignment(((0, 1, 2), (3, 4)), 5), [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(assignment(((0, 2), (3,)), 4, absent=(1,)), [0, -1, 0, 1])
    with pytest.raises(ValueError, match=r"clients \[1\] are in no cluster"):
        assignment(((0, 2), (3,)), 4)


def test_a_newcomer_joins_the_nearest_cluster_by_the_linkage():
    # distances to the clients 0..4; clusters {0, 1} and {2, 3, 4}
    d = np.array([1.0, 9.0, 2.0, 3.0, 4.0])
    clusters = [(0, 1), (2, 3, 4)]
    assert nearest_cluster(d, clusters, "single") == 0  # 1 against 2
    assert nearest_cluster(d, clusters, "complete") == 1  # 9 against 4
    assert nearest_cluster(d, clusters, "average") == 1  # 5 against 3
    assert nearest_cluster(d, clusters, "weighted") == 1
    assert nearest_cluster(np.array([2.0, 2.0]), [(0,), (1,)], "single") == 0  # the first of equals


def test_bipartition_separates_opposite_directions():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(50)
    rows = np.stack([(1 if i in GROUP_A else -1) * v + 0.3 * rng.standard_normal(50) for i in range(8)])
    first, second = bipartition(cosine_similarity(rows))
    assert {first, second} == {GROUP_A, GROUP_B}


# ---------------------------------------------------------------------------------------- CFL


def _cfl_round(algo, state, deltas, rnd):
    """The server's aggregate over uploads theta_c + delta_i (every client in cluster 0)."""
    base = state.models[0]
    results = [
        JobResult(
            Job((c,), None), (ClientResult(c, 10, 0.0, ModelWeights(head=base.head + d.astype(np.float32))),)
        )
        for c, d in deltas.items()
    ]
    return algo.aggregate(state, rnd, results)


def test_cfl_splits_two_opposite_populations_and_not_one():
    from algorithms.cfl import CFL, CFLConfig
    from algorithms.clustered import ClusterState

    algo = CFL(tiny_config(clients=8), CFLConfig(eps1=0.5, eps2=1.0, min_cluster_size=2, start_round=2))
    start = ClusterState((tuple(range(8)),), (ModelWeights(head=np.zeros(40, np.float32)),))
    rng = np.random.default_rng(1)
    v = rng.standard_normal(40)
    v *= 2 / np.linalg.norm(v)
    noise = {c: 0.05 * rng.standard_normal(40) for c in range(8)}
    opposite = {c: (v if c in GROUP_A else -v) + noise[c] for c in range(8)}
    # round 1 < start_round: no split, whatever the updates
    s1 = _cfl_round(algo, start, opposite, 1)
    assert s1.clusters == (tuple(range(8)),)
    # round 2: the mean update cancels (norm < eps1), each client's is about 2 (> eps2): split
    s2 = _cfl_round(algo, s1, opposite, 2)
    assert s2.clusters == (GROUP_A, GROUP_B) and s2.formed == 2
    scalars = dict(s2.scalars)
    assert scalars["cfl_mean_norm"] < 0.5 < 1.0 < scalars["cfl_max_norm"]
    assert scalars["cfl_gamma_max"] > 0.9  # cross similarity about -1: well separated
    # each child moved from theta_c by its own members' mean update
    for k, group in enumerate((GROUP_A, GROUP_B)):
        want = s1.models[0].head + np.mean([opposite[c] for c in group], axis=0)
        np.testing.assert_allclose(s2.models[k].head, want, atol=1e-6)
    # one population, near stationary (every update small): no split
    small = {c: noise[c] for c in range(8)}
    assert _cfl_round(algo, s1, small, 2).clusters == (tuple(range(8)),)
    # one population, all pulling the same way (mean norm about 2 > eps1): no split
    same = {c: v + noise[c] for c in range(8)}
    assert _cfl_round(algo, s1, same, 2).clusters == (tuple(range(8)),)


def test_cfl_splits_only_once_every_member_has_an_update():
    from algorithms.cfl import CFL, CFLConfig
    from algorithms.clustered import ClusterState

    algo = CFL(tiny_config(clients=8), CFLConfig(eps1=0.5, eps2=1.0, start_round=1))
    start = ClusterState((tuple(range(8)),), (ModelWeights(head=np.zeros(4, np.float32)),))
    v = np.array([2.0, 0.0, 0.0, 0.0])
    half = {c: (v if c in GROUP_A else -v) for c in (0, 1, 2, 3)}  # clients 4-7 not yet sampled
    s1 = _cfl_round(algo, start, half, 1)
    assert s1.clusters == (tuple(range(8)),)  # criteria met, but 4-7 have no update
    rest = {c: (v if c in GROUP_A else -v) for c in (4, 5, 6, 7)}
    assert _cfl_round(algo, s1, rest, 2).clusters == (GROUP_A, GROUP_B)  # 0-3's updates kept


def test_cfl_with_newcomers_held_out_clusters_and_splits_the_clients_that_train():
    """A newcomer (eval.new_clients) never trains, so it is in no cluster: the split waits for the
    clients that train only (were it in the first cluster, its missing update would hold the split
    off for ever)."""
    from algorithms.cfl import CFL, CFLConfig
    from algorithms.clustered import ClusterState

    cfg = tiny_config(clients=10, algo="cfl", **{"eval.new_clients": 0.2})
    held = set(cfg.new_clients)
    training = list(cfg.training_clients)
    assert len(held) == 2
    assert SerialExecutor(cfg, prepare(cfg)).server.state.clusters == (tuple(training),)
    algo = CFL(cfg, CFLConfig(eps1=0.5, eps2=1.0, min_cluster_size=1, start_round=1))
    start = ClusterState((tuple(training),), (ModelWeights(head=np.zeros(4, np.float32)),))
    v = np.array([2.0, 0.0, 0.0, 0.0])
    opposite = {c: (v if k % 2 else -v) for k, c in enumerate(training)}
    split = _cfl_round(algo, start, opposite, 1)
    assert len(split.clusters) == 2 and sorted(sum(split.clusters, ())) == training
    assert not held & set(sum(split.clusters, ()))


def test_cfl_runs_and_splits_in_a_run(tmp_path):
    result = run_experiment(
        tiny_config(
            tmp_path,
            algo="cfl",
            rounds=4,
            participation=1.0,
            **{"algo.start_round": 2, "algo.eps1": 100.0, "algo.eps2": 0.0},
        )
    )
    assert result.rows[0]["clusters"] == 1 and result.rows[-1]["clusters"] >= 2
    assert result.final["gm_gtest"] is None and result.final["lm_ptest"] is not None


# ---------------------------------------------------------------------------------------- PACFL and FedClust


def _planted(cfg):
    """The synthetic data dealt so that clients 0, 2, 4, 6 hold classes 0-2 and 1, 3, 5, 7 classes
    5-7 (train and test alike)."""
    fd = prepare(cfg)

    def deal(y, classes, parts):
        idx = np.flatnonzero(np.isin(y, classes))
        return np.array_split(idx, parts)

    a_train, b_train = deal(fd.train.y, [0, 1, 2], 4), deal(fd.train.y, [5, 6, 7], 4)
    a_test, b_test = deal(fd.ptest.y, [0, 1, 2], 4), deal(fd.ptest.y, [5, 6, 7], 4)
    train = [a_train[i // 2] if i in GROUP_A else b_train[i // 2] for i in range(8)]
    test = [a_test[i // 2] if i in GROUP_A else b_test[i // 2] for i in range(8)]
    return dataclasses.replace(fd, client_train=tuple(train), client_test=tuple(test), client_val=())


def test_pacfl_subspace_angles():
    from algorithms.pacfl import class_subspaces, proximity_matrix

    rng = np.random.default_rng(0)
    # two classes on orthogonal axes of R^6; a client holding class 0 twice over the other's
    x = np.zeros((6, 6))
    x[:3, 0] = [1.0, 2.0, 3.0]
    x[3:, 1] = [1.0, 1.0, 1.0]
    y = np.array([0, 0, 0, 1, 1, 1])
    u = class_subspaces(x, y, basis=1)
    np.testing.assert_allclose(np.abs(u), np.eye(6)[:, :2], atol=1e-6)  # e_0 for class 0, e_1 for class 1
    w = np.cos(np.radians(30)) * np.eye(6)[:, :1] + np.sin(np.radians(30)) * np.eye(6)[:, 2:3]
    a = proximity_matrix([u[:, :1], w, -u[:, 1:]], "pairwise")
    np.testing.assert_allclose(a[0, 1], 30.0, atol=1e-4)  # the angle between e_0 and w
    np.testing.assert_allclose(a[0, 2], 90.0, atol=1e-4)
    q = rng.standard_normal((6, 2))
    # principal: the smallest principal angle; a span and a rotation of it inside it are at 0
    same = proximity_matrix([q, q @ np.array([[0.6, -0.8], [0.8, 0.6]])], "principal")
    assert same[0, 1] < 1e-3


@pytest.mark.parametrize("algo", ["pacfl", "fedclust"])
def test_one_shot_clustering_recovers_planted_label_groups(tmp_path, algo):
    cfg = tiny_config(tmp_path, algo=algo, participation=1.0, **{"algo.num_clusters": 2})
    ex = SerialExecutor(cfg, _planted(cfg))
    results = run_round(ex, 0, list(range(8)))
    assert ex.server.state.clusters == (GROUP_A, GROUP_B)
    if algo == "fedclust":  # the warm-up trained and sent the classifier only
        assert all(r.samples_trained == r.num_samples * cfg.train.local_epochs for r in results)
        assert all(
            np.asarray(r.extra).size == sum(q.numel() for q in ex.runtime.model.head.parameters())
            for r in results
        )
    else:  # p = 3 vectors for each of the 3 classes a client holds
        assert all(np.asarray(r.extra).shape == (64, 9) for r in results)
    # FedAvg inside each cluster: the round's cluster models are the means of their members' uploads
    uploads = {r.client: r for r in run_round(ex, 1, list(range(8)))}
    state = ex.server.state
    for k, members in enumerate((GROUP_A, GROUP_B)):
        sizes = np.array([uploads[c].num_samples for c in members], np.float64)
        want = sum(
            (s / sizes.sum()) * uploads[c].weights.head.astype(np.float64) for s, c in zip(sizes, members, strict=True)
        )
        np.testing.assert_allclose(state.models[k].head, want, rtol=1e-5, atol=1e-7)
    assert not state.models[0].equals(state.models[1])


@pytest.mark.parametrize("algo", ["pacfl", "fedclust"])
def test_clients_held_out_are_left_out_of_the_clusters_and_join_the_nearest_as_newcomers(tmp_path, algo):
    """eval.new_clients: the clients held out of training answer nothing before round 1 and are in
    no cluster; a newcomer answers the same request on its own data, and joins the cluster its
    answer is nearest to by the algorithm's distance and linkage (by hand here); with
    eval.new_client_epochs 0 its model is that cluster's model, and it predicts as it does."""
    from raysim.toolkit.context import ClientContext

    cfg = tiny_config(
        tmp_path, algo=algo, participation=1.0,
        **{"algo.num_clusters": 2, "eval.new_clients": 0.25, "eval.new_client_epochs": 0},
    )  # fmt: skip
    held = cfg.new_clients
    assert len(held) == 2
    ex = SerialExecutor(cfg, _planted(cfg))
    results = run_round(ex, 0, list(cfg.training_clients))
    assert sorted(r.client for r in results) == list(cfg.training_clients)
    state = ex.server.state
    assert state.clusters == (tuple(c for c in GROUP_A if c not in held), tuple(c for c in GROUP_B if c not in held))
    run_round(ex, 1, list(cfg.training_clients))
    state = ex.server.state
    evaluation = ex.server.algo.evaluation(state)
    algo_w = ex.runtime.algo
    joining = evaluation.payload.joining
    assert [c for c, _ in joining.uploads] == list(cfg.training_clients)
    for c in held:
        # by hand: its answer, its distances to the clustered clients', the linkage's nearest
        ctx = ClientContext(ex.runtime, c, 1, evaluating=True)
        mine = algo_w.prologue_update(ctx, joining.request).extra
        ups = [u for _, u in joining.uploads]
        dist = algo_w.distances([*ups, mine])[-1, :-1]
        pos = {cid: i for i, cid in enumerate(cfg.training_clients)}
        want = nearest_cluster(dist, [[pos[m] for m in cl] for cl in state.clusters], algo_w.params.linkage)
        assert want == (0 if c in GROUP_A else 1)  # its planted group's cluster
        model = evaluation.newcomer_model(algo_w, ClientContext(ex.runtime, c, 1, evaluating=True))
        from raysim.models import get_weights
        from raysim.weights import GLOBAL_PARTS

        assert get_weights(model, GLOBAL_PARTS).equals(state.models[want].select(GLOBAL_PARTS))
    report = ex.evaluate(1)
    assert [r.client for r in report.clients if r.new] == list(held)
    assert all(r.lm_correct is not None for r in report.clients)


def test_pacfl_threshold_in_degrees(tmp_path):
    cfg = tiny_config(tmp_path, algo="pacfl", **{"algo.threshold": 0.0})
    ex = SerialExecutor(cfg, _planted(cfg))
    run_round(ex, 0, list(range(8)))
    assert len(ex.server.state.clusters) == 8  # nothing within 0 degrees
    cfg = tiny_config(tmp_path, algo="pacfl", **{"algo.threshold": 180.0})
    ex = SerialExecutor(cfg, _planted(cfg))
    run_round(ex, 0, list(range(8)))
    assert ex.server.state.clusters == (tuple(range(8)),)


def test_clusters_show_in_the_metrics_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(
        tmp_path, algo="fedclust", rounds=2, **{"algo.num_clusters": 2, "output.tensorboard": True}
    )
    result = run_experiment(cfg, data=_planted(cfg))
    assert [r["clusters"] for r in result.rows] == [2.0, 2.0]
    assert [r["cluster_size_max"] for r in result.rows] == [4.0, 4.0]
    acc = EventAccumulator(str(result.run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [t for t in acc.Tags()["tensors"] if "clusters" in t]
    assert texts, acc.Tags()
    shown = acc.Tensors(texts[0])[0]
    assert shown.step == 1 and b"0, 2, 4, 6" in shown.tensor_proto.string_val[0]


# ---------------------------------------------------------------------------------------- GPFL


def test_gpfl_conditional_inputs():
    import torch

    from algorithms.gpfl import conditional_inputs

    e = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    g, p = conditional_inputs(e, torch.tensor([2, 0, 6]))
    torch.testing.assert_close(g, torch.tensor([4 / 3, 5 / 3]))
    torch.testing.assert_close(p, torch.tensor([0.25 * 1 + 0.75 * 3, 0.75 * 3]))


def test_gpfl_loss_is_the_papers_and_its_modules_train_as_stated(tmp_path):
    import torch
    import torch.nn.functional as F

    from algorithms.gpfl import build_modules, conditional_inputs, load_modules

    # one full-batch step, so the reported loss is Eq. 8 at the received weights
    cfg = tiny_config(
        tmp_path, algo="gpfl", **{"train.batch_size": 1000, "algo.lambda": 0.5, "algo.mu": 0.01}
    )
    ex = SerialExecutor(cfg, prepare(cfg))
    sent = ex.server.state
    (res,) = run_round(ex, 1, [2])
    model = ex.runtime.model
    from raysim.models import set_weights

    set_weights(model, sent.weights.merged(ex.runtime.initial_weights.select(("head",))))
    mods = build_modules(model.filter_dim, model.num_classes, 0)
    load_modules(mods, sent.modules)
    x, y = ex.runtime.gather(ex.runtime.data.train, ex.runtime.data.client_train[2])
    with torch.no_grad():
        e = mods.embedding.weight
        g, p = conditional_inputs(e, torch.bincount(y, minlength=model.num_classes))
        f = model.filter(model.extractor(x))
        f_g = mods.valve(f, g)
        want = F.cross_entropy(model.head(mods.valve(f, p)), y)
        want += F.cross_entropy(F.linear(F.normalize(f_g), F.normalize(e)), y)
        want += 0.5 * torch.linalg.vector_norm(f_g - e[y])
        want += 0.005 * sum(torch.sum(q * q) for q in mods.parameters())  # mu on GCE and CoV only
        whole = 0.005 * sum(torch.sum(q * q) for m in (model.extractor, model.filter, model.head) for q in m.parameters())
    assert res.train_loss == pytest.approx(float(want), rel=1e-5)
    assert float(whole) > 1e-3 * float(want)  # (the model's own decay would have shown)
    # uploaded: phi (extractor, filter) and the modules, all trained; the head stays on the worker
    assert res.weights.part_names == ("extractor", "filter")
    assert not np.array_equal(res.weights.extractor, sent.weights.extractor)  # (mlp_fcd's filter is empty)
    n_gce = model.num_classes * model.filter_dim
    sent_gce, got = sent.modules[:n_gce], np.asarray(res.extra)
    assert not np.array_equal(got[:n_gce], sent_gce) and not np.array_equal(got[n_gce:], sent.modules[n_gce:])
    kept = ex.runtime.kept(2)
    assert kept.part_names == ("head",) and not np.array_equal(kept.head, ex.runtime.initial_weights.head)
    # the server averages phi and the modules by training-set size
    assert np.array_equal(ex.server.state.modules, got) and ex.server.state.weights.equals(res.weights)


def test_gpfl_personal_model_predicts_through_the_personalised_valve(tmp_path):
    import torch

    from algorithms.gpfl import conditional_inputs

    cfg = tiny_config(tmp_path, algo="gpfl")
    ex = SerialExecutor(cfg, prepare(cfg))
    run_round(ex, 1, [1, 2])
    from raysim.toolkit.context import ClientContext

    algo, state = ex.runtime.algo, ex.server.state
    x, y = ex.runtime.gather(ex.runtime.data.train, ex.runtime.data.client_train[1])
    evaluation = algo.evaluation(state)
    model = evaluation.personal_model(algo, ClientContext(ex.runtime, 1, 1))
    forward = evaluation.forward(algo, model)
    mods = algo._built
    with torch.no_grad():
        _, p = conditional_inputs(mods.embedding.weight, torch.bincount(y, minlength=model.num_classes))
        want = model.head(mods.valve(model.filter(model.extractor(x)), p))
        torch.testing.assert_close(forward(x), want)
        assert not torch.allclose(forward(x), model(x))  # not the plain head(phi(x))


# ---------------------------------------------------------------------------------------- all four


@pytest.mark.parametrize("algo", ["cfl", "pacfl", "fedclust", "gpfl"])
def test_learns_and_reports_its_metrics(tmp_path, algo):
    result = run_experiment(tiny_config(tmp_path, algo=algo, rounds=3, participation=0.75))
    assert result.final["gm_gtest"] is None and result.final["lm_ptest"] > 0.3
    assert result.rows[-1]["train_loss"] > 0


@pytest.mark.ray
@pytest.mark.parametrize("algo", ["cfl", "pacfl", "fedclust", "gpfl"])
def test_serial_equals_ray(tmp_path, ray_local, algo):
    setup = {"algo": algo, "rounds": 2, "participation": 0.75, "eval.every": 1}
    if algo == "cfl":
        setup.update({"algo.start_round": 1, "algo.eps1": 100.0, "algo.eps2": 0.0})
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)
