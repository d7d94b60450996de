"""Serial and Ray executors: the same interface, the same numbers.

An executor runs a round's jobs (plan on the server, local updates on the clients, aggregate on the
server) and evaluations. :class:`SerialExecutor` does it in-process; :class:`RayExecutor` does it with a
server actor and client-worker actors that each ask for a share of a CPU or a fraction of a GPU and
host many virtual clients.

Placement. A client has a home worker (clients are spread over workers by training-set size, longest
first). Pinned jobs (``Job.pinned``: their clients keep personal state) run on the clients' home
workers, so that state never moves; a chain whose clients live on several workers runs
as segments, each segment's result passed to the next worker as an ObjectRef that never visits the
driver. Unpinned jobs go to the least-loaded worker of the round (longest job first), since where a
job runs does not change its numbers: every random draw is keyed by (seed, round,
client, purpose) and every job trains with the configured number of threads.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from algorithms.base import ClientStats, Job, JobResult, algorithm_class
from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.errors import ConfigError
from raysim.records import ClientEval, EvalPart, EvalReport, EvalTarget, RoundStats
from raysim.weights import ModelWeights

log = logging.getLogger(__name__)


class Executor(Protocol):
    num_workers: int

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats: ...

    def evaluate(self, rnd: int) -> EvalReport: ...

    def validate(self, rnd: int) -> float: ...

    def shutdown(self) -> None: ...


def lpt_assign(costs: Sequence[float], bins: int, loads: list[float] | None = None) -> list[int]:
    """Longest processing time first: each item, largest first, to the least-loaded bin (ties to the
    lower index), starting from ``loads`` (updated in place) if given. Deterministic; returns the
    bin of each item."""
    loads = [0.0] * bins if loads is None else loads
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        b = min(range(bins), key=lambda k: (loads[k], k))
        out[i] = b
        loads[b] += costs[i]
    return out


def eval_targets(data: FederatedData) -> list[EvalTarget]:
    """What the global model must predict: the union of the clients' P-Tests and, when P-Tests are
    not drawn from G-Test (``split`` mode), G-Test too. In ``matched`` mode one pass over G-Test
    gives both ``gm_gtest`` and every ``gm_ptest``."""
    ptest_union = np.unique(np.concatenate(data.client_test)) if data.num_clients else np.zeros(0, np.int64)
    all_gtest = np.arange(len(data.gtest))
    if data.ptest is data.gtest:
        return [EvalTarget("ptest", np.union1d(ptest_union, all_gtest))]
    return [EvalTarget("ptest", ptest_union), EvalTarget("gtest", all_gtest)]


def validation_target(data: FederatedData) -> EvalTarget:
    """The clients' validation parts (indices into ``data.train``)."""
    return EvalTarget(
        "train", np.unique(np.concatenate(data.client_val)) if data.num_clients else np.zeros(0, np.int64)
    )


def accuracy_of(parts: Sequence[EvalPart]) -> float:
    correct = np.concatenate([p.global_correct[0] for p in parts])
    return float(correct.mean()) if correct.size else float("nan")


def split_targets(targets: Sequence[EvalTarget], parts: int) -> list[list[EvalTarget]]:
    """Each target cut into ``parts`` contiguous chunks, one list per worker."""
    out: list[list[EvalTarget]] = [[] for _ in range(parts)]
    for t in targets:
        for w, chunk in enumerate(np.array_split(t.indices, parts)):
            out[w].append(EvalTarget(t.pool, chunk))
    return out


def assemble_report(
    data: FederatedData, targets: Sequence[EvalTarget], parts: Sequence[EvalPart], has_global: bool
) -> EvalReport:
    """Per-client and G-Test counts from the workers' parts (``parts[w]`` answered
    ``split_targets(targets, len(parts))[w]``)."""
    bits = {"ptest": np.zeros(len(data.ptest), bool), "gtest": np.zeros(len(data.gtest), bool)}
    for chunks, part in zip(split_targets(targets, len(parts)), parts, strict=True):
        for t, correct in zip(chunks, part.global_correct, strict=True):
            bits[t.pool][t.indices] = correct
    if data.ptest is data.gtest:
        bits["gtest"] = bits["ptest"]
    personal = dict(p for part in parts for p in part.personal_correct)
    clients = tuple(
        ClientEval(
            client=c,
            n_test=int(data.client_test[c].size),
            gm_correct=int(bits["ptest"][data.client_test[c]].sum()) if has_global else None,
            lm_correct=personal.get(c),
        )
        for c in range(data.num_clients)
    )
    return EvalReport(clients, int(bits["gtest"].sum()) if has_global else None, len(data.gtest))


class SerialExecutor:
    """Everything in this process: one server host, one client runtime for every client."""

    num_workers = 1

    def __init__(self, cfg: ExperimentConfig, data: FederatedData) -> None:
        import torch

        from raysim.client import ClientRuntime
        from raysim.server import ServerHost

        torch.set_num_threads(cfg.train_threads)
        self.cfg = cfg
        self.data = data
        self.runtime = ClientRuntime(cfg, data)
        stats = ClientStats.from_label_counts(data.train_label_counts(), data.train.input_shape)
        self.server = ServerHost(cfg, stats, self.runtime.initial_weights)

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats:
        jobs = self.server.plan(rnd, sampled)
        results = [
            JobResult(job, tuple(self.runtime.run_chain(rnd, job.clients, job.payload, None))) for job in jobs
        ]
        return self.server.aggregate(rnd, results)

    def evaluate(self, rnd: int) -> EvalReport:
        algo = self.runtime.algo
        targets = eval_targets(self.data) if algo.has_global_model else []
        clients = list(range(self.data.num_clients)) if algo.has_personal_model else []
        part = self.runtime.evaluate(rnd, self.server.eval_payload(), targets, clients)
        return assemble_report(self.data, targets, [part], algo.has_global_model)

    def validate(self, rnd: int) -> float:
        part = self.runtime.evaluate(rnd, self.server.eval_payload(), [validation_target(self.data)], [])
        accuracy = accuracy_of([part])
        self.server.observe_validation(rnd, accuracy)
        return accuracy

    def shutdown(self) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# Ray


class ClientWorker:
    """A client-worker actor: hosts the clients whose home it is (and runs stateless jobs).

    The constructor only keeps its arguments; :meth:`setup` builds the runtime, so that bad input
    found there (a model that does not fit the data) reaches the driver as its ConfigError."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, index: int) -> None:
        self.cfg, self.data, self.index = cfg, data, index

    def setup(self) -> str:
        from raysim.client import ClientRuntime
        from raysim.logs import setup_worker_logging

        setup_worker_logging()
        self.runtime = ClientRuntime(self.cfg, self.data)
        self.runtime.warm_up()
        return str(self.runtime.device)

    def initial_weights(self) -> ModelWeights:
        return self.runtime.initial_weights

    def run_chain(self, rnd: int, clients: Sequence[int], payload: Any, prev: Any) -> list[Any]:
        last = prev[-1] if prev else None
        return self.runtime.run_chain(rnd, clients, payload, last)

    def evaluate(
        self, rnd: int, eval_payload: Any, targets: Sequence[EvalTarget], clients: Sequence[int]
    ) -> EvalPart:
        return self.runtime.evaluate(rnd, eval_payload, targets, clients)


class ServerActor:
    """The server actor: a :class:`ServerHost` whose payloads go into the object store once."""

    def __init__(self, cfg: ExperimentConfig, stats: ClientStats, init_weights: ModelWeights) -> None:
        self.args = (cfg, stats, init_weights)
        self._jobs: list[Job] = []

    def setup(self) -> None:
        import ray

        from raysim.logs import setup_worker_logging
        from raysim.server import ServerHost

        setup_worker_logging()
        self.host = ServerHost(*self.args)
        ray.put(np.zeros(1))  # the first put connects to the object store: not in round 1

    def plan(self, rnd: int, sampled: Sequence[int]) -> list[Job]:
        import ray

        self._jobs = self.host.plan(rnd, sampled)
        refs: dict[int, Any] = {}
        out = []
        for job in self._jobs:
            key = id(job.payload)
            if key not in refs:
                refs[key] = ray.put(job.payload)
            out.append(dataclasses.replace(job, payload=refs[key]))
        return out

    def aggregate(self, rnd: int, segment_refs: Sequence[Sequence[Any]]) -> RoundStats:
        import ray

        results = []
        for job, refs in zip(self._jobs, segment_refs, strict=True):
            links = [r for seg in ray.get(list(refs)) for r in seg]
            results.append(JobResult(job, tuple(links)))
        return self.host.aggregate(rnd, results)

    def eval_payload(self) -> Any:
        return self.host.eval_payload()

    def observe_validation(self, rnd: int, accuracy: float) -> None:
        self.host.observe_validation(rnd, accuracy)


class RayExecutor:
    """Jobs on client-worker actors, server logic in a server actor; see the module docstring."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, num_workers: int) -> None:
        import ray

        self.cfg = cfg
        self.num_workers = num_workers
        algo_cls = algorithm_class(cfg.algo)
        self.has_global = algo_cls.has_global_model
        self.has_personal = algo_cls.has_personal_model
        sizes = [int(s.size) for s in data.client_train]
        self.sizes = sizes
        self.home = lpt_assign([float(s) for s in sizes], num_workers)
        data_ref = self.data_ref = ray.put(data)  # once; workers read the arrays zero-copy
        # the driver keeps the object-store copy too, not a private one of its own
        self.data: FederatedData = ray.get(data_ref)
        stats = ClientStats.from_label_counts(data.train_label_counts(), data.train.input_shape)
        worker_cls: Any = ray.remote(ClientWorker)
        self.workers: list[Any] = [
            worker_cls.options(
                num_cpus=cfg.ray.cpus_per_worker,
                num_gpus=cfg.ray.gpus_per_worker,
                scheduling_strategy="SPREAD",
            ).remote(cfg, data_ref, i)
            for i in range(num_workers)
        ]
        setups = [w.setup.remote() for w in self.workers]
        # the server starts from worker 0's seeded initial weights (an ObjectRef that Ray resolves
        # once worker 0 is set up); it needs no model, and so no PyTorch, of its own
        init_weights = self.workers[0].initial_weights.remote()
        server_cls: Any = ray.remote(ServerActor)
        self.server = server_cls.options(num_cpus=0).remote(cfg, stats, init_weights)
        try:
            devices: list[str] = ray.get(setups)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, ConfigError):
                raise e.cause from None
            raise
        try:
            ray.get(self.server.setup.remote())
        except ray.exceptions.RayTaskError as e:  # e.g. a model too small for FedDr+'s ETF
            if isinstance(e.cause, ConfigError):
                raise e.cause from None
            raise
        self.devices = devices  # each worker's torch device, e.g. "cuda" on a share of a GPU
        log.info("%d client workers ready (%s)", num_workers, ", ".join(sorted(set(devices))))

    def _placement(self, jobs: Sequence[Job]) -> list[list[tuple[int, int, int]]]:
        """For each job, its segments as (worker, start, stop) over the job's clients: a pinned job
        in runs of clients that share a home worker; an unpinned one whole, on the worker the
        round's longest-first balancing gives it (pinned work counts towards the loads)."""
        placed: list[list[tuple[int, int, int]]] = []
        loads = [0.0] * self.num_workers
        for job in jobs:
            segs: list[tuple[int, int, int]] = []
            if job.pinned:
                for k, c in enumerate(job.clients):
                    w = self.home[c]
                    loads[w] += self.sizes[c]
                    if segs and segs[-1][0] == w:
                        segs[-1] = (w, segs[-1][1], k + 1)
                    else:
                        segs.append((w, k, k + 1))
            placed.append(segs)
        free = [j for j, job in enumerate(jobs) if not job.pinned]
        costs = [float(sum(self.sizes[c] for c in jobs[j].clients)) for j in free]
        for j, w in zip(free, lpt_assign(costs, self.num_workers, loads), strict=True):
            placed[j] = [(w, 0, len(jobs[j].clients))]
        return placed

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats:
        import ray

        jobs: list[Job] = ray.get(self.server.plan.remote(rnd, list(sampled)))
        placement = self._placement(jobs)
        seg_refs: list[list[Any]] = [[None] * len(segs) for segs in placement]
        # Submit in waves of chain position: a segment only waits for segments that start earlier,
        # so no worker's queue can block on a segment queued behind it (no deadlock).
        order = sorted(
            ((segs[s][1], j, s) for j, segs in enumerate(placement) for s in range(len(segs))),
        )
        for _, j, s in order:
            w, start, stop = placement[j][s]
            prev = seg_refs[j][s - 1] if s > 0 else None
            seg_refs[j][s] = self.workers[w].run_chain.remote(
                rnd, jobs[j].clients[start:stop], jobs[j].payload, prev
            )
        stats: RoundStats = ray.get(self.server.aggregate.remote(rnd, seg_refs))
        return stats

    def evaluate(self, rnd: int) -> EvalReport:
        import ray

        payload = self.server.eval_payload.remote()
        targets = eval_targets(self.data) if self.has_global else []
        chunks = split_targets(targets, self.num_workers)
        futures = []
        for w, worker in enumerate(self.workers):
            clients = (
                [c for c in range(self.data.num_clients) if self.home[c] == w] if self.has_personal else []
            )
            futures.append(worker.evaluate.remote(rnd, payload, chunks[w], clients))
        return assemble_report(self.data, targets, ray.get(futures), self.has_global)

    def validate(self, rnd: int) -> float:
        import ray

        payload = self.server.eval_payload.remote()
        chunks = split_targets([validation_target(self.data)], self.num_workers)
        parts = ray.get([w.evaluate.remote(rnd, payload, chunks[i], []) for i, w in enumerate(self.workers)])
        accuracy = accuracy_of(parts)
        ray.get(self.server.observe_validation.remote(rnd, accuracy))
        return accuracy

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        ray.kill(self.server)
