"""The algorithms, one module each; importing this package registers them (see ``base.register``)."""

from algorithms import fed3p2, fedavg, fedfcd, fedgh, fedpac, fedproto, fedprox, local  # noqa: F401
from algorithms.base import REGISTRY, Algorithm, register

__all__ = ["REGISTRY", "Algorithm", "register"]
