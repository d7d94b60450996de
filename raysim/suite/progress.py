"""The suite's progress line (a Ray Tune callback; imports Ray Tune)."""

from __future__ import annotations

import sys
import time
from typing import Any

from ray.tune import Callback


def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class SuiteProgress(Callback):
    """A line on stderr whenever the suite's state changes: trials done, running and queued, the
    time so far and the time left (the mean time of the trials finished in this session, times the
    trials left, over the trials running at once)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.t0 = time.time()
        self.durations: list[float] = []
        self.started: dict[str, float] = {}
        self.last = ""

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.started[trial.trial_id] = time.time()
        self.show(trials)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if trial.trial_id in self.started:
            self.durations.append(time.time() - self.started.pop(trial.trial_id))
        self.show(trials)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.show(trials)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self.show(trials)

    def show(self, trials: list[Any]) -> None:
        status = [t.status for t in trials]
        done = sum(s in ("TERMINATED", "ERROR") for s in status)
        running = status.count("RUNNING")
        queued = max(self.total - done - running, 0)
        state = f"suite: {done}/{self.total} done, {running} running, {queued} queued"
        if state == self.last:
            return
        self.last = state
        left = ""
        if self.durations and running:
            left = f", about {clock((queued + running) * sum(self.durations) / len(self.durations) / running)} left"
        print(f"{state}; {clock(time.time() - self.t0)}{left}", file=sys.stderr, flush=True)
