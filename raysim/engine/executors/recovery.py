"""The client workers of a Ray run, and what happens when one dies.

Every chain segment returns, besides its results, the memories of its clients as they left it (an
ObjectRef the driver owns, so it outlives the worker). The :class:`WorkerPool` keeps, for every
client, a ref to its latest memory. A client worker that dies (``ray.kill``, an OOM kill, a lost
node) is replaced by a new actor on the same index that is given its clients' latest memories; the
executor then runs again what was lost. Every draw is keyed by (seed, round, client, purpose), so
the retried jobs give the numbers the lost ones would have. A dead server actor ends the run
(:class:`~raysim.errors.RunAborted`): the last completed round's states are still in the object
store, and the runner writes them to a checkpoint to resume from.

Ray's own actor restarts are not used: Ray would rerun the constructor and retry the task on an
actor without its clients' memories, and the numbers would change silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from raysim.config import ExperimentConfig
from raysim.engine.executors.actors import ClientWorker
from raysim.errors import RunAborted

log = logging.getLogger(__name__)


#: actors that finished runs left for the next run of this process (``ray.reuse_workers``), by
#: :func:`_idle_key`
_IDLE: dict[tuple[Any, ...], list[Any]] = {}
#: how long a finished run's actors may take to answer before they are killed instead of kept
IDLE_PING_S = 5.0


def _idle_key(kind: str, cpus: float, gpus: float) -> tuple[Any, ...] | None:
    """The key of ``kind``'s idle actors with these resources in this process's Ray session (its
    driver's node and job: a new session's are other actors), or None where none are kept: no
    session, or inside a placement group (a suite's trial takes only what it was given)."""
    import ray

    if not ray.is_initialized() or ray.util.get_current_placement_group() is not None:
        return None
    ctx = ray.get_runtime_context()
    return (ctx.get_node_id(), ctx.get_job_id(), kind, float(cpus), float(gpus))


def take_idle(kind: str, cpus: float, gpus: float) -> Any | None:
    """An idle actor of ``kind`` with these resources, left by an earlier run and still alive (one
    that died while idle, e.g. killed for memory, is passed over), or None."""
    import ray

    key = _idle_key(kind, cpus, gpus)
    actors = _IDLE.get(key) if key is not None else None
    while actors:
        actor = actors.pop()
        try:
            ray.get(actor.ping.remote(), timeout=IDLE_PING_S)
            return actor
        except (ray.exceptions.RayError, TimeoutError):
            ray.kill(actor)
    return None


def drop_idle(cfg: ExperimentConfig, workers: int) -> None:
    """Before a run's actors start: kill the idle actors of this session that it will not take
    (every one without ``ray.reuse_workers``; with it, those of other resources and those beyond
    its ``workers``), whose resources its own actors may need."""
    keep: dict[tuple[Any, ...] | None, int] = {}
    if cfg.ray.reuse_workers:
        keep[_idle_key("client", cfg.ray.cpus_per_worker, cfg.ray.gpus_per_worker)] = workers
        keep[_idle_key("server", 0, 0)] = 1
    _trim_idle(keep)


def release_idle() -> None:
    """Kill every idle actor (before work that needs the session's resources otherwise: a suite's
    trials, in placement groups of their own)."""
    _trim_idle({})


def _trim_idle(keep: Mapping[tuple[Any, ...] | None, int]) -> None:
    """Kill the idle actors of each key beyond the first ``keep[key]`` (0 for a key not given)."""
    import ray

    if not ray.is_initialized():
        return
    for key, actors in _IDLE.items():
        n = keep.get(key, 0)
        for a in actors[n:]:
            ray.kill(a)
        del actors[n:]


def leave_idle(kind: str, cpus: float, gpus: float, actors: Sequence[Any]) -> None:
    """Keep the ``actors`` that answer a ping within :data:`IDLE_PING_S` for the next run; kill the
    others (dead, or stuck in a task), and all of them where none may be kept."""
    import ray

    key = _idle_key(kind, cpus, gpus)
    alive: list[Any] = []
    if key is not None and actors:
        pings = {a.ping.remote(): a for a in actors}
        ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=IDLE_PING_S)
        for ref in ready:
            try:
                ray.get(ref)
                alive.append(pings[ref])
            except ray.exceptions.RayError:
                pass
        _IDLE.setdefault(key, []).extend(alive)
    for a in actors:
        if not any(a is k for k in alive):
            ray.kill(a)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def server_get(ref: Any) -> Any:
    """``ray.get`` of a server actor's answer; RunAborted if the server or the cluster is gone."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as e:
        raise RunAborted(f"The server actor died ({first_line(e)}).") from None
    except (ray.exceptions.RaySystemError, ray.exceptions.ObjectLostError) as e:
        raise RunAborted(f"The Ray cluster failed ({first_line(e)}).") from None


class WorkerPool:
    """The client-worker actors (worker ``w`` hosts the clients whose ``home`` is ``w``), the refs
    of every client's latest memory, and the replacement of workers that die."""

    def __init__(self, cfg: ExperimentConfig, num_workers: int) -> None:
        """The actors start at once, before the data is there (their processes start and import
        PyTorch, most of a worker's start, while the driver loads it); :meth:`place` gives them
        their clients and :meth:`setup` the data."""
        import ray

        self.cfg = cfg
        self.data_ref: Any = None
        self.home: list[int] = []
        self.restarts = 0
        self._cls: Any = ray.remote(ClientWorker)
        drop_idle(cfg, num_workers)
        self.workers: list[Any] = [self._new_worker(i) for i in range(num_workers)]
        #: client -> ref of a dict holding its latest memory: of this round so far, and of the
        #: last completed round
        self.latest: dict[int, Any] = {}
        self.committed: dict[int, Any] = {}

    def _new_worker(self, index: int) -> Any:
        """A client-worker actor: spread over the cluster's nodes, or, inside a placement group
        (a suite's trial), in one of its bundles, so that the trial takes no more than it was given."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = ray.util.get_current_placement_group()
        strategy: Any = (
            PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
            if group is not None
            else "SPREAD"
        )
        if self.cfg.ray.reuse_workers:
            idle = take_idle("client", self.cfg.ray.cpus_per_worker, self.cfg.ray.gpus_per_worker)
            if idle is not None:
                idle.reuse.remote(self.cfg, index)  # before any call of this run: an actor's calls run in order
                return idle
        return self._cls.options(
            num_cpus=self.cfg.ray.cpus_per_worker,
            num_gpus=self.cfg.ray.gpus_per_worker,
            scheduling_strategy=strategy,
        ).remote(self.cfg, index)

    def place(self, home: Sequence[int]) -> None:
        """Client ``c``'s home is worker ``home[c]``."""
        self.home = list(home)

    def setup(self, data_ref: Any) -> list[Any]:
        """Every worker's runtime, built on the data at ``data_ref`` (an object-store ref, which
        a replacement worker is given too): the calls' refs, each to (torch device, node id)."""
        self.data_ref = data_ref
        return [w.setup.remote(data_ref) for w in self.workers]

    def clients_of(self, worker: int) -> list[int]:
        return [c for c, w in enumerate(self.home) if w == worker]

    def commit(self) -> None:
        self.committed = dict(self.latest)

    def _dead(self) -> list[int]:
        import ray

        pings = [w.ping.remote() for w in self.workers]
        dead = []
        for i, ping in enumerate(pings):
            try:
                ray.get(ping, timeout=120)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                dead.append(i)
        return dead

    def recover(self, error: BaseException, server: Any) -> None:
        """After a failed call: replace every dead worker and give it its clients' latest memories.
        If no worker died: RunAborted if the server did, else ``error`` again (a bug in a job, not
        a failure of the cluster)."""
        import ray

        dead = self._dead()
        if not dead:
            server_get(server.ping.remote())  # a task's input from a dead server
            raise error
        for w in dead:
            if self.restarts >= self.cfg.ray.max_worker_restarts:
                raise RunAborted(
                    f"Client worker {w} died and the run has already replaced "
                    f"{self.restarts} (ray.max_worker_restarts)."
                )
            self.restarts += 1
            mine = [c for c in self.clients_of(w) if c in self.latest]
            log.warning(
                "client worker %d died (%s); replacing it and restoring the state of its %d clients",
                w,
                first_line(error),
                len(mine),
            )
            ray.kill(self.workers[w])
            worker = self._new_worker(w)
            by_ref: dict[Any, list[int]] = {}
            for c in mine:
                by_ref.setdefault(self.latest[c], []).append(c)
            refs = list(by_ref)
            setup = worker.setup.remote(self.data_ref)
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
                    f"Client worker {w} died and its clients' state could not be restored ({first_line(e)})."
                ) from None
            self.workers[w] = worker

    def on_all(self, call: Callable[[int, Any], Any], server: Any) -> list[Any]:
        """``call(w, worker)`` on every worker (a read-only task, e.g. an evaluation), done again
        after replacing any worker that died."""
        import ray

        while True:
            futures = [call(w, worker) for w, worker in enumerate(self.workers)]
            try:
                return list(ray.get(futures))
            except ray.exceptions.RayError as e:
                self.recover(e, server)

    def shutdown(self, keep: bool = False) -> None:
        """Kill the workers, or (``keep``) leave those alive idle for the next run."""
        import ray

        if keep:
            leave_idle("client", self.cfg.ray.cpus_per_worker, self.cfg.ray.gpus_per_worker, self.workers)
            return
        for w in self.workers:
            ray.kill(w)


__all__ = ["WorkerPool", "drop_idle", "first_line", "leave_idle", "release_idle", "server_get", "take_idle"]
