"""Join the shortest queue with full state and the tie-breaking rules of the heterogeneous-JSQ paper.

``jsq_power_of_d.md`` §1.2: among the nodes with the fewest tasks,
  random        uniformly (RR, "random-JSQ"),
  fastest       the fastest (JFSQ), slowest: the slowest (JSSQ),
  longest_idle  the node idle the longest when some node is idle, else uniform (LISF),
  fastest_idle  the fastest idle node when some node is idle, else uniform (JFIQ).
Equal speeds tie uniformly. The dispatcher counts its own dispatches; nodes report every departure.
"""

from __future__ import annotations

import random

from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, NodeSide, Route
from lbtestbed.policies.structures import LevelIndex
from lbtestbed.spec import Experiment


class JSQDispatcher(DispatcherSide):
    name = "jsq"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.tie_break = tb = exp.policy.tie_break
        by_speed = {"fastest": 1, "fastest_idle": 1, "slowest": -1}.get(tb, 0)
        self.levels = LevelIndex(
            range(self.n), rng, exp.node_speeds, by_speed=by_speed, idle_order=tb == "longest_idle"
        )

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
        lv.increment(k)
        return Route(k, "idle" if low == 0 else "busy")

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if msg.kind != "departure":
            return super().on_message(msg)
        self.levels.decrement(msg.node)
        return NO_MESSAGES

    def on_task_failed(self, node: int) -> None:
        self.levels.decrement(node)  # no departure notice will come for it

    def gauges(self) -> dict[str, float]:
        return {"idle_nodes": float(len(self.levels.buckets[0]))}


class DepartureNotifier(NodeSide):
    """Reports every departure to the dispatcher that routed the task (JSQ, JLMU)."""

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        return (Message("departure", self.node, (), origin),)
