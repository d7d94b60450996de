"""Summing a round's uploads where they were trained: the client workers send the server
partial sums instead of every client's weights.

In the cross-device regime a round has hundreds of one-step clients, and every one of them would
send its whole model through the object store to the server, which reads them all and averages
them. An algorithm whose aggregate is exactly the size-weighted mean of every job's upload
(:func:`raysim.toolkit.aggregate.average_uploads`) declares ``presum = Presum()``; then its rounds'
uploads are summed in *blocks*: :data:`SUM_BLOCK` consecutive jobs of the plan, each block's
``sum_k c_k w_k`` in float64 in plan order, and the blocks' sums added in plan order. The blocks
depend on the plan alone, so every executor computes the same sums in the same order, and serial
and Ray runs give the same numbers bit for bit. The serial executor sums each block itself; the Ray
executor places each block whole on one worker, which sums it there and returns the block's sum
with its clients' results, their weights left out (:class:`raysim.wire.JobResult`'s ``presum``).

It applies where the round has nothing else to do with the uploads: the class's ``aggregate`` is
the one that declared it (a subclass with its own aggregate has no ``Presum``), the jobs are
unpinned single clients and the deployment is ideal (a deployment that loses or drops updates
chooses them after training, on the server). Batched training (``train.batch_clients`` K > 1) too:
a batch is K consecutive jobs of the plan trained on one worker, which sums the blocks the batch
holds whole (all of them where K is a multiple of :data:`SUM_BLOCK`, as the batches start at
multiples of K); the server sums a block that two batches share from its uploads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raysim.capabilities.declared import Capability
from raysim.config import ExperimentConfig
from raysim.toolkit.aggregate import SUM_BLOCK

#: the Ray executor sums on the workers when a round has at least this many jobs (with fewer, the
#: uploads are few and the blocks would balance the workers poorly)
PRESUM_MIN_JOBS = 4 * SUM_BLOCK


@dataclass(frozen=True)
class Presum(Capability):
    """Declared on the class whose ``aggregate`` averages every upload by training-set size."""

    owner: Any = field(default=None, compare=False)

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "owner", owner)

    @classmethod
    def averages(cls, algorithm: Any) -> bool:
        """Whether ``algorithm``'s (class or object) aggregate is the size-weighted mean of every
        upload: it declares the capability and uses the ``aggregate`` of the class that declared it
        (a subclass with its own aggregate does not average)."""
        klass = algorithm if isinstance(algorithm, type) else type(algorithm)
        found = cls.of(klass)
        return found.declared and getattr(klass, "aggregate", None) is getattr(found.owner, "aggregate", object())

    @classmethod
    def applies(cls, algorithm: Any, cfg: ExperimentConfig) -> bool:
        """Whether ``algorithm``'s rounds (class or object) may be summed on the workers under ``cfg``."""
        from raysim.deployment.model import apply_preset

        klass = algorithm if isinstance(algorithm, type) else type(algorithm)
        return (
            cls.averages(klass)
            and bool(getattr(klass, "shared_parts", ()))
            and not getattr(klass, "pinned", True)
            and apply_preset(cfg).deployment.ideal  # a named deployment's settings, where a preset is given
            and cfg.privacy.clip == "none"  # client-level DP clips each upload on the server
        )


__all__ = ["PRESUM_MIN_JOBS", "SUM_BLOCK", "Presum"]
