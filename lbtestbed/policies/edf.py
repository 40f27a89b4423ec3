"""Envoy's earliest-deadline-first scheduler, the weighted pick of its LEAST_REQUEST and ROUND_ROBIN.

Envoy v1.35.0, ``source/common/upstream/edf_scheduler.h`` (docs/spec.md, "least_request"): every entry
waits for a deadline; a pick takes the entry with the earliest deadline (equal deadlines: the one added
first), moves the scheduler's clock to that deadline and adds the entry again at clock + 1 / its weight,
the weight read at that moment. ``create_with_picks`` builds the scheduler as if ``picks`` picks had been
made from a fresh one (Envoy's randomised start, so that proxies do not all begin with the same node),
with Envoy's arithmetic step for step: the weights plus 1e-13, the floor of each entry's share of the
picks, the one correction where floating point disagrees with the floor, then the remaining picks one by
one with the plain weights.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

#: Envoy keeps the number of emulated picks below UINT32_MAX / 10
MAX_PICKS = 429_496_729
#: added to every weight while emulating the first picks (Envoy: it avoids weights that are multiples of
#: each other giving equal deadlines that floating point orders differently from picking one by one)
EPSILON = 1e-13


class EdfScheduler:
    """Entries (node indices) scheduled by deadline, ties by the order in which they were added."""

    __slots__ = ("current_time", "order_offset", "queue")

    def __init__(
        self,
        entries: list[tuple[float, int, int]] | None = None,
        current_time: float = 0.0,
        order_offset: int = 0,
    ) -> None:
        self.current_time = current_time
        self.order_offset = order_offset
        self.queue = entries if entries is not None else []  # (deadline, order offset, node)
        heapq.heapify(self.queue)

    def add(self, weight: float, node: int) -> None:
        """Schedule ``node`` at the current time + 1 / ``weight`` (which must be positive)."""
        heapq.heappush(self.queue, (self.current_time + 1.0 / weight, self.order_offset, node))
        self.order_offset += 1

    def pick_and_add(self, weight: Callable[[int], float]) -> int:
        """The entry with the earliest deadline; it is added again with ``weight(node)`` read now."""
        deadline, _, node = heapq.heappop(self.queue)
        self.current_time = deadline
        self.add(weight(node), node)
        return node

    @classmethod
    def create_with_picks(
        cls, nodes: Sequence[int], weight: Callable[[int], float], picks: int
    ) -> EdfScheduler:
        """The scheduler of ``nodes`` after ``picks`` picks (Envoy's ``createWithPicks``)."""
        picks %= MAX_PICKS
        if not nodes:
            return cls()
        aug = [weight(k) + EPSILON for k in nodes]
        weights_sum = 0.0
        for w in aug:
            weights_sum += w
        entries: list[tuple[float, int, int]] = []
        picks_so_far = 0
        max_pick_time = 0.0
        for i, (k, w) in enumerate(zip(nodes, aug, strict=True)):
            floor_picks = int(w * picks / weights_sum)
            if floor_picks > 0 and floor_picks / w >= picks / weights_sum:
                floor_picks -= 1
            entries.append(((floor_picks + 1) / w, i, k))
            max_pick_time = max(max_pick_time, floor_picks / w)
            picks_so_far += floor_picks
        scheduler = cls(entries, max_pick_time, len(nodes))
        while picks_so_far < picks:
            scheduler.pick_and_add(weight)
            picks_so_far += 1
        return scheduler
