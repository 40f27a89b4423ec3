"""Dispatcher data structures with O(1) or O(log n) picks (docs/theory.md, "What each policy sends")."""

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


class SpeedBuckets:
    """Node ids grouped by exact speed: O(log s) pick of a uniform node among the fastest (or slowest).

    Keeping one uniform set per speed makes ties between equal speeds exactly uniform at every pick; a
    per-node random tie key drawn once would favour whoever drew low and stayed.
    """

    __slots__ = ("_groups", "_heap", "_sign", "rng", "speeds")

    def __init__(self, speeds: Sequence[float], rng: random.Random, fastest: bool = True) -> None:
        self.speeds, self.rng = speeds, rng
        self._sign = -1.0 if fastest else 1.0
        self._groups: dict[float, TokenSet] = {}
        self._heap: list[float] = []  # signed speeds with a non-empty group, lazily cleaned

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def add(self, k: int) -> None:
        s = self.speeds[k]
        group = self._groups.get(s)
        if group is None:
            group = self._groups[s] = TokenSet()
        if not group:
            heapq.heappush(self._heap, self._sign * s)
        group.add(k)

    def discard(self, k: int) -> None:
        group = self._groups.get(self.speeds[k])
        if group is not None:
            group.discard(k)

    def pick(self) -> int:
        """A uniform node among those of the best speed (the buckets must not be empty)."""
        heap, groups = self._heap, self._groups
        while True:
            group = groups[self._sign * heap[0]]
            if group:
                return group.pick(self.rng)
            heapq.heappop(heap)  # that speed has no node left here


class LevelIndex:
    """Nodes bucketed by occupancy level, as a dispatcher with full state sees them.

    Keeps the minimum level and picks a node of a level uniformly, or by speed (fastest or slowest, with
    uniform ties), or the one that has been at level 0 the longest. Idle-order picks use a queue whose
    stale entries are skipped by checking a per-node stamp.
    """

    __slots__ = ("_by_speed", "_fifo0", "_speed", "_stamp", "buckets", "level", "min_level", "rng", "speeds")

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
        self._speed: list[SpeedBuckets] = []
        self._fifo0: deque[tuple[int, int]] | None = deque() if idle_order else None
        self.min_level = 0
        for k in nodes:
            self.level[k] = 0
            self._stamp[k] = 0
            self._enter(k, 0)

    def _enter(self, k: int, lvl: int) -> None:
        while lvl >= len(self.buckets):
            self.buckets.append(TokenSet())
        self.buckets[lvl].add(k)
        stamp = self._stamp[k] = self._stamp[k] + 1
        if self._by_speed:
            assert self.speeds is not None
            while lvl >= len(self._speed):
                self._speed.append(SpeedBuckets(self.speeds, self.rng, fastest=self._by_speed > 0))
            self._speed[lvl].add(k)
        if lvl == 0 and self._fifo0 is not None:
            fifo = self._fifo0
            fifo.append((k, stamp))
            if len(fifo) > 4 * len(self.buckets[0]) + 64:  # drop stale entries, keeping the idle order
                self._fifo0 = deque(e for e in fifo if self._stamp[e[0]] == e[1] and self.level[e[0]] == 0)

    def _leave(self, k: int, lvl: int) -> None:
        self.buckets[lvl].discard(k)
        if self._by_speed:
            self._speed[lvl].discard(k)

    def increment(self, k: int) -> None:
        lvl = self.level[k]
        self._leave(k, lvl)
        self.level[k] = lvl + 1
        self._enter(k, lvl + 1)
        if lvl == self.min_level and not self.buckets[lvl]:
            self.min_level = lvl + 1

    def decrement(self, k: int) -> None:
        lvl = self.level[k]
        if lvl == 0:
            raise ValueError(f"node {k} reported a departure while it holds no task")
        self._leave(k, lvl)
        self.level[k] = lvl - 1
        self._enter(k, lvl - 1)
        if lvl - 1 < self.min_level:
            self.min_level = lvl - 1

    def move(self, k: int, lvl: int) -> None:
        """Put node ``k`` at level ``lvl``; a step of one is exactly ``increment`` or ``decrement``."""
        old = self.level[k]
        if lvl == old:
            return
        if old < 0:
            raise ValueError(f"node {k} was removed: restore it")
        if lvl == old + 1:
            self.increment(k)
        elif lvl == old - 1:
            self.decrement(k)
        else:
            if lvl < 0:
                raise ValueError(f"level {lvl} for node {k}")
            self._leave(k, old)
            self.level[k] = lvl
            self._enter(k, lvl)
            if lvl < self.min_level:
                self.min_level = lvl
            elif old == self.min_level and not self.buckets[old]:
                self._lowest()

    def remove(self, k: int) -> None:
        """Take node ``k`` out (it is down): no pick returns it until ``restore``."""
        old = self.level[k]
        if old < 0:
            return
        self._leave(k, old)
        self.level[k] = -1  # out: its entry in the longest-idle queue is stale (and restore makes a new one)
        if old == self.min_level and not self.buckets[old]:
            self._lowest()

    def restore(self, k: int, lvl: int) -> None:
        """Put a removed node ``k`` back at level ``lvl`` (it entered it now, as for the idle order)."""
        if self.level[k] >= 0:
            self.move(k, lvl)
            return
        self.level[k] = lvl
        self._enter(k, lvl)
        if lvl < self.min_level or not self.buckets[self.min_level]:
            self.min_level = lvl  # lower, or the index was empty

    def __contains__(self, k: object) -> bool:
        """Whether ``k`` is in the index (not removed)."""
        return isinstance(k, int) and self.level.get(k, -1) >= 0

    def _lowest(self) -> None:
        """min_level anew, after its bucket emptied by more than one step: the lowest occupied level
        (0 when the index holds no node)."""
        self.min_level = next((i for i, b in enumerate(self.buckets) if b), 0)

    def pick_uniform(self, lvl: int) -> int:
        return self.buckets[lvl].pick(self.rng)

    def pick_by_speed(self, lvl: int) -> int:
        """The fastest (or slowest, as configured) node at ``lvl``; equal speeds tie uniformly."""
        return self._speed[lvl].pick()

    def pick_longest_idle(self) -> int:
        """The node that has been at level 0 the longest."""
        assert self._fifo0 is not None
        fifo, stamp, level = self._fifo0, self._stamp, self.level
        while True:
            k, s = fifo[0]
            if stamp[k] == s and level[k] == 0:
                return k
            fifo.popleft()
