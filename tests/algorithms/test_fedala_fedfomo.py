"""FedALA and FedFomo: each one's defining property on the numbers, its refusals, a short run that
learns and reports its metrics, and serial = Ray."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import resolve_config, validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import run_round, tiny_config, without_times

FOMO = {"data.val_fraction": 0.2}


def _executor(tmp_path, algo, **changes):
    cfg = tiny_config(tmp_path, algo=algo, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _random_weights(like: ModelWeights, seed: int) -> ModelWeights:
    g = np.random.default_rng(seed)
    return ModelWeights(**{n: g.normal(size=a.shape).astype(np.float32) for n, a in like.items()})


# ---------------------------------------------------------------------------------------- FedALA


def test_fedala_higher_layers_are_the_last_parameter_tensors_across_parts():
    from algorithms.fedala import higher_slots
    from raysim.models import build_model

    model = build_model("cnn3p2_fmnist", (1, 16, 16), 10, seed=1)  # extractor: 2 convs; filter: FC; head: FC
    slots = higher_slots(model, 3)
    filt = model.filter[0]
    assert [(s[0], s[3]) for s in slots] == [
        ("filter", tuple(filt.bias.shape)),
        ("head", (10, 50)),
        ("head", (10,)),
    ]
    # the filter's bias lies after its weight in the part's flat array
    assert slots[0][1:3] == (filt.weight.numel(), filt.weight.numel() + filt.bias.numel())
    assert [s[0] for s in higher_slots(model, 100)].count("extractor") == 4  # p past the count: every layer


def test_fedala_theta_hat_is_the_global_model_at_w_ones_and_the_local_at_w_zeros():
    """(c): theta_hat = theta * W + theta_i * (1 - W) on the higher layers, exactly the global model
    at W = 1 and exactly the local one at W = 0; the lower layers are always the global model's."""
    from algorithms.fedala import higher_slots, mixed
    from raysim.models import build_model, get_weights

    model = build_model("cnn3p2_fmnist", (1, 16, 16), 10, seed=1)
    start = get_weights(model, GLOBAL_PARTS)
    glob, loc = _random_weights(start, 1), _random_weights(start, 2)
    slots = higher_slots(model, 3)
    ones = [np.ones(b - a, np.float32) for _, a, b, _ in slots]
    assert mixed(glob, loc, slots, ones).equals(glob)
    zeros = [np.zeros(b - a, np.float32) for _, a, b, _ in slots]
    at_zero = mixed(glob, loc, slots, zeros)
    half = [np.full(b - a, 0.25, np.float32) for _, a, b, _ in slots]
    at_quarter = mixed(glob, loc, slots, half)
    higher = np.zeros(start.part("filter").size, bool)
    higher[slots[0][1] : slots[0][2]] = True
    for got, want_higher in ((at_zero, loc), (at_quarter, None)):
        np.testing.assert_array_equal(got.extractor, glob.extractor)  # a lower part, whole
        # the filter's weight is a lower layer
        np.testing.assert_array_equal(got.filter[~higher], glob.filter[~higher])
        if want_higher is not None:
            np.testing.assert_array_equal(got.filter[higher], loc.filter[higher])
            np.testing.assert_array_equal(got.head, loc.head)
    want = loc.head + (glob.head - loc.head) * 0.25  # Eq. 4 as the paper writes it
    np.testing.assert_allclose(at_quarter.head, want, rtol=1e-6, atol=1e-6)


def test_fedala_learns_w_for_the_higher_layers_only_and_keeps_it(tmp_path):
    """(a) and (b): round 1 has nothing to mix (the local model is the global one); at the client's
    next round W is learned until its losses settle (more than num_pre_loss passes), in [0, 1], moved
    from ones, only for the higher layers' entries, and theta_hat's lower layers are the global
    model's exactly; a later round learns W for one pass from the kept W."""
    from algorithms.fedala import higher_slots
    from raysim.toolkit.context import ClientContext

    ex = _executor(tmp_path, "fedala", **{"algo.layer_idx": 3, "algo.eta": 5.0})
    algo, runtime = ex.runtime.algo, ex.runtime
    run_round(ex, 1, [0, 1, 2, 3])
    assert runtime.stored(0, "fedala_weights") is None  # round 1: theta_hat = theta, W not learned yet
    glob = ex.server.state.weights
    local = runtime.kept(0).select(GLOBAL_PARTS)
    slots = higher_slots(runtime.model, 3)  # mlp_fcd: the extractor's bias, the head's weight and bias
    assert [s[0] for s in slots] == ["extractor", "head", "head"]

    probe = algo.adaptive_local_aggregation(ClientContext(runtime, 0, 2), glob, keep=False)
    assert runtime.stored(0, "fedala_weights") is None  # without keep, nothing the client keeps changes
    ctx = ClientContext(runtime, 0, 2)
    hat = algo.adaptive_local_aggregation(ctx, glob)
    assert hat.equals(probe)  # the same draws, the same W
    w = runtime.stored(0, "fedala_weights")
    assert [x.size for x in w] == [b - a for _, a, b, _ in slots]  # W only for the higher layers
    assert all(((x >= 0) & (x <= 1)).all() for x in w) and any((x < 1).any() for x in w)
    per_pass = int(0.8 * ctx.num_samples)  # every sample of the subset, the partial last batch too
    assert per_pass % 20  # (this client's subset does not divide into batches of 20)
    passes = ctx.samples_trained // per_pass
    assert ctx.samples_trained == passes * per_pass and 10 < passes <= 100  # the first ALA runs to its stop
    ext_higher = np.zeros(glob.extractor.size, bool)
    ext_higher[slots[0][1] : slots[0][2]] = True
    # the lower layers: the global model's, exactly
    np.testing.assert_array_equal(hat.extractor[~ext_higher], glob.extractor[~ext_higher])
    for (part, a, b, _), wk in zip(slots, w, strict=True):
        g, loc = glob.part(part)[a:b], local.part(part)[a:b]
        np.testing.assert_allclose(hat.part(part)[a:b], loc + (g - loc) * wk, rtol=1e-5, atol=1e-6)
    assert not hat.equals(glob) and not hat.equals(local)

    later = ClientContext(runtime, 0, 3)
    algo.adaptive_local_aggregation(later, glob)
    assert later.samples_trained == per_pass  # afterwards, one pass a round
    w2 = runtime.stored(0, "fedala_weights")
    assert any(not np.array_equal(x, y) for x, y in zip(w, w2, strict=True))  # from the kept W, moved on


def test_fedala_keeps_w_in_the_unit_interval_under_a_large_rate(tmp_path):
    from raysim.toolkit.context import ClientContext

    ex = _executor(tmp_path, "fedala", **{"algo.eta": 1e6, "algo.max_start_passes": 3})
    run_round(ex, 1, [0, 1, 2, 3])
    ex.runtime.algo.adaptive_local_aggregation(ClientContext(ex.runtime, 1, 2), ex.server.state.weights)
    w = np.concatenate(ex.runtime.stored(1, "fedala_weights"))
    assert w.min() >= 0 and w.max() <= 1 and ((w == 0) | (w == 1)).mean() > 0.5  # clipped


def test_fedala_personal_model_is_the_model_after_its_last_training(tmp_path):
    ex = _executor(tmp_path, "fedala")
    (res,) = run_round(ex, 1, [2])
    assert ex.runtime.kept(2).select(GLOBAL_PARTS).equals(res.weights)
    (res2,) = run_round(ex, 2, [2])
    assert ex.runtime.kept(2).select(GLOBAL_PARTS).equals(res2.weights)
    assert not res2.weights.equals(res.weights)


# ---------------------------------------------------------------------------------------- FedFomo


def test_fomo_weights_are_the_loss_drop_over_the_distance():
    """(a) on a hand-made case: (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||, 0 at distance 0."""
    from algorithms.fedfomo import distance, fomo_weights

    own = ModelWeights(head=np.array([0.0, 0.0], np.float32))
    models = [
        ModelWeights(head=np.array(v, np.float32)) for v in ([3.0, 4.0], [1.0, 0.0], [0.0, 0.5], [0.0, 0.0])
    ]
    dists = [distance(m, own) for m in models]
    assert dists == [5.0, 1.0, 0.5, 0.0]
    w = fomo_weights(2.0, [1.0, 2.5, 1.5, 0.1], dists)
    np.testing.assert_allclose(w, [1.0 / 5.0, -0.5, 1.0, 0.0])


def test_fomo_update_combines_the_models_with_the_clipped_normalised_weights():
    """(b): theta_i + sum_n w_n (theta_n - theta_i) with max(w, 0) / sum; a model that does not
    lower the loss gets nothing; with no positive weight the client keeps its model."""
    from algorithms.fedfomo import fomo_update

    own = ModelWeights(head=np.array([1.0, 1.0], np.float32))
    models = [ModelWeights(head=np.array(v, np.float32)) for v in ([3.0, 1.0], [1.0, 5.0], [-9.0, -9.0])]
    got = fomo_update(own, models, np.array([2.0, 1.0, -1.0]))
    np.testing.assert_allclose(got.head, [1 + 2 / 3 * 2, 1 + 1 / 3 * 4], rtol=1e-6)
    assert fomo_update(own, models, np.array([-1.0, 0.0, -3.0])) is own


def test_fomo_client_weighs_on_its_validation_part_and_uploads_the_update(tmp_path):
    """(a) and (b) in a run: the weights a client uploads are its validation losses' drop from its
    baseline (the update its last training started from) over the distance, computed here apart
    from the algorithm, for its own trained model and the M downloaded ones; with no local epochs
    its upload is the combination baseline + sum w_n (theta_n - baseline). Client 5 has not trained
    yet (its model and baseline are the initial one, weighed 0), so the others' trained models
    lower its loss; client 0 trained in round 1 from the initial model, which is its baseline, and
    its own trained model is weighed among the others (the authors' first_model baseline with the
    client itself among the candidates): kept as far as it lowers the loss."""
    import torch
    import torch.nn.functional as F

    from algorithms.fedfomo import BASELINE, fomo_update
    from raysim.models import build_model, set_weights
    from raysim.toolkit.context import ClientContext

    first = _executor(tmp_path / "a", "fedfomo", participation=1.0, **FOMO, **{"algo.m": 3})
    run_round(first, 1, [0, 1, 2, 3, 4, 6, 7])  # the store holds their models and the initial one for 5
    ex = _executor(
        tmp_path / "b", "fedfomo", participation=1.0, **FOMO, **{"algo.m": 3, "train.local_epochs": 0}
    )
    ex.server.state = first.server.state
    ex.runtime.memory.update(first.runtime.memory)
    initial = ex.runtime.initial_weights.select(GLOBAL_PARTS)
    jobs = {job.clients[0]: job for job in ex.server.plan(2, [5, 0])}
    owns = {c: ClientContext(ex.runtime, c, 2).kept(GLOBAL_PARTS) for c in (5, 0)}
    assert owns[5].equals(initial) and not owns[0].equals(initial)
    results = {r.client: r for r in run_round(ex, 2, [5, 0])}

    data = prepare(ex.cfg)
    model = build_model("mlp_fcd", (1, 8, 8), 10, seed=0)
    flat = lambda w: np.concatenate([w.part(p).astype(np.float64) for p in GLOBAL_PARTS])  # noqa: E731
    for c in (5, 0):
        idx = data.client_val[c]
        assert idx.size > 0 and not np.isin(idx, data.client_train[c]).any()
        x, y = torch.from_numpy(data.train.features(idx)), torch.from_numpy(data.train.y[idx])

        def val_loss(w: ModelWeights, x: torch.Tensor = x, y: torch.Tensor = y) -> float:
            set_weights(model, w)
            model.eval()
            with torch.no_grad():
                return float(F.cross_entropy(model(x), y))

        candidates = (owns[c], *jobs[c].payload.models)

        def weight(m: ModelWeights, val_loss=val_loss) -> float:
            d = np.linalg.norm(flat(m) - flat(initial))  # the baseline: the initial model for both
            return 0.0 if d == 0 else (val_loss(initial) - val_loss(m)) / d

        res = results[c]
        assert res.extra.ids == (c, *jobs[c].payload.ids)
        np.testing.assert_allclose(res.extra.weights, [weight(m) for m in candidates], rtol=1e-4, atol=1e-7)
        assert (res.extra.weights[1:] > 0).any() and not res.weights.equals(owns[c])
        np.testing.assert_allclose(
            flat(res.weights), flat(fomo_update(initial, candidates, res.extra.weights)), rtol=1e-6, atol=1e-7
        )
        assert ex.runtime.kept(c).select(GLOBAL_PARTS).equals(res.weights)  # the personal model
        # (no local epochs: the update is also what it trained from, its next round's baseline)
        assert ex.runtime.stored(c, BASELINE).equals(res.weights)
    assert results[5].extra.weights[0] == 0.0  # nothing trained yet: its own model is its baseline
    assert results[0].extra.weights[0] > 0  # its round-1 training lowered its validation loss


def test_fomo_downloads_m_stored_models_and_counts_their_bytes(tmp_path):
    """(c): each sampled client downloads M other clients' models from the store, M times the
    model's bytes; the upload is one model and the M + 1 weights (its own model's and the M's)."""
    ex = _executor(tmp_path, "fedfomo", participation=1.0, **FOMO, **{"algo.m": 3})
    run_round(ex, 1, list(range(8)))
    store = ex.server.state.models
    model_bytes = store[0].nbytes
    jobs = ex.server.plan(2, [0, 4, 6])
    for job in jobs:
        (i,) = job.clients
        ids = job.payload.ids
        assert len(ids) == 3 == len(set(ids)) and i not in ids and job.pinned
        assert all(m is store[n] for m, n in zip(job.payload.models, ids, strict=True))
    stats = ex.train_round(2, [0, 4, 6])
    assert stats.bytes_down == 3 * 3 * model_bytes
    assert stats.bytes_up == 3 * (model_bytes + 4 * 8)


def test_fomo_never_offers_the_model_of_a_client_held_out_of_training(tmp_path):
    cfg = tiny_config(tmp_path, algo="fedfomo", **FOMO, **{"eval.new_clients": 0.25, "algo.m": 5})
    held = set(cfg.new_clients)
    assert len(held) == 2
    ex = SerialExecutor(cfg, prepare(cfg))
    for rnd in (1, 2):
        for job in ex.server.plan(rnd, list(cfg.training_clients)):
            assert len(job.payload.ids) == 5 and not held & set(job.payload.ids)
    with pytest.raises(ConfigError, match=r"at most the other training clients \(5\)"):
        validate(tiny_config(tmp_path, algo="fedfomo", **FOMO, **{"eval.new_clients": 0.25, "algo.m": 6}))


def test_fomo_chooses_by_affinity_greedily_and_explores_with_epsilon():
    from algorithms.fedfomo import choose_models

    row = np.array([0.0, 0.5, -1.0, 2.0, 0.1, 0.0])
    others = [1, 2, 3, 4, 5]  # client 0's
    greedy = choose_models(row, others, 3, 0.0, np.random.default_rng(0))
    assert greedy == [3, 1, 4]  # the highest affinities
    explored = {tuple(choose_models(row, others, 3, 1.0, np.random.default_rng(s))) for s in range(20)}
    assert len(explored) > 5 and all(0 not in c and len(set(c)) == 3 for c in explored)
    assert choose_models(row, [1, 2, 5], 3, 0.0, np.random.default_rng(0)) == [1, 5, 2]  # only the candidates


def test_fomo_server_stores_the_uploads_and_adds_the_normalised_weights_to_p(tmp_path):
    from algorithms.fedfomo import FedFomo, FedFomoConfig, FomoState, FomoUpload

    cfg = tiny_config(tmp_path, algo="fedfomo", clients=4, **FOMO)
    algo = FedFomo(cfg, FedFomoConfig(m=2))
    start = ModelWeights(head=np.zeros(2, np.float32))
    state = FomoState((start,) * 4, np.zeros((4, 4)))
    up = ModelWeights(head=np.ones(2, np.float32))
    result = ClientResult(1, 10, 0.0, up, extra=FomoUpload((0, 3), np.array([0.6, -0.2])))
    new = algo.aggregate(state, 1, [JobResult(Job((1,), None), (result,))])
    assert new.models[1] is up and new.models[0] is start
    np.testing.assert_allclose(new.affinity[1], [0.6 / 0.4, 0.0, 0.0, -0.2 / 0.4])
    assert not new.affinity[[0, 2, 3]].any() and not state.affinity.any()


def test_fomo_needs_validation_parts_which_its_paper_setup_gives(tmp_path):
    settings = {"algo": "fedfomo", "data": {"dataset": "synthetic"}, "output": {"out": str(tmp_path)}}
    assert resolve_config(settings).data.val_fraction == 0.2
    with pytest.raises(
        ConfigError, match=r"^FedFomo weighs .* set data.val_fraction \(its paper setup sets 0.2\).$"
    ):
        validate(resolve_config({**settings, "paper_setup": False}))


# ---------------------------------------------------------------------------------------- both


@pytest.mark.parametrize(
    ("algo", "name", "value", "sentence"),
    [
        ("fedala", "layer_idx", 0, "algo.layer_idx must be at least 1, not 0."),
        ("fedala", "layer_idx", 1.5, "algo.layer_idx must be an integer, not 1.5."),
        ("fedala", "p", "two", "algo.layer_idx must be an integer, not 'two'."),
        ("fedala", "eta", 0, "algo.eta must be above 0, not 0.0."),
        ("fedala", "eta", -1, "algo.eta must be above 0, not -1.0."),
        ("fedala", "eta", "fast", "algo.eta must be a number, not 'fast'."),
        ("fedala", "rand_percent", 0, "algo.rand_percent must be at least 1, not 0."),
        ("fedala", "rand_percent", 101, "algo.rand_percent must be at most 100, not 101."),
        ("fedala", "rand_percent", 50.5, "algo.rand_percent must be an integer, not 50.5."),
        ("fedala", "threshold", -0.1, "algo.threshold must be at least 0, not -0.1."),
        ("fedala", "threshold", "x", "algo.threshold must be a number, not 'x'."),
        ("fedala", "threshold", None, "algo.threshold must be a number, not None."),
        ("fedala", "num_pre_loss", 0, "algo.num_pre_loss must be at least 1, not 0."),
        ("fedala", "num_pre_loss", -3, "algo.num_pre_loss must be at least 1, not -3."),
        ("fedala", "num_pre_loss", 2.5, "algo.num_pre_loss must be an integer, not 2.5."),
        ("fedala", "max_start_passes", 0, "algo.max_start_passes must be at least 1, not 0."),
        ("fedala", "max_start_passes", -1, "algo.max_start_passes must be at least 1, not -1."),
        ("fedala", "max_start_passes", "many", "algo.max_start_passes must be an integer, not 'many'."),
        ("fedfomo", "m", 0, "algo.m must be at least 1, not 0."),
        ("fedfomo", "m", "five", "algo.m must be an integer, not 'five'."),
        (
            "fedfomo",
            "m",
            8,
            "FedFomo's algo.m (8) must be at most the other training clients (7): a client downloads other "
            "clients' models.",
        ),
        ("fedfomo", "epsilon", -0.1, "algo.epsilon must be at least 0, not -0.1."),
        ("fedfomo", "epsilon", 1.5, "algo.epsilon must be at most 1, not 1.5."),
        ("fedfomo", "epsilon", "high", "algo.epsilon must be a number, not 'high'."),
        ("fedfomo", "epsilon_decay", -0.05, "algo.epsilon_decay must be at least 0, not -0.05."),
        ("fedfomo", "epsilon_decay", "slow", "algo.epsilon_decay must be a number, not 'slow'."),
        ("fedfomo", "epsilon_decay", float("nan"), "algo.epsilon_decay must be a number, not nan."),
    ],
)
def test_a_mistyped_setting_is_refused_in_one_sentence(tmp_path, algo, name, value, sentence):
    extra = FOMO if algo == "fedfomo" else {}
    with pytest.raises(ConfigError) as refused:
        validate(tiny_config(tmp_path, algo=algo, **extra, **{f"algo.{name}": value}))
    assert str(refused.value) == sentence


@pytest.mark.parametrize(("algo", "extra"), [("fedala", {}), ("fedfomo", {**FOMO, "algo.m": 3})])
def test_learns_and_reports_its_metrics(tmp_path, algo, extra):
    result = run_experiment(tiny_config(tmp_path, algo=algo, rounds=4, participation=0.75, **extra))
    assert result.final["lm_ptest"] > 0.3  # ten classes: chance is 0.1
    assert (result.final["gm_gtest"] is None) == (algo == "fedfomo")
    losses = [row["train_loss"] for row in result.rows if row.get("train_loss") is not None]
    assert losses[-1] < losses[0]


@pytest.mark.ray
@pytest.mark.parametrize(("algo", "extra"), [("fedala", {}), ("fedfomo", {**FOMO, "algo.m": 3})])
def test_serial_equals_ray(tmp_path, ray_local, algo, extra):
    setup = {"algo": algo, "rounds": 3, "participation": 0.75, "eval.every": 1, **extra}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)
