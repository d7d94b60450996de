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
