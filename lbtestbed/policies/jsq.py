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

Several dispatchers (docs/spec.md, "`dispatchers` and `split`", "`view`"). With ``view = "local"`` each
dispatcher's picture counts the tasks it routed, and hears of their departures only. With ``view =
"full"`` a node also tells every other dispatcher of each arrival (``arrival``) and every dispatcher of
each departure: a notice to dispatcher e carries e's (A, D), the node's task count X and its event number
s (arrivals plus departures), and e sees X - (A - D) tasks of the others there (from the newest notice,
by s) on top of its own ``sent - acked``. With exact delivery every picture is then the true occupancy, at
2K - 1 messages per task.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lbtestbed.model.experiment import Experiment, NodeClass, PolicyParams
from lbtestbed.model.reader import TableReader
from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, NodeSide, Route, State
from lbtestbed.policies.structures import LevelIndex
from lbtestbed.policies.unit import MessageCost, Policy, Quantity

#: JSQ's tie-breaking rules among the nodes with the fewest tasks (module docstring)
TIE_BREAKS = ("random", "fastest", "slowest", "longest_idle", "fastest_idle")


@dataclass(frozen=True)
class CountingParams(PolicyParams):
    """What the policies whose nodes report every departure share (JSQ, JLMU, SLTA): with several
    dispatchers, a ``view`` of their own tasks or (``full``) of every task."""

    def full_view(self) -> bool:
        return self.view == "full" and self.dispatchers > 1

    def message_kinds(self) -> tuple[str, ...]:
        # arrival notices only tell the other dispatchers
        return ("departure", "arrival") if self.full_view() else ("departure",)


def notice_cost(exp: Experiment) -> MessageCost:
    """The notices of a node that reports every departure (and, in a full view, every arrival)."""
    k = exp.policy.dispatchers
    delayed = exp.network.delay is not None
    if exp.policy.view == "full" and k > 1:
        # K - 1 arrival and K departure notices; without an emulated delay the origin's departure rides
        own = 2.0 * k - 1 if delayed else 2.0 * (k - 1)
        return MessageCost(
            2.0 * k - 1, f"2K - 1 = {2 * k - 1}: K - 1 arrival and K departure notices", own=own
        )
    return MessageCost(1.0, "one departure notice per task", own=1.0 if delayed else 0.0)


@dataclass(frozen=True)
class JSQParams(CountingParams):
    name: str = "jsq"
    tie_break: str = "random"

    KEYS = ("tie_break", "view")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> JSQParams:
        return cls(**common, tie_break=r.string("tie_break", default="random", choices=TIE_BREAKS))


def departure_counts(data: Sequence[Any], what: str = "a departure") -> tuple[int, int]:
    """(A, D) of a departure notice or a report: integers with 0 <= D <= A."""
    if len(data) != 2:
        raise ValueError(f"{what} is (arrived, departed), got {len(data)} values")
    a, d = data
    if type(a) is not int or type(d) is not int or not 0 <= d <= a:
        raise ValueError(f"{what} needs integers 0 <= departed <= arrived, got {a!r} and {d!r}")
    return a, d


def full_view_counts(data: Sequence[Any], what: str) -> tuple[int, int, int, int]:
    """(A, D, X, s) of a full-view notice: this dispatcher's counts, the node's tasks and event number."""
    if len(data) != 4:
        raise ValueError(f"{what} is (arrived, departed, tasks, events), got {len(data)} values")
    a, d = departure_counts(data[:2], what)
    x, s = data[2:]
    if type(x) is not int or type(s) is not int or x < a - d or s < 0:
        raise ValueError(f"{what} needs integers tasks >= arrived - departed and events >= 0")
    return a, d, x, s


class CountingDispatcher(DispatcherSide):
    """The picture JSQ and JLMU share: per node ``sent - acked`` tasks (module docstring), in LevelIndexes."""

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.sent = [0] * self.n  # tasks routed to each node, less those that failed
        self.acked = [0] * self.n  # departures the node reported: the largest D seen
        assert isinstance(exp.policy, CountingParams)
        self.full = exp.policy.full_view()
        self.others = [0] * self.n  # full view: the other dispatchers' tasks at each node
        self.events = [-1] * self.n  # full view: the event number those counts are from

    def _levels(self, k: int) -> LevelIndex:
        """The index that holds node ``k``."""
        raise NotImplementedError

    def _level(self, k: int) -> int:
        """The tasks at ``k`` in this dispatcher's picture."""
        own = self.sent[k] - self.acked[k]
        return (own if own > 0 else 0) + self.others[k]

    def _sync(self, k: int) -> None:
        """Move ``k`` to the level its counts say (a down node stays out of the index)."""
        if k not in self.live.down:
            self._levels(k).move(k, self._level(k))

    def _others(self, k: int, a: int, d: int, x: int, s: int) -> None:
        """Full view: the others' tasks at ``k`` after its event ``s``, unless we know a later one."""
        if s > self.events[k]:
            self.events[k] = s
            self.others[k] = x - (a - d)

    def _apply(self, k: int, a: int, d: int) -> None:
        if a > self.sent[k]:
            self.sent[k] = a  # tasks that arrived although we counted them as failed (or never sent them)
        if d > self.acked[k]:
            self.acked[k] = d
        self._sync(k)

    def _report_counts(self, k: int, report: Sequence[Any]) -> tuple[int, int]:
        """(A, D) for this dispatcher in a node's report (x, A[0], D[0], A[1], D[1], ..., s); with a full
        view, the others' tasks it shows are taken in as well."""
        i = 1 + 2 * self.index
        if len(report) < i + 3:
            raise ValueError(f"a report of {len(report)} values has no counts for dispatcher {self.index}")
        a, d = departure_counts(report[i : i + 2], "a report")
        if self.full:
            self._others(k, *full_view_counts((a, d, report[0], report[-1]), "a report"))
        return a, d

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        k = msg.node
        if self.full and msg.kind in ("departure", "arrival"):
            a, d, x, s = full_view_counts(msg.data, f"a full-view {msg.kind} notice")
            self._others(k, a, d, x, s)
            self._apply(k, a, d)
        elif msg.kind == "departure":
            self._apply(k, *departure_counts(msg.data))
        else:
            return super().on_message(msg)
        return NO_MESSAGES

    def on_task_failed(self, node: int) -> None:
        if self.sent[node] > 0:
            self.sent[node] -= 1  # it never ran there: no departure will count it
        self._sync(node)

    def on_node_down(self, node: int) -> None:
        if self.live.set_down(node):
            self._levels(node).remove(node)

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        if fresh:
            self.events[node] = -1  # a node that started anew numbers its events from 0 again
        a, d = self._report_counts(node, report)
        if fresh:  # nothing of ours on its way there, and no end of an earlier task will be reported
            self.sent[node], self.acked[node] = a, d
        else:
            self.sent[node] = max(self.sent[node], a)
            self.acked[node] = max(self.acked[node], d)
        if self.live.set_up(node):
            self._levels(node).restore(node, self._level(node))
        else:
            self._sync(node)  # up already (the first contact): unchanged unless the report says otherwise
        return NO_MESSAGES

    def reconcile(self, node: int, report: tuple[int, ...]) -> tuple[Message, ...]:
        self._apply(node, *self._report_counts(node, report))
        return NO_MESSAGES


class JSQDispatcher(CountingDispatcher):
    name = "jsq"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        assert isinstance(exp.policy, JSQParams)
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

    def gauges(self) -> State:
        return {"idle_nodes": float(len(self.levels.buckets[0]))}


class DepartureNotifier(NodeSide):
    """Reports every departure to the dispatcher that routed the task (JSQ, JLMU), with the counts of that
    dispatcher's tasks that arrived and left so far; with a full view, every arrival to the other
    dispatchers and every departure to all, with the node's task count and event number (module
    docstring)."""

    def __init__(self, exp: Experiment, node: int, rng: random.Random, dispatchers: int = 1) -> None:
        super().__init__(exp, node, rng, dispatchers)
        self.arrived = [0] * max(1, dispatchers)  # A[d]: tasks of dispatcher d that arrived here
        self.departed = [0] * max(1, dispatchers)  # D[d]: tasks of dispatcher d that left
        self.events = 0  # arrivals plus departures: orders the full view's notices
        self.full = exp.policy.view == "full" and dispatchers > 1

    def _notices(self, kind: str, x: int, to: range | list[int]) -> tuple[Message, ...]:
        s, k = self.events, self.node
        return tuple(Message(kind, k, (self.arrived[e], self.departed[e], x, s), e) for e in to)

    def on_arrival(self, x: int, origin: int, piggyback: tuple[Any, ...]) -> tuple[Message, ...]:
        self.arrived[origin] += 1
        self.events += 1
        if not self.full:
            return NO_MESSAGES
        return self._notices("arrival", x, [e for e in range(self.dispatchers) if e != origin])

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        d = self.departed[origin] = self.departed[origin] + 1
        self.events += 1
        if self.full:
            return self._notices("departure", x, range(self.dispatchers))
        return (Message("departure", self.node, (self.arrived[origin], d), origin),)

    def report(self, x: int) -> tuple[int, ...]:
        out = [x]
        for a, d in zip(self.arrived, self.departed, strict=True):
            out += (a, d)
        out.append(self.events)
        return tuple(out)


class JSQ(Policy):
    name = "jsq"
    summary = (
        "join the shortest queue on counts kept by departure notices, with the heterogeneous-JSQ tie rules"
    )
    params = JSQParams
    dispatcher = JSQDispatcher
    node = DepartureNotifier
    kinds = ("departure", "arrival")
    message_id: ClassVar[Mapping[str, tuple[int, ...]]] = {
        "departure": (0, 1, 3),
        "arrival": (0, 1, 3),
    }  # (arrived, departed), a full view's event
    exported = (
        Quantity("idle_nodes", "Nodes idle in this dispatcher's picture (it counts no task at them)"),
    )
    picture = "idle_nodes"

    def messages(self, exp: Experiment) -> MessageCost:
        return notice_cost(exp)


POLICIES = (JSQ(),)
