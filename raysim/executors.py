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

Failures. Every chain segment returns, besides its results, the personal states of its clients as
they left it (an ObjectRef the driver owns, so it outlives the worker). The driver keeps, for every
client, a ref to its latest state; the server's state comes back from every aggregation the same
way. A client worker that dies (``ray.kill``, an OOM kill, a lost node) is replaced by a new actor
that is given its clients' latest states, and the round's segments that were lost with it (and the
segments after them in their chains) run again: every draw is keyed by (seed, round, client,
purpose), so the retried jobs give the numbers the lost ones would have. A dead server actor ends
the run (:class:`RunAborted`); the last completed round's server and client states are still in the
object store, and the runner writes them to a checkpoint to resume from.
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
from raysim.errors import ConfigError, RunAborted
from raysim.records import ClientEval, EvalPart, EvalReport, EvalTarget, RoundStats
from raysim.weights import ModelWeights

log = logging.getLogger(__name__)


class Executor(Protocol):
    num_workers: int
    restarts: int  # client workers replaced after dying

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats: ...

    def evaluate(self, rnd: int) -> EvalReport: ...

    def validate(self, rnd: int) -> float: ...

    def end_round(self, rnd: int) -> None:
        """Round ``rnd`` is complete (trained, validated, evaluated): it is what :meth:`snapshot`
        returns from now on."""

    def snapshot(self) -> tuple[int, Any, dict[int, Any]]:
        """(round, server state, every client's personal state) as of the last completed round."""

    def restore(self, rnd: int, server_state: Any, client_states: dict[int, Any]) -> None:
        """Put a checkpoint's states back, as if round ``rnd`` had just been completed here."""

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
    restarts = 0

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
        self.completed = -1

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

    def end_round(self, rnd: int) -> None:
        self.completed = rnd

    def snapshot(self) -> tuple[int, Any, dict[int, Any]]:
        return self.completed, self.server.state, dict(self.runtime.states)

    def restore(self, rnd: int, server_state: Any, client_states: dict[int, Any]) -> None:
        self.server.state = server_state
        self.runtime.states = dict(client_states)
        self.completed = rnd

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

    def setup(self) -> tuple[str, str]:
        """Build the runtime; returns (torch device, Ray node id)."""
        import ray

        from raysim.client import ClientRuntime
        from raysim.logs import setup_worker_logging

        setup_worker_logging()
        self.runtime = ClientRuntime(self.cfg, self.data)
        self.runtime.warm_up()
        return str(self.runtime.device), ray.get_runtime_context().get_node_id()

    def initial_weights(self) -> ModelWeights:
        return self.runtime.initial_weights

    def ping(self) -> int:
        return self.index

    def run_chain(
        self, rnd: int, clients: Sequence[int], payload: Any, prev: Any
    ) -> tuple[list[Any], dict[int, Any], int]:
        """Called with ``num_returns=3``: the segment's results, its clients' personal states as
        they leave it, and the number of results (a small object the driver reads to learn that
        the segment succeeded, without fetching the rest)."""
        last = prev[-1] if prev else None
        results = self.runtime.run_chain(rnd, clients, payload, last)
        return results, self.runtime.export_states(clients), len(results)

    def import_states(self, clients: Sequence[Sequence[int]], *parts: dict[int, Any]) -> None:
        """Take ``clients[k]``'s states from ``parts[k]`` (a replacement worker, or a resumed run)."""
        for wanted, part in zip(clients, parts, strict=True):
            self.runtime.import_states({c: part[c] for c in wanted if c in part})

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

    def aggregate(self, rnd: int, segment_refs: Sequence[Sequence[Any]]) -> tuple[RoundStats, Any]:
        """Called with ``num_returns=2``: the round's statistics and the new server state (kept
        by the driver as the last good state)."""
        import ray

        results = []
        for job, refs in zip(self._jobs, segment_refs, strict=True):
            links = [r for seg in ray.get(list(refs)) for r in seg]
            results.append(JobResult(job, tuple(links)))
        return self.host.aggregate(rnd, results), self.host.state

    def eval_payload(self) -> Any:
        return self.host.eval_payload()

    def observe_validation(self, rnd: int, accuracy: float) -> Any:
        self.host.observe_validation(rnd, accuracy)
        return self.host.state

    def get_state(self) -> Any:
        return self.host.state

    def ping(self) -> None:
        pass

    def set_state(self, state: Any) -> None:
        self.host.state = state


class RayExecutor:
    """Jobs on client-worker actors, server logic in a server actor; see the module docstring."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, num_workers: int) -> None:
        import ray

        self.cfg = cfg
        self.num_workers = num_workers
        self.restarts = 0
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
        self.worker_cls: Any = ray.remote(ClientWorker)
        self.workers: list[Any] = [self._new_worker(i) for i in range(num_workers)]
        setups = [w.setup.remote() for w in self.workers]
        # the server starts from worker 0's seeded initial weights (an ObjectRef that Ray resolves
        # once worker 0 is set up); it needs no model, and so no PyTorch, of its own
        init_weights = self.workers[0].initial_weights.remote()
        server_cls: Any = ray.remote(ServerActor)
        self.server = server_cls.options(num_cpus=0).remote(cfg, stats, init_weights)
        placed: list[tuple[str, str]] = _config_errors_first(setups)
        _config_errors_first([self.server.setup.remote()])  # e.g. a model too small for FedDr+'s ETF
        self.devices = [d for d, _ in placed]  # each worker's torch device, e.g. "cuda" on a GPU share
        self.nodes = [n for _, n in placed]  # each worker's Ray node
        # the last good states: of the last completed round (committed) and of this round so far
        self.completed = -1
        self.server_state: Any = self.server.get_state.remote()
        self.committed_server_state: Any = self.server_state
        self.client_state: dict[int, Any] = {}  # client -> ref of a dict holding its latest state
        self.committed_client_state: dict[int, Any] = {}
        log.info(
            "%d client workers ready on %d node(s) (%s)",
            num_workers,
            len(set(self.nodes)),
            ", ".join(sorted(set(self.devices))),
        )

    def _new_worker(self, index: int) -> Any:
        return self.worker_cls.options(
            num_cpus=self.cfg.ray.cpus_per_worker,
            num_gpus=self.cfg.ray.gpus_per_worker,
            scheduling_strategy="SPREAD",
        ).remote(self.cfg, self.data_ref, index)

    # ---- failures

    def _server_get(self, ref: Any) -> Any:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise RunAborted(f"The server actor died ({_first_line(e)}).") from None
        except (ray.exceptions.RaySystemError, ray.exceptions.ObjectLostError) as e:
            raise RunAborted(f"The Ray cluster failed ({_first_line(e)}).") from None

    def _dead_workers(self) -> list[int]:
        import ray

        pings = [w.ping.remote() for w in self.workers]
        dead = []
        for i, ping in enumerate(pings):
            try:
                ray.get(ping, timeout=120)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                dead.append(i)
        return dead

    def _recover(self, error: BaseException) -> None:
        """After a failed call: replace every dead worker and give it its clients' latest states.
        If no worker died: RunAborted if the server did, else ``error`` again (a bug in a job, not
        a failure of the cluster)."""
        import ray

        dead = self._dead_workers()
        if not dead:
            self._server_get(self.server.ping.remote())  # a task's input from a dead server
            raise error
        for w in dead:
            if self.restarts >= self.cfg.ray.max_worker_restarts:
                raise RunAborted(
                    f"Client worker {w} died and the run has already replaced "
                    f"{self.restarts} (ray.max_worker_restarts)."
                )
            self.restarts += 1
            mine = [c for c in range(len(self.sizes)) if self.home[c] == w and c in self.client_state]
            log.warning(
                "client worker %d died (%s); replacing it and restoring the state of its %d clients",
                w,
                _first_line(error),
                len(mine),
            )
            ray.kill(self.workers[w])
            worker = self._new_worker(w)
            by_ref: dict[Any, list[int]] = {}
            for c in mine:
                by_ref.setdefault(self.client_state[c], []).append(c)
            refs = list(by_ref)
            setup = worker.setup.remote()
            restored = worker.import_states.remote([by_ref[r] for r in refs], *refs)
            try:
                ray.get([setup, restored], timeout=self.cfg.ray.replace_timeout_s)
            except ray.exceptions.GetTimeoutError:
                ray.kill(worker)
                raise RunAborted(
                    f"Client worker {w} died and no replacement found a place in the cluster within "
                    f"{self.cfg.ray.replace_timeout_s:g} s (ray.replace_timeout_s); the cluster has lost "
                    "nodes or resources."
                ) from None
            except ray.exceptions.RayError as e:  # its clients' states were lost with their node
                ray.kill(worker)
                raise RunAborted(
                    f"Client worker {w} died and its clients' state could not be restored ({_first_line(e)})."
                ) from None
            self.workers[w] = worker

    # ---- rounds

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

        jobs: list[Job] = self._server_get(self.server.plan.remote(rnd, list(sampled)))
        placement = self._placement(jobs)
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
            submitted = []
            for _, j, s in todo:
                w, start, stop = placement[j][s]
                prev = results[j][s - 1] if s > 0 else None
                clients = jobs[j].clients[start:stop]
                res, states, count = (
                    self.workers[w]
                    .run_chain.options(num_returns=3)
                    .remote(rnd, clients, jobs[j].payload, prev)
                )
                results[j][s] = res
                submitted.append((j, s, clients, states, count))
            failure: BaseException | None = None
            for j, s, clients, states, count in submitted:
                try:
                    ray.get(count)
                except ray.exceptions.RayError as e:
                    failure = failure or e
                    continue
                done[j][s] = True
                if jobs[j].pinned:  # a pinned job's clients keep their state on their home worker
                    self.client_state.update(dict.fromkeys(clients, states))
            if failure is not None:
                self._recover(failure)
        stats_ref, state_ref = self.server.aggregate.options(num_returns=2).remote(rnd, results)
        stats: RoundStats = self._server_get(stats_ref)
        self.server_state = state_ref
        return stats

    def _on_workers(self, call: Any) -> list[Any]:
        """``call(w, worker)`` on every worker (a read-only task, e.g. an evaluation), done again
        after replacing any worker that died."""
        import ray

        while True:
            futures = [call(w, worker) for w, worker in enumerate(self.workers)]
            try:
                return list(ray.get(futures))
            except ray.exceptions.RayError as e:
                self._recover(e)

    def evaluate(self, rnd: int) -> EvalReport:
        payload = self.server.eval_payload.remote()
        targets = eval_targets(self.data) if self.has_global else []
        chunks = split_targets(targets, self.num_workers)
        clients = [
            [c for c in range(self.data.num_clients) if self.home[c] == w] if self.has_personal else []
            for w in range(self.num_workers)
        ]
        parts = self._on_workers(lambda w, worker: worker.evaluate.remote(rnd, payload, chunks[w], clients[w]))
        return assemble_report(self.data, targets, parts, self.has_global)

    def validate(self, rnd: int) -> float:
        payload = self.server.eval_payload.remote()
        chunks = split_targets([validation_target(self.data)], self.num_workers)
        parts = self._on_workers(lambda w, worker: worker.evaluate.remote(rnd, payload, chunks[w], []))
        accuracy = accuracy_of(parts)
        state_ref = self.server.observe_validation.remote(rnd, accuracy)
        self._server_get(state_ref)
        self.server_state = state_ref
        return accuracy

    # ---- checkpoints

    def end_round(self, rnd: int) -> None:
        self.completed = rnd
        self.committed_server_state = self.server_state
        self.committed_client_state = dict(self.client_state)

    def snapshot(self) -> tuple[int, Any, dict[int, Any]]:
        """Fetched from the object store (the states outlive the actors that made them)."""
        import ray

        refs = self.committed_client_state
        unique = list(set(refs.values()))
        parts = dict(zip(unique, ray.get(unique), strict=True))
        server_state = ray.get(self.committed_server_state)
        return self.completed, server_state, {c: parts[ref][c] for c, ref in sorted(refs.items())}

    def restore(self, rnd: int, server_state: Any, client_states: dict[int, Any]) -> None:
        import ray

        calls = [self.server.set_state.remote(server_state)]
        for w, worker in enumerate(self.workers):
            part = {c: s for c, s in client_states.items() if self.home[c] == w}
            if part:
                ref = ray.put(part)
                calls.append(worker.import_states.remote([list(part)], ref))
                self.client_state.update(dict.fromkeys(part, ref))
        self._server_get(calls[0])
        ray.get(calls[1:])
        self.server_state = self.server.get_state.remote()
        self.end_round(rnd)

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        ray.kill(self.server)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _config_errors_first(refs: Sequence[Any]) -> Any:
    """``ray.get(refs)``, raising a ConfigError that a task raised as itself (bad input found where
    the model is built), not wrapped in Ray's task error."""
    import ray

    try:
        return ray.get(list(refs))
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ConfigError):
            raise e.cause from None
        raise
