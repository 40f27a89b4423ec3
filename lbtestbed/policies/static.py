"""Policies that use no state information and send no messages."""

from __future__ import annotations

from lbtestbed.policies.base import DispatcherSide, Route


class RandomDispatcher(DispatcherSide):
    """Uniformly random node (that is up)."""

    name = "random"

    def dispatch(self) -> Route:
        return Route(self.live.pick(self.rng), "random")  # while all are up: int(random() * n), as ever


class RoundRobinDispatcher(DispatcherSide):
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
