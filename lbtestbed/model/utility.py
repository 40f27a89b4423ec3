"""Utility functions of server pools (Goldsztajn et al. 2021, arXiv 2112.08958, §2.1; docs/theory.md,
"The pool model").

u(x) is the utility of a pool holding x tasks; ``delta(x) = u(x+1) - u(x)`` is the marginal utility of the
slot the pool's next task would fill. Policies, simulator and theory share these objects, so all of them
break ties on the same rounded marginal utilities.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

#: marginal utilities are rounded to this many decimals before they are compared (docs/theory.md, "Slots
#: and their ranking": the sort key)
TIE_DECIMALS = 12


class Utility:
    """A concave utility u on {0, 1, 2, ...}, evaluated from a growing cache."""

    __slots__ = ("_values", "describe_text")

    def __init__(self, first_values: Sequence[float], describe_text: str) -> None:
        self._values = list(first_values)
        self.describe_text = describe_text

    def _extend(self, x: int) -> None:
        raise NotImplementedError

    def value(self, x: int) -> float:
        if x >= len(self._values):
            self._extend(x)
        return self._values[x]

    def delta(self, x: int) -> float:
        """u(x + 1) - u(x), rounded so that exact ties stay ties."""
        return round(self.value(x + 1) - self.value(x), TIE_DECIMALS)

    def values(self, upto: int) -> list[float]:
        """u(0), ..., u(upto)."""
        self.value(upto)
        return self._values[: upto + 1]

    def table(self) -> dict[str, object]:
        """The spec's ``utility`` table that reads back as this utility."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:  # equal when the spec gives the same table
        return isinstance(other, Utility) and type(other) is type(self) and other.table() == self.table()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.table().items())))


class XLogUtility(Utility):
    """u(x) = x ln(r / x), u(0) = 0: x tasks sharing a resource r (Goldsztajn et al. 2021, arXiv
    2112.08958, Table 1)."""

    __slots__ = ("r",)

    def __init__(self, r: float) -> None:
        self.r = r
        super().__init__([0.0], f"x ln({r:g}/x)")

    def _extend(self, x: int) -> None:
        for k in range(len(self._values), x + 1):
            self._values.append(k * math.log(self.r / k))

    def table(self) -> dict[str, object]:
        return {"kind": "xlog", "r": self.r}


class TableUtility(Utility):
    """u given as a table u(0..m); beyond the table u continues with its last increment."""

    __slots__ = ("given", "last_step")

    def __init__(self, values: Sequence[float]) -> None:
        if len(values) < 2:
            raise ValueError("a utility table needs at least two values")
        self.given = list(values)
        self.last_step = values[-1] - values[-2]
        super().__init__(values, f"table{list(values)!r}")

    def _extend(self, x: int) -> None:
        while len(self._values) <= x:
            self._values.append(self._values[-1] + self.last_step)

    def table(self) -> dict[str, object]:
        return {"kind": "table", "values": list(self.given)}


def first_concavity_violation(values: Sequence[float]) -> int | None:
    """The first j whose marginal utility exceeds the one before it, or None if u is concave."""
    steps = [round(b - a, TIE_DECIMALS) for a, b in itertools.pairwise(values)]
    for j in range(1, len(steps)):
        if steps[j] > steps[j - 1]:
            return j
    return None
