"""pFedHN: each client trains the weights the server's hypernetwork generates for it and uploads the
change; the server pulls the changes back through the hypernetwork (the chain rule, by hand on a
small case) and steps as the authors' optimiser; the embeddings are per client, the rest shared;
the state resumes to the bit; serial against Ray; the refusals."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import algorithms.pfedhn  # noqa: F401  (registers "pfedhn" until algorithms/__init__.py imports it)
from algorithms.pfedhn import (
    HNState,
    HyperNet,
    PFedHNConfig,
    Target,
    client_gradient,
    generated_weights,
    hypernet_gradient,
    hypernet_step,
)
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import GLOBAL_PARTS, ModelWeights
from tests.conftest import assert_serial_equals_ray, run_round, tiny_config

PLUGIN = ("algorithms.pfedhn",)


def _config(tmp_path, **changes):
    return tiny_config(tmp_path, algo="pfedhn", plugins=PLUGIN, **changes)


def _executor(tmp_path, **changes):
    cfg = _config(tmp_path, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _context(ex, client, rnd, **kw):
    from raysim.toolkit.context import ClientContext

    return ClientContext(ex.runtime, client, rnd, **kw)


def _generated(ex, state, client):
    algo = ex.server.algo
    return generated_weights(state.hnet, client, algo._targets, algo._base)


def test_each_client_trains_its_own_generated_weights_for_k_steps_and_uploads_the_change(tmp_path):
    ex = _executor(tmp_path, **{"algo.inner_steps": 3})
    state = ex.server.state
    theta = {c: _generated(ex, state, c) for c in (3, 1)}
    assert not theta[3].equals(theta[1])  # each client's own model, from its own embedding
    got = run_round(ex, 1, [3, 1])
    assert [r.client for r in got] == [3, 1]
    for r in got:
        assert r.samples_trained == 3 * 20  # K = 3 steps of B = 20
        # by hand: the client's K steps from theta_i in a fresh context (the same shuffles; the
        # gradient clip at norm 50 does not bind on this data)
        ctx = _context(ex, r.client, 1)
        ctx.load(theta[r.client])
        ctx.train(GLOBAL_PARTS, 0.05, steps=3)
        trained = ctx.weights(GLOBAL_PARTS)
        for part in GLOBAL_PARTS:
            np.testing.assert_array_equal(
                r.weights.part(part), theta[r.client].part(part) - trained.part(part)
            )
        assert np.abs(r.weights.part("head")).max() > 1e-4  # it moved


# a hypernetwork small enough to differentiate by hand: N = 3 clients, d = 2, width 4, one hidden
# layer, two generated tensors of the part "head" (3 and 2 entries)
_TARGETS = (Target("head", 0, (3,), "head.weight"), Target("head", 3, (2,), "head.bias"))


def _tiny_hypernet(seed=2, n=3, d=2, h=4):
    g = np.random.default_rng(seed)

    def a(*shape):
        return g.standard_normal(shape).astype(np.float32)

    return HyperNet((a(n, d), a(h, d), a(h), a(h, h), a(h), a(3, h), a(3), a(2, h), a(2)), n_hidden=1)


def _delta(seed):
    head = np.random.default_rng(seed).standard_normal(5).astype(np.float32)
    return ModelWeights(extractor=np.zeros(0, np.float32), filter=np.zeros(0, np.float32), head=head)


def _chain_rule_by_hand(hnet, client, delta):
    """(d theta_i / d(phi, v))^T Delta theta_i through f = W1 relu(W0 v_i + b0) + b1, theta = H f + c."""
    e_tab, w0, b0, w1, b1, h1, c1, h2, c2 = (t.astype(np.float64) for t in hnet.tensors)
    e = e_tab[client]
    a1 = w0 @ e + b0
    r = np.maximum(a1, 0)
    f = w1 @ r + b1
    d1, d2 = delta.part("head")[:3].astype(np.float64), delta.part("head")[3:].astype(np.float64)
    gf = h1.T @ d1 + h2.T @ d2
    ga1 = (w1.T @ gf) * (a1 > 0)
    ge = np.zeros_like(e_tab)
    ge[client] = w0.T @ ga1
    return [ge, np.outer(ga1, e), ga1, np.outer(gf, r), gf, np.outer(d1, f), d1, np.outer(d2, f), d2]


def test_the_server_gradient_is_the_chain_rule_by_hand_averaged_over_the_round():
    hnet = _tiny_hypernet()
    uploads = [(0, _delta(1)), (2, _delta(2))]
    got = hypernet_gradient(hnet, uploads, _TARGETS)
    by_client = [_chain_rule_by_hand(hnet, c, d) for c, d in uploads]
    want = [(a + b) / 2 for a, b in zip(*by_client, strict=True)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not got[0][1].any()  # client 1 sent nothing: its embedding has no gradient
    assert got[0][0].all() and got[0][2].all()
    assert (got[2] == 0).sum() == 1  # one hidden unit is off (ReLU) for both clients: its rows have none


@pytest.mark.parametrize("grad_clip", [50.0, 0.5])  # the clip idle, and binding
def test_the_server_step_is_the_authors_sgd_with_the_embeddings_own_rate(grad_clip):
    import torch

    params = PFedHNConfig(
        server_lr=0.1, embed_lr=0.3, server_momentum=0.9, server_weight_decay=0.01, grad_clip=grad_clip
    )
    hnet = _tiny_hypernet()
    phi = [torch.nn.Parameter(torch.from_numpy(t.copy())) for t in hnet.tensors]
    opt = torch.optim.SGD(  # as the authors' trainer builds it
        [{"params": phi[1:]}, {"params": phi[:1], "lr": 0.3}], lr=0.1, momentum=0.9, weight_decay=0.01
    )
    state = HNState(hnet)
    for seed in (1, 2):  # two steps: the second reads the momentum buffers
        grads = hypernet_gradient(state.hnet, [(seed, _delta(seed))], _TARGETS)
        state = hypernet_step(state, grads, params)
        opt.zero_grad()
        for p, g in zip(phi, grads, strict=True):
            p.grad = torch.from_numpy(g.copy())
        torch.nn.utils.clip_grad_norm_(phi, grad_clip)
        opt.step()
        for mine, theirs in zip(state.hnet.tensors, phi, strict=True):
            np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["each", "mean"])
def test_a_round_of_several_clients_is_one_hypernetwork_step_a_client_or_one_on_their_mean(tmp_path, mode):
    """Algorithm 1 takes one step a sampled client: a round of clients 3 and 1 is two steps (client
    1's, then 3's), each on its gradient at the phi that generated the round's weights; with
    ``round_steps: mean``, one step on the two gradients' mean. Whatever order the results come in."""
    changes = {"algo.inner_steps": 2, "algo.round_steps": mode}
    ex = _executor(tmp_path / "a", **changes)
    before = ex.server.state
    handed: list = []
    inner = ex.server.aggregate

    def aggregate(r, results):
        handed.extend(results)
        return inner(r, results)

    ex.server.aggregate = aggregate
    ex.train_round(1, [3, 1])
    uploads = {r.client: r.weights for jr in handed for r in jr.results}
    assert sorted(uploads) == [1, 3]
    targets = ex.server.algo._targets
    params = PFedHNConfig(inner_steps=2, round_steps=mode)
    if mode == "each":
        want = before
        for c in (1, 3):
            want = hypernet_step(want, client_gradient(before.hnet, c, uploads[c], targets), params)
    else:
        want = hypernet_step(before, hypernet_gradient(before.hnet, [(1, uploads[1]), (3, uploads[3])], targets), params)
    after = ex.server.state
    assert all(np.array_equal(a, b) for a, b in zip(after.hnet.tensors, want.hnet.tensors, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(after.momentum, want.momentum, strict=True))
    # the results handed over in the other order: the same state to the bit
    flipped = ex.server.algo.aggregate(before, 1, list(reversed(handed)))
    assert len(handed) == 2  # one job a client here, so reversing them reverses the uploads
    assert all(np.array_equal(a, b) for a, b in zip(flipped.hnet.tensors, after.hnet.tensors, strict=True))


def test_one_step_a_client_moves_each_embedding_by_its_whole_gradient(tmp_path):
    """Against the mean's one step, one step a client moves a sampled client's embedding by its own
    gradient at the full rate (without momentum and weight decay, exactly; n = 2 here: twice as far)."""
    changes = {
        "algo.inner_steps": 2, "algo.server_momentum": 0.0, "algo.server_weight_decay": 0.0, "algo.server_lr": 1.0,
    }  # fmt: skip
    moves = {}
    for mode in ("each", "mean"):
        ex = _executor(tmp_path / mode, **changes, **{"algo.round_steps": mode})
        before = ex.server.state.hnet.embeddings.copy()
        run_round(ex, 1, [3, 1])
        moves[mode] = ex.server.state.hnet.embeddings - before
    assert np.abs(moves["mean"][[1, 3]]).max() > 1e-4  # well above float32's spacing near 1
    np.testing.assert_allclose(moves["each"][[1, 3]], 2 * moves["mean"][[1, 3]], rtol=1e-3, atol=1e-6)
    assert not moves["each"][[0, 2, 4, 5, 6, 7]].any()


def test_a_round_moves_the_shared_hypernetwork_and_only_its_clients_embeddings(tmp_path):
    ex = _executor(
        tmp_path, **{"algo.inner_steps": 2, "algo.server_momentum": 0.0, "algo.server_weight_decay": 0.0}
    )
    before = ex.server.state.hnet
    run_round(ex, 1, [3, 1])
    after = ex.server.state.hnet
    moved = np.abs(after.embeddings - before.embeddings).max(axis=1) > 0
    assert moved.tolist() == [c in (1, 3) for c in range(8)]  # v_i: personal
    for old, new in zip(before.tensors[1:], after.tensors[1:], strict=True):
        assert not np.array_equal(old, new)  # phi: shared by every client
    # so every client's generated model moved, the sampled ones' and the others'
    assert not _generated(ex, ex.server.state, 6).equals(
        generated_weights(before, 6, ex.server.algo._targets, ex.server.algo._base)
    )


def test_a_clients_personal_model_is_what_the_hypernetwork_generates_for_it(tmp_path):
    from raysim.models import get_weights

    ex = _executor(tmp_path, **{"algo.inner_steps": 2})
    run_round(ex, 1, [3, 1])
    state = ex.server.state
    evaluation = ex.server.algo.evaluation(state)
    models = {}
    for c in (3, 5):
        model = evaluation.personal_model(ex.server.algo, _context(ex, c, 1, evaluating=True))
        models[c] = get_weights(model, GLOBAL_PARTS)
        assert models[c].equals(_generated(ex, state, c))
        assert models[c].equals(ex.server.algo.plan(state, 2, [c])[0].payload.weights)  # what it is sent next
    assert not models[3].equals(models[5])


def test_a_newcomer_learns_its_embedding_with_the_hypernetwork_frozen(tmp_path):
    """A client held out of training (eval.new_clients) starts from its row of the table and takes
    SGD steps on its embedding alone, at the embeddings' rate, on the cross-entropy of what the
    frozen hypernetwork generates: one step on one batch of all its samples, checked against the
    gradient by central differences; its model is h(v'; phi); the server's state is untouched."""
    import torch

    from raysim.models import get_weights, set_weights

    ex = _executor(
        tmp_path,
        **{"algo.inner_steps": 2, "algo.embed_lr": 0.5, "eval.new_clients": 0.25, "eval.new_client_epochs": 1,
           "train.batch_size": 400},
    )  # fmt: skip
    cfg = ex.cfg
    run_round(ex, 1, list(cfg.training_clients))
    state = ex.server.state
    before = [t.copy() for t in state.hnet.tensors]
    algo = ex.runtime.algo
    evaluation = ex.server.algo.evaluation(state)
    c = cfg.new_clients[0]
    model = evaluation.newcomer_model(algo, _context(ex, c, 1, evaluating=True))
    got = get_weights(model, GLOBAL_PARTS)

    ctx = _context(ex, c, 1, evaluating=True)
    x, y = ctx.train_tensors()
    assert x.shape[0] <= 400  # one batch: every sample, in any order
    targets, base = ex.server.algo._targets, ex.server.algo._base

    def loss(v):
        set_weights(ctx.model, generated_weights(state.hnet, c, targets, base, v))
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(ctx.model(x), y))

    v0 = state.hnet.embeddings[c].astype(np.float64)
    eps = 1e-3
    grad = np.array([(loss(v0 + eps * e) - loss(v0 - eps * e)) / (2 * eps) for e in np.eye(v0.size)])
    assert np.abs(grad).max() > 1e-3  # a step that moves it
    want = generated_weights(state.hnet, c, targets, base, v0 - 0.5 * grad)
    for part in GLOBAL_PARTS:
        np.testing.assert_allclose(got.part(part), want.part(part), rtol=1e-3, atol=2e-5)
    assert not got.equals(_generated(ex, state, c))  # it moved from its row's model
    assert all(np.array_equal(a, b) for a, b in zip(before, state.hnet.tensors, strict=True))
    result = run_experiment(_config(tmp_path / "run", rounds=2, **{"eval.new_clients": 0.25, "algo.inner_steps": 2}))
    assert result.final["new_lm_ptest"] is not None and result.final["new_gm_ptest"] is None


def test_the_hypernetwork_is_server_state_and_resumes_to_the_bit(tmp_path):
    whole = _executor(tmp_path / "a", **{"algo.inner_steps": 2})
    stopped = _executor(tmp_path / "b", **{"algo.inner_steps": 2})
    rounds = {1: [3, 1], 2: [3, 6], 3: [0, 1]}
    for rnd in (1, 2):
        run_round(whole, rnd, rounds[rnd])
        run_round(stopped, rnd, rounds[rnd])
    saved = pickle.loads(pickle.dumps(stopped.server.saved))
    assert isinstance(saved, HNState) and saved.momentum is not None
    resumed = _executor(tmp_path / "c", **{"algo.inner_steps": 2})
    resumed.server.restore(saved)
    run_round(whole, 3, rounds[3])
    run_round(resumed, 3, rounds[3])
    a, b = whole.server.state, resumed.server.state
    assert all(np.array_equal(x, y) for x, y in zip(a.hnet.tensors, b.hnet.tensors, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(a.momentum, b.momentum, strict=True))


def test_learns_and_reports_personal_metrics_only(tmp_path):
    result = run_experiment(_config(tmp_path, rounds=4, participation=0.5))  # K = 50, the authors'
    assert result.final["gm_gtest"] is None
    assert result.final["lm_ptest"] > 0.35  # 10 classes: well above chance, from generated weights only
    losses = [row["train_loss"] for row in result.rows]
    assert 0 < losses[-1] < losses[0]


@pytest.mark.ray
def test_serial_equals_ray(tmp_path, ray_local):
    assert_serial_equals_ray(
        tmp_path,
        algo="pfedhn",
        plugins=PLUGIN,
        rounds=2,
        participation=0.75,
        **{"algo.inner_steps": 5, "eval.every": 1},
    )


def test_a_model_with_batch_norm_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(ConfigError, match="has BatchNorm layers") as refused:
        validate(_config(tmp_path, model="cnn_pac_bn", **{"data.synthetic.shape": (1, 16, 16)}))
    assert "\n" not in str(refused.value)


def test_a_model_too_large_to_generate_is_refused_in_one_sentence(tmp_path):
    cfg = _config(tmp_path, model="cnn_fcd", **{"data.synthetic.shape": (3, 32, 32)})
    with pytest.raises(ConfigError, match="choose a smaller model") as refused:
        SerialExecutor(cfg, prepare(cfg))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("inner_steps", 0),
        ("hidden_dim", 0),
        ("n_hidden", -1),
        ("embed_dim", -1),
        ("server_lr", 0),
        ("embed_lr", -0.1),
        ("server_momentum", 1.0),
        ("server_weight_decay", -1e-3),
        ("grad_clip", 0),
        ("inner_grad_clip", "high"),
        ("round_steps", "Each"),
        ("round_steps", "sum"),
        ("round_steps", 1),
    ],
)
def test_a_mistyped_setting_is_refused_in_one_sentence(tmp_path, name, value):
    with pytest.raises(ConfigError) as refused:
        validate(_config(tmp_path, **{f"algo.{name}": value}))
    sentence = str(refused.value)
    assert f"algo.{name}" in sentence and sentence.endswith(".") and "\n" not in sentence
