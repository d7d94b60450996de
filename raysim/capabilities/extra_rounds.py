"""The capability of a pass over every client outside the training rounds (:class:`ExtraRounds`),
declared on an algorithm's class.

- ``prologue``: a round 0 over every client before round 1 (``plan`` and ``aggregate`` get
  ``rnd = 0``), e.g. FedFCD's first upload of class prototypes, PACFL's and FedClust's clustering.
  It is not a training round and is not logged; a checkpoint after it resumes at round 1.
- ``epilogue``: a pass over every client after the last round's training and before its evaluation
  (``plan`` and ``aggregate`` get ``rnd = rounds + 1``), e.g. SphereFed's calibration statistics of
  the final global model. It is not logged as a round; its compute and bytes are counted in the last.

The runner asks :meth:`ExtraRounds.first_round` and :attr:`ExtraRounds.epilogue`; an algorithm
without the capability has neither pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from raysim.capabilities.declared import Capability


@dataclass(frozen=True)
class ExtraRounds(Capability):
    """``extra_rounds = ExtraRounds(prologue=True)`` (or ``epilogue=True``) on an algorithm's class."""

    prologue: bool = False
    epilogue: bool = False

    @classmethod
    def absent(cls) -> ExtraRounds:
        """An algorithm that declares no ``ExtraRounds``: :data:`NO_EXTRA_ROUNDS` (neither pass)."""
        return NO_EXTRA_ROUNDS

    def first_round(self) -> int:
        """The first round a fresh run takes: 0 (the prologue) or 1."""
        return 0 if self.prologue else 1


#: what an algorithm that says nothing has
NO_EXTRA_ROUNDS = ExtraRounds(declared=False)

__all__ = ["NO_EXTRA_ROUNDS", "ExtraRounds"]
