"""The simulator's future events in time order: a calendar queue (R. Brown, "Calendar queues: a fast O(1)
priority queue implementation for the simulation event set problem", Communications of the ACM 31(10), 1988).

An event is a tuple whose first two items are its model time and a sequence number no other event has;
events leave in (time, sequence) order, exactly the order a binary heap of the same tuples gives, so the
queue changes no result.

Why not one heap: with n nodes it holds about n pending completions, and every push and pop walks log n
levels of tuples scattered through memory; from about 10 000 nodes on, the cache misses of those walks
cost more than the rest of an event. The calendar cuts model time into days of equal width and files each
event under its day, in one of ``days`` lists used in turn (a ring: day d in list d mod days). Only the
current day is kept as a heap (``today``), a few dozen events that stay in the cache; filing an event is
an append. Events beyond the ring's year wait in a heap of their own (``later``) until their day comes
into range.

The last event of today is a marker, ``(end, -1, None, DAY_OVER)``, at ``end``, the first instant of the
next day: when it comes up (``today[0]``), the driver pops it and calls ``next_day``, which moves the next
day that holds events into ``today``. A driver on a hot path may push an event before ``end`` straight
onto the ``today`` heap (``heapq``), without a call; ``push`` files any event where it belongs. With
nothing left to come the marker is at infinity.
"""

from __future__ import annotations

import heapq
import math

from lbtestbed.model.nodes import NodeModel

#: (model time, sequence number, the node that completes or None, what else it carries): see engine.py
Event = tuple[float, int, NodeModel | None, object]

INF = math.inf
#: what the marker that ends a day carries
DAY_OVER = "day over"


class CalendarQueue:
    """Events by (time, sequence); ``today[0]`` is the next one, or the marker that ends the day."""

    __slots__ = ("day", "days", "end", "filed", "idle", "later", "mask", "per_time", "ring", "today")

    def __init__(self, width: float, days: int) -> None:
        """Days of ``width`` model seconds, a ring of at least ``days`` of them (rounded up to a power of
        two); today is day 0. An infinite width makes one day of all time: a plain heap."""
        self.per_time = 1.0 / width
        size = 1 << max(1, (days - 1).bit_length())
        self.days = size
        self.mask = size - 1
        self.ring: list[list[Event]] = [[] for _ in range(size)]
        self.filed = 0  # events in the ring
        self.later: list[Event] = []  # a heap of the events beyond the ring's year
        self.day = 0
        self.end = self._end_of(0) if self.per_time else INF
        self.idle = True  # nothing after today: the marker is at infinity
        self.today: list[Event] = [(INF, -1, None, DAY_OVER)]  # a heap

    def _end_of(self, day: int) -> float:
        """The first instant of day ``day + 1``: the least time whose day (``int(t * per_time)``) is after
        ``day``. Times before it fall on ``day`` or earlier, exactly, whatever the rounding."""
        t = (day + 1) / self.per_time
        while int(t * self.per_time) <= day:
            t = math.nextafter(t, INF)
        while int(math.nextafter(t, -INF) * self.per_time) > day:
            t = math.nextafter(t, -INF)
        return t

    def push(self, event: Event) -> None:
        if event[0] < self.end:
            heapq.heappush(self.today, event)
        else:
            self.file(event)

    def file(self, event: Event) -> None:
        """File an event of a later day (at or after ``end``) under its day."""
        if self.idle:  # the marker comes back from infinity to the end of today
            self.idle = False
            today = self.today
            today.remove((INF, -1, None, DAY_OVER))
            heapq.heapify(today)
            heapq.heappush(today, (self.end, -1, None, DAY_OVER))
        day = int(event[0] * self.per_time)
        if day - self.day < self.days:
            self.ring[day & self.mask].append(event)
            self.filed += 1
        else:
            heapq.heappush(self.later, event)

    def next_day(self) -> None:
        """Today is over (its marker was popped): make the next day that holds events today."""
        ring, later, mask = self.ring, self.later, self.mask
        today = self.today
        while self.filed or later:
            if not self.filed:  # nothing in the ring: jump to the day of the first event beyond it
                self.day = max(self.day, int(later[0][0] * self.per_time) - 1)
            self.day += 1
            horizon = self.day + self.days
            while later and int(later[0][0] * self.per_time) < horizon:  # into the ring's new year
                event = heapq.heappop(later)
                ring[int(event[0] * self.per_time) & mask].append(event)
                self.filed += 1
            bucket = ring[self.day & mask]
            if bucket:
                self.end = self._end_of(self.day)
                self.filed -= len(bucket)
                today.extend(bucket)
                bucket.clear()
                today.append((self.end, -1, None, DAY_OVER))
                heapq.heapify(today)
                return
        self.idle = True
        heapq.heappush(today, (INF, -1, None, DAY_OVER))

    def __len__(self) -> int:
        return len(self.today) - 1 + self.filed + len(self.later)
