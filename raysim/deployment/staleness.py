"""An asynchronous update's weight by its staleness (``deployment.staleness``): the functions of
Xie, Koyejo and Gupta, "Asynchronous Federated Optimization" (2019), Sec. 5.2, of which FedBuff's
1/sqrt(1 + tau) is the polynomial one with A = 0.5."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from raysim.errors import ConfigError


@dataclass(frozen=True)
class Staleness:
    """An update's weight s(tau), tau the server steps since its client started
    (``deployment.staleness``):

    - ``constant``: 1;
    - ``polynomial[:A]``: (1 + tau)^-A (Xie et al. 2019, "Asynchronous Federated Optimization",
      Sec. 5.2; A = 0.5 by default, FedBuff's 1/sqrt(1 + tau));
    - ``hinge[:A:B]``: 1 while tau <= B, then 1 / (A (tau - B) + 1) (Xie et al., Sec. 5.2; by default
      A = 10 and B = 4, our choice).
    """

    kind: Literal["constant", "polynomial", "hinge"]
    a: float = 0.5
    b: float = 4.0

    @classmethod
    def parse(cls, text: str) -> Staleness:
        """``text`` as a staleness function; a mistake is one sentence naming the forms."""
        forms = "constant, polynomial[:A] (A above 0) or hinge[:A:B] (A above 0, B at least 0)"
        kind, *params = [p.strip() for p in str(text).split(":")]
        arity = {"constant": 0, "polynomial": 1, "hinge": 2}
        if kind not in arity or len(params) > arity[kind]:
            raise ConfigError(f"deployment.staleness takes {forms}, not {text!r}.")
        try:
            values = [float(p) for p in params]
        except ValueError:
            raise ConfigError(f"deployment.staleness takes {forms}: {text!r} has a part that is not a number.") from None
        if kind == "hinge" and len(values) == 1:
            raise ConfigError(f"deployment.staleness=hinge takes both A and B (hinge:A:B), not {text!r}.")
        if any(not math.isfinite(v) for v in values) or (values and values[0] <= 0) or (len(values) == 2 and values[1] < 0):
            raise ConfigError(f"deployment.staleness takes {forms}, not {text!r}.")
        if kind == "polynomial":
            return cls("polynomial", *values)
        if kind == "hinge":
            return cls("hinge", *values) if values else cls("hinge", 10.0, 4.0)
        return cls("constant")

    def __call__(self, tau: int) -> float:
        if self.kind == "constant":
            return 1.0
        if self.kind == "polynomial":
            return float((1.0 + tau) ** -self.a)
        return 1.0 if tau <= self.b else 1.0 / (self.a * (tau - self.b) + 1.0)


__all__ = ["Staleness"]
