"""The Ray executor: jobs on client-worker actors, the server logic in a server actor.

Each client worker asks for a share of a CPU or a fraction of a GPU and hosts many virtual clients
(:mod:`~raysim.executors.placement` says where they live and where jobs run). The dataset goes into
the object store once and every worker reads it zero-copy. A chain whose clients live on several
workers runs as segments, each segment's result passed to the next worker as an ObjectRef that never
visits the driver. A worker's chains that start from a payload go to it in one call, which trains
them side by side on its job slots (:mod:`~raysim.executors.slots`). Workers that die are replaced
(:mod:`~raysim.executors.recovery`).

The executor owns its Ray session (:mod:`~raysim.executors.session`): :meth:`RayExecutor.start`
starts local Ray or joins a cluster while the data loads, and :meth:`RayExecutor.shutdown` stops Ray
if it started it. Inside a Ray session someone else started (a suite's trial, a test), it uses that
session and leaves it running.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.executors import session
from raysim.executors.actors import ServerActor, config_errors_first
from raysim.executors.base import DataLoader
from raysim.executors.batching import batch_units
from raysim.executors.evaluation import (
    accuracy_of,
    assemble_report,
    eval_targets,
    split_targets,
    validation_target,
)
from raysim.executors.placement import lpt_assign, place_jobs
from raysim.executors.recovery import WorkerPool, server_get
from raysim.experiment import algorithm_class
from raysim.records import EvalReport, RoundStats, Snapshot
from raysim.wire import ClientStats, Job

log = logging.getLogger(__name__)

#: a chain segment of a round: (job, segment, its clients)
Member = tuple[int, int, tuple[int, ...]]


class RayExecutor:
    """See the module docstring. ``owns_ray``: this executor started Ray and stops it at the end."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, num_workers: int, owns_ray: bool = False) -> None:
        import ray

        self.cfg = cfg
        self.num_workers = num_workers
        self.owns_ray = owns_ray
        algo_cls = algorithm_class(cfg.algo)
        self.has_global = algo_cls.has_global_model
        self.batches_pinned = algo_cls.batches_pinned
        self.has_personal = algo_cls.evaluates_personal(cfg)
        self.sizes = [int(s.size) for s in data.client_train]
        data_ref = ray.put(data)  # once; workers read the arrays zero-copy
        # the driver keeps the object-store copy too, not a private one of its own
        self.data: FederatedData = ray.get(data_ref)
        stats = ClientStats.from_label_counts(data.train_label_counts(), data.train.input_shape)
        self.pool = WorkerPool(cfg, data_ref, lpt_assign([float(s) for s in self.sizes], num_workers), num_workers)
        setups = [w.setup.remote() for w in self.pool.workers]
        # the server starts from worker 0's seeded initial weights (an ObjectRef that Ray resolves
        # once worker 0 is set up); it needs no model, and so no PyTorch, of its own
        init_weights = self.pool.workers[0].initial_weights.remote()
        server_cls: Any = ray.remote(ServerActor)
        self.server = server_cls.options(num_cpus=0).remote(cfg, stats)
        server_setup = self.server.setup.remote(init_weights)
        placed: list[tuple[str, str]] = config_errors_first(setups)
        config_errors_first([server_setup])  # e.g. a model too small for FedDr+'s ETF
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
    def start(cls, cfg: ExperimentConfig, load_data: DataLoader) -> RayExecutor:
        """Start local Ray (or join the configured cluster, or use the Ray session already running
        here) while the data loads in a thread (both are mostly waiting), then the actors."""
        started = False
        try:
            with ThreadPoolExecutor(1) as threads:
                loading = threads.submit(load_data)
                try:
                    started = session.start_ray(cfg)
                finally:
                    data = loading.result()
            workers = session.default_workers(cfg)
            session.check_resources(cfg, workers)
            return cls(cfg, data, workers, owns_ray=started)
        except BaseException:
            if started:
                session.stop_ray()
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

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats:
        import ray

        planned: list[Job] = server_get(self.server.plan.remote(rnd, list(sampled)))
        # jobs trained together (train.batch_clients) run as one unit on one worker: an unpinned
        # batch where the round's load is lightest, a pinned one on its first client's home worker,
        # the others' memories brought there and sent home afterwards
        units = batch_units(planned, self.cfg.train.batch_clients, self.batches_pinned)
        jobs = [
            planned[u[0]] if len(u) == 1 else Job(tuple(c for j in u for c in planned[j].clients), planned[u[0]].payload)
            for u in units
        ]
        placement = place_jobs(jobs, self.pool.home, self.sizes, self.num_workers)
        pinned_batch = [len(u) > 1 and planned[u[0]].pinned for u in units]
        for u, pinned in enumerate(pinned_batch):
            if pinned:
                placement[u] = [(self.pool.home[jobs[u].clients[0]], 0, len(jobs[u].clients))]
        homecoming: list[Any] = []
        results: list[list[Any]] = [[None] * len(segs) for segs in placement]
        done: list[list[bool]] = [[False] * len(segs) for segs in placement]
        while True:
            # Submit in waves of chain position: a segment only waits for segments that start
            # earlier, so no worker's queue can block on a segment queued behind it (no deadlock).
            todo = sorted(
                (segs[s][1], j, s) for j, segs in enumerate(placement) for s in range(len(segs)) if not done[j][s]
            )
            if not todo:
                break
            # each submission: its (job, segment, clients) members, their memories' ref, its count's ref
            submitted: list[tuple[list[Member], Any, Any]] = []
            # a worker's consecutive chains from a payload go in one call, which trains them on its
            # job slots; each worker's calls keep the order of ``todo``
            open_calls: dict[int, list[Member]] = {}
            for _, j, s in todo:
                w, start, stop = placement[j][s]
                clients = tuple(jobs[j].clients[start:stop])
                if len(units[j]) == 1 and s == 0:
                    open_calls.setdefault(w, []).append((j, s, clients))
                    continue
                # before a worker's next call, its open one; before a later segment, every open one
                # (the segment before it may be in one)
                for v in [w] if s == 0 else list(open_calls):
                    if v in open_calls:
                        submitted.append(self._run_jobs(v, rnd, open_calls.pop(v), jobs, results))
                if len(units[j]) > 1:
                    chains = [planned[i].clients for i in units[j]]
                    if pinned_batch[j]:  # the members' memories from their homes, before the batch
                        self._bring(w, clients)
                    refs = (
                        self.pool.workers[w]
                        .run_batch.options(num_returns=len(chains) + 2)
                        .remote(rnd, chains, jobs[j].payload)
                    )
                    results[j][s] = list(refs[:-2])
                    submitted.append(([(j, s, clients)], refs[-2], refs[-1]))
                else:  # a later segment of a chain, from the segment before
                    res, states, count = (
                        self.pool.workers[w]
                        .run_chain.options(num_returns=3)
                        .remote(rnd, clients, jobs[j].payload, results[j][s - 1])
                    )
                    results[j][s] = res
                    submitted.append(([(j, s, clients)], states, count))
            for w, members in open_calls.items():
                submitted.append(self._run_jobs(w, rnd, members, jobs, results))
            failure: BaseException | None = None
            for members, states, count in submitted:
                try:
                    ray.get(count)
                except ray.exceptions.RayError as e:
                    failure = failure or e
                    continue
                for j, s, clients in members:
                    done[j][s] = True
                    if jobs[j].pinned or pinned_batch[j]:  # clients whose memory lives on a home worker
                        self.pool.latest.update(dict.fromkeys(clients, states))
                    if pinned_batch[j]:
                        homecoming += self._send_home(placement[j][s][0], clients, states)
            if failure is not None:
                self.pool.recover(failure, self.server)
        per_job: list[list[Any]] = [[] for _ in planned]  # each planned job's segments, as the server planned them
        for u, unit in enumerate(units):
            if len(unit) > 1:
                for i, j in enumerate(unit):
                    per_job[j] = [results[u][0][i]]
            else:
                per_job[unit[0]] = results[u]
        stats_ref, state_ref = self.server.aggregate.options(num_returns=2).remote(rnd, per_job)
        stats: RoundStats = server_get(stats_ref)
        ray.get(homecoming)
        self.server_state = state_ref
        return stats

    def _run_jobs(
        self, w: int, rnd: int, members: list[Member], jobs: Sequence[Job], results: list[list[Any]]
    ) -> tuple[list[Member], Any, Any]:
        """Worker ``w`` trains ``members`` (first segments, each from its job's payload) in one
        call; each member's results ref goes into ``results``. Returns the submission."""
        payloads = list(dict.fromkeys(jobs[j].payload for j, _, _ in members))  # each payload once
        specs = [(clients, payloads.index(jobs[j].payload)) for j, _, clients in members]
        refs = self.pool.workers[w].run_jobs.options(num_returns=len(members) + 2).remote(rnd, specs, *payloads)
        for (j, s, _), res in zip(members, refs[:-2], strict=True):
            results[j][s] = res
        return members, refs[-2], refs[-1]

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
        payload = self.server.eval_payload.remote()
        targets = eval_targets(self.data) if self.has_global else []
        chunks = split_targets(targets, self.num_workers)
        clients = [self.pool.clients_of(w) if self.has_personal else [] for w in range(self.num_workers)]
        parts = self.pool.on_all(
            lambda w, worker: worker.evaluate.remote(rnd, payload, chunks[w], clients[w]), self.server
        )
        return assemble_report(self.data, targets, parts, self.has_global)

    def validate(self, rnd: int) -> float:
        payload = self.server.eval_payload.remote()
        chunks = split_targets([validation_target(self.data)], self.num_workers)
        parts = self.pool.on_all(lambda w, worker: worker.evaluate.remote(rnd, payload, chunks[w], []), self.server)
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
            self.pool.shutdown()
            ray.kill(self.server)
        finally:
            if self.owns_ray:
                session.stop_ray()


__all__ = ["RayExecutor"]
