"""Join the idle queue (Lu et al. 2011; ``jsq_power_of_d.md`` §3-4).

A node that becomes idle sends an idle token to one dispatcher (chosen uniformly when there are several).
A dispatcher that holds tokens sends the task to one of their nodes and drops that token; with none it picks
a node uniformly at random. Which token: ``random`` uniform, ``longest_idle`` the oldest token (FIFO),
``fastest``/``fastest_idle`` the fastest node's, ``slowest`` the slowest node's.
"""

from __future__ import annotations

import random
from collections import deque

from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, NodeSide, Route
from lbtestbed.policies.structures import SpeedBuckets, TokenSet
from lbtestbed.spec import Experiment


class JIQDispatcher(DispatcherSide):
    name = "jiq"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0, dispatchers: int = 1) -> None:
        super().__init__(exp, rng, index)
        self.tie_break = exp.policy.tie_break
        self.speeds = exp.node_speeds
        self.tokens = TokenSet()
        self._fifo: deque[int] = deque()
        self._by_speed = SpeedBuckets(self.speeds, rng, fastest=self.tie_break != "slowest")
        # at start every node is idle; with several dispatchers each node announces itself to one of them
        for k in range(self.n):
            if dispatchers == 1 or k % dispatchers == index:
                self._add(k)

    def _add(self, k: int) -> None:
        if k in self.tokens:
            return  # a duplicate token changes nothing
        self.tokens.add(k)
        if self.tie_break == "longest_idle":
            self._fifo.append(k)
        elif self.tie_break != "random":
            self._by_speed.add(k)

    def _take(self) -> int:
        if self.tie_break == "random":
            k = self.tokens.pick(self.rng)
        else:
            k = self._fifo.popleft() if self.tie_break == "longest_idle" else self._by_speed.pick()
        self.tokens.discard(k)
        self._by_speed.discard(k)
        return k

    def dispatch(self) -> Route:
        if self.tokens:
            return Route(self._take(), "idle_token")
        return Route(int(self.rng.random() * self.n), "random")

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if msg.kind != "idle_token":
            return super().on_message(msg)
        self._add(msg.node)
        return NO_MESSAGES

    def gauges(self) -> dict[str, float]:
        return {"idle_tokens": float(len(self.tokens))}


class IdleTokenSender(NodeSide):
    """Sends an idle token when the node's last task leaves."""

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        if x:
            return NO_MESSAGES
        to = int(self.rng.random() * self.dispatchers) if self.dispatchers > 1 else 0
        return (Message("idle_token", self.node, (), to),)
