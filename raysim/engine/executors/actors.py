"""The Ray actors: client workers (each hosting many virtual clients) and the server."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.engine.evaluation import Evaluation
from raysim.errors import ConfigError
from raysim.records import EvalPart, EvalTarget, RoundStats
from raysim.toolkit.aggregate import BlockSum
from raysim.weights import ModelWeights
from raysim.wire import ClientResult, ClientStats, Job, JobResult

#: a block of a round's sum on a worker: its jobs' positions in the call and their coefficients
Block = tuple[Sequence[int], Sequence[float]]

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientMemory


class ClientWorker:
    """A client-worker actor: hosts the clients whose home it is (and runs stateless jobs).

    The data comes to :meth:`setup`, not to the constructor: an actor whose constructor waits for
    an argument is not started until the argument exists. The constructor imports the training
    code (PyTorch, most of a worker's start), so that the worker's process starts and imports it
    while the driver loads the data and puts it into the object store. :meth:`setup` builds the
    runtime, so that bad input found there (a model that does not fit the data) reaches the driver
    as its ConfigError."""

    def __init__(self, cfg: ExperimentConfig, index: int) -> None:
        import raysim.engine.client  # noqa: F401  (PyTorch and the client runtime)

        self.cfg, self.index = cfg, index

    def reuse(self, cfg: ExperimentConfig, index: int) -> None:
        """Become a new run's worker ``index`` (``ray.reuse_workers``): this run's data, runtimes,
        job slots and clients' memories go, as if the actor had been constructed now; every
        number a run computes comes from its own seeded streams and thread settings, so a reused
        process gives a fresh one's numbers (the serial-against-Ray tests run on reused actors)."""
        slots = getattr(self, "slots", None)
        if slots is not None:
            slots.close()
        self.__dict__.clear()
        self.__init__(cfg, index)  # type: ignore[misc]

    def setup(self, data: FederatedData) -> tuple[str, str]:
        """Build the runtimes on ``data`` (one per job slot, :mod:`~raysim.engine.executors.slots`);
        returns (torch device, Ray node id)."""
        import ray

        from raysim.engine.executors.slots import JobSlots
        from raysim.logs import setup_worker_logging

        setup_worker_logging()
        self.data = data
        self.slots = JobSlots(self.cfg, data, self.cfg.worker_jobs)
        self.runtime = self.slots.main
        self.slots.warm_up()
        return str(self.runtime.device), ray.get_runtime_context().get_node_id()

    def initial_weights(self) -> ModelWeights:
        return self.runtime.initial_weights

    def ping(self) -> int:
        return self.index

    def run_chain(
        self, rnd: int, clients: Sequence[int], payload: Any, prev: Any, index: int | None = None
    ) -> tuple[list[Any], dict[int, ClientMemory], int]:
        """Called with ``num_returns=3``: the segment's results, its clients' memories as they
        leave it, and the number of results (a small object the driver reads to learn that the
        segment succeeded, without fetching the rest). ``prev``: the segment before's results, or
        (with ``index``) the bundle of the ``run_jobs`` call that trained it."""
        if index is not None:
            prev = prev[0][index]
        last = prev[-1] if prev else None
        results = self.runtime.run_chain(rnd, clients, payload, last)
        return results, self.runtime.export_states(clients), len(results)

    def run_jobs(
        self, rnd: int, jobs: Sequence[tuple[Sequence[int], int]], sums: Sequence[Block], *payloads: Any
    ) -> tuple[Any, dict[int, ClientMemory], int]:
        """Chains that start from a payload (no earlier segment), ``(clients, k)`` each, trained
        from ``payloads[k]`` on the job slots. Called with ``num_returns=3``: a bundle of each job's
        results and the sums of the blocks in ``sums`` (each the positions of its jobs among
        ``jobs`` and their coefficients: :mod:`raysim.capabilities.presum`; their uploads are
        left out of the results), the clients' memories as they leave, and the number of
        results. One object for the call's results, not one per job: a round of hundreds of
        one-step clients would otherwise put hundreds into the object store."""
        blocks = BlockSums(sums)
        results = self.slots.run_jobs(rnd, [(clients, payloads[k]) for clients, k in jobs], blocks.take)
        clients = [c for chain, _ in jobs for c in chain]
        return (results, blocks.totals()), self.runtime.export_states(clients), sum(len(r) for r in results)

    def run_batches(
        self,
        rnd: int,
        batches: Sequence[tuple[Sequence[Sequence[int]], int]],
        sums: Sequence[Block],
        *payloads: Any,
    ) -> tuple[Any, dict[int, ClientMemory], int]:
        """Batches of jobs, each trained together (``train.batch_clients``) from ``payloads[k]``,
        ``(chains, k)`` each, one batch after another. Called with ``num_returns=3``, as
        :meth:`run_jobs`: a bundle of every job's results (one segment each, in the order of the
        batches' chains, what the server reads) and the sums of the blocks in ``sums`` (positions
        among those jobs; their uploads left out of the results), the clients' memories, and the
        number of results."""
        blocks = BlockSums(sums)
        results: list[list[ClientResult]] = []
        for chains, k in batches:
            for res in self.runtime.run_batch(rnd, chains, payloads[k]):
                results.append(blocks.take(len(results), res))
        clients = [c for chains, _ in batches for chain in chains for c in chain]
        return (results, blocks.totals()), self.runtime.export_states(clients), sum(len(r) for r in results)

    def run_batch(self, rnd: int, chains: Sequence[Sequence[int]], payload: Any) -> tuple[Any, dict[int, ClientMemory], int]:
        """A pinned batch (its clients' memories brought here first): :meth:`run_batches` of it alone."""
        return self.run_batches(rnd, [(chains, 0)], (), payload)

    def import_states(self, clients: Sequence[Sequence[int]], *parts: dict[int, ClientMemory]) -> None:
        """Take ``clients[k]``'s memories from ``parts[k]`` (a replacement worker, or a resumed run)."""
        for wanted, part in zip(clients, parts, strict=True):
            self.runtime.import_states({c: part[c] for c in wanted if c in part})

    def evaluate(
        self, rnd: int, evaluation: Evaluation, targets: Sequence[EvalTarget], clients: Sequence[int]
    ) -> EvalPart:
        return self.slots.evaluate(rnd, evaluation, targets, clients)


class BlockSums:
    """A ``run_jobs`` call's blocks (:mod:`raysim.capabilities.presum`), each summed as its jobs
    finish (:class:`~raysim.toolkit.aggregate.BlockSum`): a job's upload is added once every job
    before it in its block has been, and then its results keep no weights. The sums are those of
    :func:`~raysim.toolkit.aggregate.block_sum` over each block in order, bit for bit; what changes
    is what is held at once: an upload goes as soon as it is added, so a worker's share of a round
    of hundreds of clients is not hundreds of models in memory, paged in anew each round."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        scratch: dict[str, np.ndarray] = {}  # one set of term buffers for every block of the call
        self.sums = [BlockSum(scratch) for _ in blocks]
        self.coeffs = [list(coeffs) for _, coeffs in blocks]
        self.order = [list(positions) for positions, _ in blocks]  # each block's jobs, by place in the call
        self.block_of = {i: b for b, positions in enumerate(self.order) for i in positions}
        self.added = [0] * len(blocks)  # how many of each block's jobs are in its sum
        self.waiting: dict[int, list[ClientResult]] = {}  # finished before their turn

    def take(self, i: int, results: list[ClientResult]) -> list[ClientResult]:
        """Job ``i`` has finished with ``results`` (``JobSlots.run_jobs``'s ``on_done``). Returns the
        same list, whose last result loses its weights when they are added (now, or when the jobs
        before it in its block have finished)."""
        b = self.block_of.get(i)
        if b is None:
            return results
        if results[-1].weights is None:
            raise ValueError("every client must upload weights to be averaged")
        self.waiting[i] = results
        order = self.order[b]
        while self.added[b] < len(order) and order[self.added[b]] in self.waiting:
            done = self.waiting.pop(order[self.added[b]])
            upload = done[-1].weights
            assert upload is not None
            self.sums[b].add(upload, self.coeffs[b][self.added[b]])
            done[-1] = dataclasses.replace(done[-1], weights=None)
            self.added[b] += 1
        return results

    def totals(self) -> list[ModelWeights]:
        """Each block's sum, in the order the blocks were given."""
        if any(n < len(order) for n, order in zip(self.added, self.order, strict=True)):
            raise RuntimeError("a block's jobs did not all finish")
        return [s.total() for s in self.sums]


class ServerActor:
    """The server actor: a :class:`~raysim.engine.server.ServerHost` whose payloads go into the object
    store once."""

    def __init__(self, cfg: ExperimentConfig, stats: ClientStats) -> None:
        self.args = (cfg, stats)
        self._jobs: list[Job] = []

    def reuse(self, cfg: ExperimentConfig, stats: ClientStats) -> None:
        """Become a new run's server (``ray.reuse_workers``), as if constructed now."""
        self.__dict__.clear()
        self.__init__(cfg, stats)  # type: ignore[misc]

    def setup(self, init_weights: ModelWeights) -> str:
        """``init_weights`` comes here, not to the constructor: an actor whose constructor waits for
        an argument is not started until the argument exists, and the server's process can start
        while the client workers set up (the weights are worker 0's, once it is set up). Returns the
        actor's Ray node."""
        import ray

        from raysim.engine.server import ServerHost
        from raysim.logs import setup_worker_logging

        setup_worker_logging()
        self.host = ServerHost(*self.args, init_weights)
        ray.put(np.zeros(1))  # the first put connects to the object store: not in round 1
        return str(ray.get_runtime_context().get_node_id())

    def plan(self, rnd: int, sampled: Sequence[int] | None) -> list[Job]:
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

    def aggregate(
        self,
        rnd: int,
        segments: Sequence[Sequence[Piece]],
        presums: dict[int, tuple[int, int]],
        *values: Any,
    ) -> tuple[RoundStats, Any]:
        """Called with ``num_returns=2``: the round's statistics and the new server state (kept
        by the driver as the last good state). ``values``: the round's result objects, each once
        (Ray fetches them before the call: they come as its top-level ObjectRefs); ``segments``:
        per planned job, its segments' results as pieces of them (:func:`pieces_of`);
        ``presums``: the blocks summed on the workers, by their first job (a bundle's index
        among ``values`` and the block's place in it)."""

        def value(piece: Piece) -> Any:
            i, position = piece
            return values[i] if position is None else values[i][0][position]

        results = []
        for j, (job, pieces) in enumerate(zip(self._jobs, segments, strict=True)):
            links = [r for piece in pieces for r in value(piece)]
            presum = None
            if j in presums:
                i, k = presums[j]
                presum = values[i][1][k]
            results.append(JobResult(job, tuple(links), presum))
        return self.host.aggregate(rnd, results), self.host.saved

    def evaluation(self) -> Evaluation:
        return self.host.evaluation()

    def take_commits(self) -> tuple[list[int], dict[int, Any]]:
        """Called with ``num_returns=2``: the clients whose memory the last async step's arrivals
        changed, and a dict of those memories (for their home workers)."""
        return self.host.take_commits()

    def observe_validation(self, rnd: int, accuracy: float) -> Any:
        self.host.observe_validation(rnd, accuracy)
        return self.host.saved

    def get_state(self) -> Any:
        return self.host.saved

    def ping(self) -> None:
        pass

    def set_state(self, state: Any) -> None:
        self.host.restore(state)


#: one piece of a round's results: the index of its object among the call's values, and its place
#: in a ``run_jobs`` bundle (None: the object is the segment's results themselves)
Piece = tuple[int, int | None]


def pieces_of(
    segments: Sequence[Sequence[Any]], presums: dict[int, tuple[Any, int]]
) -> tuple[list[Any], list[list[Piece]], dict[int, tuple[int, int]]]:
    """The arguments of ``ServerActor.aggregate`` for a round whose results are ``segments`` (per
    planned job, its segments' results: each an ObjectRef of them or ``(ref of a run_jobs
    bundle, position)``) and ``presums`` (by first job, ``(bundle ref, block)``): the distinct
    ObjectRefs in order, and both with each ref replaced by its index among them. A round of
    hundreds of one-step clients names a worker's bundle hundreds of times; Ray would serialise
    each naming of a ref on its own, and here it goes once."""
    index: dict[Any, int] = {}

    def at(ref: Any) -> int:
        return index.setdefault(ref, len(index))

    coded = [
        [(at(piece[0]), piece[1]) if isinstance(piece, tuple) else (at(piece), None) for piece in pieces]
        for pieces in segments
    ]
    blocks = {first: (at(ref), k) for first, (ref, k) in presums.items()}
    return list(index), coded, blocks


def config_errors_first(refs: Sequence[Any]) -> Any:
    """``ray.get(refs)``, raising a ConfigError that a task raised as itself (bad input found where
    the model is built), not wrapped in Ray's task error."""
    import ray

    try:
        return ray.get(list(refs))
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ConfigError):
            raise e.cause from None
        raise


__all__ = ["Block", "ClientWorker", "Piece", "ServerActor", "config_errors_first", "pieces_of"]
