"""The server side: holds the algorithm's server state, plans jobs and aggregates results.

docs/design.md: the server actor holds the server state (global weights, global head, prototypes,
groupings) and does aggregation, global-head training and grouping, so the driver stays thin and
nothing big crosses it. :class:`ServerHost` is that logic; the serial executor calls it in-process
and the Ray executor wraps it in an actor.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from raysim.capabilities.asynchronous import Asynchronous, Staleness
from raysim.capabilities.private_release import PrivateRelease
from raysim.capabilities.round_log import RoundLog
from raysim.capabilities.validation import Validation
from raysim.config import ExperimentConfig, evaluation_due
from raysim.deployment.clock import Arrival
from raysim.deployment.model import Deployment, RoundClose, async_sizes
from raysim.engine import buffered
from raysim.engine.buffered import Buffer, Saved, SyncClock
from raysim.engine.evaluation import Evaluation
from raysim.engine.experiment import make_algorithm
from raysim.engine.hooks import AlgorithmHooks
from raysim.engine.private import released_statistics
from raysim.privacy.client_level import PrivateState, private_rounds
from raysim.privacy.sample_level import ExampleAccount
from raysim.privacy.sample_level import on as example_level
from raysim.records import RoundStats
from raysim.weights import ModelWeights, payload_nbytes
from raysim.wire import ClientResult, ClientStats, Job, JobResult, ServerContext

log = logging.getLogger(__name__)


class AsyncEnvironment:
    """What the async simulation asks of the deployment (:class:`raysim.engine.buffered.Environment`),
    from the server's deployment and its knowledge of the clients; ``allowed``: who may start
    (None: every client)."""

    def __init__(self, host: ServerHost, allowed: Sequence[int] | None) -> None:
        self.host = host
        self.deployment = host.deployment
        self.allowed = None if allowed is None else set(allowed)

    def available(self, rnd: int, now_s: float) -> list[int]:
        out = self.deployment.available(rnd, now_s)
        return out if self.allowed is None else [c for c in out if c in self.allowed]

    def draw(self, rnd: int, batch: int, pool: Sequence[int], k: int) -> list[int]:
        return self.deployment.draw(rnd, batch, pool, k)

    def lost(self, rnd: int, client: int) -> bool:
        return self.deployment.lost(rnd, client)

    def nominal_s(self, client: int) -> float:
        return self.host._nominal(client)

    def duration_s(self, result: JobResult) -> float:
        return self.deployment.work_s(result)

    def offline_at(self, client: int, start_s: float, end_s: float) -> float | None:
        return self.deployment.offline_at(client, start_s, end_s)

    def next_online_s(self, now_s: float, excluded: set[int]) -> float:
        clients = [c for c in self.host.cfg.training_clients if c not in excluded]
        if self.allowed is not None:
            clients = [c for c in clients if c in self.allowed]
        return float(self.deployment.availability.next_online_s(now_s, clients))


@dataclass
class AsyncRound:
    """An async round in progress: its environment, and the updates trained so far, by client."""

    rnd: int
    env: AsyncEnvironment
    trained: dict[int, JobResult] = field(default_factory=dict)
    asked: set[int] = field(default_factory=set)  # the clients its waves have planned


class ServerHost:
    """``init_weights`` are the seeded initial model's (every part), as a client runtime built
    them: the server needs no model of its own, so it loads PyTorch only if its algorithm does."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        stats: ClientStats,
        init_weights: ModelWeights,
        algorithm: AlgorithmHooks | None = None,
    ) -> None:
        self.cfg = cfg
        self.algo = algorithm if algorithm is not None else make_algorithm(cfg)
        #: client-level DP (privacy.clip): each round's uploads released as one noised mean, or
        #: through the algorithm's own release (PrivateRelease), after its statistics' release
        self.private = private_rounds(cfg, released_statistics(cfg, self.algo))
        self.own_release = self.private is not None and PrivateRelease.of(self.algo).declared
        self.state = self.algo.init(
            ServerContext(
                cfg=cfg, clients=stats, init_weights=init_weights, adapt=self.algo.adapt_model,
                private_rows=self.private.noised_rows if self.private is not None else None,
            )  # fmt: skip
        )
        #: the simulated deployment: who is sampled, lost clients left out of the plan, late
        #: updates out of the aggregate, and the run's one clock
        self.deployment = Deployment(cfg)
        d = self.deployment.d
        self.train_sizes = stats.train_sizes.tolist()
        self.model_bytes = payload_nbytes(init_weights)
        self.deadline_s = d.deadline_s
        if d.policy == "deadline" and d.deadline_s is None:
            self.deadline_s = self.deployment.default_deadline_s(self.train_sizes, self.model_bytes)
            log.info("deployment deadline: %.3g simulated seconds a round", self.deadline_s)
        self._lost: list[int] = []
        self._sampled: list[int] = []
        self.concurrency, self.buffer_size = async_sizes(self.deployment.cfg)
        #: deployment.mode=async: the updates in flight and the clock (raysim.engine.buffered)
        self.buffer: Buffer | None = Buffer.initial(self.concurrency) if d.mode == "async" else None
        #: a timed synchronous deployment: the clock and the clients still working
        self.clock: SyncClock | None = SyncClock() if d.mode == "sync" and d.active else None
        self.staleness = Staleness.parse(d.staleness)
        self._round: AsyncRound | None = None
        self._commits: dict[int, Any] = {}
        #: sample-level DP (privacy.example_clip): each client's DP-SGD steps, accounted per client
        self.examples = ExampleAccount(cfg, self.train_sizes) if example_level(cfg) else None
        self.private_state: PrivateState | None = (
            self.private.initial if self.private is not None else PrivateState(0.0) if self.examples else None
        )

    @property
    def saved(self) -> Any:
        """What a checkpoint keeps of the server: the algorithm's state (in a timed deployment with
        the clock, in async mode the updates in flight, and under DP the privacy state: the
        adaptive clip, the clients' DP-SGD steps)."""
        if self.buffer is None and self.clock is None and self.private_state is None:
            return self.state
        return Saved(self.state, self.buffer, self.clock, self.private_state)

    def restore(self, saved: Any) -> None:
        if isinstance(saved, Saved):
            self.state, self.buffer, self.clock = saved.state, saved.buffer, saved.clock
            if self.private_state is not None:
                assert isinstance(saved.privacy, PrivateState), "a private run's checkpoint keeps its state"
                self.private_state = saved.privacy
        else:
            self.state = saved
        self._round = None

    @property
    def clock_s(self) -> float:
        """The simulated clock: the run's one clock."""
        if self.buffer is not None:
            return self.buffer.clock_s
        return self.clock.clock_s if self.clock is not None else 0.0

    def _async(self, rnd: int) -> bool:
        return self.buffer is not None and self.deployment.applies(rnd)

    def plan(self, rnd: int, sampled: Sequence[int] | None) -> list[Job]:
        """The algorithm's jobs for round ``rnd``: for the clients the deployment samples
        (``sampled`` None; a prologue or epilogue pass, or a caller, names them), without those
        whose update the deployment loses (a chain goes on from the last client whose update
        arrived). In async mode: the next wave of the round's starts that have not trained
        (:func:`raysim.engine.buffered.simulate`; ``sampled`` then limits who may start)."""
        if self._async(rnd):
            return self._async_plan(rnd, sampled)
        if sampled is None:
            busy = self.clock.busy_at(self.clock_s) if self.clock is not None else set()
            sampled = self.deployment.sample(rnd, self.clock_s, busy)
        self._sampled = list(sampled)
        if not sampled:  # no client was available
            self._lost = []
            return []
        jobs, self._lost = self.deployment.without_lost(rnd, self.algo.plan(self.state, rnd, sampled))
        return jobs

    def aggregate(self, rnd: int, results: Sequence[JobResult]) -> RoundStats:
        """Aggregate the updates that reached the server under the deployment's round policy (all
        of them, those before the deadline, or the first K); a round that none reached leaves the
        state as it was. The statistics count every client that trained. In async mode a wave's
        results, and the step once the round's events are known (``RoundStats.pending`` until then)."""
        if self._async(rnd):
            return self._async_aggregate(rnd, results)
        start = self.clock_s
        late_until: tuple[tuple[int, float], ...] = ()
        offline = 0
        if not self.deployment.applies(rnd):
            closed = RoundClose(list(results), 0.0, 0)
        elif not self._sampled:  # no client available: the round lasts until one is
            closed = RoundClose([], self.deployment.idle_s(start), 0)
        else:
            lost = [Arrival(c, self._nominal(c), dropped=True) for c in self._lost]
            closed = self.deployment.close(rnd, results, self.deadline_s, start_s=start, lost=lost)
            late_until, offline = closed.late_until, closed.offline
        if self.own_release and 1 <= rnd <= self.cfg.rounds:
            private_log = self._own_release(rnd, closed.kept)
        else:
            kept, private_log = self._released(rnd, closed.kept)
            if kept:
                self.state = self.algo.aggregate(self.state, rnd, kept)
        if self.clock is not None:
            end = start + closed.duration_s
            busy = {c: u for c, u in self.clock.busy if u > end}
            busy.update({c: start + t for c, t in late_until if start + t > end})
            self.clock = SyncClock(end, tuple(sorted(busy.items())))
        flat = [r for jr in results for r in jr.results]
        private_log = (*private_log, *self._examples_spent(rnd, flat))
        return self._stats(rnd, flat, flat, closed, len(self._lost) + offline, closed.late, private_log)

    def _examples_spent(self, rnd: int, trained: Sequence[ClientResult]) -> tuple[tuple[str, float], ...]:
        """Sample-level DP: the round's DP-SGD steps added to each client's, and the largest
        epsilon over the clients (``example_epsilon``)."""
        if self.examples is None or self.private_state is None or not 1 <= rnd <= self.cfg.rounds:
            return ()
        steps = dict(self.private_state.example_steps)
        for r in trained:
            steps[r.client] = steps.get(r.client, 0) + r.dp_steps
        self.private_state = dataclasses.replace(self.private_state, example_steps=tuple(sorted(steps.items())))
        return (("example_epsilon", self.examples.epsilon(steps)),) if self._reported(rnd) else ()

    def _released(self, rnd: int, kept: Sequence[JobResult]) -> tuple[Sequence[JobResult], tuple[tuple[str, float], ...]]:
        """The updates the algorithm aggregates: as they arrived, or under client-level DP in a
        training round their noised mean as one upload (even where none arrived: the noise is
        released all the same), with the round's privacy log (its clip, the share unclipped and the
        epsilon spent so far)."""
        if self.private is None or not 1 <= rnd <= self.cfg.rounds:
            return kept, ()
        base = self.algo.started_from(self.state)  # type: ignore[attr-defined]
        if not base.part_names:  # nothing shared, nothing uploaded (Local): nothing to release
            return kept, (("epsilon", 0.0),) if self._reported(rnd) else ()
        assert self.private_state is not None
        release = self.private.private_round(rnd, base, kept, self.private_state)
        self.private_state = release.state
        spent = (("epsilon", self.private.epsilon(rnd)),) if self._reported(rnd) else ()
        return release.results, (*release.scalars, *spent)

    def _own_release(self, rnd: int, kept: Sequence[JobResult]) -> tuple[tuple[str, float], ...]:
        """Client-level DP for an algorithm that makes its own release: its ``private_aggregate``
        reads the round's uploads (even where none arrived: its units' noise is released all the
        same) only through the round's :class:`raysim.privacy.client_level.Release`."""
        assert self.private is not None and self.private_state is not None
        release = self.private.release(rnd, self.private_state)
        self.state = self.algo.private_aggregate(self.state, rnd, kept, release)  # type: ignore[attr-defined]
        spent = (("epsilon", self.private.epsilon(rnd)),) if self._reported(rnd) else ()
        return (*release.scalars, *spent)

    def _reported(self, rnd: int) -> bool:
        """Whether round ``rnd``'s row is written, so its epsilon is asked for (an accountant's
        answer takes a fraction of a second; the rows are the evaluated rounds, and a run with a time
        budget may end at any round)."""
        return evaluation_due(self.cfg, rnd) or self.cfg.deployment.time_budget_s is not None

    def _nominal(self, client: int) -> float:
        return self.deployment.nominal_s(client, self.train_sizes[client], self.model_bytes)

    # ---- async mode: a round of events (raysim.engine.buffered)

    def _async_plan(self, rnd: int, sampled: Sequence[int] | None) -> list[Job]:
        if self._round is None or self._round.rnd != rnd:
            self._round = AsyncRound(rnd, AsyncEnvironment(self, sampled))
        need = self._simulate().need
        if not need:
            return []
        again = sorted(set(need) & self._round.asked)
        if again:
            raise RuntimeError(f"{self.cfg.algo} planned no job for client(s) {again} of an async round's wave.")
        self._round.asked.update(need)
        jobs = self.algo.plan(self.state, rnd, sorted(need))
        if any(len(j.clients) != 1 for j in jobs):
            raise RuntimeError(
                f"{self.cfg.algo} planned a chain of clients, which async mode cannot start one by one."
            )
        return jobs

    def _simulate(self) -> buffered.Simulation:
        assert self.buffer is not None and self._round is not None
        d = self.deployment.d
        return buffered.simulate(
            self.buffer,
            self._round.rnd,
            self.buffer_size,
            self._round.trained,
            self._round.env,
            max_staleness=d.max_staleness,
        )

    def _async_aggregate(self, rnd: int, results: Sequence[JobResult]) -> RoundStats:
        assert self.buffer is not None and self._round is not None and self._round.rnd == rnd
        self._round.trained.update({jr.final.client: jr for jr in results})
        sim = self._simulate()
        if sim.need:  # another wave: the executor trains the server's next plan
            return RoundStats(
                rnd=rnd, clients=0, train_loss=0.0, num_samples=0, bytes_down=0, bytes_up=0, pending=True
            )
        now = Asynchronous.started_from(self.algo, self.state)
        rebase = Asynchronous.of(self.algo).rebase
        taken = buffered.finish(self.buffer, sim, now, self.staleness, rebase=rebase)
        self.buffer = taken.buffer
        self._round = None
        self._commits = dict(taken.commits)
        closed = RoundClose(taken.results, taken.duration_s, 0)
        if closed.kept:
            self.state = self.algo.aggregate(self.state, rnd, closed.kept)
        started = [r for f in taken.started for r in f.result.results] if taken.started else []  # type: ignore[union-attr]
        arrived = [r for jr in taken.results for r in jr.results]
        extra = (("staleness", taken.staleness), ("in_flight", float(len(taken.buffer.pool))))
        return self._stats(
            rnd, started, arrived, closed, taken.lost, taken.stale, extra, tuple(sorted(taken.commits))
        )

    def take_commits(self) -> tuple[list[int], dict[int, Any]]:
        """The clients whose memory the last async step's arrivals changed, and those memories
        (for the executor to write on the clients' workers), once."""
        commits, self._commits = self._commits, {}
        return sorted(commits), commits

    def _stats(
        self,
        rnd: int,
        flat: Sequence[ClientResult],
        arrived: Sequence[ClientResult],
        closed: RoundClose,
        lost: int,
        late: int,
        extra: tuple[tuple[str, float], ...] = (),
        commits: tuple[int, ...] = (),
    ) -> RoundStats:
        """The round's statistics: compute and traffic over ``flat`` (the clients that trained in
        it), the local models read over ``arrived`` (those whose updates reached the server: in
        async mode the step's)."""
        log, val = RoundLog.of(self.algo), Validation.of(self.algo)
        n = sum(r.num_samples for r in flat)
        loss = sum(r.train_loss * r.num_samples for r in flat) / max(n, 1)
        return RoundStats(
            rnd=rnd,
            clients=len(flat),
            train_loss=float(loss),
            num_samples=n,
            bytes_down=sum(r.bytes_down for r in flat),
            bytes_up=sum(r.bytes_up for r in flat),
            samples_trained=sum(r.samples_trained for r in flat),
            client_analyses=tuple((r.client, r.analysis) for r in arrived if r.analysis is not None),
            updated_lm=tuple((r.client, r.lm_correct) for r in arrived if r.lm_correct is not None),
            client_epochs=sum(r.samples_trained / r.num_samples for r in flat if r.num_samples),
            scalars=log.scalars(self.algo, self.state, rnd) + extra,
            texts=log.texts(self.algo, self.state, rnd),
            images=log.images(self.algo, self.state, rnd) if evaluation_due(self.cfg, rnd) else (),
            validate=val.wanted(self.algo, self.state, rnd),
            sim_duration_s=closed.duration_s,
            lost=lost,
            late=late,
            sim_clock_s=self.clock_s,
            commits=commits,
        )

    def observe_validation(self, rnd: int, accuracy: float) -> None:
        """The global model's validation accuracy after round ``rnd``, for an algorithm with the
        ``validation`` capability (asked for in that round's ``RoundStats.validate``)."""
        self.state = Validation.of(self.algo).observe(self.algo, self.state, rnd, accuracy)

    def evaluation(self) -> Evaluation:
        """What the workers evaluate the current state with (the algorithm's ``evaluation`` hook)."""
        return self.algo.evaluation(self.state)
