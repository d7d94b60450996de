"""The algorithms, one module each; importing this package registers them in
:data:`raysim.registry.ALGORITHMS` (the registry imports it the first time it is read)."""

from algorithms import (  # noqa: F401
    cfl,
    ditto,
    fed3p2,
    fedamp,
    fedavg,
    fedbabu,
    fedclust,
    feddrplus,
    feddyn,
    fedexp,
    fedfcd,
    fedgh,
    fedntd,
    fedpac,
    fedper,
    fedproto,
    fedprox,
    fedrod,
    gpfl,
    local,
    pacfl,
    perfedavg,
    pfedme,
    scaffold,
)
