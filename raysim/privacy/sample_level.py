"""Sample-level DP's accounting on the server: each client is accounted on its own sampling rate and
its own DP-SGD steps (:mod:`raysim.privacy.dp_sgd`), and a run reports the largest epsilon over its
clients (``example_epsilon``).

Client k trains its lots at rate q_k = min(1, B / n_k) (``train.batch_size`` B, n_k its training
examples), and every DP-SGD step it takes is one composition of the Poisson-sampled Gaussian with
noise multiplier ``privacy.example_noise_multiplier`` (its ``ClientResult.dp_steps``, summed over
the rounds it trained in, whether or not its update reached the server: its data was used). Its
epsilon at delta is :func:`raysim.privacy.accounting.dp_sgd_epsilon`; the run's is the largest.
Epsilon grows with the steps at a fixed rate and with the rate at fixed steps, so only the clients
no other one exceeds in both are computed.

delta: ``privacy.delta`` where given, else 1 / n^1.1 for the largest client's n examples (below
1 / n_k for every client, as a guarantee about one example of n_k needs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from raysim.config import ExperimentConfig


def on(cfg: ExperimentConfig) -> bool:
    """Whether the run is private at the example level (``privacy.example_clip``)."""
    return cfg.privacy.example_clip is not None


def example_delta(cfg: ExperimentConfig, train_sizes: Sequence[int]) -> float:
    """The delta of sample-level DP (the module's docstring)."""
    if cfg.privacy.delta is not None:
        return float(cfg.privacy.delta)
    return 1.0 / max(max(train_sizes), 2) ** 1.1


@dataclass
class ExampleAccount:
    """The run's per-client DP-SGD steps and their largest epsilon."""

    cfg: ExperimentConfig
    train_sizes: Sequence[int]
    _cache: dict[tuple[float, int], float] = field(default_factory=dict, repr=False)

    def rate(self, client: int) -> float:
        from raysim.privacy.dp_sgd import sampling_rate

        return float(sampling_rate(self.cfg.train.batch_size, int(self.train_sizes[client])))

    def epsilon(self, steps: Mapping[int, int]) -> float:
        """The largest epsilon over the clients, after ``steps`` (client -> DP-SGD steps so far)."""
        from raysim.privacy.accounting import dp_sgd_epsilon

        p = self.cfg.privacy
        delta = example_delta(self.cfg, self.train_sizes)
        points = {(self.rate(c), int(s)) for c, s in steps.items() if s > 0}
        frontier = [a for a in points if not any(b != a and b[0] >= a[0] and b[1] >= a[1] for b in points)]
        best = 0.0
        for q, s in frontier:
            if (q, s) not in self._cache:
                self._cache[(q, s)] = dp_sgd_epsilon(p.example_noise_multiplier, q, s, delta, p.accountant)
            best = max(best, self._cache[(q, s)])
        return best


__all__ = ["ExampleAccount", "example_delta", "on"]
