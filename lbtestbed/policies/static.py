"""Policies that use no state information and send no messages."""

from __future__ import annotations

import random

from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, Route
from lbtestbed.policies.structures import Liveness
from lbtestbed.spec import Experiment


class _Stateless(DispatcherSide):
    """Keeps only which nodes are up."""

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.live = Liveness(range(self.n))

    def on_node_down(self, node: int) -> None:
        self.live.set_down(node)

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        self.live.set_up(node)
        return NO_MESSAGES


class RandomDispatcher(_Stateless):
    """Uniformly random node (that is up)."""

    name = "random"

    def dispatch(self) -> Route:
        if not self.live.down:
            return Route(int(self.rng.random() * self.n), "random")
        return Route(self.live.pick(self.rng), "random")


class RoundRobinDispatcher(_Stateless):
    """Nodes in turn, in id order, skipping those that are down; each dispatcher starts at a random node so
    that several do not align."""

    name = "round_robin"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._next = int(self.rng.random() * self.n)

    def dispatch(self) -> Route:
        k = self._next
        down = self.live.down
        while k in down:  # some node is up
            k = k + 1 if k + 1 < self.n else 0
        self._next = k + 1 if k + 1 < self.n else 0
        return Route(k, "round_robin")
