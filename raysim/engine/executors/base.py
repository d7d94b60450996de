"""The executor interface: what the runner's round loop calls, the same for every executor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from raysim.data import FederatedData
from raysim.records import EvalReport, RoundStats, Snapshot

if TYPE_CHECKING:
    from raysim.engine.experiment import Experiment

#: the data, loaded and partitioned: the runner's loads in a thread of its own from before the executor
#: starts, so an executor starts its cluster first and then asks (it also starts the run's side work)
DataLoader = Callable[[], FederatedData]


class Executor(Protocol):
    num_workers: int
    restarts: int  # client workers replaced after dying
    data: FederatedData

    @classmethod
    def start(cls, experiment: Experiment, load_data: DataLoader) -> Executor:
        """A running executor for the checked ``experiment`` (its config and its algorithm's class,
        looked up once in the driver), on the data ``load_data`` returns. An executor that needs a cluster
        starts it (or joins one, or uses the Ray session already running in this process) and
        :meth:`shutdown` stops it only if it started it."""
        ...

    def train_round(self, rnd: int, sampled: Sequence[int] | None = None) -> RoundStats:
        """Plan, train and aggregate round ``rnd`` over the clients the server samples (the
        deployment's draw on the server's clock; ``sampled``: these instead); then, if the
        algorithm asks (its ``validation`` capability, ``RoundStats.validate``), evaluate the global
        model on the validation parts and pass the accuracy back to the server
        (:func:`raysim.engine.executors.evaluation.validated`: ``val_gm`` among the stats' scalars)."""
        ...

    def evaluate(self, rnd: int) -> EvalReport: ...

    def end_round(self, rnd: int) -> None:
        """Round ``rnd`` is complete (trained, validated, evaluated): it is what :meth:`snapshot`
        returns from now on."""
        ...

    def snapshot(self) -> Snapshot:
        """The server state and every client's memory as of the last completed round."""
        ...

    def restore(self, snapshot: Snapshot) -> None:
        """Put a checkpoint's states back, as if its round had just been completed here."""
        ...

    def shutdown(self) -> None: ...


__all__ = ["DataLoader", "Executor"]
