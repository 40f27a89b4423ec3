"""Power-of-d policies: JSQ(d) by probing and least-request over local counts.

JSQ(d) is the policy of Fittipaldi et al. 2018 (arXiv 1809.05373); docs/theory.md, "`power_of_d` and
`least_request`: the supermarket model", gives its mean field and when least-request makes the same decisions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import NamedTuple

from lbtestbed.model.spec import Experiment
from lbtestbed.policies.base import (
    DispatcherSide,
    Message,
    Probe,
    Route,
    sample_distinct,
    sample_with_replacement,
)
from lbtestbed.policies.edf import EdfScheduler


class InstantProbe(NamedTuple):
    """A probing policy's fast path for a driver whose probes are answered at once (the simulator without
    network delay): ``pick()`` makes the whole decision, ``dispatch`` and ``resolve`` in one call."""

    pick: Callable[[], int]  # the node the task joins
    probes: int  # probes per task, each answered by one probe_reply
    outcome: str  # the Route.outcome that resolve would give


class _Sampler(DispatcherSide):
    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        assert isinstance(exp.policy.d, int)
        self.d = exp.policy.d
        self._sample = sample_with_replacement if exp.policy.replace else sample_distinct

    def _sample_up(self) -> tuple[int, ...]:
        """d nodes that are up; while all are, exactly the draws and nodes of a sample over all n."""
        if not self.live.down:
            return self._sample(self.rng, self.n, self.d)
        return self.live.sample(self.rng, self.d, self._sample)

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
        return Probe(self._sample_up())

    def resolve(self, probe: Probe, replies: Sequence[int]) -> Route:
        probe, replies = self._without_down(probe, replies)
        if not probe.nodes:  # every probed node went down while the probes were out
            return Route(self.live.pick(self.rng), "probed")
        if self.tie_break == "random":
            return Route(self._first_min(probe.nodes, replies), "probed")
        low = min(replies)
        tied = [k for k, x in zip(probe.nodes, replies, strict=True) if x == low]
        sign = 1.0 if self.tie_break == "fastest" else -1.0
        best = max(sign * self.speeds[k] for k in tied)
        return Route(next(k for k in tied if sign * self.speeds[k] == best), "probed")

    def instant_probe(self, occupancy: Sequence[int]) -> InstantProbe | None:
        """``dispatch`` and ``resolve`` fused, when every probed node k replies ``occupancy[k]`` at once.

        ``pick()`` draws exactly the random numbers ``dispatch`` draws, in the same order, and returns the
        node ``resolve`` would choose, so a run is the same to the last bit either way; it only saves the
        probe, reply and route objects (the simulator's hottest path). ``occupancy`` is read at each call.
        None when ties go by speed: that rule stays on the general path. It knows nothing of nodes that
        are down (the simulator has none): a driver with faults uses ``dispatch`` and ``resolve``.
        """
        if self.tie_break != "random":
            return None
        rng, n, d, sample = self.rng, self.n, self.d, self._sample
        if d == 2 and sample is sample_distinct:
            draw, n1 = rng.random, n - 1

            def pick() -> int:
                # sample_distinct(rng, n, 2) and _first_min, inlined: the first of the two in random order
                # unless the second holds fewer tasks
                a = int(draw() * n)
                b = int(draw() * n1)
                if b >= a:
                    b += 1
                return b if occupancy[b] < occupancy[a] else a

        else:

            def pick() -> int:
                probed = sample(rng, n, d)
                best = probed[0]
                low = occupancy[best]
                for k in probed:
                    if occupancy[k] < low:
                        best, low = k, occupancy[k]
                return best

        return InstantProbe(pick, d, "probed")


class LeastRequestDispatcher(_Sampler):
    """Envoy's LEAST_REQUEST over the dispatcher's own counts of tasks in flight (docs/spec.md,
    "least_request").

    No messages: the dispatcher counts a task from forwarding until its completion passes back through it.
    While the weights of the nodes that are up are equal, power-of-d on those counts (Envoy's
    ``choice_count`` is d; the first of the sampled nodes with the fewest wins). When they differ, Envoy's
    earliest-deadline-first schedule (``edf.EdfScheduler``) over the effective weights
    weight / (active + 1)^active_request_bias, each read when its node is picked; it is built afresh,
    from the same random start, whenever a node goes down or comes back, as Envoy rebuilds it when its
    set of healthy hosts changes.
    """

    name = "least_request"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.in_flight = [0] * self.n
        self.weights = exp.node_weights
        self.bias = exp.policy.active_request_bias
        self.edf: EdfScheduler | None = None
        self.seed = 0
        self.weighted = len(set(self.weights)) > 1
        if self.weighted:
            # Envoy draws its seed once per load balancer; a spec whose weights are all equal never
            # schedules, and draws nothing (its runs stay those of plain power-of-d)
            self.seed = rng.getrandbits(32)
            self._refresh()

    def _host_weight(self, k: int) -> float:
        """Envoy's ``hostWeight``: weight / (active + 1)^active_request_bias."""
        w = self.weights[k]
        if self.bias == 1.0:
            return w / (self.in_flight[k] + 1)
        if self.bias != 0.0:
            return w / math.pow(self.in_flight[k] + 1, self.bias)
        return w

    def _refresh(self) -> None:
        """The schedule of the nodes that are up, or none when their weights are equal or one is up."""
        up = self.live.up
        weights = {self.weights[k] for k in up}
        if len(weights) <= 1 or len(up) <= 1:
            self.edf = None
        else:
            self.edf = EdfScheduler.create_with_picks(up, self._host_weight, self.seed)

    def dispatch(self) -> Route:
        inflight = self.in_flight
        if self.edf is not None:
            k = self.edf.pick_and_add(self._host_weight)
            inflight[k] += 1
            return Route(k, "weighted")
        nodes = self._sample_up()
        k = self._first_min(nodes, [inflight[j] for j in nodes])
        inflight[k] += 1
        return Route(k, "sampled")

    def on_task_done(self, node: int, latency: float) -> None:
        self.in_flight[node] -= 1

    def on_node_down(self, node: int) -> None:
        was = len(self.live.up)
        super().on_node_down(node)
        if self.weighted and len(self.live.up) != was:
            self._refresh()

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        if fresh:  # the host reports no end of a task routed there before
            self.in_flight[node] = 0
        was = len(self.live.up)
        out = super().on_node_up(node, report, fresh)
        if self.weighted and len(self.live.up) != was:
            self._refresh()
        return out

    def gauges(self) -> dict[str, float]:
        return {"tasks_in_flight": float(sum(self.in_flight))}
