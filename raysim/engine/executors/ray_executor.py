"""The Ray executor: jobs on client-worker actors, the server logic in a server actor.

Each client worker asks for a share of a CPU or a fraction of a GPU and hosts many virtual clients
(:mod:`~raysim.engine.executors.placement` says where they live and where jobs run). The dataset goes into
the object store once and every worker reads it zero-copy. A chain whose clients live on several
workers runs as segments, each segment's result passed to the next worker as an ObjectRef that never
visits the driver. A worker's chains that start from a payload go to it in one call, which trains
them side by side on its job slots (:mod:`~raysim.engine.executors.slots`), and so do its batches of
unpinned jobs (``train.batch_clients``), trained one batch after another. What goes to which worker in
which order is a pure plan (:mod:`~raysim.engine.executors.schedule`); this executor submits it, collects
the results and replaces workers that die (:mod:`~raysim.engine.executors.recovery`).

The executor owns its Ray session (:mod:`~raysim.engine.executors.session`): :meth:`RayExecutor.start`
starts local Ray or joins a cluster, and the client workers' actors, while the data loads, and
:meth:`RayExecutor.shutdown` stops Ray if it started it. On a cluster it joined, each node that hosted
its actors then starts as many idle worker processes for the next run (``ray.prestart_s``,
:func:`~raysim.engine.executors.session.prestart_workers`). Inside a Ray session someone else started
(a suite's trial, a test), it uses that session and leaves it running.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from raysim.capabilities.batching import Batching
from raysim.capabilities.presum import PRESUM_MIN_JOBS, SUM_BLOCK, Presum
from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.engine.executors import session
from raysim.engine.executors.actors import Block, ServerActor, config_errors_first, pieces_of
from raysim.engine.executors.base import DataLoader
from raysim.engine.executors.evaluation import (
    accuracy_of,
    assemble_report,
    eval_targets,
    evaluated_clients,
    split_targets,
    validated,
    validation_target,
)
from raysim.engine.executors.placement import lpt_assign
from raysim.engine.executors.recovery import WorkerPool, leave_idle, server_get, take_idle
from raysim.engine.executors.schedule import (
    BatchCall,
    BatchesCall,
    Call,
    JobsCall,
    Member,
    RoundPlan,
    next_wave,
    plan_round,
)
from raysim.engine.experiment import Experiment
from raysim.internals import internals_on
from raysim.records import EvalReport, RoundStats, Snapshot
from raysim.toolkit.aggregate import upload_coefficients
from raysim.wire import ClientStats, Job

log = logging.getLogger(__name__)


class RayExecutor:
    """See the module docstring. ``owns_ray``: this executor started Ray and stops it at the end."""

    def __init__(
        self,
        experiment: ExperimentConfig | Experiment,
        data: FederatedData,
        num_workers: int,
        owns_ray: bool = False,
        pool: WorkerPool | None = None,
    ) -> None:
        """``experiment``: checked by the runner, or a bare config (its algorithm resolved here);
        ``pool``: the client workers, started already (:meth:`start` starts them while the data
        loads), else started here."""
        import ray

        exp = Experiment.of(experiment)
        cfg = self.cfg = exp.cfg
        self.num_workers = num_workers
        self.owns_ray = owns_ray
        algo_cls = exp.algorithm
        self.has_global = algo_cls.evaluates_global(cfg)
        self.batch_pinned = Batching.of(algo_cls).pinned
        self.presum = Presum.applies(algo_cls, cfg)  # uploads summed on the workers, in blocks
        self._coeffs: Any = None  # this round's upload coefficients, when its blocks are summed on the workers
        self._presums: dict[int, tuple[Any, int]] = {}  # this round's worker sums, by their block's first job
        self.has_personal = algo_cls.evaluates_personal(cfg)
        self.sizes = [int(s.size) for s in data.client_train]
        # the workers' processes (started by :meth:`start` already, or now) import PyTorch while the
        # data goes into the store
        self.pool = pool if pool is not None else WorkerPool(cfg, num_workers)
        self.pool.place(lpt_assign([float(s) for s in self.sizes], num_workers))
        data_ref = ray.put(data)  # once; workers read the arrays zero-copy
        # the driver keeps the object-store copy too, not a private one of its own
        self.data: FederatedData = ray.get(data_ref)
        stats = ClientStats.from_label_counts(data.train_label_counts(), data.train.input_shape)
        setups = self.pool.setup(data_ref)
        # the server starts from worker 0's seeded initial weights (an ObjectRef that Ray resolves
        # once worker 0 is set up); it needs no model, and so no PyTorch, of its own
        init_weights = self.pool.workers[0].initial_weights.remote()
        idle = take_idle("server", 0, 0) if cfg.ray.reuse_workers else None
        if idle is not None:
            idle.reuse.remote(cfg, stats)
            self.server: Any = idle
        else:
            server_cls: Any = ray.remote(ServerActor)
            self.server = server_cls.options(num_cpus=0).remote(cfg, stats)
        server_setup = self.server.setup.remote(init_weights)
        placed: list[tuple[str, str]] = config_errors_first(setups)
        [self.server_node] = config_errors_first([server_setup])  # e.g. a model too small for FedDr+'s ETF
        self.devices = [d for d, _ in placed]  # each worker's torch device, e.g. "cuda" on a GPU share
        self.nodes = [n for _, n in placed]  # each worker's Ray node
        # the last good server state: of the last completed round (committed) and of this round so far
        self.completed = -1
        self.server_state: Any = self.server.get_state.remote()
        self.committed_server_state: Any = self.server_state
        log.info(
            "%d client workers ready on %d node(s) (%s)",
            num_workers,
            len(set(self.nodes)),
            ", ".join(sorted(set(self.devices))),
        )

    @classmethod
    def start(cls, experiment: Experiment, load_data: DataLoader) -> RayExecutor:
        """Start local Ray (or join the configured cluster, or use the Ray session already running
        here) and the client workers' actors, then ask for the data (the runner's loads in a thread
        of its own meanwhile) and set the actors up on it. Where the data fails, its error is the
        one raised."""
        cfg = experiment.cfg
        internals_on()  # a mistyped RAYSIM_INTERNALS refused before Ray starts or the data is asked for
        started = False
        pool: WorkerPool | None = None
        try:
            try:
                started = session.start_ray(cfg)
                workers = session.default_workers(cfg)
                session.check_resources(cfg, workers)
                pool = WorkerPool(cfg, workers)
            finally:
                data = load_data()
            return cls(experiment, data, workers, owns_ray=started, pool=pool)
        except BaseException:
            if started:
                session.stop_ray()
            elif pool is not None:  # a Ray session that stays: the actors go
                pool.shutdown()
            raise

    @property
    def restarts(self) -> int:
        return self.pool.restarts

    @property
    def home(self) -> list[int]:
        return self.pool.home

    @property
    def workers(self) -> list[Any]:
        return self.pool.workers

    # ---- rounds

    def train_round(self, rnd: int, sampled: Sequence[int] | None = None) -> RoundStats:
        """The server's plan for the round (over the clients it samples, or ``sampled``),
        scheduled (:mod:`~raysim.engine.executors.schedule`) and submitted wave by wave until every
        segment is done (a failed call's segments go again, on a replacement worker); then the
        server aggregates (in async mode, plan and aggregate again until the server's step is
        known, and its arrivals' memories go to their clients' workers), and the global model is
        validated if the algorithm asks."""
        stats = self._train(rnd, sampled)
        while stats.pending:
            stats = self._train(rnd, sampled)
        if stats.commits:
            self._commit()
        return validated(stats, rnd, self.validate)

    def _commit(self) -> None:
        """The last async step's arrivals' memories, written on their clients' home workers."""
        import ray

        clients_ref, memories = self.server.take_commits.options(num_returns=2).remote()
        clients: list[int] = server_get(clients_ref)
        by_worker: dict[int, list[int]] = {}
        for c in clients:
            by_worker.setdefault(self.pool.home[c], []).append(c)
        ray.get([self.pool.workers[w].import_states.remote([cs], memories) for w, cs in by_worker.items()])
        self.pool.latest.update(dict.fromkeys(clients, memories))

    def _train(self, rnd: int, sampled: Sequence[int] | None) -> RoundStats:
        import ray

        planned: list[Job] = server_get(self.server.plan.remote(rnd, None if sampled is None else list(sampled)))
        blocked = (
            self.presum
            and len(planned) >= PRESUM_MIN_JOBS
            and all(not j.pinned and len(j.clients) == 1 for j in planned)
        )
        plan = plan_round(
            planned,
            self.cfg.train.batch_clients,
            self.batch_pinned,
            self.pool.home,
            self.sizes,
            self.num_workers,
            block=SUM_BLOCK if blocked else None,
        )
        self._coeffs = upload_coefficients([self.sizes[j.clients[-1]] for j in planned]) if blocked else None
        self._presums = {}
        results: list[list[Any]] = [[None] * len(segs) for segs in plan.placement]
        done: set[tuple[int, int]] = set()
        homecoming: list[Any] = []
        while calls := next_wave(plan, done):
            # each call's memories ref and count ref (the count resolves once the call is done)
            submitted = [self._submit(rnd, plan, call, results) for call in calls]
            failure: BaseException | None = None
            for call, (states, count) in zip(calls, submitted, strict=True):
                try:
                    ray.get(count)
                except ray.exceptions.RayError as e:
                    failure = failure or e
                    continue
                for m in call.members:
                    done.add(m.key)
                    pinned_batch = plan.pinned_batch[m.unit]
                    if plan.jobs[m.unit].pinned or pinned_batch:  # clients whose memory lives on a home worker
                        self.pool.latest.update(dict.fromkeys(m.clients, states))
                    if pinned_batch:
                        homecoming += self._send_home(m.worker, m.clients, states)
            if failure is not None:
                self.pool.recover(failure, self.server)
        refs, segments, presums = pieces_of(plan.per_planned_job(results), self._presums)
        stats_ref, state_ref = self.server.aggregate.options(num_returns=2).remote(rnd, segments, presums, *refs)
        stats: RoundStats = server_get(stats_ref)
        ray.get(homecoming)
        self.server_state = state_ref
        return stats

    def _submit(self, rnd: int, plan: RoundPlan, call: Call, results: list[list[Any]]) -> tuple[Any, Any]:
        """Submit ``call``; its members' results refs go into ``results``. Returns the refs of the
        memories it leaves and of its count."""
        worker = self.pool.workers[call.worker]
        if isinstance(call, JobsCall):  # first segments, each from its job's payload
            payloads, which, firsts, sums = self._gathered(plan, call.members)
            specs = [(m.clients, k) for m, k in zip(call.members, which, strict=True)]
            bundle, states, count = worker.run_jobs.options(num_returns=3).remote(rnd, specs, sums, *payloads)
            for i, m in enumerate(call.members):
                results[m.unit][m.segment] = (bundle, i)
            self._presums.update({first: (bundle, k) for k, first in enumerate(firsts)})
            return states, count
        if isinstance(call, BatchesCall):  # a worker's unpinned batches, each from its payload
            payloads, which, firsts, sums = self._gathered(plan, call.members)
            batches = [(list(chains), k) for chains, k in zip(call.chains, which, strict=True)]
            bundle, states, count = worker.run_batches.options(num_returns=3).remote(rnd, batches, sums, *payloads)
            at = 0
            for m, chains in zip(call.members, call.chains, strict=True):
                results[m.unit][m.segment] = [(bundle, at + i) for i in range(len(chains))]
                at += len(chains)
            self._presums.update({first: (bundle, k) for k, first in enumerate(firsts)})
            return states, count
        m = call.member
        if isinstance(call, BatchCall):  # pinned: the members' memories from their homes, before the batch
            self._bring(call.worker, m.clients)
            bundle, states, count = worker.run_batch.options(num_returns=3).remote(
                rnd, list(call.chains), plan.jobs[m.unit].payload
            )
            results[m.unit][m.segment] = [(bundle, i) for i in range(len(call.chains))]
            return states, count
        prev = results[m.unit][m.segment - 1]  # the segment before: a ref, or a bundle's and a place in it
        prev_ref, index = prev if isinstance(prev, tuple) else (prev, None)
        res, states, count = worker.run_chain.options(num_returns=3).remote(
            rnd, m.clients, plan.jobs[m.unit].payload, prev_ref, index
        )
        results[m.unit][m.segment] = res
        return states, count

    def _gathered(self, plan: RoundPlan, members: Sequence[Member]) -> tuple[list[Any], list[int], list[int], list[Block]]:
        """What a call of ``members`` that each start from their job's payload takes: the payloads,
        each once; each member's payload among them; and the blocks the call holds whole
        (:meth:`_blocks`: their first planned jobs, and the blocks to sum)."""
        payloads = list(dict.fromkeys(plan.jobs[m.unit].payload for m in members))
        which = [payloads.index(plan.jobs[m.unit].payload) for m in members]
        return payloads, which, *self._blocks(plan, [plan.units[m.unit] for m in members])

    def _blocks(self, plan: RoundPlan, units: Sequence[Sequence[int]]) -> tuple[list[int], list[Block]]:
        """The blocks of the round's sum that a call holds whole (:mod:`~raysim.capabilities.presum`),
        to sum on its worker: ``units``, the call's jobs as the planned jobs each stands for (a
        ``run_jobs`` call's single jobs; a batch's jobs, one planned job each); returns each block's
        first planned job, and each block's positions among the call's jobs with their
        coefficients. Empty unless the round is summed on the workers."""
        if self._coeffs is None:
            return [], []
        planned_at = [j for unit in units for j in unit]  # the call's jobs, by position
        by_block: dict[int, list[int]] = {}
        for i, j in enumerate(planned_at):
            by_block.setdefault(j // SUM_BLOCK, []).append(i)
        firsts: list[int] = []
        sums: list[Block] = []
        for b, positions in sorted(by_block.items()):
            planned = [planned_at[i] for i in positions]
            if planned != list(range(b * SUM_BLOCK, min((b + 1) * SUM_BLOCK, len(plan.planned)))):
                continue  # not whole here, or not in plan order: the server sums it
            firsts.append(b * SUM_BLOCK)
            sums.append((positions, [float(self._coeffs[j]) for j in planned]))
        return firsts, sums

    def _bring(self, w: int, clients: Sequence[int]) -> None:
        """Worker ``w`` takes the latest memories of those of ``clients`` whose home is elsewhere
        (queued before the batch that needs them: an actor runs its calls in order)."""
        by_ref: dict[Any, list[int]] = {}
        for c in clients:
            if self.pool.home[c] != w and c in self.pool.latest:
                by_ref.setdefault(self.pool.latest[c], []).append(c)
        if by_ref:
            refs = list(by_ref)
            self.pool.workers[w].import_states.remote([by_ref[r] for r in refs], *refs)

    def _send_home(self, w: int, clients: Sequence[int], states: Any) -> list[Any]:
        """Each home worker other than ``w`` takes its clients' memories as a batch on ``w`` left them."""
        by_home: dict[int, list[int]] = {}
        for c in clients:
            if self.pool.home[c] != w:
                by_home.setdefault(self.pool.home[c], []).append(c)
        return [self.pool.workers[h].import_states.remote([cs], states) for h, cs in by_home.items()]

    def evaluate(self, rnd: int) -> EvalReport:
        evaluation = self.server.evaluation.remote()
        targets = eval_targets(self.data) if self.has_global else []
        chunks = split_targets(targets, self.num_workers)
        clients = [evaluated_clients(self.cfg, self.has_personal, self.pool.clients_of(w)) for w in range(self.num_workers)]
        parts = self.pool.on_all(
            lambda w, worker: worker.evaluate.remote(rnd, evaluation, chunks[w], clients[w]), self.server
        )
        return assemble_report(self.data, targets, parts, self.has_global, self.cfg.new_clients)

    def validate(self, rnd: int) -> float:
        """The global model's accuracy on the validation parts, passed back to the server."""
        evaluation = self.server.evaluation.remote()
        chunks = split_targets([validation_target(self.data)], self.num_workers)
        parts = self.pool.on_all(lambda w, worker: worker.evaluate.remote(rnd, evaluation, chunks[w], []), self.server)
        accuracy = accuracy_of(parts)
        state_ref = self.server.observe_validation.remote(rnd, accuracy)
        server_get(state_ref)
        self.server_state = state_ref
        return accuracy

    # ---- checkpoints

    def end_round(self, rnd: int) -> None:
        self.completed = rnd
        self.committed_server_state = self.server_state
        self.pool.commit()

    def snapshot(self) -> Snapshot:
        """Fetched from the object store (the states outlive the actors that made them)."""
        import ray

        refs = self.pool.committed
        unique = list(set(refs.values()))
        parts = dict(zip(unique, ray.get(unique), strict=True))
        server_state = ray.get(self.committed_server_state)
        return Snapshot(self.completed, server_state, {c: parts[ref][c] for c, ref in sorted(refs.items())})

    def restore(self, snapshot: Snapshot) -> None:
        import ray

        calls = [self.server.set_state.remote(snapshot.server_state)]
        for w, worker in enumerate(self.pool.workers):
            part = {c: s for c, s in snapshot.client_states.items() if self.pool.home[c] == w}
            if part:
                ref = ray.put(part)
                calls.append(worker.import_states.remote([list(part)], ref))
                self.pool.latest.update(dict.fromkeys(part, ref))
        server_get(calls[0])
        ray.get(calls[1:])
        self.server_state = self.server.get_state.remote()
        self.end_round(snapshot.round)

    def shutdown(self) -> None:
        import ray

        try:
            # ray.reuse_workers in a session this run did not start: the actors wait for the next run
            keep = self.cfg.ray.reuse_workers and not self.owns_ray
            self.pool.shutdown(keep)
            if keep:
                leave_idle("server", 0, 0, [self.server])
            else:
                ray.kill(self.server)
            if self.owns_ray and self.cfg.ray.prestart_s > 0 and session.joined_cluster():
                # the next run on this cluster starts its actors in processes started now
                hosted = Counter([*self.nodes, self.server_node])
                session.prestart_workers(hosted, self.cfg.ray.prestart_s)
        finally:
            if self.owns_ray:
                session.stop_ray()


__all__ = ["RayExecutor"]
