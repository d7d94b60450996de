"""FedBN and LG-FedAvg, and the BatchNorm models FedBN runs on: each one's defining property on the
numbers."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare, run_experiment
from raysim.errors import ConfigError
from raysim.weights import BODY, GLOBAL_PARTS
from tests.conftest import run_round, tiny_config, without_times

BN_MODELS = {"cnn_pac_bn": "cnn_pac", "cnn3p2_fmnist_bn": "cnn3p2_fmnist"}
#: FedBN on a BatchNorm model; drop_last, so that no training batch is a single sample (which a
#: BatchNorm1d cannot normalise)
FEDBN = {"algo": "fedbn", "model": "cnn_pac_bn", "data.synthetic.shape": (1, 16, 16), "train.drop_last": True}


def _executor(tmp_path, **changes):
    cfg = tiny_config(tmp_path, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _size_weighted_mean(arrays, sizes):
    return np.average(
        np.stack([a.astype(np.float64) for a in arrays]), axis=0, weights=np.asarray(sizes, float)
    )


# ---------------------------------------------------------------------------------------- the BN models


@pytest.mark.parametrize("name", sorted(BN_MODELS))
def test_a_bn_model_is_its_plain_model_with_batch_norm_after_each_conv_and_hidden_fc(name):
    from torch import nn

    from raysim.models import batch_norm_mask, build_model, get_weights

    bn = build_model(name, (1, 28, 28), 10, seed=4)
    plain = build_model(BN_MODELS[name], (1, 28, 28), 10, seed=4)
    for part in GLOBAL_PARTS:
        layers = list(bn.part(part).modules())
        for i, m in enumerate(layers):  # every conv and hidden FC is followed by its BatchNorm
            if isinstance(m, (nn.Conv2d, nn.Linear)) and part != "head":
                follower = layers[i + 1]
                kind = nn.BatchNorm2d if isinstance(m, nn.Conv2d) else nn.BatchNorm1d
                assert isinstance(follower, kind) and follower.num_features == (
                    m.out_channels if isinstance(m, nn.Conv2d) else m.out_features
                ), (name, part, i)
        # the same layers and the same initial draws: without its BatchNorm entries, the plain model
        flat, mask = get_weights(bn, (part,)).part(part), batch_norm_mask(bn, part)
        np.testing.assert_array_equal(flat[~mask], get_weights(plain, (part,)).part(part))
    assert not any(isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d) for m in bn.head.modules())
    assert sum(batch_norm_mask(bn, p).sum() for p in GLOBAL_PARTS) == 4 * sum(
        m.num_features for m in bn.modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)
    )


@pytest.mark.parametrize("name", sorted(BN_MODELS))
def test_a_bn_model_trains_and_its_flat_parts_carry_batch_norm_parameters_and_statistics(name):
    import torch
    from torch import nn

    from raysim.models import batch_norm_mask, build_model, get_weights, set_weights
    from raysim.toolkit.train import SGDConfig, iterate_batches, local_train

    model = build_model(name, (1, 16, 16), 10, seed=1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 16, 16, generator=g) * 3 + 1, torch.randint(0, 10, (16,), generator=g)
    before = get_weights(model, GLOBAL_PARTS)
    stats = local_train(
        model,
        lambda e: iterate_batches(x, y, torch.arange(16), 8),
        epochs=1,
        parts=GLOBAL_PARTS,
        sgd=SGDConfig(0.1),
    )
    assert stats.steps == 2 and np.isfinite(stats.loss)
    after = get_weights(model, GLOBAL_PARTS)
    for part in GLOBAL_PARTS:
        module = model.part(part)
        norms = [m for m in module.modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)]
        mask = batch_norm_mask(model, part)
        # the part's flat array: its float tensors in state_dict order, num_batches_tracked left out
        floats = {k: t for k, t in module.state_dict().items() if t.is_floating_point()}
        assert after.part(part).size == sum(t.numel() for t in floats.values())
        assert all("num_batches_tracked" not in k for k in floats)
        want = np.concatenate(
            [
                t.detach().reshape(-1).numpy()
                for m in norms
                for t in (m.weight, m.bias, m.running_mean, m.running_var)
            ]
            or [np.zeros(0, np.float32)]
        )
        np.testing.assert_array_equal(after.part(part)[mask], want)
        for m in norms:  # trained: the affine parameters moved, the statistics followed the batches
            assert int(m.num_batches_tracked) == 2
            assert not np.allclose(m.running_mean.numpy(), 0) and not np.allclose(m.running_var.numpy(), 1)
        if norms:
            assert not np.array_equal(after.part(part)[mask], before.part(part)[mask])
    fresh = build_model(name, (1, 16, 16), 10, seed=2)
    set_weights(fresh, after)  # the statistics travel with the weights
    for a, b in zip(model.modules(), fresh.modules(), strict=True):
        if isinstance(a, nn.BatchNorm1d | nn.BatchNorm2d):
            assert torch.equal(a.running_mean, b.running_mean) and torch.equal(a.running_var, b.running_var)


def test_a_training_batch_of_one_sample_is_refused_in_a_sentence_and_otherwise_it_is_batchnorm1d():
    import torch
    from torch import nn

    from raysim.models import StrictBatchNorm1d

    strict, plain = StrictBatchNorm1d(5), nn.BatchNorm1d(5)
    x = torch.randn(4, 5) * 2 + 1
    assert torch.equal(strict(x), plain(x)) and torch.equal(strict.running_var, plain.running_var)
    assert list(strict.state_dict()) == list(plain.state_dict())
    with pytest.raises(ConfigError) as refused:
        strict(x[:1])
    assert str(refused.value).endswith(
        "set train.drop_last=true, or a train.batch_size that leaves no sample alone."
    )
    strict.eval()
    assert torch.equal(strict(x[:1]), plain.eval()(x[:1]))  # evaluation normalises by the running statistics


def test_bn_models_are_registered_as_not_batchable_with_their_plain_models_inputs():
    from raysim.registry import MODELS

    for name, plain in BN_MODELS.items():
        entry, base = MODELS.get(name), MODELS.get(plain)
        assert not entry.batchable and (entry.feature_dim, entry.min_size, entry.channels) == (
            base.feature_dim, base.min_size, base.channels
        )  # fmt: skip


# ---------------------------------------------------------------------------------------- FedBN


def _fedbn_round(tmp_path):
    from raysim.models import batch_norm_mask

    ex = _executor(tmp_path, **FEDBN)
    sent = ex.server.state.weights
    clients = [0, 2, 5, 7]
    uploads = run_round(ex, 1, clients)
    masks = {p: batch_norm_mask(ex.runtime.model, p) for p in GLOBAL_PARTS}
    return ex, sent, uploads, masks


def test_fedbn_batch_norm_never_leaves_a_client_and_the_rest_is_averaged(tmp_path):
    from algorithms.fedbn import BN_STORE

    ex, sent, uploads, masks = _fedbn_round(tmp_path)
    assert masks["extractor"].sum() == 4 * (16 + 32 + 128) and not masks["head"].any()
    new = ex.server.state.weights
    kept = {r.client: ex.runtime.stored(r.client, BN_STORE) for r in uploads}
    for r in uploads:
        for p in GLOBAL_PARTS:
            m = masks[p]
            # (a) every uploaded BatchNorm entry is what was sent
            np.testing.assert_array_equal(r.weights.part(p)[m], sent.part(p)[m])
            # ... while the rest was trained
            if (~m).any():
                assert not np.array_equal(r.weights.part(p)[~m], sent.part(p)[~m])
        # (b) what the client kept is its trained BatchNorm entries, not the server's
        assert not np.array_equal(kept[r.client].extractor, sent.extractor[masks["extractor"]])
    firsts = [kept[r.client].extractor for r in uploads]
    assert all(not np.array_equal(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1 :])
    # (c) the new shared weights: the size-weighted mean of the uploads, BatchNorm entries as sent
    sizes = [r.num_samples for r in uploads]
    for p in GLOBAL_PARTS:
        m = masks[p]
        want = _size_weighted_mean([r.weights.part(p) for r in uploads], sizes)
        np.testing.assert_allclose(new.part(p)[~m], want[~m], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(new.part(p)[m], sent.part(p)[m], rtol=1e-7, atol=0)
    # the clients that did not train kept nothing
    assert ex.runtime.stored(1, BN_STORE) is None


def test_fedbn_personal_model_is_the_shared_weights_with_its_own_batch_norm(tmp_path):
    from algorithms.fedbn import BN_STORE
    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    ex, sent, uploads, masks = _fedbn_round(tmp_path)
    algo, evaluation = ex.runtime.algo, ex.server.evaluation()
    shared = ex.server.state.weights
    assert evaluation.global_model(algo, ex.runtime.model) is None  # no global model
    for cid in (0, 1):  # one that trained, one that never did
        model = evaluation.personal_model(algo, ClientContext(ex.runtime, cid, 1, evaluating=True))
        got = get_weights(model, GLOBAL_PARTS)
        own = ex.runtime.stored(cid, BN_STORE)
        for p in GLOBAL_PARTS:
            m = masks[p]
            np.testing.assert_array_equal(got.part(p)[~m], shared.part(p)[~m])
            want = own.part(p) if own is not None else ex.runtime.initial_weights.part(p)[m]
            np.testing.assert_array_equal(got.part(p)[m], want)
    # a second round: a client trains on from the BatchNorm it kept, and still uploads the sent one
    sent2 = ex.server.state.weights
    first = ex.runtime.stored(0, BN_STORE)
    (again,) = run_round(ex, 2, [0])
    for p in GLOBAL_PARTS:
        np.testing.assert_array_equal(again.weights.part(p)[masks[p]], sent2.part(p)[masks[p]])
    assert not np.array_equal(ex.runtime.stored(0, BN_STORE).extractor, first.extractor)


def test_fedbn_refuses_a_model_without_batch_norm_before_any_work(tmp_path):
    from algorithms.fedbn import FedBN
    from raysim.models import build_model
    from raysim.wire import NoConfig

    with pytest.raises(ConfigError) as refused:
        validate(tiny_config(tmp_path, algo="fedbn"))
    sentence = str(refused.value)
    assert sentence.startswith(
        "fedbn keeps each client's BatchNorm layers local, and the model mlp_fcd has none"
    )
    assert sentence.endswith(".") and len(sentence.split(". ")) == 1 and "cnn_pac_bn" in sentence
    for name in BN_MODELS:  # a model with BatchNorm is taken
        validate(tiny_config(tmp_path, **{**FEDBN, "model": name}))
    # a client that finds no BatchNorm in its model (a user's model registered otherwise) refuses too
    algo = FedBN(tiny_config(tmp_path, **FEDBN), NoConfig())
    with pytest.raises(ConfigError, match="has none"):
        algo.masks(build_model("mlp_fcd", (1, 16, 16), 10, seed=0))


def test_fedbn_learns_and_reports_its_metrics(tmp_path):
    result = run_experiment(tiny_config(tmp_path, **FEDBN, rounds=3, participation=0.75))
    assert result.final["gm_gtest"] is None and result.final["lm_ptest"] is not None
    assert result.rows[-1]["train_loss"] < result.rows[0]["train_loss"]


# ---------------------------------------------------------------------------------------- LG-FedAvg


def test_lgfedavg_body_stays_local_and_the_head_is_averaged(tmp_path):
    ex = _executor(tmp_path, algo="lgfedavg")
    init = ex.runtime.initial_weights
    assert ex.server.state.weights.part_names == ("head",)
    for rnd, clients in ((1, [0, 2, 5, 7]), (2, [0, 1, 2])):
        sent = ex.server.state.weights
        uploads = run_round(ex, rnd, clients)
        for r in uploads:  # only the head goes up, trained from the one sent
            assert r.weights.part_names == ("head",)
            assert not np.array_equal(r.weights.head, sent.head)
        want = _size_weighted_mean([r.weights.head for r in uploads], [r.num_samples for r in uploads])
        np.testing.assert_allclose(ex.server.state.weights.head, want, rtol=1e-6, atol=1e-7)
        assert ex.server.state.weights.part_names == ("head",)
    bodies = {c: ex.runtime.kept(c) for c in (0, 1, 2, 5, 7)}
    for body in bodies.values():  # each trained client's body is its own and was trained
        assert body.part_names == BODY
        assert not np.array_equal(body.extractor, init.extractor)
    assert ex.runtime.kept(3).part_names == ()  # one that never trained keeps nothing
    ids = sorted(bodies)
    assert all(
        not np.array_equal(bodies[a].extractor, bodies[b].extractor) for a in ids for b in ids if a < b
    )


def test_lgfedavg_personal_model_is_the_shared_head_over_its_own_body(tmp_path):
    from raysim.models import get_weights
    from raysim.toolkit.context import ClientContext

    ex = _executor(tmp_path, algo="lgfedavg")
    run_round(ex, 1, [0, 2])
    algo, evaluation = ex.runtime.algo, ex.server.evaluation()
    assert evaluation.global_model(algo, ex.runtime.model) is None
    for cid in (0, 1):
        got = get_weights(
            evaluation.personal_model(algo, ClientContext(ex.runtime, cid, 1, evaluating=True)), GLOBAL_PARTS
        )
        assert np.array_equal(got.head, ex.server.state.weights.head)
        body = ex.runtime.kept(cid) if cid == 0 else ex.runtime.initial_weights
        assert all(np.array_equal(got.part(p), body.part(p)) for p in BODY)


def test_lgfedavg_learns_and_reports_its_metrics(tmp_path):
    result = run_experiment(tiny_config(tmp_path, algo="lgfedavg", rounds=3, participation=0.75))
    assert result.final["gm_gtest"] is None and result.final["lm_ptest"] is not None
    assert result.rows[-1]["train_loss"] < result.rows[0]["train_loss"]


# ---------------------------------------------------------------------------------------- both


@pytest.mark.ray
@pytest.mark.parametrize("setup", [FEDBN, {"algo": "lgfedavg"}], ids=["fedbn", "lgfedavg"])
def test_serial_equals_ray(tmp_path, ray_local, setup):
    setup = {**setup, "rounds": 2, "participation": 0.75, "eval.every": 1}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(
        tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2})
    )
    assert without_times(ray_run.rows) == without_times(serial.rows)


def test_a_batch_of_one_sample_on_a_batchnorm_fc_is_refused_before_training(tmp_path):
    """cnn_pac_bn's BatchNorm after its FC cannot train on one sample: a split that leaves a
    client one sample for its last batch is refused once the split is known, in one sentence;
    train.drop_last=true runs it."""
    from raysim.engine.runner import prepare, run_experiment
    from raysim.errors import ConfigError
    from tests.conftest import tiny_config

    sizes = [int(i.size) for i in prepare(tiny_config(tmp_path / "n", model="cnn_pac_bn", **{"data.synthetic.shape": (1, 16, 16), "train.drop_last": True})).client_train]
    b = next(b for b in range(5, 60) if any(n % b == 1 for n in sizes))
    setup = {"algo": "fedbn", "model": "cnn_pac_bn", "rounds": 1, "train.batch_size": b, "data.synthetic.shape": (1, 16, 16)}
    with pytest.raises(ConfigError, match="cannot train on a batch of one sample") as err:
        run_experiment(tiny_config(tmp_path / "a", **setup))
    assert "train.drop_last=true" in str(err.value)
    assert run_experiment(tiny_config(tmp_path / "b", **setup, **{"train.drop_last": True})).rows


def test_a_client_without_a_full_batch_is_refused_under_drop_last(tmp_path):
    """train.drop_last leaves out each epoch's last partial batch: a client with fewer training
    samples than a batch would have none and never train; refused once the split is known, in one
    sentence that names the client and its size. A batch it can fill runs."""
    from raysim.engine.runner import prepare, run_experiment
    from raysim.errors import ConfigError
    from tests.conftest import tiny_config

    cfg = tiny_config(tmp_path / "n", **{"data.partition": "dirichlet:0.1", "train.drop_last": True})
    sizes = [int(prepare(cfg).client_train[c].size) for c in cfg.training_clients]
    smallest = min(sizes)
    setup = {"rounds": 1, "data.partition": "dirichlet:0.1", "train.drop_last": True}
    with pytest.raises(ConfigError, match=f"has {smallest} training samples, fewer than a batch of {smallest + 1}") as err:
        run_experiment(tiny_config(tmp_path / "a", **setup, **{"train.batch_size": smallest + 1}))
    assert f"Client {sizes.index(smallest)} " in str(err.value) and "train.drop_last=false" in str(err.value)
    assert run_experiment(tiny_config(tmp_path / "b", **setup, **{"train.batch_size": smallest})).rows
