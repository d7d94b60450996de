"""Seeded random streams keyed by what they are for.

docs/design.md: every random draw comes from (seed, round, client, purpose), never from a global generator
or from scheduling order, so serial and Ray runs give the same numbers whatever the number of workers.
"""

from __future__ import annotations

import zlib

import numpy as np

NO_CLIENT = -1


def _key(purpose: str) -> int:
    return zlib.crc32(purpose.encode())


def seed_sequence(seed: int, purpose: str, rnd: int = 0, client: int = NO_CLIENT) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, _key(purpose), rnd, client + 1])


def generator(seed: int, purpose: str, rnd: int = 0, client: int = NO_CLIENT) -> np.random.Generator:
    """A NumPy generator for one purpose, e.g. ``generator(seed, "shuffle", rnd, client)``."""
    return np.random.default_rng(seed_sequence(seed, purpose, rnd, client))


def int_seed(seed: int, purpose: str, rnd: int = 0, client: int = NO_CLIENT) -> int:
    """A 63-bit integer seed (for ``torch.manual_seed``) for one purpose."""
    return int(seed_sequence(seed, purpose, rnd, client).generate_state(1, np.uint64)[0] >> np.uint64(1))


def sample_clients(seed: int, rnd: int, num_clients: int, per_round: int) -> list[int]:
    """The clients of round ``rnd``: ``per_round`` drawn uniformly without replacement, sorted."""
    if per_round >= num_clients:
        return list(range(num_clients))
    rng = generator(seed, "sample", rnd)
    return sorted(int(c) for c in rng.choice(num_clients, size=per_round, replace=False))


def new_client_count(num_clients: int, share: float) -> int:
    """How many of ``num_clients`` clients ``eval.new_clients=share`` holds out: ``round(share *
    num_clients)``, at least one when ``share`` > 0."""
    return 0 if share <= 0 else max(1, round(share * num_clients))


_HELD_OUT: dict[tuple[int, int, float], tuple[int, ...]] = {}


def held_out_clients(seed: int, num_clients: int, share: float) -> tuple[int, ...]:
    """The clients ``eval.new_clients=share`` holds out of training, sorted: a draw without
    replacement on the seed's own stream ("new_clients"), so every process of a run holds out the
    same ones."""
    key = (seed, num_clients, share)
    if key not in _HELD_OUT:
        n = new_client_count(num_clients, share)
        picked = generator(seed, "new_clients").choice(num_clients, size=n, replace=False) if n else np.zeros(0, np.int64)
        _HELD_OUT[key] = tuple(sorted(int(c) for c in picked))
    return _HELD_OUT[key]

