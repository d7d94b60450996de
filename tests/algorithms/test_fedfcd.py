"""FedFCD: what leaves a client, the alternating theta/phi updates, the global head
trained only on the server, the GFR (Eq. 5), the ablation switches and the round-0 upload."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.fedfcd import FCDPayload
from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare, run_experiment
from raysim.toolkit.context import ClientContext
from raysim.toolkit.prototypes import ClassMeans, weighted_means
from raysim.weights import PARTS
from tests.conftest import tiny_config

SETUP = {"algo": "fedfcd", "participation": 1.0, "clients": 6, "rounds": 2, "train.local_epochs": 2}


def _executor(tmp_path, **changes):
    cfg = tiny_config(tmp_path, **{**SETUP, **changes})
    return SerialExecutor(cfg, prepare(cfg))


class Received:
    """Keeps everything the server receives, round 0 included."""

    def __init__(self, host):
        self.rounds: dict[int, list] = {}
        inner = host.aggregate

        def aggregate(rnd, results):
            self.rounds[rnd] = [r for jr in results for r in jr.results]
            return inner(rnd, results)

        host.aggregate = aggregate


def test_only_class_means_and_counts_leave_a_client_and_lfrs_come_before_round_1(tmp_path):
    ex = _executor(tmp_path)
    seen = Received(ex.server)
    # as the runner does: round 0 over every client (the ExtraRounds prologue), then round 1
    ex.train_round(0, list(range(6)))
    ex.train_round(1, list(range(6)))
    assert sorted(r.client for r in seen.rounds[0]) == list(range(6))
    for rnd in (0, 1):
        for r in seen.rounds[rnd]:
            assert r.weights is None  # no extractor, no head
            assert isinstance(r.extra, ClassMeans)
            assert r.extra.means.shape == (10, 100) and r.extra.counts.shape == (10,)
    assert all(r.train_loss == 0.0 for r in seen.rounds[0])  # round 0 trains nothing
    counts = ex.data.train_label_counts()
    np.testing.assert_array_equal(
        np.stack([r.extra.counts for r in seen.rounds[1]]), counts[[r.client for r in seen.rounds[1]]]
    )


def test_theta_step_leaves_phi_and_phi_step_leaves_theta_and_the_global_head_never_trains(
    tmp_path, monkeypatch
):
    ex = _executor(tmp_path)
    ex.train_round(0, list(range(6)))
    calls = []
    inner = ClientContext.train

    def spy(self, parts, lr, **kw):
        before = self.weights(PARTS)
        stats = inner(self, parts, lr, **kw)
        calls.append((tuple(parts), before, self.weights(PARTS)))
        return stats

    monkeypatch.setattr(ClientContext, "train", spy)
    ex.train_round(1, [0])
    assert [c[0] for c in calls] == [("extractor", "filter"), ("phead",)] * 2  # two epochs, alternating
    for parts, before, after in calls:
        changed = {p for p in PARTS if not np.array_equal(before.part(p), after.part(p))}
        assert "head" not in changed  # phi_g is frozen on the client
        if parts == ("phead",):
            assert changed == {"phead"}  # theta_i untouched in the phi step
        else:
            assert changed == {"extractor"}  # phi_i untouched in the theta step (no filter in mlp_fcd)


def test_without_alternation_theta_and_phi_train_together(tmp_path, monkeypatch):
    ex = _executor(tmp_path, **{"algo.alternate": False})
    ex.train_round(0, list(range(6)))
    calls = []
    inner = ClientContext.train
    monkeypatch.setattr(
        ClientContext,
        "train",
        lambda self, parts, lr, **kw: calls.append(tuple(parts)) or inner(self, parts, lr, **kw),
    )
    ex.train_round(1, [0])
    assert calls == [("extractor", "filter", "phead")] * 2


def test_the_global_head_changes_on_the_server_only(tmp_path):
    ex = _executor(tmp_path)
    head0 = ex.server.state.head
    ex.train_round(0, list(range(6)))
    head1 = ex.server.state.head
    assert not head1.equals(head0)  # trained on the initial LFRs
    ex.train_round(1, list(range(6)))
    assert not ex.server.state.head.equals(head1)
    shown = ex.server.evaluation().payload  # the head and the GFR a newcomer trains on
    assert shown.head.equals(ex.server.state.head) and np.array_equal(shown.gfr, ex.server.state.gfr)


def test_gfr_is_the_count_weighted_mean_of_lfrs():
    means = np.array([[[1.0, 0.0], [0.0, 0.0]], [[3.0, 2.0], [5.0, 5.0]]])  # (K=2, C=2, d=2)
    counts = np.array([[1, 0], [3, 2]])
    gfr, mask = weighted_means(ClassMeans(means, counts))
    np.testing.assert_allclose(gfr, [[(1 * 1 + 3 * 3) / 4, (0 + 3 * 2) / 4], [5.0, 5.0]])
    np.testing.assert_array_equal(mask, [True, True])
    gfr, mask = weighted_means(ClassMeans(means[:1], counts[:1]))
    np.testing.assert_array_equal(mask, [True, False])  # nobody holds class 1: no GFR for it


def test_server_gfr_uses_every_clients_latest_lfrs(tmp_path):
    ex = _executor(tmp_path)
    ex.train_round(0, list(range(6)))
    s = ex.server.state
    gfr, mask = weighted_means(s.lfr)
    np.testing.assert_allclose(s.gfr, gfr)
    np.testing.assert_array_equal(s.lfr.counts, ex.data.train_label_counts())


def _train_once(tmp_path, lam, gfr_scale):
    ex = _executor(tmp_path, **{"algo.lambda": lam})
    ex.train_round(0, list(range(6)))
    s = ex.server.state
    payload = FCDPayload(s.head, s.gfr * gfr_scale, s.gfr_mask, 0.05)
    return ex.runtime.run_chain(1, [0], payload, None)[0], ex.runtime.kept(0)


@pytest.mark.parametrize("lam, same", [(0.0, True), (1.0, False)])
def test_lambda_zero_removes_the_alignment_term(tmp_path, lam, same):
    _, a = _train_once(tmp_path / "a", lam, 1.0)
    _, b = _train_once(tmp_path / "b", lam, 3.0)  # another GFR changes training only through R_i
    assert a.equals(b) == same


def test_fusion_sums_global_and_local_logits_and_can_be_turned_off(tmp_path):
    import torch

    for fusion in (True, False):
        ex = _executor(tmp_path / str(fusion), **{"algo.fusion": fusion})
        model = ex.runtime.model
        x = torch.randn(5, 1, 8, 8)
        out = ex.server.evaluation().forward(ex.runtime.algo, model)(x)
        z = model.extractor(x)
        expected = model.head(z) + model.phead(z) if fusion else model.phead(z)
        torch.testing.assert_close(out, expected)


def test_fedfcd_learns_and_reports_no_global_model(tmp_path):
    result = run_experiment(tiny_config(tmp_path, **{**SETUP, "rounds": 4}))
    assert result.final["gm_gtest"] is None and result.final["gm_ptest"] is None
    assert result.final["lm_ptest"] > 0.6
    fedavg = run_experiment(tiny_config(tmp_path / "avg", **{**SETUP, "algo": "fedavg", "rounds": 1}))
    assert result.rows[-1]["bytes_up"] < fedavg.rows[-1]["bytes_up"] / 5  # prototypes, not weights


@pytest.mark.parametrize(
    ("dataset", "classes", "shape"),
    [("fmnist", 10, (1, 28, 28)), ("cifar10", 10, (3, 32, 32)), ("cifar100", 100, (3, 32, 32))],
)
def test_fedfcds_paper_setup_keeps_the_rate_constant_on_every_dataset(dataset, classes, shape):
    """Sec. 4.1: the clients' rate "is set to 0.01", with no schedule; the default decay would have
    left 6.6e-5 of it by round 500."""
    from algorithms.fedfcd import FedFCD
    from raysim.registry import DatasetInfo

    setup = FedFCD.paper_setup(DatasetInfo(dataset, classes, shape, 50_000, 10_000))
    assert (setup["train.lr"], setup["train.lr_decay"], setup["rounds"]) == (0.01, 1.0, 500)
