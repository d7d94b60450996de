"""The personalisation baselines' defining properties: which parts are averaged, which stay
personal, what trains when (FedBABU, FedPer, FedRep, FedRoD, Ditto, SCAFFOLD)."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.toolkit.aggregate import weighted_mean
from raysim.toolkit.context import ClientContext
from raysim.weights import BODY, GLOBAL_PARTS, PARTS
from tests.conftest import run_round, tiny_config


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, **{"participation": 0.5, **changes})
    return SerialExecutor(cfg, prepare(cfg))


def test_fedbabu_freezes_the_random_head_and_fine_tunes_everything_at_the_end(tmp_path):
    ex = _executor(tmp_path, "fedbabu", rounds=2)
    head0 = ex.server.state.weights.select(("head",))
    assert head0.equals(ex.runtime.initial_weights.select(("head",)))  # random (seeded) init
    got = run_round(ex, 1, [0, 1, 2, 3])
    assert all(set(r.weights.part_names) == set(BODY) for r in got)
    np.testing.assert_allclose(
        ex.server.state.weights.part("extractor"),
        weighted_mean([r.weights for r in got], [r.num_samples for r in got]).part("extractor"),
    )
    run_round(ex, 2, [4, 5, 6, 7])
    assert ex.server.state.weights.select(("head",)).equals(head0)  # never trained in the rounds
    ft = ex.server.evaluation().personal_model(ex.runtime.algo, ClientContext(ex.runtime, 0, 2))
    assert not np.array_equal(
        ft.head.weight.detach().numpy().ravel(), head0.part("head")[: ft.head.weight.numel()]
    )


def test_fedper_averages_the_body_and_keeps_heads_on_their_clients(tmp_path):
    ex = _executor(tmp_path, "fedper")
    got = run_round(ex, 1, [0, 1, 2, 3])
    assert all(set(r.weights.part_names) == set(BODY) for r in got)  # no head is sent
    body = weighted_mean([r.weights for r in got], [r.num_samples for r in got])
    assert ex.server.state.weights.equals(body)
    heads = {c: ex.runtime.kept(c).select(("head",)) for c in (0, 1, 2, 3)}
    assert not heads[0].equals(heads[1])
    run_round(ex, 2, [1, 2])
    assert ex.runtime.kept(0).select(("head",)).equals(heads[0])  # not sampled: its head did not move
    assert not ex.runtime.kept(1).select(("head",)).equals(heads[1])  # sampled: it trained its own head again


@pytest.mark.parametrize("algo", ["fedper", "fedrep"])
def test_a_global_head_averages_the_trained_heads_for_evaluation_only(tmp_path, algo):
    """algo.global_head: the trained clients' heads come up with the body and are averaged by
    training-set size into the evaluated global model; the body still goes down alone, each client
    trains with its own head, and the local models are those of a run without it."""
    ex = _executor(tmp_path / "gm", algo, **{"algo.global_head": True})
    plain = _executor(tmp_path / "plain", algo)
    got = run_round(ex, 1, [0, 1, 2, 3])
    assert all(set(r.weights.part_names) == {*BODY, "head"} for r in got)
    heads = [ex.runtime.kept(c).select(("head",)) for c in (0, 1, 2, 3)]
    np.testing.assert_allclose(
        ex.server.state.weights.part("head"),
        weighted_mean(heads, [r.num_samples for r in got]).part("head"),
        rtol=1e-6,
    )
    jobs = ex.runtime.algo.plan(ex.server.state, 2, [0])
    assert set(jobs[0].payload.weights.part_names) == set(BODY)  # the averaged head stays on the server
    run_round(plain, 1, [0, 1, 2, 3])
    for c in (0, 1, 2, 3):  # the same local training
        assert ex.runtime.kept(c).equals(plain.runtime.kept(c))
    assert ex.server.state.weights.select(BODY).equals(plain.server.state.weights)
    with_gm = run_experiment(tiny_config(tmp_path / "run_gm", algo=algo, **{"algo.global_head": True}))
    without = run_experiment(tiny_config(tmp_path / "run", algo=algo))
    assert all(r["gm_gtest"] is not None for r in with_gm.rows)
    assert all(r["gm_gtest"] is None for r in without.rows)
    assert [r["lm_ptest"] for r in with_gm.rows] == [r["lm_ptest"] for r in without.rows]


def test_fedrep_trains_the_head_then_the_body(tmp_path, monkeypatch):
    ex = _executor(tmp_path, "fedrep", **{"algo.head_epochs": 3, "algo.body_epochs": 2})
    calls = []
    inner = ClientContext.train

    def spy(self, parts, lr, **kw):
        before = self.weights(PARTS)
        out = inner(self, parts, lr, **kw)
        after = self.weights(PARTS)
        changed = {p for p in PARTS if not np.array_equal(before.part(p), after.part(p))}
        calls.append((tuple(parts), kw.get("epochs"), changed))
        return out

    monkeypatch.setattr(ClientContext, "train", spy)
    got = run_round(ex, 1, [0])
    assert calls == [(("head",), 3, {"head"}), (BODY, 2, {"extractor"})]  # mlp_fcd has no filter
    assert set(got[0].weights.part_names) == set(BODY)


def test_fedrod_personal_head_learns_from_detached_features_and_is_never_sent(tmp_path):
    import torch

    from algorithms.fedrod import rod_losses

    ex = _executor(tmp_path, "fedrod")
    got = run_round(ex, 1, [0, 1, 2, 3])
    assert all(set(r.weights.part_names) == set(GLOBAL_PARTS) for r in got)  # body + generic head
    assert ex.runtime.kept(0).phead is not None
    model = ex.runtime.model
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 4, (8,))
    prior = torch.log(torch.tensor([0.5, 0.3, 0.2] + [1e-8] * 7))  # 10 classes, 7 absent
    model.zero_grad()
    balanced, personal = rod_losses(model, x, y, prior)
    personal.backward()
    assert all(
        p.grad is None or not p.grad.any() for p in [*model.extractor.parameters(), *model.head.parameters()]
    )
    assert any(p.grad is not None and p.grad.any() for p in model.phead.parameters())
    z = model.extractor(x)
    torch.testing.assert_close(balanced, torch.nn.functional.cross_entropy(model.head(z) + prior, y))
    lm = ex.server.evaluation().forward(ex.runtime.algo, model)(x)  # LM: generic plus personal logits
    torch.testing.assert_close(lm, model.head(z) + model.phead(z))


def test_ditto_keeps_a_personal_model_pulled_to_the_global_one(tmp_path):
    ex = _executor(tmp_path, "ditto", **{"algo.lambda": 0.5})
    w0 = ex.server.state.weights
    got = run_round(ex, 1, [0, 1, 2, 3])
    assert ex.server.state.weights.equals(
        weighted_mean([r.weights for r in got], [r.num_samples for r in got])
    )
    v = ex.runtime.kept(0)
    assert not v.equals(ex.server.state.weights)  # the personal model is its own
    # a huge lambda pins v_k to the received w
    pinned = _executor(tmp_path / "pin", "ditto", **{"algo.lambda": 1e4, "train.lr": 1e-4})
    run_round(pinned, 1, [0])
    np.testing.assert_allclose(
        pinned.runtime.kept(0).part("extractor"), w0.part("extractor"), atol=1e-3
    )


def test_scaffold_control_variates_persist_on_the_worker_and_correct_the_steps(tmp_path):
    ex = _executor(tmp_path, "scaffold", participation=1.0)
    x0 = ex.server.state.weights
    got = run_round(ex, 1, list(range(8)))
    c1 = {c: ex.runtime.stored(c, "control") for c in range(8)}
    assert all(np.abs(c1[c].part("extractor")).sum() > 0 for c in range(8))
    # round 1 starts with c = c_i = 0: plain SGD, so x1 - x0 is the mean of the clients' steps
    mean_dy = np.mean([r.weights.part("extractor").astype(np.float64) for r in got], axis=0)
    np.testing.assert_allclose(
        ex.server.state.weights.part("extractor") - x0.part("extractor"), mean_dy, atol=1e-5
    )
    # the server's c is (1/N) sum of the clients' Delta c = the mean of the c_i (all started at 0)
    np.testing.assert_allclose(
        ex.server.state.control.part("extractor"),
        np.mean([c1[c].part("extractor") for c in range(8)], axis=0),
        atol=1e-6,
    )
    # round 2: client 0 starts from its stored c_i (its own upload Delta c = c_i+ - c_i shows it)
    got2 = run_round(ex, 2, [0])
    np.testing.assert_allclose(
        got2[0].extra.part("extractor"),
        ex.runtime.stored(0, "control").part("extractor").astype(np.float64) - c1[0].part("extractor"),
        atol=1e-6,
    )
    assert all(ex.runtime.stored(c, "control").equals(c1[c]) for c in range(1, 8))  # untouched


def test_scaffold_control_is_the_mean_over_the_clients_that_train(tmp_path):
    """With newcomers held out (eval.new_clients), N is the clients that train: after a round of
    all of them from zero, c is still the mean of their c_i."""
    ex = _executor(tmp_path, "scaffold", participation=1.0, **{"eval.new_clients": 0.25})
    training = list(ex.cfg.training_clients)
    assert len(training) == 6
    run_round(ex, 1, training)
    np.testing.assert_allclose(
        ex.server.state.control.part("extractor"),
        np.mean([ex.runtime.stored(c, "control").part("extractor") for c in training], axis=0),
        atol=1e-6,
    )


def test_baselines_learn(tmp_path):
    for algo in ("fedbabu", "fedper", "fedrep", "fedrod", "ditto", "scaffold"):
        r = run_experiment(tiny_config(tmp_path / algo, algo=algo, rounds=4))
        best = r.best["lm_ptest"] if r.best["lm_ptest"] is not None else r.best["gm_gtest"]
        assert best > 0.5, (algo, r.best)


def test_scaffold_control_is_option_ii_under_plain_sgd(tmp_path):
    """With plain SGD the mean of the raw gradients equals c_i - c + (x - y) / (K eta)."""
    ex = _executor(
        tmp_path, "scaffold", participation=1.0, **{"train.momentum": 0.0, "train.weight_decay": 0.0}
    )
    run_round(ex, 1, list(range(8)))
    c_i = ex.runtime.stored(0, "control")
    job = ex.server.plan(2, [0])[0]
    payload = job.payload
    res = ex.runtime.run_chain(2, job.clients, payload, None)[0]
    n = ex.data.client_train[0].size
    k = ex.cfg.train.local_epochs * -(-n // ex.cfg.train.batch_size)
    for part in GLOBAL_PARTS:
        if c_i.part(part).size == 0:
            continue
        option_ii = (
            c_i.part(part).astype(np.float64)
            - payload.control.part(part)
            - res.weights.part(part) / (k * payload.lr)  # res.weights is y - x
        )
        new = ex.runtime.stored(0, "control").part(part)
        np.testing.assert_allclose(new, option_ii, rtol=1e-3, atol=1e-4)


@pytest.mark.ray
def test_a_global_head_gives_the_same_numbers_on_serial_and_ray(tmp_path, ray_local):
    from tests.conftest import without_times

    changes = {"algo.global_head": True}
    serial = run_experiment(tiny_config(tmp_path / "s", algo="fedper", **changes))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", algo="fedper", **changes, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)
    assert serial.rows[-1]["gm_gtest"] is not None
