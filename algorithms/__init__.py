"""The algorithms, one module each; importing this package registers them (see ``base.register``)."""

from algorithms import (  # noqa: F401
    ditto,
    fed3p2,
    fedavg,
    fedbabu,
    feddrplus,
    fedfcd,
    fedgh,
    fedpac,
    fedper,
    fedproto,
    fedprox,
    fedrod,
    local,
    scaffold,
)
from algorithms.base import REGISTRY, Algorithm, register

__all__ = ["REGISTRY", "Algorithm", "register"]
