"""Serial and Ray executors: the same interface, the same numbers.

An executor runs a round's jobs (plan on the server, local updates on the clients, aggregate on the
server) and evaluations. :class:`SerialExecutor` does it in-process; :class:`RayExecutor` does it with a
server actor and client-worker actors that each ask for a share of a CPU or a fraction of a GPU and
host many virtual clients.

Placement. A client has a home worker (clients are spread over workers by training-set size, longest
first). Jobs of algorithms whose clients keep personal state (``Algorithm.pins_clients``) run on the
clients' home workers, so that state never moves; a chain whose clients live on several workers runs
as segments, each segment's result passed to the next worker as an ObjectRef that never visits the
driver. Jobs of stateless algorithms go to the least-loaded worker of the round (longest job first),
since where a job runs does not change its numbers: every random draw is keyed by (seed, round,
client, purpose) and every job trains with the configured number of threads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from algorithms.base import Job, JobResult, algorithm_class
from raysim.client import ClientEval, ClientRuntime, EvalReport
from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.server import RoundStats, ServerHost, client_stats

log = logging.getLogger(__name__)


class Executor(Protocol):
    num_workers: int

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats: ...

    def evaluate(self, rnd: int) -> EvalReport: ...

    def shutdown(self) -> None: ...


def lpt_assign(costs: Sequence[float], bins: int, loads: list[float] | None = None) -> list[int]:
    """Longest processing time first: each item, largest first, to the least-loaded bin (ties to the
    lower index). Deterministic; returns the bin of each item."""
    loads = [0.0] * bins if loads is None else loads
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        b = min(range(bins), key=lambda k: (loads[k], k))
        out[i] = b
        loads[b] += costs[i]
    return out


def merge_reports(reports: Sequence[EvalReport]) -> EvalReport:
    clients: list[ClientEval] = sorted((c for r in reports for c in r.clients), key=lambda c: c.client)
    gt = [r.gtest_correct for r in reports if r.gtest_correct is not None]
    return EvalReport(
        clients=tuple(clients),
        gtest_correct=sum(gt) if gt else None,
        gtest_total=sum(r.gtest_total for r in reports),
    )


def gtest_chunks(n: int, parts: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, parts + 1).astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(parts)]


class SerialExecutor:
    """Everything in this process: one server host, one client runtime for every client."""

    num_workers = 1

    def __init__(self, cfg: ExperimentConfig, data: FederatedData) -> None:
        import torch

        torch.set_num_threads(cfg.train_threads)
        self.cfg = cfg
        self.data = data
        self.server = ServerHost(cfg, client_stats(data.train_label_counts()), data.train.input_shape, data.num_classes)
        self.runtime = ClientRuntime(cfg, data)

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats:
        jobs = self.server.plan(rnd, sampled)
        results = [JobResult(job, tuple(self.runtime.run_chain(rnd, job.clients, job.payload, None))) for job in jobs]
        return self.server.aggregate(rnd, results)

    def evaluate(self, rnd: int) -> EvalReport:
        clients = range(self.data.num_clients)
        gtest = (0, len(self.data.gtest)) if self.runtime.algo.has_global_model else None
        return self.runtime.evaluate(rnd, self.server.eval_payload(), list(clients), gtest)

    def shutdown(self) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# Ray


class ClientWorker:
    """A client-worker actor: hosts the clients whose home it is (and runs stateless jobs)."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, index: int) -> None:
        from raysim.logs import setup_worker_logging

        setup_worker_logging()
        self.index = index
        self.runtime = ClientRuntime(cfg, data)

    def ready(self) -> str:
        return str(self.runtime.device)

    def run_chain(self, rnd: int, clients: Sequence[int], payload: Any, prev: Any) -> list[Any]:
        last = prev[-1] if prev else None
        return self.runtime.run_chain(rnd, clients, payload, last)

    def evaluate(self, rnd: int, eval_payload: Any, clients: Sequence[int], gtest: tuple[int, int] | None) -> EvalReport:
        return self.runtime.evaluate(rnd, eval_payload, clients, gtest)


class ServerActor:
    """The server actor: a :class:`ServerHost` whose payloads go into the object store once."""

    def __init__(self, cfg: ExperimentConfig, stats: Any, input_shape: Sequence[int], num_classes: int) -> None:
        import torch

        from raysim.logs import setup_worker_logging

        setup_worker_logging()
        torch.set_num_threads(1)
        self.host = ServerHost(cfg, stats, input_shape, num_classes)
        self._jobs: list[Job] = []

    def plan(self, rnd: int, sampled: Sequence[int]) -> list[Job]:
        import ray

        self._jobs = self.host.plan(rnd, sampled)
        refs: dict[int, Any] = {}
        out = []
        for job in self._jobs:
            key = id(job.payload)
            if key not in refs:
                refs[key] = ray.put(job.payload)
            out.append(Job(job.clients, refs[key]))
        return out

    def aggregate(self, rnd: int, segment_refs: Sequence[Sequence[Any]]) -> RoundStats:
        import ray

        results = []
        for job, refs in zip(self._jobs, segment_refs):
            links = [r for seg in ray.get(list(refs)) for r in seg]
            results.append(JobResult(job, tuple(links)))
        return self.host.aggregate(rnd, results)

    def eval_payload(self) -> Any:
        return self.host.eval_payload()


class RayExecutor:
    """Jobs on client-worker actors, server logic in a server actor; see the module docstring."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, num_workers: int) -> None:
        import ray

        self.cfg = cfg
        self.num_workers = num_workers
        self.num_clients = data.num_clients
        self.num_gtest = len(data.gtest)
        algo_cls = algorithm_class(cfg.algo)
        self.pinned = algo_cls.pins_clients
        self.has_global = algo_cls.has_global_model
        sizes = [int(s.size) for s in data.client_train]
        self.sizes = sizes
        self.home = lpt_assign([float(s) for s in sizes], num_workers)
        data_ref = ray.put(data)  # once; workers read the arrays zero-copy
        stats = client_stats(data.train_label_counts())
        worker_cls = ray.remote(ClientWorker)
        self.workers = [
            worker_cls.options(
                num_cpus=cfg.ray.cpus_per_worker,
                num_gpus=cfg.ray.gpus_per_worker,
                scheduling_strategy="SPREAD",
                name=None,
            ).remote(cfg, data_ref, i)
            for i in range(num_workers)
        ]
        self.server = ray.remote(ServerActor).options(num_cpus=0).remote(
            cfg, stats, data.train.input_shape, data.num_classes
        )
        devices = ray.get([w.ready.remote() for w in self.workers])
        log.info("%d client workers ready (%s)", num_workers, ", ".join(sorted(set(devices))))

    def _placement(self, jobs: Sequence[Job]) -> list[list[tuple[int, int, int]]]:
        """For each job, its segments as (worker, start, stop) over the job's clients."""
        if self.pinned:
            placed = []
            for job in jobs:
                segs: list[tuple[int, int, int]] = []
                for k, c in enumerate(job.clients):
                    w = self.home[c]
                    if segs and segs[-1][0] == w:
                        segs[-1] = (w, segs[-1][1], k + 1)
                    else:
                        segs.append((w, k, k + 1))
                placed.append(segs)
            return placed
        costs = [float(sum(self.sizes[c] for c in job.clients)) for job in jobs]
        bins = lpt_assign(costs, self.num_workers)
        return [[(bins[j], 0, len(job.clients))] for j, job in enumerate(jobs)]

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
        chunks = gtest_chunks(self.num_gtest, self.num_workers)
        futures = []
        for w, worker in enumerate(self.workers):
            clients = [c for c in range(self.num_clients) if self.home[c] == w]
            gtest = chunks[w] if self.has_global else None
            futures.append(worker.evaluate.remote(rnd, payload, clients, gtest))
        return merge_reports(ray.get(futures))

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        ray.kill(self.server)
