"""The executor interface: what the runner's round loop calls, the same for every executor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.records import EvalReport, RoundStats, Snapshot

#: loads and partitions the data (an executor may start its cluster meanwhile)
DataLoader = Callable[[], FederatedData]


class Executor(Protocol):
    num_workers: int
    restarts: int  # client workers replaced after dying
    data: FederatedData

    @classmethod
    def start(cls, cfg: ExperimentConfig, load_data: DataLoader) -> Executor:
        """A running executor on the data ``load_data`` returns. An executor that needs a cluster
        starts it (or joins one, or uses the Ray session already running in this process) and
        :meth:`shutdown` stops it only if it started it."""
        ...

    def train_round(self, rnd: int, sampled: Sequence[int]) -> RoundStats: ...

    def evaluate(self, rnd: int) -> EvalReport: ...

    def validate(self, rnd: int) -> float: ...

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
