"""Power-of-d policies: JSQ(d) by probing (``jsq_power_of_d.md`` §2) and least-request over local counts."""

from __future__ import annotations

import random
from collections.abc import Sequence

from lbtestbed.policies.base import DispatcherSide, Probe, Route, sample_distinct, sample_with_replacement
from lbtestbed.spec import Experiment


class _Sampler(DispatcherSide):
    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        assert isinstance(exp.policy.d, int)
        self.d = exp.policy.d
        self._sample = sample_with_replacement if exp.policy.replace else sample_distinct

    def _first_min(self, nodes: Sequence[int], values: Sequence[int]) -> int:
        """The node with the least value; nodes come in random order, so ties are uniform."""
        best = 0
        for k in range(1, len(nodes)):
            if values[k] < values[best]:
                best = k
        return nodes[best]


class PowerOfDDispatcher(_Sampler):
    """JSQ(d): probe d nodes (distinct unless ``replace``), join the least occupied.

    Ties are uniform, or go to the fastest or slowest probed node (``tie_break``). Each probe and each reply
    is one message: 2d per task.
    """

    name = "power_of_d"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.tie_break = exp.policy.tie_break
        self.speeds = exp.node_speeds

    def dispatch(self) -> Probe:
        return Probe(self._sample(self.rng, self.n, self.d))

    def resolve(self, probe: Probe, replies: Sequence[int]) -> Route:
        if self.tie_break == "random":
            return Route(self._first_min(probe.nodes, replies), "probed")
        low = min(replies)
        tied = [k for k, x in zip(probe.nodes, replies, strict=True) if x == low]
        sign = 1.0 if self.tie_break == "fastest" else -1.0
        best = max(sign * self.speeds[k] for k in tied)
        return Route(next(k for k in tied if sign * self.speeds[k] == best), "probed")


class LeastRequestDispatcher(_Sampler):
    """Power-of-d over the dispatcher's own counts of tasks in flight, as production proxies do.

    No messages: the dispatcher counts a task from forwarding until its completion passes back through it.
    """

    name = "least_request"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.in_flight = [0] * self.n

    def dispatch(self) -> Route:
        nodes = self._sample(self.rng, self.n, self.d)
        inflight = self.in_flight
        k = self._first_min(nodes, [inflight[j] for j in nodes])
        inflight[k] += 1
        return Route(k, "sampled")

    def on_task_done(self, node: int) -> None:
        self.in_flight[node] -= 1

    def gauges(self) -> dict[str, float]:
        return {"tasks_in_flight": float(sum(self.in_flight))}
