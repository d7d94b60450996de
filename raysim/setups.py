"""Where each setting of an algorithm's paper setup comes from (``Algorithm.setup_sources``).

A paper setup (``Algorithm.paper_setup``) is a dict of dotted settings; its sources, one per key,
say whether the paper states the value (:class:`Stated`, with the section or table) or the setup
chose it where the paper is silent (:class:`Choice`, with whose behaviour it follows: the authors'
code, PFLlib, a sibling setup). :mod:`raysim.engine.setups` renders both, per algorithm and
dataset, into the table of ``docs/algorithms.md``, and a test fails when the two drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stated:
    """The paper states the value, at ``where`` (e.g. "Sec. 5.1", "Table 6")."""

    where: str


@dataclass(frozen=True)
class Choice:
    """The paper does not state the value; ``why`` says whose it is (e.g. "PFLlib's default")."""

    why: str


Source = Stated | Choice

__all__ = ["Choice", "Source", "Stated"]
