"""Clients that never trained (``eval.new_clients``): who is held out, that they never train, what
their models are (the algorithm's newcomer adaptation), how they are reported, and the refusals."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from raysim.config import ExperimentConfig, from_dict
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.rng import held_out_clients
from raysim.toolkit.context import ClientContext
from raysim.weights import BODY, GLOBAL_PARTS
from tests.conftest import run_round, tiny_config, without_times
from tests.golden import one_case_per_algorithm

NEW = {"eval.new_clients": 0.25, "eval.new_client_epochs": 1}


def test_held_out_clients_are_a_seeded_draw_and_the_cohort_counts_only_the_others():
    cfg = tiny_config(clients=8, participation=0.5, **NEW)
    assert len(cfg.new_clients) == 2 and cfg.new_clients == held_out_clients(3, 8, 0.25)
    assert tiny_config(clients=8, **NEW).new_clients == cfg.new_clients  # the same seed, the same clients
    others = {tiny_config(clients=8, seed=s, **NEW).new_clients for s in range(6)}
    assert len(others) > 1  # another seed, other clients
    assert set(cfg.training_clients) == set(range(8)) - set(cfg.new_clients)
    assert cfg.clients_per_round == 3  # half of the 6 that train, not of the 8
    assert tiny_config(clients=8, **{"eval.new_clients": 0.01}).new_clients.__len__() == 1  # at least one
    assert tiny_config(clients=8).new_clients == () and tiny_config(clients=8).clients_per_round == 4


def test_held_out_clients_never_train(tmp_path):
    """Every round samples from the training clients only; a held-out client's memory stays empty
    (Ditto keeps a personal model on every client it trains) even with everyone participating."""
    cfg = tiny_config(tmp_path, algo="ditto", participation=1.0, rounds=3, **NEW)
    ex = SerialExecutor(cfg, prepare(cfg))
    for rnd in (1, 2, 3):
        trained = sorted(r.client for r in run_round(ex, rnd, ex.server.deployment.sample(rnd, 0.0)))
        assert trained == list(cfg.training_clients)
    for c in cfg.new_clients:
        assert ex.runtime.kept(c).part_names == ()
    assert all(ex.runtime.kept(c).part_names for c in cfg.training_clients)


def _correct(ex, cid, model, forward=None):
    """How many of client ``cid``'s P-Test samples ``model`` (in eval mode) classifies right,
    predicting with ``forward`` (default the model itself)."""
    x, y = ex.runtime.gather(ex.data.ptest, ex.data.client_test[cid])
    model.eval()
    import torch

    with torch.no_grad():
        return int(((forward or model)(x).argmax(1) == y).sum())


def _eval_accuracy(ex, cid, model):
    return _correct(ex, cid, model) / len(ex.data.client_test[cid])


def _trained(cfg, prologue=False):
    """A serial executor of ``cfg`` after rounds 1 and 2, and before them the round 0 over the
    training clients where the algorithm has one (its prologue)."""
    ex = SerialExecutor(cfg, prepare(cfg))
    if prologue:
        ex.train_round(0, list(cfg.training_clients))
    for rnd in (1, 2):
        ex.train_round(rnd)
    return ex


def test_a_newcomer_is_the_global_model_fine_tuned_and_reported_apart(tmp_path):
    """FedAvg: new_gm_ptest is the global model on the held-out clients' P-Tests; new_lm_ptest is
    the global model fine-tuned for eval.new_client_epochs on the newcomer's data (0 epochs: the
    global model itself); gm_ptest averages the training clients only."""
    base = {"algo": "fedavg", "rounds": 2, "eval.every": 1, **NEW}
    run = run_experiment(tiny_config(tmp_path / "one", **base))
    clients = [r for r in pq.read_table(tmp_path / "one" / "clients.parquet").to_pylist() if r["round"] == 2]
    new = [r for r in clients if r["new"]]
    old = [r for r in clients if not r["new"]]
    row = run.rows[-1]
    assert [r["client"] for r in new] == list(tiny_config(**base).new_clients)
    assert row["new_gm_ptest"] == pytest.approx(np.mean([r["gm_ptest"] for r in new]))
    assert row["gm_ptest"] == pytest.approx(np.mean([r["gm_ptest"] for r in old]))
    assert row["new_lm_ptest"] == pytest.approx(np.mean([r["lm_ptest"] for r in new]))
    assert row["lm_ptest"] is None  # FedAvg has no personal models: only the newcomers adapt
    assert run.final["new_lm_ptest"] == row["new_lm_ptest"] and run.best["new_gm_ptest"] is not None

    # the adaptation by hand: the final global model, trained E_new epochs on the newcomer's stream
    cfg = tiny_config(tmp_path / "hand", **base)
    ex = SerialExecutor(cfg, prepare(cfg))
    for rnd in (1, 2):
        ex.train_round(rnd)
    weights = ex.server.state.weights
    for r in new:
        ctx = ClientContext(ex.runtime, r["client"], 2, evaluating=True)
        ctx.load(weights)
        assert _eval_accuracy(ex, r["client"], ctx.model) == pytest.approx(r["gm_ptest"])
        ctx.train(GLOBAL_PARTS, ex.runtime.algo.lr(2), epochs=1, stream="newcomer")
        assert _eval_accuracy(ex, r["client"], ctx.model) == pytest.approx(r["lm_ptest"])
        assert r["lm_ptest"] != r["gm_ptest"]

    still = run_experiment(tiny_config(tmp_path / "zero", **{**base, "eval.new_client_epochs": 0}))
    assert still.rows[-1]["new_lm_ptest"] == still.rows[-1]["new_gm_ptest"]  # no epochs: the global model


def test_a_shared_body_newcomer_trains_a_fresh_head_on_the_received_body(tmp_path):
    """FedPer (body shared, head personal): a newcomer takes the shared body with the initial
    model's head and trains the head only; with 0 epochs it is that model untouched."""
    base = {"algo": "fedper", "rounds": 2, **NEW}
    cfg = tiny_config(tmp_path / "hand", **{**base, "eval.new_client_epochs": 0})
    ex = _trained(cfg)
    report = ex.evaluate(2)
    body = ex.server.state.weights
    for c in cfg.new_clients:
        ctx = ClientContext(ex.runtime, c, 2, evaluating=True)
        ctx.load(body.merged(ctx.initial_weights.select(("head",))))
        got = next(e for e in report.clients if e.client == c)
        assert got.new and got.gm_correct is None
        assert got.lm_correct / got.n_test == pytest.approx(_eval_accuracy(ex, c, ctx.model))

    cfg1 = tiny_config(tmp_path / "one", **base)
    ex1 = SerialExecutor(cfg1, prepare(cfg1))
    for rnd in (1, 2):
        ex1.train_round(rnd)
    c = cfg1.new_clients[0]
    ctx = ClientContext(ex1.runtime, c, 2, evaluating=True)
    start = ex1.server.state.weights.merged(ctx.initial_weights.select(("head",)))
    model = ex1.server.evaluation().newcomer_model(ex1.runtime.algo, ctx)
    from raysim.models import get_weights

    after = get_weights(model, GLOBAL_PARTS)
    for p in BODY:  # the body is the shared one, untouched
        np.testing.assert_array_equal(after.part(p), start.part(p))
    assert not np.array_equal(after.part("head"), start.part("head"))  # the head trained


def _by_hand(algo, ex, ctx, rnd):
    """A newcomer's model and forward as its algorithm's paper trains a client that joins now,
    written here from the algorithm's own parts: Local, its initial model trained alone;
    FedProto, its initial model on cross-entropy plus lambda times the distance to the current
    global prototypes, predicting by the nearest one; FedGH, its initial body under the global
    head trained with cross-entropy, then that body with the global head; FedAMP, its initial
    model on Eq. 8 with the initial model as u_i (a client without a model gets no attention)."""
    import torch

    from raysim.toolkit.features import aligned_cross_entropy, representation

    state, lr = ex.server.state, ex.runtime.algo.lr(rnd)
    init = ctx.initial_weights
    if algo == "local":
        ctx.load(init)
        ctx.train(GLOBAL_PARTS, lr, epochs=1, stream="newcomer")
        return ctx.model, ctx.model
    if algo == "fedamp":  # no model uploaded, no attention: u_i = w_i = the initial model
        from raysim.toolkit.train import cross_entropy, proximal_term

        ctx.load(init)
        from raysim.models import parameters_of

        anchor = [w.detach().clone() for w in parameters_of(ctx.model, GLOBAL_PARTS)]
        p = ex.runtime.algo.params
        coef = p.lam / (2 * p.alpha_k)

        def eq8(model, x, y):
            return cross_entropy(model, x, y) + coef * proximal_term(model, anchor, GLOBAL_PARTS)

        ctx.train(GLOBAL_PARTS, lr, epochs=1, stream="newcomer", loss_fn=eq8)
        return ctx.model, ctx.model
    if algo == "fedgh":
        ctx.load(init.select(BODY).merged(state.head))
        ctx.train((*BODY, "head"), lr, epochs=1, stream="newcomer")
        ctx.load(ctx.weights(BODY).merged(state.head))
        return ctx.model, ctx.model
    ctx.load(init.select((*BODY, "head")))
    lam = ex.runtime.algo.params.lam
    ctx.train((*BODY, "head"), lr, epochs=1, stream="newcomer", loss_fn=aligned_cross_entropy(lam, state.protos, state.mask, ctx.device))
    protos, mask = torch.tensor(state.protos), torch.tensor(state.mask)
    model = ctx.model
    return model, lambda x: (-torch.cdist(representation(model, x), protos) ** 2).masked_fill(~mask, float("-inf"))


@pytest.mark.parametrize("algo", ["local", "fedproto", "fedgh", "fedamp"])
def test_a_newcomer_without_a_global_model_trains_its_own_as_a_joining_client(tmp_path, algo):
    """Local (nothing shared), FedProto (the global prototypes), FedGH (the global head) and FedAMP
    (no model uploaded, so no attention): a newcomer's model is its initial model trained for eval.new_client_epochs as the algorithm's
    client trains when it joins, checked against that training written by hand; the clients'
    models are untouched (the OWN_WAY test below)."""
    cfg = tiny_config(tmp_path, algo=algo, rounds=2, **NEW)
    ex = _trained(cfg)
    report = ex.evaluate(2)
    for c in cfg.new_clients:
        got = next(e for e in report.clients if e.client == c)
        assert got.new and got.gm_correct is None and got.lm_correct is not None
        model, forward = _by_hand(algo, ex, ClientContext(ex.runtime, c, 2, evaluating=True), 2)
        assert got.lm_correct == _correct(ex, c, model, forward)
        if algo == "local":  # nothing shared: not the initial model, and not any client's
            untrained = ClientContext(ex.runtime, c, 2, evaluating=True)
            untrained.load(untrained.initial_weights)
            assert _eval_accuracy(ex, c, untrained.model) != got.lm_correct / got.n_test


@pytest.mark.ray
def test_serial_equals_ray_with_new_clients(tmp_path, ray_local):
    for algo in ("fedavg", "fedper"):
        setup = {"algo": algo, "rounds": 2, "eval.every": 1, **NEW}
        serial = run_experiment(tiny_config(tmp_path / f"s{algo}", **setup))
        ray_run = run_experiment(
            tiny_config(tmp_path / f"r{algo}", **setup, **{"ray.executor": "ray", "ray.workers": 2})
        )
        assert without_times(ray_run.rows) == without_times(serial.rows)
        assert serial.rows[-1]["new_lm_ptest"] is not None


@pytest.mark.parametrize(
    ("value", "words"),
    [(1.0, "below 1"), (-0.2, "at least 0"), ("a quarter", "number"), (0.95, "leaving none to train")],
)
def test_new_clients_refused_in_one_sentence(value, words):
    with pytest.raises(ConfigError, match=words) as err:
        validate(from_dict(ExperimentConfig, {"clients": 4, "eval": {"new_clients": value}}))
    assert str(err.value).count(". ") == 0


@pytest.mark.parametrize("value", [-1, 1.5, "two"])
def test_new_client_epochs_refused(value):
    with pytest.raises(ConfigError, match="new_client_epochs"):
        validate(from_dict(ExperimentConfig, {"eval": {"new_clients": 0.2, "new_client_epochs": value}}))


def test_an_async_deployment_never_starts_a_held_out_client(tmp_path):
    """FedBuff in async mode (the clients start as others finish, over the training clients only):
    with eval.updated_lm every client trained in an evaluated round has its reading, and no
    held-out client ever has one."""
    cfg = tiny_config(
        tmp_path,
        algo="fedbuff",
        rounds=4,
        participation=1.0,
        **NEW,
        **{"deployment.mode": "async", "deployment.devices": "lognormal:1", "eval.updated_lm": True},
    )
    run_experiment(cfg)
    rows = pq.read_table(tmp_path / "clients.parquet").to_pylist()
    trained = {r["client"] for r in rows if r.get("updated_lm_ptest") is not None}
    assert trained and trained <= set(cfg.training_clients)
    assert all(r["new"] == (r["client"] in cfg.new_clients) for r in rows)


OWN_WAY = {
    "fedbn": {"model": "cnn_pac_bn", "data.synthetic.shape": (1, 16, 16), "train.drop_last": True},
    "fedala": {},
    "fedfomo": {"data.val_fraction": 0.2},
    "apfl": {},
    "lgfedavg": {},
    "pacfl": {},
    "fedclust": {},
    "pfedhn": {"algo.inner_steps": 2},
    "fedpac": {},
    "local": {},
    "fedproto": {},
    "fedgh": {},
    "fedfcd": {},
    "gpfl": {},
    "fedcp": {},
    "fedamp": {},
}


@pytest.mark.parametrize("algo", sorted(OWN_WAY))
def test_an_algorithm_with_a_newcomer_of_its_own_reports_it_and_leaves_the_clients_alone(tmp_path, algo):
    """FedBN (the shared weights, its own BatchNorm learned), FedALA (its first ALA, not kept),
    FedFomo (the M models it would download, weighed on its validation part), APFL (v and alpha
    on the mixed loss), LG-FedAvg (a body of its own under the shared head), PACFL and FedClust
    (the nearest cluster, by its answer to the request of before round 1), pFedHN (its embedding
    learned with the hypernetwork frozen), FedPAC (a head on the shared body), Local (its own
    model alone), FedProto (on the global prototypes), FedGH (its body under the global head),
    FedFCD (Algorithm 1's client epochs on the global head and GFR), GPFL and FedCP (a personal
    head under the shared parts and modules): each newcomer gets a model, and evaluating it changes
    nothing any client keeps."""
    cfg = tiny_config(tmp_path, algo=algo, rounds=2, **NEW, **OWN_WAY[algo])
    ex = _trained(cfg, prologue=algo in ("pacfl", "fedclust", "fedfcd"))
    before = {c: dict(ex.runtime.memory.get(c).values) if c in ex.runtime.memory else None for c in range(8)}
    kept = {c: ex.runtime.kept(c) for c in range(8)}
    report = ex.evaluate(2)
    new = [c for c in report.clients if c.new]
    assert [c.client for c in new] == list(cfg.new_clients) and all(c.lm_correct is not None for c in new)
    for c in range(8):
        after = ex.runtime.memory.get(c)
        assert (after is None) == (before[c] is None)
        assert ex.runtime.kept(c).equals(kept[c])
    assert all(c not in ex.runtime.memory for c in cfg.new_clients)


@pytest.mark.ray
def test_serial_equals_ray_for_newcomers_of_their_own(tmp_path, ray_local):
    for algo in ("fedfomo", "fedala", "fedclust", "fedfcd", "fedcp"):
        setup = {"algo": algo, "rounds": 2, **NEW, **OWN_WAY[algo]}
        serial = run_experiment(tiny_config(tmp_path / f"s{algo}", **setup))
        ray_run = run_experiment(
            tiny_config(tmp_path / f"r{algo}", **setup, **{"ray.executor": "ray", "ray.workers": 2})
        )
        assert without_times(ray_run.rows) == without_times(serial.rows)
        assert serial.rows[-1]["new_lm_ptest"] is not None


@pytest.mark.parametrize("case", one_case_per_algorithm())
def test_every_algorithm_runs_with_clients_held_out(case, tmp_path):
    """Every registered algorithm of algorithms/ (its golden case's settings) runs with a fifth of
    its clients held out under four rotated domains, as the benchmark's rotate:4 regime does: the
    held-out clients are reported apart, and they have a newcomer's model exactly where the
    algorithm says it evaluates newcomers."""
    from raysim.config import replace
    from raysim.registry import ALGORITHMS
    from tests.golden import case_config

    cfg = case_config(case, tmp_path)
    cfg = replace(
        cfg, rounds=1, clients=10, participation=1.0,
        **{"eval.every": 1, "eval.new_clients": 0.2, "eval.new_client_epochs": 1, "data.feature_shift": "rotate:4"},
    )  # fmt: skip
    run = run_experiment(cfg)
    rows = pq.read_table(tmp_path / "clients.parquet").to_pylist()
    assert {r["client"] for r in rows if r["new"]} == set(cfg.new_clients)
    evaluates = ALGORITHMS.get(cfg.algo).evaluates_newcomers(cfg)
    assert (run.final["new_lm_ptest"] is not None) == evaluates


def test_a_fedfcd_newcomer_trains_its_own_parts_under_the_global_head(tmp_path):
    """FedFCD: a newcomer starts from its initial extractor and personal head under the current
    global head (0 epochs: exactly that, predicting by the fused decision), and Algorithm 1's
    client epochs train its extractor and personal head, never the global head."""
    from raysim.models import get_weights

    for epochs in (0, 1):
        cfg = tiny_config(tmp_path / str(epochs), algo="fedfcd", rounds=2, **{**NEW, "eval.new_client_epochs": epochs})
        ex = _trained(cfg, prologue=True)
        report = ex.evaluate(2)
        head = ex.server.state.head
        for c in cfg.new_clients:
            ctx = ClientContext(ex.runtime, c, 2, evaluating=True)
            start = ctx.initial_weights.select((*BODY, "phead")).merged(head)
            model = ex.server.evaluation().newcomer_model(ex.runtime.algo, ctx)
            after = get_weights(model, (*BODY, "phead", "head"))
            np.testing.assert_array_equal(after.part("head"), head.part("head"))
            moved = [not np.array_equal(after.part(p), start.part(p)) for p in ("extractor", "phead")]
            assert moved == [epochs > 0, epochs > 0]
            if epochs == 0:
                ctx.load(start)
                want = _correct(ex, c, ctx.model, ex.runtime.algo.decision(ctx.model))
                assert next(e for e in report.clients if e.client == c).lm_correct == want


@pytest.mark.parametrize(("algo", "personal", "shared"), [("gpfl", "head", BODY), ("fedcp", "phead", (*BODY, "head"))])
def test_a_newcomer_with_shared_modules_trains_only_its_personal_head(tmp_path, algo, personal, shared):
    """GPFL and FedCP: a newcomer takes the shared parts (and the modules beside them) with the
    initial personal head and trains the personal head alone; at 0 epochs its model is exactly
    that start, predicting as a client's personalised model does."""
    from raysim.models import get_weights

    for epochs in (0, 1):
        cfg = tiny_config(tmp_path / str(epochs), algo=algo, rounds=2, **{**NEW, "eval.new_client_epochs": epochs})
        ex = _trained(cfg)
        report = ex.evaluate(2)
        evaluation = ex.server.evaluation()
        algo_obj = ex.runtime.algo
        for c in cfg.new_clients:
            ctx = ClientContext(ex.runtime, c, 2, evaluating=True)
            start = ex.server.state.weights.merged(ctx.initial_weights.select((personal,)))
            model = evaluation.newcomer_model(algo_obj, ctx)
            after = get_weights(model, (*shared, personal))
            for p in shared:
                np.testing.assert_array_equal(after.part(p), start.part(p))
            assert (not np.array_equal(after.part(personal), start.part(personal))) == (epochs > 0)
            want = _correct(ex, c, model, evaluation.newcomer_forward(algo_obj, model))
            assert next(e for e in report.clients if e.client == c).lm_correct == want
