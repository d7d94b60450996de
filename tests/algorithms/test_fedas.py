"""FedAS: its defining properties on the numbers (the alignment loss and the Fisher trace by hand,
the server's Fisher-weighted mean, the body aligned before training and the head kept on its client,
the local model evaluated), serial against Ray, and the refusal of mistyped settings."""

from __future__ import annotations

import numpy as np
import pytest

import algorithms.fedas  # noqa: F401  (registers "fedas")
from algorithms.fedas import alignment_loss, alignment_loss_of, fisher_trace
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.experiment import validate
from raysim.engine.runner import prepare
from raysim.errors import ConfigError
from raysim.weights import BODY, GLOBAL_PARTS
from tests.conftest import assert_serial_equals_ray, run_round, tiny_config

PLUGINS = ("algorithms.fedas",)


def _executor(tmp_path, algo="fedas", **changes):
    cfg = tiny_config(tmp_path, algo=algo, plugins=PLUGINS, **changes)
    return SerialExecutor(cfg, prepare(cfg))


def _context(ex, client, rnd):
    from raysim.toolkit.context import ClientContext

    return ClientContext(ex.runtime, client, rnd)


def test_alignment_loss_sums_each_present_class_mean_squared_error_by_hand():
    """The authors' nn.MSELoss()(features of class c, p_c), summed over the batch's classes: each
    sample's error against its class's prototype. It is FL-bench's error of the class mean plus the
    class's feature variance over d, so a batch whose class means are the prototypes still has its
    spread to align."""
    import torch

    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, 5, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 2, 2, 0, 2, 3, 0])  # class 1 absent from the batch
    protos = torch.randn(4, 5, generator=g, dtype=torch.float64)
    want = of_means = spread = 0.0
    zn, yn, pn = z.numpy(), y.numpy(), protos.numpy()
    for c in (0, 2, 3):
        rows = zn[yn == c]
        want += float(np.mean((rows - pn[c]) ** 2))
        of_means += float(np.mean((rows.mean(axis=0) - pn[c]) ** 2))
        spread += float(rows.var(axis=0).mean())
    got = float(alignment_loss(z, y, protos))
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(of_means + spread, rel=1e-12) and spread > 0
    mse = torch.nn.MSELoss()  # the authors' clientas.py, written out
    by_class = [mse(z[y == c], protos[c].expand(int((y == c).sum()), -1)) for c in (0, 2, 3)]
    assert got == pytest.approx(float(sum(by_class)), rel=1e-12)
    # at the class means only the spread is left; with every row at its prototype, nothing
    means = torch.stack([_class_mean(z, y, c) for c in range(4)])
    assert float(alignment_loss(z, y, means)) == pytest.approx(spread, rel=1e-12)
    assert float(alignment_loss(protos[y], y, protos)) == 0.0


def test_the_class_mean_form_is_fl_benchs_the_per_sample_one_less_the_spread():
    import torch

    from algorithms.fedas import class_mean_alignment_loss

    g = torch.Generator().manual_seed(1)
    z = torch.randn(9, 4, generator=g, dtype=torch.float64)
    y = torch.tensor([1, 1, 3, 3, 3, 0, 1, 0, 3])
    protos = torch.randn(5, 4, generator=g, dtype=torch.float64)
    zn, yn, pn = z.numpy(), y.numpy(), protos.numpy()
    want = sum(float(np.mean((zn[yn == c].mean(axis=0) - pn[c]) ** 2)) for c in (0, 1, 3))
    spread = sum(float(zn[yn == c].var(axis=0).mean()) for c in (0, 1, 3))
    assert float(class_mean_alignment_loss(z, y, protos)) == pytest.approx(want, rel=1e-12)
    assert float(alignment_loss(z, y, protos)) == pytest.approx(want + spread, rel=1e-12)


def test_the_alignment_loss_setting_picks_the_form_the_body_is_aligned_on(tmp_path):
    """alignment_loss=class_mean aligns on FL-bench's term: a different aligned body from the same
    start, and the default is the authors' per-sample term."""
    assert _executor(tmp_path / "d").runtime.algo.params.alignment_loss == "sample"
    bodies = {}
    for form in ("sample", "class_mean"):
        ex = _executor(tmp_path / form, **{"algo.alignment_loss": form, "algo.alignment_epochs": 2})
        run_round(ex, 1, [0, 1, 2, 3])
        ctx = _context(ex, 0, 2)
        ex.runtime.algo.align(ctx, ex.server.state.weights)
        bodies[form] = ctx.weights(BODY)
    assert not bodies["sample"].equals(bodies["class_mean"])


def _class_mean(z, y, c):
    import torch

    rows = z[y == c]
    return rows.mean(0) if rows.shape[0] else torch.zeros(z.shape[1], dtype=z.dtype)


def test_fisher_trace_is_the_sum_over_batches_of_squared_nll_gradients(tmp_path):
    import torch

    ex = _executor(tmp_path)
    run_round(ex, 1, [2])
    ctx = _context(ex, 2, 1)
    ctx.load(ex.runtime.kept(2).select(GLOBAL_PARTS))
    got = fisher_trace(ctx, GLOBAL_PARTS)
    model = ctx.model
    model.eval()
    params = [p for part in GLOBAL_PARTS for p in getattr(model, part).parameters()]
    want = 0.0
    batches = list(ctx.batches(0, "fedas/fisher"))
    assert len(batches) > 1
    for x, y in batches:  # PFLlib's clientas.py, written out
        nll = -torch.log_softmax(model(x), dim=1)[torch.arange(len(y)), y].mean()
        for gr in torch.autograd.grad(nll, params):
            want += float((gr.double() ** 2).sum())
    model.train()
    assert want > 0
    assert got == pytest.approx(want, rel=1e-9)


def test_server_weighs_the_bodies_by_the_clients_fisher_traces_and_keeps_no_head(tmp_path):
    ex = _executor(tmp_path)
    got = run_round(ex, 1, [1, 4, 6])
    assert [r.client for r in got] == [1, 4, 6]
    for r in got:  # the body goes up, the head never leaves its client
        assert set(r.weights.part_names) == set(BODY)
        kept = ex.runtime.kept(r.client)
        assert kept.select(BODY).equals(r.weights)  # the local model after the update, kept whole
        ctx = _context(ex, r.client, 1)
        ctx.load(kept.select(GLOBAL_PARTS))
        assert r.extra == pytest.approx(fisher_trace(ctx, GLOBAL_PARTS), rel=1e-12)
    traces = np.array([r.extra for r in got])
    sizes = np.array([r.num_samples for r in got], dtype=np.float64)
    assert np.ptp(traces / traces.sum()) > 1e-3 and np.ptp(traces / traces.sum() - sizes / sizes.sum()) > 1e-3
    state = ex.server.state.weights
    assert set(state.part_names) == set(BODY)
    gap = 0.0
    for part in BODY:  # (mlp_fcd's filter is empty)
        stack = np.stack([r.weights.part(part).astype(np.float64) for r in got])
        fisher = np.tensordot(traces / traces.sum(), stack, axes=1)
        by_size = np.tensordot(sizes / sizes.sum(), stack, axes=1)
        np.testing.assert_allclose(state.part(part), fisher, rtol=0, atol=1e-6)
        gap = max(gap, float(np.abs(fisher - by_size).max(initial=0.0)))
    assert gap > 1e-5  # not FedAvg's mean


def test_without_alignment_a_first_update_is_fedpers(tmp_path):
    """A client's first update with no alignment trains FedPer's way (the received body with its own
    head, cross-entropy, the same batches); with alignment the body moves first, so it differs."""
    plain = run_round(_executor(tmp_path / "0", **{"algo.alignment_epochs": 0}), 1, [3, 5])
    fedper = run_round(_executor(tmp_path / "p", "fedper"), 1, [3, 5])
    aligned = run_round(_executor(tmp_path / "1"), 1, [3, 5])
    for a, b, c in zip(plain, fedper, aligned, strict=True):
        assert a.weights.equals(b.weights)
        assert not c.weights.equals(a.weights)


def test_alignment_pulls_the_received_body_to_the_previous_models_prototypes(tmp_path):
    import torch

    from raysim.toolkit.features import class_means, extract_features

    ex = _executor(tmp_path, **{"algo.alignment_epochs": 3, "algo.alignment_lr": 0.05})
    algo, runtime = ex.runtime.algo, ex.runtime
    run_round(ex, 1, [0, 1, 2, 3])
    received = ex.server.state.weights
    previous = runtime.kept(0).select(GLOBAL_PARTS)
    assert not previous.select(BODY).equals(received)

    ctx = _context(ex, 0, 2)
    x, y = ctx.train_tensors()
    ctx.load(previous)
    protos = torch.from_numpy(
        class_means(extract_features(ctx.model, x).flatten(1), y, ctx.model.num_classes).means
    )

    def full_loss(weights):
        ctx.load(weights)
        ctx.model.eval()
        with torch.no_grad():
            out = float(alignment_loss_of(protos)(ctx.model, x, y))
        ctx.model.train()
        return out

    before = full_loss(received.merged(previous.select(("head",))))
    algo.align(ctx, received)
    aligned = ctx.weights(GLOBAL_PARTS)
    assert aligned.select(("head",)).equals(previous.select(("head",)))  # the own head, untouched
    assert not aligned.select(BODY).equals(received)
    assert full_loss(aligned) < 0.9 * before
    # the prototypes' own model: its class means are the prototypes, so only its spread is left
    ctx.load(previous)
    z = extract_features(ctx.model, x).flatten(1).double()
    spread = sum(float(z[y == c].var(0, unbiased=False).mean()) for c in y.unique())
    assert full_loss(previous) == pytest.approx(spread, rel=1e-5)
    assert runtime.kept(0).select(GLOBAL_PARTS).equals(previous)  # alignment keeps nothing


def test_the_personalised_model_is_the_clients_last_local_model(tmp_path):
    ex = _executor(tmp_path)
    run_round(ex, 1, [1, 4])
    evaluation = ex.runtime.algo.evaluation(ex.server.state)
    for client in (1, 4, 7):  # 7 not yet trained: the initial model
        ctx = _context(ex, client, 1)
        evaluation.personal_model(ex.runtime.algo, ctx)
        model_weights = ctx.weights(GLOBAL_PARTS)
        want = (
            ex.runtime.kept(client).select(GLOBAL_PARTS)
            if client != 7
            else ctx.initial_weights.select(GLOBAL_PARTS)
        )
        assert model_weights.equals(want)


@pytest.mark.ray
def test_serial_equals_ray(tmp_path, ray_local):
    rows = assert_serial_equals_ray(
        tmp_path, algo="fedas", rounds=2, participation=0.75, plugins=PLUGINS, **{"eval.every": 1}
    )
    assert rows[-1]["lm_ptest"] is not None and rows[-1]["gm_ptest"] is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("alignment_lr", 0),
        ("alignment_lr", -0.01),
        ("alignment_lr", "fast"),
        ("alignment_epochs", -1),
        ("alignment_epochs", "one"),
        ("alignment_loss", "samples"),
        ("alignment_loss", "mean"),
        ("alignment_loss", 1),
    ],
)
def test_a_mistyped_setting_is_refused_in_one_sentence(tmp_path, name, value):
    with pytest.raises(ConfigError) as refused:
        validate(tiny_config(tmp_path, algo="fedas", plugins=PLUGINS, **{f"algo.{name}": value}))
    sentence = str(refused.value)
    assert f"algo.{name}" in sentence and sentence.endswith(".") and "\n" not in sentence
