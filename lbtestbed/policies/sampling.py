"""Power-of-d policies: JSQ(d) by probing and least-request over local counts.

JSQ(d) is the policy of Fittipaldi et al. 2018 (arXiv 1809.05373); docs/theory.md, "`power_of_d` and
`least_request`: the supermarket model", gives its mean field and when least-request makes the same decisions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from lbtestbed.model.experiment import Experiment, NodeClass, PolicyParams
from lbtestbed.model.reader import TableReader
from lbtestbed.policies.base import (
    DispatcherSide,
    Message,
    NodeSide,
    Probe,
    Route,
    State,
    sample_distinct,
    sample_with_replacement,
)
from lbtestbed.policies.edf import EdfScheduler
from lbtestbed.policies.jsq import TIE_BREAKS as JSQ_TIE_BREAKS
from lbtestbed.policies.unit import SENDS, Curve, MessageCost, Policy, Quantity

#: how power_of_d breaks ties among the sampled nodes holding the fewest tasks
TIE_BREAKS = ("random", "fastest", "slowest")
#: least_request's node weights (docs/spec.md, "least_request"): all equal, each node's speed, each class's
WEIGHTS = ("equal", "speed", "class")


def _read_d(r: TableReader, classes: Sequence[NodeClass]) -> tuple[int, bool]:
    """d (default 2) and whether the sample is drawn with replacement; d distinct nodes must exist."""
    d = r.integer("d", default=2, minimum=1)
    replace = r.boolean("replace", False)
    n = sum(c.count for c in classes)
    if d > n and not replace:
        raise r.fail("d", f"samples {d} distinct nodes but the spec has only {n}")
    return d, replace


@dataclass(frozen=True)
class PowerOfDParams(PolicyParams):
    name: str = "power_of_d"
    d: int = 2
    replace: bool = False
    tie_break: str = "random"

    KEYS = ("d", "replace", "tie_break")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> PowerOfDParams:
        d, replace = _read_d(r, classes)
        tie_break = r.string("tie_break", default="random", choices=JSQ_TIE_BREAKS)
        if tie_break not in TIE_BREAKS:
            raise r.fail(
                "tie_break", "power_of_d breaks ties among sampled nodes by random, fastest or slowest"
            )
        return cls(**common, d=d, replace=replace, tie_break=tie_break)

    def message_kinds(self) -> tuple[str, ...]:
        return ("probe", "probe_reply")


@dataclass(frozen=True)
class LeastRequestParams(PolicyParams):
    """Envoy's LEAST_REQUEST: ``d`` is its choice_count; the nodes' ``weights`` (WEIGHTS) and the exponent
    of the active requests in weight / (active + 1)^active_request_bias when the weights differ."""

    name: str = "least_request"
    d: int = 2
    replace: bool = False
    active_request_bias: float = 1.0
    weights: str = "equal"

    KEYS = ("d", "replace", "active_request_bias", "weights")

    @classmethod
    def read(
        cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]
    ) -> LeastRequestParams:
        d, replace = _read_d(r, classes)
        weights = r.string("weights", default="equal", choices=WEIGHTS)
        for i, c in enumerate(classes):
            if c.weight is None and weights == "class":
                raise r.fail(
                    "weights", f'"class" takes each class\'s weight, and classes[{i}] ({c.name!r}) has none'
                )
        bias = r.number("active_request_bias", 1.0, positive=False)
        return cls(**common, d=d, replace=replace, active_request_bias=bias, weights=weights)

    def reads_class_weights(self) -> bool:
        return self.weights == "class"


def node_weights(exp: Experiment) -> tuple[float, ...]:
    """least_request's weight of every node (Envoy's load_balancing_weight, ``policy.weights``): its speed,
    its class's weight, or 1 (1 for every node under any other policy)."""
    weights = exp.policy.weights if isinstance(exp.policy, LeastRequestParams) else "equal"
    if weights == "speed":
        return exp.node_speeds
    if weights == "class":
        return tuple(float(exp.classes[c].weight or 0.0) for c in exp.node_class)
    return (1.0,) * exp.n


class InstantProbe(NamedTuple):
    """A probing policy's fast path for a driver whose probes are answered at once (the simulator without
    network delay): ``pick()`` makes the whole decision, ``dispatch`` and ``resolve`` in one call."""

    pick: Callable[[], int]  # the node the task joins
    probes: int  # probes per task, each answered by one probe_reply
    outcome: str  # the Route.outcome that resolve would give


def instant_probe_of(
    dispatcher: DispatcherSide, sides: Sequence[NodeSide], occupancy: Sequence[int]
) -> InstantProbe | None:
    """The dispatcher side's instant probe over ``occupancy``, where the policy's side of a run allows one:
    the dispatcher has one, keeps no clock and hears no task's end, and its node sides say nothing on an
    arrival or a departure and reply to a probe as ``NodeSide`` does. A driver checks its own side first
    (no delays, faults, learning, one dispatcher): both simulator kernels take it under this one rule."""
    instant_probe = getattr(dispatcher, "instant_probe", None)
    if (
        instant_probe is None
        or dispatcher.uses_clock
        or type(dispatcher).on_task_done is not DispatcherSide.on_task_done
        or any(type(s).on_departure is not NodeSide.on_departure for s in sides)
        or any(type(s).probe_reply is not NodeSide.probe_reply for s in sides)
        or any(type(s).on_arrival is not NodeSide.on_arrival for s in sides)
    ):
        return None
    fast = instant_probe(occupancy)
    assert fast is None or isinstance(fast, InstantProbe)
    return fast


class _Sampler(DispatcherSide):
    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        params = exp.policy
        assert isinstance(params, PowerOfDParams | LeastRequestParams)
        self.d = params.d
        self._sample = sample_with_replacement if params.replace else sample_distinct

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
        assert isinstance(exp.policy, PowerOfDParams)
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
        self.weights = node_weights(exp)
        assert isinstance(exp.policy, LeastRequestParams)
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

    def gauges(self) -> State:
        return {"pending_tasks": float(sum(self.in_flight))}


#: what least_request and peak_ewma export: the count their choice reads
PENDING_TASKS = Quantity(
    "pending_tasks",
    "Tasks this dispatcher routed and has not had answered, as the policy counts them for its choice "
    "(a restarted node's count starts again at 0)",
)


class PowerOfD(Policy):
    name = "power_of_d"
    aliases = ("jsq_d",)
    summary = "JSQ(d): probe d nodes, join the least occupied (Mitzenmacher 2001; the supermarket model)"
    params = PowerOfDParams
    dispatcher = PowerOfDDispatcher
    kinds = ("probe", "probe_reply")
    frontier = (Curve("JSQ(d)", "d", (1, 2, 3, 5)),)

    def messages(self, exp: Experiment) -> MessageCost:
        assert isinstance(exp.policy, PowerOfDParams)
        d = exp.policy.d
        return MessageCost(2.0 * d, f"2d = {2 * d}: d probes and d replies", SENDS, probes=float(d))


class LeastRequest(Policy):
    name = "least_request"
    summary = "Envoy's LEAST_REQUEST: P2C (or EDF by weight) over the dispatcher's own tasks in flight"
    params = LeastRequestParams
    dispatcher = LeastRequestDispatcher
    exported = (PENDING_TASKS,)


POLICIES = (PowerOfD(), LeastRequest())
