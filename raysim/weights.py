"""Model weights on the wire: one flat, contiguous float32 array per model part (NumPy only).

docs/design.md: weights travel as flat contiguous arrays per model part, so the Ray object store holds one
buffer per part and workers read it zero-copy. A part's flat array is every floating tensor of its
``state_dict`` (parameters and buffers, e.g. BatchNorm statistics) in ``state_dict`` order; reading
and writing them on a model is :mod:`raysim.models`' side (``get_weights``, ``set_weights``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

#: the named parts of every model (raysim.models.SplitModel)
PARTS = ("extractor", "filter", "head", "phead")
#: the parts of the global path extractor -> filter -> head
GLOBAL_PARTS = ("extractor", "filter", "head")
BODY = ("extractor", "filter")  # what makes the representation the heads read


@dataclass(frozen=True, eq=False)
class ModelWeights:
    """Flat float32 arrays for the parts present; a part that is None is not carried."""

    extractor: np.ndarray | None = None
    filter: np.ndarray | None = None
    head: np.ndarray | None = None
    phead: np.ndarray | None = None

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in PARTS:
            arr = getattr(self, name)
            if arr is not None:
                yield name, arr

    def part(self, name: str) -> np.ndarray:
        arr = getattr(self, name)
        if arr is None:
            raise KeyError(f"these weights carry no {name}")
        out: np.ndarray = arr
        return out

    @property
    def part_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.items())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for _, a in self.items())

    def select(self, parts: Sequence[str]) -> ModelWeights:
        return ModelWeights(**{p: getattr(self, p) for p in parts})

    def merged(self, other: ModelWeights) -> ModelWeights:
        """These weights with ``other``'s parts put over them."""
        return ModelWeights(
            **{p: getattr(other, p) if getattr(other, p) is not None else getattr(self, p) for p in PARTS}
        )

    def equals(self, other: ModelWeights) -> bool:
        if self.part_names != other.part_names:
            return False
        return all(np.array_equal(a, getattr(other, n)) for n, a in self.items())


def map_parts(fn: Callable[..., np.ndarray], *ws: ModelWeights) -> ModelWeights:
    """Apply ``fn`` part by part to weights that carry the same parts."""
    names = ws[0].part_names
    for w in ws[1:]:
        if w.part_names != names:
            raise ValueError(f"weights carry different parts: {names} vs {w.part_names}")
    return ModelWeights(**{n: fn(*(getattr(w, n) for w in ws)) for n in names})


def payload_nbytes(obj: Any) -> int:
    """Bytes of the arrays inside a payload or result (dataclasses, sequences, mappings, arrays)."""
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):  # a torch.Tensor
        return int(obj.numel() * obj.element_size())
    if isinstance(obj, ModelWeights):
        return obj.nbytes
    if hasattr(obj, "__dataclass_fields__"):
        return sum(payload_nbytes(getattr(obj, f.name)) for f in fields(obj))
    if isinstance(obj, (list, tuple)):
        return sum(payload_nbytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(payload_nbytes(x) for x in obj.values())
    return 0
