"""Dispatcher data structures with O(1) or O(log n) picks (jsq_power_of_d.md §4, jlmu_slta.md §5.4)."""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Iterable, Sequence


class TokenSet:
    """A set of node ids with O(1) add, remove and uniform pick (array plus positions, swap-remove)."""

    __slots__ = ("_items", "_pos")

    def __init__(self, items: Iterable[int] = ()) -> None:
        self._items: list[int] = []
        self._pos: dict[int, int] = {}
        for k in items:
            self.add(k)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, k: object) -> bool:
        return k in self._pos

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._items))

    def add(self, k: int) -> None:
        if k not in self._pos:
            self._pos[k] = len(self._items)
            self._items.append(k)

    def discard(self, k: int) -> None:
        i = self._pos.pop(k, None)
        if i is None:
            return
        last = self._items.pop()
        if i < len(self._items):
            self._items[i] = last
            self._pos[last] = i

    def pick(self, rng: random.Random) -> int:
        """A uniformly random member (the set must not be empty)."""
        items = self._items
        return items[int(rng.random() * len(items))]


class LevelIndex:
    """Nodes bucketed by occupancy level, as a dispatcher with full state sees them.

    Keeps the minimum level and picks a node of a level uniformly, or by speed (fastest or slowest, with
    uniform ties), or the one that has been at level 0 the longest. Speed and idle-order picks use lazy
    heaps and a queue whose stale entries are skipped by checking a per-node stamp.
    """

    __slots__ = ("_by_speed", "_fifo0", "_heaps", "_stamp", "buckets", "level", "min_level", "rng", "speeds")

    def __init__(
        self,
        nodes: Sequence[int],
        rng: random.Random,
        speeds: Sequence[float] | None = None,
        by_speed: int = 0,
        idle_order: bool = False,
    ) -> None:
        """by_speed: +1 to support fastest picks, -1 slowest, 0 none; idle_order: longest-idle picks."""
        self.rng = rng
        self.speeds = speeds
        self._by_speed = by_speed
        self.level: dict[int, int] = {}
        self.buckets: list[TokenSet] = [TokenSet()]
        self._stamp: dict[int, int] = {}
        self._heaps: list[list[tuple[float, float, int, int]]] = [[]]
        self._fifo0: deque[tuple[int, int]] | None = deque() if idle_order else None
        self.min_level = 0
        for k in nodes:
            self.level[k] = 0
            self._stamp[k] = 0
            self._enter(k, 0)

    def _enter(self, k: int, lvl: int) -> None:
        while lvl >= len(self.buckets):
            self.buckets.append(TokenSet())
            self._heaps.append([])
        self.buckets[lvl].add(k)
        stamp = self._stamp[k] = self._stamp[k] + 1
        if self._by_speed:
            assert self.speeds is not None
            heap = self._heaps[lvl]
            heapq.heappush(heap, (-self._by_speed * self.speeds[k], self.rng.random(), k, stamp))
            if len(heap) > 4 * len(self.buckets[lvl]) + 64:  # drop stale entries now and then
                self._heaps[lvl] = [e for e in heap if self._stamp[e[2]] == e[3]]
                heapq.heapify(self._heaps[lvl])
        if lvl == 0 and self._fifo0 is not None:
            fifo = self._fifo0
            fifo.append((k, stamp))
            if len(fifo) > 4 * len(self.buckets[0]) + 64:  # drop stale entries, keeping the idle order
                self._fifo0 = deque(e for e in fifo if self._stamp[e[0]] == e[1] and self.level[e[0]] == 0)

    def increment(self, k: int) -> None:
        lvl = self.level[k]
        self.buckets[lvl].discard(k)
        self.level[k] = lvl + 1
        self._enter(k, lvl + 1)
        if lvl == self.min_level and not self.buckets[lvl]:
            self.min_level = lvl + 1

    def decrement(self, k: int) -> None:
        lvl = self.level[k]
        if lvl == 0:
            raise ValueError(f"node {k} reported a departure while it holds no task")
        self.buckets[lvl].discard(k)
        self.level[k] = lvl - 1
        self._enter(k, lvl - 1)
        if lvl - 1 < self.min_level:
            self.min_level = lvl - 1

    def pick_uniform(self, lvl: int) -> int:
        return self.buckets[lvl].pick(self.rng)

    def pick_by_speed(self, lvl: int) -> int:
        """The fastest (or slowest, as configured) node at ``lvl``; equal speeds tie uniformly."""
        heap = self._heaps[lvl]
        stamp, level = self._stamp, self.level
        while True:
            _, _, k, s = heap[0]
            if stamp[k] == s and level[k] == lvl:
                return k
            heapq.heappop(heap)

    def pick_longest_idle(self) -> int:
        """The node that has been at level 0 the longest."""
        assert self._fifo0 is not None
        fifo, stamp, level = self._fifo0, self._stamp, self.level
        while True:
            k, s = fifo[0]
            if stamp[k] == s and level[k] == 0:
                return k
            fifo.popleft()
