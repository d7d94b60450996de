"""Fed3+2p's readings of what the paper leaves open: who trains in a coordinator's chain
(``chain_sampling``), a client's update inside a chain (epochs or steps; momentum restarted or
carried), the phase lengths, and what a run records to compare them (the chains' KL, compute)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from algorithms.grouping import group_kl
from raysim import rng
from raysim.engine.experiment import validate
from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError
from raysim.models import parameter_views
from raysim.toolkit.context import ClientContext
from raysim.toolkit.train import SGDConfig, local_train
from raysim.weights import GLOBAL_PARTS
from tests.algorithms.test_fed3p2 import SETUP, Recorder, _executor
from tests.conftest import tiny_config, without_times

READING = {**SETUP, "clients": 20, "participation": 0.25, "algo.num_type_a": 4}  # coordinators of 5


def _round(tmp_path, mode, rnd=1, **changes):
    """Round ``rnd`` of phase 1 with ``chain_sampling=mode``: (executor, the jobs' results, sampled)."""
    ex = _executor(tmp_path, **{**READING, "rounds": 8, "algo.chain_sampling": mode, **changes})
    rec = Recorder(ex.server)
    sampled = rng.sample_clients(ex.cfg.seed, rnd, ex.cfg.clients, ex.cfg.clients_per_round)
    ex.train_round(rnd, sampled)
    return ex, rec.received[-1], sampled


def _trained(results):
    return sorted(r.client for jr in results for r in jr.results)


def _saw_its_own_data(ex, results, epochs=1):
    """Every chain link trained on its own client's whole training set, ``epochs`` times."""
    for jr in results:
        assert [r.client for r in jr.results] == list(jr.job.clients)
        for r in jr.results:
            assert r.num_samples == ex.data.client_train[r.client].size
            assert r.samples_trained == epochs * r.num_samples


def test_global_chains_each_coordinators_sampled_members(tmp_path):
    ex, results, sampled = _round(tmp_path, "global")
    assert _trained(results) == sorted(sampled) and len(sampled) == 5  # rho N, as FedAvg
    groups = [set(g) for g in ex.server.state.type_a.groups]
    for jr in results:  # each chain lies inside one coordinator
        assert any(set(jr.job.clients) <= g for g in groups)
    _saw_its_own_data(ex, results)


def test_coordinators_train_whole_coordinators_until_rho_n(tmp_path):
    for rnd in (1, 2, 3):
        ex, results, _ = _round(tmp_path / str(rnd), "coordinators", rnd=rnd)
        groups = ex.server.state.type_a.groups
        chains = [set(jr.job.clients) for jr in results]
        assert all(c in [set(g) for g in groups] for c in chains)  # each chain a whole coordinator
        trained = _trained(results)
        assert len(trained) >= ex.cfg.clients_per_round  # at least rho N ...
        assert len(trained) - min(len(c) for c in chains) < ex.cfg.clients_per_round  # ... no more coordinators
        _saw_its_own_data(ex, results)
    ex, results, _ = _round(tmp_path / "half", "coordinators", participation=0.5)
    assert len(_trained(results)) == 10  # two coordinators of 5


def test_all_trains_every_member_of_every_coordinator(tmp_path):
    ex, results, _ = _round(tmp_path, "all")
    assert _trained(results) == list(range(20))  # N, 1/rho times FedAvg's
    assert sorted(tuple(sorted(jr.job.clients)) for jr in results) == sorted(ex.server.state.type_a.groups)
    _saw_its_own_data(ex, results)


def test_regroup_splits_the_sampled_clients_into_balanced_low_kl_chains(tmp_path):
    ex, results, sampled = _round(tmp_path, "regroup", participation=0.6)  # 12 sampled, 4 chains
    assert _trained(results) == sorted(sampled)
    sizes = sorted(len(jr.job.clients) for jr in results)
    assert sizes == [3, 3, 3, 3]
    counts = ex.data.train_label_counts()
    regrouped = group_kl(counts, [jr.job.clients for jr in results], reference=counts[sampled].sum(0))
    # against the chains that the global reading makes of the same clients
    global_chains = [
        [k for k in g if k in set(sampled)] for g in ex.server.state.type_a.groups if set(g) & set(sampled)
    ]
    assert regrouped.mean() < group_kl(counts, global_chains, reference=counts[sampled].sum(0)).mean()
    _saw_its_own_data(ex, results)


def test_chain_kl_and_round_kl_are_logged_in_phase_1(tmp_path):
    cfg = tiny_config(tmp_path, **{**READING, "rounds": 4, "eval.every": 1})
    result = run_experiment(cfg)
    rows = pq.read_table(tmp_path / "metrics.parquet").to_pylist()
    assert [r["phase"] for r in rows] == [1, 1, 2, 2]
    assert all(r["chain_kl"] > 0 and 0 <= r["round_kl"] <= r["chain_kl"] for r in rows[:2])
    assert [r["chain_kl"] for r in rows[2:]] == [None, None]
    assert result.rows[0]["chain_kl"] == rows[0]["chain_kl"]
    ex, results, _ = _round(tmp_path / "x", "global")
    counts = ex.data.train_label_counts()
    want = group_kl(counts, [jr.job.clients for jr in results]).mean()
    assert ex.server.algo.round_scalars(ex.server.state, 1)["chain_kl"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("mode", ["global", "coordinators", "all", "regroup"])
@pytest.mark.ray
def test_every_reading_is_the_same_on_serial_and_ray(tmp_path, ray_local, mode):
    setup = {**READING, "rounds": 3, "eval.every": 1, "algo.chain_sampling": mode, "algo.chain_momentum": "carry"}
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **{"ray.executor": "ray", "ray.workers": 2}))
    assert without_times(ray_run.rows) == without_times(serial.rows)


# ---------------------------------------------------------------------------------------- the update


def _chain_of_two(tmp_path, momentum, **changes):
    ex = _executor(tmp_path, **{**READING, "rounds": 4, "algo.chain_momentum": momentum, **changes})
    job = next(j for j in ex.server.plan(1, list(range(20))) if len(j.clients) >= 2)
    first, second = ex.runtime.run_chain(1, job.clients[:2], job.payload, None)
    return ex, job, first, second


def _by_hand(ex, job, first, client, momentum):
    """Client ``client`` trained from ``first``'s upload with a fresh optimizer whose momentum
    buffers start at ``momentum`` (None: zero)."""
    ctx = ClientContext(ex.runtime, client, 1)
    ctx.load(job.payload.weights.merged(first.weights))
    t = ex.cfg.train
    local_train(
        ctx.model,
        lambda e: ctx.batches(e),
        epochs=t.local_epochs,
        parts=GLOBAL_PARTS,
        sgd=SGDConfig(job.payload.lr, t.momentum, t.weight_decay),
        momentum=None if momentum is None else parameter_views(ctx.model, momentum),
    )
    return ctx.weights(GLOBAL_PARTS)


def test_momentum_carried_along_the_chain_or_restarted(tmp_path):
    ex, job, first, second = _chain_of_two(tmp_path / "carry", "carry")
    # carry: the first client's last momentum buffers travel with its weights ...
    assert first.extra is not None and first.extra.part_names == GLOBAL_PARTS
    assert any(np.abs(a).sum() > 0 for _, a in first.extra.items())
    passed = ex.server.algo.continue_chain(job.payload, first)
    assert passed.momentum is first.extra and passed.weights.equals(job.payload.weights.merged(first.weights))
    # ... and the second client's optimizer starts from them
    assert second.weights.equals(_by_hand(ex, job, first, job.clients[1], first.extra))
    assert second.bytes_down == job.payload.weights.nbytes + first.extra.nbytes

    ex, job, first_r, second_r = _chain_of_two(tmp_path / "restart", "restart")
    assert first_r.extra is None and ex.server.algo.continue_chain(job.payload, first_r).momentum is None
    assert first_r.weights.equals(first.weights)  # the first client is the same either way
    assert second_r.weights.equals(_by_hand(ex, job, first_r, job.clients[1], None))  # zero buffers
    assert not second_r.weights.equals(second.weights)


def test_a_chain_update_of_one_step_is_eq_9(tmp_path):
    """chain_steps=1: W^(k) - eta grad L on one mini-batch (Eq. 9 read literally)."""
    ex, job, first, _ = _chain_of_two(tmp_path, "restart", **{"algo.chain_steps": 1})
    assert first.samples_trained == min(ex.cfg.train.batch_size, first.num_samples)
    ctx = ClientContext(ex.runtime, job.clients[0], 1)
    ctx.load(job.payload.weights)
    x, y = next(iter(ctx.batches(0)))
    import torch

    ctx.model.train()
    ctx.model.zero_grad()
    torch.nn.functional.cross_entropy(ctx.model(x), y).backward()
    eta, wd = job.payload.lr, ex.cfg.train.weight_decay
    with torch.no_grad():
        for p in [q for part in GLOBAL_PARTS for q in ctx.model.part(part).parameters()]:
            p -= eta * (p.grad + wd * p)
    np.testing.assert_allclose(
        np.concatenate([a for _, a in first.weights.items()]),
        np.concatenate([a for _, a in ctx.weights(GLOBAL_PARTS).items()]),
        rtol=0,
        atol=1e-7,
    )
    _, _, two_epochs, _ = _chain_of_two(tmp_path / "e", "restart", **{"algo.chain_epochs": 2})
    assert two_epochs.samples_trained == 2 * two_epochs.num_samples


# ---------------------------------------------------------------------------------------- phases


@pytest.mark.parametrize(
    ("changes", "phases"),
    [
        ({}, [1, 1, 1, 2, 2, 2]),  # T/2
        ({"algo.phase1_rounds": 4}, [1, 1, 1, 1, 2, 2]),
        ({"algo.phase2_rounds": 1}, [1, 1, 1, 1, 1, 2]),
        ({"algo.phase1_rounds": 2, "algo.phase2_rounds": 4}, [1, 1, 2, 2, 2, 2]),
        ({"algo.phase1_rounds": 6}, [1, 1, 1, 1, 1, 1]),  # the GM trains every round
    ],
)
def test_phase_lengths_are_respected(tmp_path, changes, phases):
    result = run_experiment(tiny_config(tmp_path, **{**SETUP, "rounds": 6, "eval.every": 1, **changes}))
    assert [r["phase"] for r in result.rows] == phases
    assert (result.rows[-1]["lm_ptest"] is None) == (phases[-1] == 1)


def test_phases_that_do_not_add_up_are_refused(tmp_path):
    cfg = tiny_config(tmp_path, **{**SETUP, "rounds": 6, "algo.phase1_rounds": 6, "algo.phase2_rounds": 3})
    with pytest.raises(ConfigError, match=r"phases \(6 \+ 3 rounds\) must add up to the rounds \(6\); run 9"):
        validate(cfg)
    for bad, match in (
        ({"algo.chain_sampling": "some"}, "chain_sampling is one of 'global', 'coordinators', 'all', 'regroup'"),
        ({"algo.chain_momentum": "keep"}, "chain_momentum is 'restart' or 'carry'"),
        ({"algo.chain_steps": 1, "algo.chain_epochs": 2}, "chain_epochs or chain_steps, not both"),
        ({"algo.chain_steps": 0}, "chain_steps must be at least 1"),
    ):
        with pytest.raises(ConfigError, match=match):
            validate(tiny_config(tmp_path, **{**SETUP, **bad}))
