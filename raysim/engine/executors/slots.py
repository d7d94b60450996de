"""A client worker's job slots: it trains several independent jobs at once.

On a CPU, a small network's convolutions scale poorly over intra-op threads: two one-thread jobs
side by side do more per second than one job on two threads (10-50 % more on ``cnn3p2_fmnist``). So
a worker with ``cfg.worker_jobs`` slots holds that many :class:`~raysim.engine.client.ClientRuntime`
s, each with its own model and the algorithm's client side, all sharing the clients' memories (one
dict: a client's memory lives on its worker, whichever slot trains it). A round's jobs for this
worker run in threads of their own, each on ``cfg.train_threads`` intra-op threads, so a job's
numbers are the ones it gives anywhere else (docs/design.md: the thread count is part of the
numbers). Jobs that share a client run in the order given; the others start longest first as slots
free up.

With one slot everything runs in the caller's thread, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.engine.evaluation import Evaluation
from raysim.engine.executors.evaluation import split_targets
from raysim.records import EvalPart, EvalTarget

if TYPE_CHECKING:
    from raysim.engine.client import ClientRuntime
    from raysim.wire import ClientResult


def predecessors(chains: Sequence[Sequence[int]]) -> list[set[int]]:
    """For each chain, the earlier chains it must wait for: the last earlier one that holds each of
    its clients (a client's memory changes in the order the chains were given)."""
    last: dict[int, int] = {}
    out: list[set[int]] = []
    for i, clients in enumerate(chains):
        out.append({last[c] for c in clients if c in last})
        for c in clients:
            last[c] = i
    return out


class JobSlots:
    """``count`` runtimes over one memory, and the threads that run jobs on them."""

    def __init__(self, cfg: ExperimentConfig, data: FederatedData, count: int) -> None:
        from raysim.engine.client import ClientRuntime

        self.runtimes: list[ClientRuntime] = [ClientRuntime(cfg, data)]
        for _ in range(count - 1):
            runtime = ClientRuntime(cfg, data)
            runtime.memory = self.runtimes[0].memory
            self.runtimes.append(runtime)
        self.sizes = [int(s.size) for s in data.client_train]
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="raysim-job") if count > 1 else None

    @property
    def main(self) -> ClientRuntime:
        """The runtime of the calls that run one thing at a time (chain segments, batches)."""
        return self.runtimes[0]

    def warm_up(self) -> None:
        """Each runtime's warm-up, in a thread of its own (first-call costs are partly per thread)."""
        if self._pool is None:
            self.main.warm_up()
            return
        together = threading.Barrier(len(self.runtimes))

        def warm(runtime: ClientRuntime) -> None:
            runtime.warm_up()
            together.wait(timeout=300)  # holds this thread, so that each runtime warms up a different one

        list(self._pool.map(warm, self.runtimes))

    def run_jobs(
        self,
        rnd: int,
        jobs: Sequence[tuple[Sequence[int], Any]],
        on_done: Callable[[int, list[ClientResult]], list[ClientResult]] | None = None,
    ) -> list[list[ClientResult]]:
        """Each job, ``(clients, payload)``, a chain trained from ``payload`` (``run_chain``); their
        results in the order given. ``on_done(i, results)``, on the calling thread as each job
        finishes, returns what to keep of job ``i``'s results."""
        keep = on_done if on_done is not None else (lambda i, results: results)
        if self._pool is None or len(jobs) <= 1:
            return [keep(i, self.main.run_chain(rnd, clients, payload, None)) for i, (clients, payload) in enumerate(jobs)]
        after = predecessors([clients for clients, _ in jobs])
        cost = [sum(self.sizes[c] for c in clients) for clients, _ in jobs]
        results: list[list[ClientResult] | None] = [None] * len(jobs)
        free = list(reversed(self.runtimes))
        waiting, done = set(range(len(jobs))), set[int]()
        running: dict[Future[list[ClientResult]], tuple[int, ClientRuntime]] = {}
        failure: BaseException | None = None
        while running or (waiting and failure is None):
            if failure is None:
                ready = sorted((i for i in waiting if after[i] <= done), key=lambda i: (-cost[i], i))
                for i in ready[: len(free)]:
                    runtime = free.pop()
                    waiting.discard(i)
                    clients, payload = jobs[i]
                    running[self._pool.submit(runtime.run_chain, rnd, clients, payload, None)] = (i, runtime)
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in finished:
                i, runtime = running.pop(future)
                free.append(runtime)
                try:
                    results[i] = keep(i, future.result())
                    done.add(i)
                except BaseException as e:  # the others finish first: no thread may outlive this call
                    failure = failure or e
        if failure is not None:
            raise failure
        return [r for r in results if r is not None]

    def evaluate(
        self, rnd: int, evaluation: Evaluation, targets: Sequence[EvalTarget], clients: Sequence[int]
    ) -> EvalPart:
        """The runtimes' evaluations of contiguous shares of ``targets`` and ``clients``, joined in
        order: the part one runtime would give."""
        if self._pool is None:
            return self.main.evaluate(rnd, evaluation, targets, clients)
        k = len(self.runtimes)
        chunks = split_targets(targets, k)
        shares = [[int(c) for c in share] for share in np.array_split(np.asarray(clients, dtype=np.int64), k)]
        parts = list(
            self._pool.map(
                lambda i: self.runtimes[i].evaluate(rnd, evaluation, chunks[i], shares[i]), range(k)
            )
        )

        def joined(field: str) -> tuple[np.ndarray, ...]:
            per_part = [getattr(p, field) for p in parts]
            if not all(len(x) == len(targets) for x in per_part):
                return ()
            return tuple(np.concatenate([x[t] for x in per_part]) for t in range(len(targets)))

        return EvalPart(
            joined("global_correct"),
            tuple(pc for p in parts for pc in p.personal_correct),
            joined("global_align"),
            joined("global_norm"),
            tuple(f for p in parts for f in p.features),
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


__all__ = ["JobSlots", "predecessors"]
