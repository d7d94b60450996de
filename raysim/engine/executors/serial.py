"""The serial executor: everything in this process, one server host and one client runtime for
every client. It gives the numbers the Ray executor gives (docs/design.md)."""

from __future__ import annotations

from collections.abc import Sequence

from raysim.capabilities.batching import Batching, batch_units
from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.engine.executors.base import DataLoader
from raysim.engine.executors.evaluation import (
    accuracy_of,
    assemble_report,
    eval_targets,
    evaluated_clients,
    validated,
    validation_target,
)
from raysim.engine.experiment import Experiment
from raysim.internals import internals_on
from raysim.records import EvalReport, RoundStats, Snapshot
from raysim.wire import ClientStats, JobResult


class SerialExecutor:
    num_workers = 1
    restarts = 0

    def __init__(self, experiment: ExperimentConfig | Experiment, data: FederatedData) -> None:
        """``experiment``: checked by the runner, or a bare config (its algorithm resolved here)."""
        import torch

        from raysim.engine.client import ClientRuntime
        from raysim.engine.server import ServerHost

        exp = Experiment.of(experiment)
        cfg = self.cfg = exp.cfg
        torch.set_num_threads(cfg.train_threads)
        self.data = data
        self.runtime = ClientRuntime(cfg, data, exp.make_algorithm())
        stats = ClientStats.from_label_counts(data.train_label_counts(), data.train.input_shape)
        self.server = ServerHost(cfg, stats, self.runtime.initial_weights, exp.make_algorithm())
        self.completed = -1

    @classmethod
    def start(cls, experiment: Experiment, load_data: DataLoader) -> SerialExecutor:
        internals_on()  # a mistyped RAYSIM_INTERNALS refused before the data is asked for
        return cls(experiment, load_data())

    def train_round(self, rnd: int, sampled: Sequence[int] | None = None) -> RoundStats:
        """Round ``rnd`` over the clients the server samples (or ``sampled``): in async mode wave
        after wave until the server's step is known, its arrivals' memories written after it."""
        stats = self._wave(rnd, sampled)
        while stats.pending:
            stats = self._wave(rnd, sampled)
        if stats.commits:
            _, memories = self.server.take_commits()
            self.runtime.memory.update(memories)
        return validated(stats, rnd, self.validate)

    def _wave(self, rnd: int, sampled: Sequence[int] | None) -> RoundStats:
        jobs = self.server.plan(rnd, sampled)
        results: list[JobResult | None] = [None] * len(jobs)
        for unit in batch_units(jobs, self.cfg.train.batch_clients, Batching.of(self.runtime.algo).pinned):
            if len(unit) > 1:  # jobs trained together (train.batch_clients)
                chains = [jobs[j].clients for j in unit]
                for j, res in zip(unit, self.runtime.run_batch(rnd, chains, jobs[unit[0]].payload), strict=True):
                    results[j] = JobResult(jobs[j], tuple(res))
            else:
                job = jobs[unit[0]]
                results[unit[0]] = JobResult(job, tuple(self.runtime.run_chain(rnd, job.clients, job.payload, None)))
        return self.server.aggregate(rnd, [r for r in results if r is not None])

    def evaluate(self, rnd: int) -> EvalReport:
        algo = self.runtime.algo
        has_global = algo.evaluates_global(self.cfg)
        targets = eval_targets(self.data) if has_global else []
        clients = evaluated_clients(self.cfg, algo.evaluates_personal(self.cfg), range(self.data.num_clients))
        part = self.runtime.evaluate(rnd, self.server.evaluation(), targets, clients)
        return assemble_report(self.data, targets, [part], has_global, self.cfg.new_clients)

    def validate(self, rnd: int) -> float:
        """The global model's accuracy on the validation parts, passed back to the server."""
        part = self.runtime.evaluate(rnd, self.server.evaluation(), [validation_target(self.data)], [])
        accuracy = accuracy_of([part])
        self.server.observe_validation(rnd, accuracy)
        return accuracy

    def end_round(self, rnd: int) -> None:
        self.completed = rnd

    def snapshot(self) -> Snapshot:
        return Snapshot(self.completed, self.server.saved, dict(self.runtime.memory))

    def restore(self, snapshot: Snapshot) -> None:
        self.server.restore(snapshot.server_state)
        self.runtime.memory = dict(snapshot.client_states)
        self.completed = snapshot.round

    def shutdown(self) -> None:
        pass


__all__ = ["SerialExecutor"]
