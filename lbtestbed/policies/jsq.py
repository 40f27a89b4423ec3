"""Join the shortest queue with full state and the tie-breaking rules of the heterogeneous-JSQ paper.

Its rules (docs/theory.md, "Tie-breaking rules"): among the nodes with the fewest tasks,
  random        uniformly (RR, "random-JSQ"),
  fastest       the fastest (JFSQ), slowest: the slowest (JSSQ),
  longest_idle  the node idle the longest when some node is idle, else uniform (LISF),
  fastest_idle  the fastest idle node when some node is idle, else uniform (JFIQ).
Equal speeds tie uniformly. The dispatcher counts its own dispatches; nodes report every departure.

Counts that survive lost, duplicated and reordered messages. A node counts, per dispatcher d, the tasks of
d that arrived (A) and that left (D); each departure notice carries (A, D) as they are after it. The
dispatcher keeps per node ``sent`` (tasks it routed there, less those that failed) and ``acked`` (the
largest D it saw) and sees ``sent - acked`` tasks there (never fewer than 0). A notice takes the larger of
each pair, so a duplicate or an overtaken notice changes nothing, a lost one is made good by the next (or
by the node's report, ``reconcile``), and a task counted as failed that ran all the same is counted again.
With exact delivery every notice lowers the count by one, as a plain decrement would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from lbtestbed.model.spec import Experiment
from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, NodeSide, Route
from lbtestbed.policies.structures import LevelIndex


def departure_counts(data: Sequence[Any], what: str = "a departure") -> tuple[int, int]:
    """(A, D) of a departure notice or a report: integers with 0 <= D <= A."""
    if len(data) != 2:
        raise ValueError(f"{what} is (arrived, departed), got {len(data)} values")
    a, d = data
    if type(a) is not int or type(d) is not int or not 0 <= d <= a:
        raise ValueError(f"{what} needs integers 0 <= departed <= arrived, got {a!r} and {d!r}")
    return a, d


class CountingDispatcher(DispatcherSide):
    """The picture JSQ and JLMU share: per node ``sent - acked`` tasks (module docstring), in LevelIndexes."""

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.sent = [0] * self.n  # tasks routed to each node, less those that failed
        self.acked = [0] * self.n  # departures the node reported: the largest D seen

    def _levels(self, k: int) -> LevelIndex:
        """The index that holds node ``k``."""
        raise NotImplementedError

    def _sync(self, k: int) -> None:
        """Move ``k`` to the level its counts say (a down node stays out of the index)."""
        if k not in self.live.down:
            lvl = self.sent[k] - self.acked[k]
            self._levels(k).move(k, lvl if lvl > 0 else 0)

    def _apply(self, k: int, a: int, d: int) -> None:
        if a > self.sent[k]:
            self.sent[k] = a  # tasks that arrived although we counted them as failed (or never sent them)
        if d > self.acked[k]:
            self.acked[k] = d
        self._sync(k)

    def _report_counts(self, report: Sequence[Any]) -> tuple[int, int]:
        """(A, D) for this dispatcher in a node's report (x, A[0], D[0], A[1], D[1], ...)."""
        i = 1 + 2 * self.index
        if len(report) < i + 2:
            raise ValueError(f"a report of {len(report)} values has no counts for dispatcher {self.index}")
        return departure_counts(report[i : i + 2], "a report")

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if msg.kind != "departure":
            return super().on_message(msg)
        self._apply(msg.node, *departure_counts(msg.data))
        return NO_MESSAGES

    def on_task_failed(self, node: int) -> None:
        if self.sent[node] > 0:
            self.sent[node] -= 1  # it never ran there: no departure will count it
        self._sync(node)

    def on_node_down(self, node: int) -> None:
        if self.live.set_down(node):
            self._levels(node).remove(node)

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        a, d = self._report_counts(report)
        if fresh:  # nothing of ours on its way there, and no end of an earlier task will be reported
            self.sent[node], self.acked[node] = a, d
        else:
            self.sent[node] = max(self.sent[node], a)
            self.acked[node] = max(self.acked[node], d)
        if self.live.set_up(node):
            lvl = self.sent[node] - self.acked[node]
            self._levels(node).restore(node, lvl if lvl > 0 else 0)
        else:
            self._sync(node)  # up already (the first contact): unchanged unless the report says otherwise
        return NO_MESSAGES

    def reconcile(self, node: int, report: tuple[int, ...]) -> tuple[Message, ...]:
        self._apply(node, *self._report_counts(report))
        return NO_MESSAGES


class JSQDispatcher(CountingDispatcher):
    name = "jsq"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.tie_break = tb = exp.policy.tie_break
        by_speed = {"fastest": 1, "fastest_idle": 1, "slowest": -1}.get(tb, 0)
        self.levels = LevelIndex(
            range(self.n), rng, exp.node_speeds, by_speed=by_speed, idle_order=tb == "longest_idle"
        )

    def _levels(self, k: int) -> LevelIndex:
        return self.levels

    def dispatch(self) -> Route:
        lv = self.levels
        low = lv.min_level
        tb = self.tie_break
        if tb in ("fastest", "slowest") or (tb == "fastest_idle" and low == 0):
            k = lv.pick_by_speed(low)
        elif tb == "longest_idle" and low == 0:
            k = lv.pick_longest_idle()
        else:
            k = lv.pick_uniform(low)
        s = self.sent[k] = self.sent[k] + 1
        if s > self.acked[k]:  # else more departures were reported than we count tasks: it stays at 0
            lv.increment(k)
        return Route(k, "idle" if low == 0 else "busy")

    def gauges(self) -> dict[str, float]:
        return {"idle_nodes": float(len(self.levels.buckets[0]))}


class DepartureNotifier(NodeSide):
    """Reports every departure to the dispatcher that routed the task (JSQ, JLMU), with the counts of that
    dispatcher's tasks that arrived and left so far (module docstring)."""

    def __init__(self, exp: Experiment, node: int, rng: random.Random, dispatchers: int = 1) -> None:
        super().__init__(exp, node, rng, dispatchers)
        self.arrived = [0] * max(1, dispatchers)  # A[d]: tasks of dispatcher d that arrived here
        self.departed = [0] * max(1, dispatchers)  # D[d]: tasks of dispatcher d that left

    def on_arrival(self, x: int, origin: int, piggyback: tuple[Any, ...]) -> tuple[Message, ...]:
        self.arrived[origin] += 1
        return NO_MESSAGES

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        d = self.departed[origin] = self.departed[origin] + 1
        return (Message("departure", self.node, (self.arrived[origin], d), origin),)

    def report(self, x: int) -> tuple[int, ...]:
        out = [x]
        for a, d in zip(self.arrived, self.departed, strict=True):
            out += (a, d)
        return tuple(out)
