"""Uploads summed on the workers (raysim.capabilities.presum): a round's sum in blocks
that depend on the plan alone, the same bit for bit wherever each block is summed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from raysim.capabilities.presum import PRESUM_MIN_JOBS, SUM_BLOCK, Presum
from raysim.engine.executors.placement import place_blocks
from raysim.engine.executors.schedule import next_wave, plan_round
from raysim.engine.runner import run_experiment
from raysim.registry import ALGORITHMS
from raysim.toolkit.aggregate import average_uploads, block_sum, upload_coefficients, weighted_mean
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, Job, JobResult
from tests.conftest import tiny_config, without_times


def uploads(n: int, seed: int = 0) -> list[JobResult]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        w = ModelWeights(extractor=rng.normal(size=37).astype(np.float32), head=rng.normal(size=5).astype(np.float32))
        out.append(JobResult(Job((k,), None), (ClientResult(k, int(rng.integers(1, 60)), 0.0, w),)))
    return out


def as_worker_sums(results: list[JobResult]) -> list[JobResult]:
    """``results`` as a Ray round summed on the workers leaves them: each block's sum on its first
    job (computed with the coefficients the driver sends), every upload left out."""
    c = upload_coefficients([jr.final.num_samples for jr in results])
    out = []
    for j, jr in enumerate(results):
        presum = None
        if j % SUM_BLOCK == 0:
            block = results[j : j + SUM_BLOCK]
            presum = block_sum([b.final.weights for b in block], [float(x) for x in c[j : j + SUM_BLOCK]])
        final = dataclasses.replace(jr.final, weights=None)
        out.append(JobResult(jr.job, (final,), presum))
    return out


def same(a: ModelWeights, b: ModelWeights) -> bool:
    return a.part_names == b.part_names and all(
        np.array_equal(getattr(a, n), getattr(b, n)) and getattr(a, n).dtype == getattr(b, n).dtype
        for n in a.part_names
    )


@pytest.mark.parametrize("n", [1, SUM_BLOCK, SUM_BLOCK + 1, 5 * SUM_BLOCK + 3])
def test_worker_sums_give_the_servers_average_bit_for_bit(n):
    results = uploads(n, seed=n)
    assert same(average_uploads(as_worker_sums(results)), average_uploads(results))


def test_a_round_of_one_block_is_the_flat_weighted_mean_and_more_blocks_sum_in_order():
    results = uploads(SUM_BLOCK)
    sizes = [jr.final.num_samples for jr in results]
    flat = weighted_mean([jr.final.weights for jr in results], sizes)
    assert same(average_uploads(results), flat)
    more = uploads(3 * SUM_BLOCK + 2, seed=7)
    c = upload_coefficients([jr.final.num_samples for jr in more])
    parts = [block_sum([jr.final.weights for jr in more[b : b + SUM_BLOCK]], c[b : b + SUM_BLOCK])
             for b in range(0, len(more), SUM_BLOCK)]  # fmt: skip
    by_hand = (((parts[0].extractor + parts[1].extractor) + parts[2].extractor) + parts[3].extractor).astype(np.float32)
    assert np.array_equal(average_uploads(more).extractor, by_hand)
    assert np.allclose(by_hand, sum(ck * jr.final.weights.extractor.astype(np.float64) for ck, jr in zip(c, more, strict=True)))


def test_a_worker_sums_each_block_as_its_jobs_finish_in_any_order():
    """BlockSums (a run_jobs call on a worker with job slots): jobs finish out of order, each upload
    is added once the jobs before it in its block are, and the sums equal block_sum's over each
    block in order, bit for bit. The block's results lose their weights, other jobs keep theirs."""
    from raysim.engine.executors.actors import BlockSums

    results = uploads(2 * SUM_BLOCK + 3, seed=3)
    c = upload_coefficients([jr.final.num_samples for jr in results])
    blocks = [(list(range(b, b + SUM_BLOCK)), [float(x) for x in c[b : b + SUM_BLOCK]]) for b in (0, SUM_BLOCK)]
    sums = BlockSums(blocks)
    kept = {}
    for i in np.random.default_rng(0).permutation(len(results)):  # the order the jobs finish in
        kept[int(i)] = sums.take(int(i), [results[i].final])
    for (positions, coeffs), got in zip(blocks, sums.totals(), strict=True):
        assert same(got, block_sum([results[i].final.weights for i in positions], coeffs))
    assert all(kept[i][-1].weights is None for i in range(2 * SUM_BLOCK))
    assert all(kept[i][-1].weights is results[i].final.weights for i in range(2 * SUM_BLOCK, len(results)))


def test_a_worker_refuses_a_block_job_without_an_upload_or_an_unfinished_block():
    from raysim.engine.executors.actors import BlockSums

    results = uploads(SUM_BLOCK)
    blocks = [(list(range(SUM_BLOCK)), [1.0] * SUM_BLOCK)]
    with pytest.raises(ValueError, match="every client must upload"):
        BlockSums(blocks).take(0, [dataclasses.replace(results[0].final, weights=None)])
    sums = BlockSums(blocks)
    sums.take(1, [results[1].final])
    with pytest.raises(RuntimeError, match="did not all finish"):
        sums.totals()


def test_a_block_without_its_sum_or_uploads_is_refused():
    results = as_worker_sums(uploads(2 * SUM_BLOCK))
    results[SUM_BLOCK] = dataclasses.replace(results[SUM_BLOCK], presum=None)
    with pytest.raises(ValueError, match="every client must upload"):
        average_uploads(results)


@pytest.mark.parametrize(
    ("algo", "changes", "applies"),
    [
        ("fedavg", {}, True),
        ("fedprox", {}, True),
        ("fedntd", {}, True),
        ("fedexp", {}, False),  # its own aggregate (the extrapolated step)
        ("fedbuff", {}, False),
        ("ditto", {}, False),  # pinned: personal models on home workers
        ("fedper", {}, False),
        ("local", {}, False),  # nothing shared
        ("fedavg", {"train.batch_clients": 4}, True),  # a batch's whole blocks, on its worker
        ("fedavg", {"deployment.dropout": 0.2}, False),
        ("fedavg", {"deployment.preset": "stragglers"}, False),
    ],
)
def test_which_rounds_may_be_summed_on_the_workers(algo, changes, applies):
    cfg = tiny_config(algo=algo, **changes)
    assert Presum.applies(ALGORITHMS.get(algo), cfg) is applies


def test_blocks_are_placed_whole_and_balanced():
    jobs = [Job((c,), None) for c in range(50)]
    segs = place_blocks(jobs, [20] * 50, 2, SUM_BLOCK)
    where = [s[0][0] for s in segs]
    for b in range(0, 50, SUM_BLOCK):
        assert len(set(where[b : b + SUM_BLOCK])) == 1
    assert abs(where.count(0) - where.count(1)) <= SUM_BLOCK
    plan = plan_round(jobs, 1, False, [0] * 50, [20] * 50, 2, block=SUM_BLOCK)
    calls = next_wave(plan)
    assert sorted(len(call.members) for call in calls) == sorted([where.count(0), where.count(1)])
    pinned = [Job((c,), None, pinned=True) for c in range(50)]
    assert plan_round(pinned, 1, False, [c % 2 for c in range(50)], [20] * 50, 2, block=SUM_BLOCK).placement == (
        plan_round(pinned, 1, False, [c % 2 for c in range(50)], [20] * 50, 2).placement
    )


@pytest.mark.ray
def test_fedavg_summed_on_workers_equals_serial(tmp_path, ray_local, executors):
    """Rounds of 40 one-step clients: Ray (2 workers; 1 worker with 2 job slots) sums every block on
    the workers, and every number equals the serial run's."""
    setup = {"clients": 80, "participation": 0.5, "rounds": 2, "data.partition": "iid", "data.synthetic.train_samples": 1600}
    assert round(80 * 0.5) >= PRESUM_MIN_JOBS
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    for workers, cpus in ((2, 1), (1, 2)):
        changes = {"ray.executor": "ray", "ray.workers": workers, "ray.cpus_per_worker": cpus}
        ray_run = run_experiment(tiny_config(tmp_path / f"r{workers}", **setup, **changes))
        assert sorted(executors[-1]._presums) == list(range(0, 40, SUM_BLOCK)), workers  # the last round's
        assert without_times(ray_run.rows) == without_times(serial.rows), workers


@pytest.mark.parametrize("name", ["cnn3p2_fmnist", "mlp_fcd", "cnn_pac", "cnn_fcd", "resnet18", "mobilenet", "vgg11"])
def test_a_parts_flat_layout_is_its_state_dicts(name):
    """float_tensors reads a part's tensors without building a state dict: the same tensors, in
    state_dict's order, BatchNorm statistics included (resnet18, mobilenet)."""
    from raysim.models import PARTS, build_model, float_tensors

    shape = (3, 32, 32) if name in ("resnet18", "mobilenet", "vgg11") else (1, 28, 28)
    model = build_model(name, shape, 10, 0)
    for part in PARTS:
        module = model.part(part)
        expected = [t for t in module.state_dict(keep_vars=True).values() if t.is_floating_point()]
        got = float_tensors(module)
        assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected, strict=True)), part


def test_a_shared_module_is_laid_out_twice_as_in_its_state_dict():
    from torch import nn

    from raysim.models import float_tensors

    lin = nn.Linear(3, 2)
    module = nn.Sequential(lin, nn.ReLU(), lin, nn.BatchNorm1d(2))
    expected = [t for t in module.state_dict(keep_vars=True).values() if t.is_floating_point()]
    got = float_tensors(module)
    assert len(got) == len(expected) == 8 and all(a is b for a, b in zip(got, expected, strict=True))


@pytest.mark.ray
@pytest.mark.parametrize(("k", "summed"), [(16, [0, 8, 16, 24, 32]), (12, [0, 16, 24])])
def test_batched_fedavg_summed_on_workers_equals_serial(tmp_path, ray_local, executors, k, summed):
    """Rounds of 40 one-step clients trained K at a time: each batch's worker sums the blocks the
    batch holds whole (every block with K = 16; with K = 12 the blocks that two batches share are
    summed on the server from their uploads), and every number equals the serial batched run's."""
    setup = {
        "clients": 80, "participation": 0.5, "rounds": 2, "data.partition": "iid",
        "data.synthetic.train_samples": 1600, "train.batch_clients": k,
    }  # fmt: skip
    serial = run_experiment(tiny_config(tmp_path / "s", **setup))
    changes = {"ray.executor": "ray", "ray.workers": 2, "ray.cpus_per_worker": 1}
    ray_run = run_experiment(tiny_config(tmp_path / "r", **setup, **changes))
    assert sorted(executors[-1]._presums) == summed  # the last round's
    assert without_times(ray_run.rows) == without_times(serial.rows)
