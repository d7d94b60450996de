"""The small records that travel back to the driver: round statistics and evaluation counts.

Plain dataclasses of numbers and NumPy arrays, so the driver reads them without PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RoundStats:
    """What the driver learns of a round."""

    rnd: int
    clients: int
    train_loss: float  # sample-weighted mean over the round's clients
    num_samples: int
    bytes_down: int
    bytes_up: int
    samples_trained: int = 0  # samples the round's clients trained on, every pass counted
    client_epochs: float = 0.0  # the same in passes over each client's data: sum of samples_trained / n_k
    scalars: tuple[tuple[str, float], ...] = ()  # the algorithm's own (round_log)
    texts: tuple[tuple[str, str], ...] = ()  # the algorithm's own (round_log)
    images: tuple[tuple[str, Any], ...] = ()  # (tag, uint8 image) (round_log)
    validate: bool = False  # the algorithm asks for the global model's validation accuracy
    #: ``eval.analyses``: (client, its local model's ``local_*`` values) for the round's clients
    client_analyses: tuple[tuple[int, dict[str, float | None]], ...] = ()
    #: ``eval.updated_lm``: (client, its updated local model's correct count on its P-Test)
    updated_lm: tuple[tuple[int, int], ...] = ()
    #: the simulated deployment (raysim.deployment): the round's simulated duration (until its
    #: aggregation could start), the sampled clients whose update was lost, and the updates that
    #: arrived too late (after the deadline, or beyond the first K under over-selection)
    sim_duration_s: float = 0.0
    lost: int = 0
    late: int = 0
    #: the server's simulated clock at the round's end (its one clock: raysim.engine.server)
    sim_clock_s: float = 0.0
    #: async mode: the round is not done; the executor trains the server's next plan (a wave of the
    #: round's event simulation, raysim.engine.buffered) and aggregates again
    pending: bool = False
    #: async mode: the clients whose memory the step's arrivals changed (the server's
    #: ``take_commits`` holds them, for their workers)
    commits: tuple[int, ...] = ()


@dataclass(frozen=True)
class EvalTarget:
    """Samples the global model predicts: ``indices`` into ``data.ptest`` or ``data.gtest``."""

    pool: str  # "ptest" | "gtest" | "train" (the clients' validation parts)
    indices: np.ndarray
    #: the one share of an evaluation that also gives the global model's one-off outputs (the
    #: features of ``eval.features``): the first chunk of the first target
    leads: bool = False


@dataclass(frozen=True)
class EvalPart:
    """One worker's share of an evaluation."""

    global_correct: tuple[np.ndarray, ...]  # per target: a bool per sample
    personal_correct: tuple[tuple[int, int | None], ...]  # (client, correct on its P-Test)
    #: ``eval.analyses``: per target, cos(f(x), v_y) and ||f(x)|| per sample (else empty)
    global_align: tuple[np.ndarray, ...] = ()
    global_norm: tuple[np.ndarray, ...] = ()
    #: ``eval.features``: ("global" or "client_<c>", the features f(x) of the fixed sample of G-Test)
    features: tuple[tuple[str, np.ndarray], ...] = ()


@dataclass(frozen=True)
class ClientEval:
    """Correct predictions on one client's P-Test (None where the model does not exist)."""

    client: int
    n_test: int
    gm_correct: int | None
    lm_correct: int | None
    #: ``eval.updated_lm``: the client's model as its local update in this round left it (None
    #: where the client was not trained this round, or the setting is off)
    ulm_correct: int | None = None
    #: ``eval.analyses``: the global model on G-Test's observed/unobserved classes (raysim.results.analysis)
    gm_split: dict[str, float | None] | None = None
    #: held out of training (``eval.new_clients``): ``lm_correct`` is its newcomer model's
    new: bool = False
    #: ``data.feature_shift``: the client's domain (None without a shift)
    domain: int | None = None


@dataclass(frozen=True)
class EvalReport:
    clients: tuple[ClientEval, ...]
    gtest_correct: int | None
    gtest_total: int
    #: ``eval.analyses``: the global model's accuracy on each class of G-Test
    gm_class_acc: list[float | None] | None = None
    #: ``eval.features``: the features of the fixed G-Test sample, the global model's then each client's
    features: tuple[tuple[str, np.ndarray], ...] = ()
    #: ``data.feature_shift``: the global model's correct predictions and the sample count on each
    #: domain's copy of G-Test (empty without a shift, or without a global model)
    gtest_domains: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """Everything an executor holds of a run at a round boundary: the server state and every
    client's memory (``raysim.toolkit.context.ClientMemory``) as of the completed round ``round`` (0: after
    the prologue; -1: nothing completed yet). A checkpoint embeds one; ``Executor.restore`` puts
    one back."""

    round: int
    server_state: Any
    client_states: dict[int, Any]


@dataclass
class RunTotals:
    """What a run has spent so far: wall time training and evaluating, and compute (the samples
    its clients trained on, and the same in client-epochs). Kept in checkpoints, so a resumed run
    goes on counting."""

    train_time_s: float = 0.0  # the rounds' wall times, training only
    eval_time_s: float = 0.0
    samples_trained: int = 0
    client_epochs: float = 0.0
    sim_time_s: float = 0.0  # the simulated clock (raysim.deployment): the rounds' simulated durations
    updates_lost: int = 0  # the deployment's: sampled clients whose update was lost
    updates_late: int = 0  # and updates that came too late to be aggregated

    def add_round(self, stats: RoundStats, round_time: float, eval_time: float) -> None:
        self.train_time_s += round_time
        self.eval_time_s += eval_time
        self.samples_trained += stats.samples_trained
        self.client_epochs += stats.client_epochs
        self.sim_time_s += stats.sim_duration_s
        self.updates_lost += stats.lost
        self.updates_late += stats.late
