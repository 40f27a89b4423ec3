"""The ranking of coordinates (slots) by marginal utility (Goldsztajn et al. 2021, arXiv 2112.08958, §2.3;
docs/theory.md, "Slots and their ranking").

Slot (i, j) of class i is the place a class-i pool holding j - 1 tasks offers to its next task; its value is
the marginal utility delta_i(j - 1). The enumeration (i_1, j_1), (i_2, j_2), ... lists the slots from best to
worst: larger marginal utility first, exact ties by the dictionary order of (i, j) ("ij", the default) or of
(j, i) ("ji"). It is a k-way merge of the per-class streams, each sorted because u_i is concave. JLMU,
SLTA and the theory all read it from here, so they break ties identically.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from lbtestbed.model.utility import Utility


class Ranking:
    """The enumeration of slots, extended lazily, with SLTA's thresholds l_i(r)."""

    def __init__(self, utilities: Sequence[Utility], order: str = "ij") -> None:
        if order not in ("ij", "ji"):
            raise ValueError(f"rank order must be 'ij' or 'ji', got {order!r}")
        self.utilities = list(utilities)
        self.order = order
        self.m = len(self.utilities)
        self._heap = [self.key(i, 1) for i in range(self.m)]
        heapq.heapify(self._heap)
        self._slots: list[tuple[int, int]] = [(-1, -1)]  # 1-based: _slots[k] = (i_k, j_k)
        self._thresholds: list[tuple[int, ...]] = [(0,) * self.m, (0,) * self.m]  # _thresholds[r] = l(r)

    def key(self, i: int, j: int) -> tuple[float, int, int, int, int]:
        """Sort key of slot (i, j): smaller ranks better."""
        d = -self.utilities[i].delta(j - 1)
        return (d, i, j, i, j) if self.order == "ij" else (d, j, i, i, j)

    def _extend(self, k: int) -> None:
        while len(self._slots) <= k:
            *_, i, j = heapq.heappop(self._heap)
            heapq.heappush(self._heap, self.key(i, j + 1))
            self._slots.append((i, j))
            prev = list(self._thresholds[-1])
            prev[i] += 1
            self._thresholds.append(tuple(prev))

    def slot(self, k: int) -> tuple[int, int]:
        """(i_k, j_k), the k-th best slot, k >= 1; classes are 0-based, j is 1-based."""
        if k < 1:
            raise ValueError(f"slots are numbered from 1, got {k}")
        self._extend(k)
        return self._slots[k]

    def thresholds(self, r: int) -> tuple[int, ...]:
        """l(r): l_i(r) = #{k < r : i_k = i}, the number of class-i slots ranked above (i_r, j_r)."""
        self._extend(r)
        return self._thresholds[r]

    def marginal(self, k: int) -> float:
        """delta of the k-th slot."""
        i, j = self.slot(k)
        return self.utilities[i].delta(j - 1)

    def better(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        """Whether slot a ranks above slot b."""
        return self.key(*a) < self.key(*b)
