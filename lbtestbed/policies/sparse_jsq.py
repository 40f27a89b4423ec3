"""JSQ on sparse feedback: the dispatcher's own estimates of the queues, corrected by occasional updates
(van der Boor, Borst and van Leeuwaarden, "Hyper-Scalable JSQ with Sparse Feedback", 2019, arXiv 1903.02337;
docs/spec.md, "`sparse_jsq`"; docs/theory.md, "Sparse feedback: JSQ on occasional updates").

The dispatcher keeps an estimate of every node's queue, 0 at start. A task goes to a node of least
estimate, ties broken uniformly at random, and raises that node's estimate by one. A node's ``queue_update``
sets its estimate to the node's true number of tasks at the update. The nodes update on timers of their own
(``NodeSide.timed``): ``asynchronous``, each node at the points of a Poisson process of rate delta drawn
from its own stream; ``synchronous``, every node at the model times k T, k = 1, 2, ... of the clock they
share. ``rate`` is the update messages per task: an update goes to each of the K dispatchers, so with total
arrival rate Lambda and n nodes delta = rate Lambda / (n K) and T = 1 / delta.

Sequence numbers. An update is (clock, seq, x): the clock its schedule runs on (``NodeSide.start_timer``),
its number on that schedule and the node's tasks. A dispatcher applies an update only if its (clock, seq)
is later than the last it applied for that node, so a duplicated or overtaken update changes nothing (it is
counted in ``sparse_jsq_stale_updates_total``). A node's report (x, clock, seq, the x of that update) makes
good an update that was lost: it is applied as if it had arrived late.

With several dispatchers each keeps its own estimates: it raises them for its own tasks only, and every
update resets them all.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lbtestbed.model.experiment import Experiment, NodeClass, PolicyParams
from lbtestbed.model.reader import TableReader
from lbtestbed.model.streams import node_random
from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, NodeSide, Route, State
from lbtestbed.policies.structures import LevelIndex
from lbtestbed.policies.unit import SENDS, Curve, MessageCost, Policy, Quantity

#: how the nodes time their updates
UPDATES = ("asynchronous", "synchronous")
#: the message rates the frontier tries, in update messages per task
RATES = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class SparseJSQParams(PolicyParams):
    """How the nodes time their updates, and how many update messages they send per task."""

    name: str = "sparse_jsq"
    updates: str = "asynchronous"
    rate: float = 1.0

    KEYS = ("updates", "rate")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> SparseJSQParams:
        return cls(
            **common,
            updates=r.string("updates", default="asynchronous", choices=UPDATES),
            rate=r.number("rate", default=1.0, positive=True),
        )

    def message_kinds(self) -> tuple[str, ...]:
        return ("queue_update",)


def update_rate(exp: Experiment) -> float:
    """delta: each node's updates per model second, rate Lambda / (n K) (module docstring)."""
    params = exp.policy
    assert isinstance(params, SparseJSQParams)
    return params.rate * exp.workload.arrival_rate / (exp.n * params.dispatchers)


def _count(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"{what} is an integer >= 0, got {v!r}")
    return v


class EstimateDispatcher(DispatcherSide):
    """Least estimate, ties uniform; +1 per task; an update sets the estimate (module docstring)."""

    name = "sparse_jsq"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.estimates = LevelIndex(range(self.n), rng)  # every estimate 0: the nodes start empty
        self.applied: list[tuple[int, int]] = [(-1, -1)] * self.n  # per node: (clock, seq) of the last update

    def dispatch(self) -> Route:
        est = self.estimates
        k = est.pick_uniform(est.min_level)
        est.increment(k)
        return Route(k, "least_estimate")

    def _apply(self, k: int, clock: int, seq: int, x: int) -> bool:
        """Set node k's estimate to ``x`` if (clock, seq) is later than the last update applied."""
        if (clock, seq) <= self.applied[k]:
            return False
        self.applied[k] = (clock, seq)
        if k not in self.live.down:
            self.estimates.move(k, x)
        return True

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if msg.kind != "queue_update":
            return super().on_message(msg)
        if len(msg.data) != 3:
            raise ValueError(f"a queue update is (clock, seq, tasks), got {len(msg.data)} values")
        clock, seq, x = (_count(v, "a queue update's (clock, seq, tasks)") for v in msg.data)
        if not self._apply(msg.node, clock, seq, x):
            self.stale_tokens += 1
        return NO_MESSAGES

    def on_task_failed(self, node: int) -> None:
        # the task never reached the node: take back the +1 it made
        if node not in self.live.down and self.estimates.level[node] > 0:
            self.estimates.decrement(node)

    def _report(self, report: Sequence[Any]) -> tuple[int, int, int, int]:
        if len(report) != 4:
            raise ValueError(f"a sparse_jsq report is (x, clock, seq, updated x), got {len(report)} values")
        x, clock, seq, updated = (_count(v, "a report's value") for v in report)
        return x, clock, seq, updated

    def reconcile(self, node: int, report: tuple[int, ...]) -> tuple[Message, ...]:
        _, clock, seq, updated = self._report(report)
        if seq > 0:  # the node's last update, applied now if it never came: a late arrival
            self._apply(node, clock, seq, updated)
        return NO_MESSAGES

    def on_node_down(self, node: int) -> None:
        if self.live.set_down(node):
            self.estimates.remove(node)

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        x, clock, seq, _ = self._report(report)
        back = self.live.set_up(node)
        if not (fresh or back):
            return self.reconcile(node, report)
        # started anew, or back from down (its estimate was taken out): the report is the latest news,
        # what the node holds now, taken as an update
        self.applied[node] = (clock, seq) if fresh else max(self.applied[node], (clock, seq))
        if back:
            self.estimates.restore(node, x)
        else:
            self.estimates.move(node, x)
        return NO_MESSAGES

    def gauges(self) -> State:
        return {
            "sparse_jsq_least_estimate": float(self.estimates.min_level),
            "sparse_jsq_stale_updates_total": float(self.stale_tokens),
        }


class QueueReporter(NodeSide):
    """Sends its number of tasks to every dispatcher at the points of its schedule: a Poisson process of
    rate delta (``asynchronous``) or k T (``synchronous``), on the clock the driver names."""

    draws = True
    timed = True

    def __init__(self, exp: Experiment, node: int, rng: random.Random, dispatchers: int = 1) -> None:
        super().__init__(exp, node, rng, dispatchers)
        params = exp.policy
        assert isinstance(params, SparseJSQParams)
        self.synchronous = params.updates == "synchronous"
        self.delta = update_rate(exp)
        self.period = 1.0 / self.delta
        # the schedule's own stream, drawn afresh from its start on every clock (NodeSide.start_timer)
        self.seed = rng.getrandbits(64)
        self.stream = random.Random(self.seed)
        self.clock = -1  # no schedule yet
        self.seq = 0  # the number of the next update on the schedule
        self.last = (0, 0)  # (seq, x) of the last update sent on this clock

    def _after(self, t: float) -> float:
        """The time of update number ``self.seq``, which follows the one at ``t``."""
        if self.synchronous:
            return self.seq * self.period  # k T exactly: every node's k-th update at the same instant
        return t + self.stream.expovariate(self.delta)

    def start_timer(self, clock: int, after: float) -> float:
        self.clock, self.seq, self.last = clock, 1, (0, 0)
        self.stream = random.Random(self.seed)
        t = self._after(0.0)
        while t <= after:  # skipped, but numbered: the later updates keep their numbers
            self.seq += 1
            t = self._after(t)
        return t

    def on_timer(self, t: float, x: int) -> tuple[tuple[Message, ...], float]:
        seq = self.seq
        self.last = (seq, x)
        data = (self.clock, seq, x)
        msgs = tuple(Message("queue_update", self.node, data, e) for e in range(max(1, self.dispatchers)))
        self.seq = seq + 1
        return msgs, self._after(t)

    def report(self, x: int) -> tuple[int, ...]:
        seq, updated = self.last
        return (x, max(self.clock, 0), seq, updated)


class SparseJSQ(Policy):
    name = "sparse_jsq"
    aliases = ("jsq_sparse_feedback",)
    summary = (
        "JSQ on the dispatcher's estimates, +1 per task, reset by occasional queue updates, asynchronous or "
        "synchronous (van der Boor, Borst and van Leeuwaarden 2019)"
    )
    params = SparseJSQParams
    dispatcher = EstimateDispatcher
    node = QueueReporter
    kinds = ("queue_update",)
    message_id: ClassVar[Mapping[str, tuple[int, ...]]] = {"queue_update": (0, 1)}  # (clock, seq)
    exported = (
        Quantity("sparse_jsq_least_estimate", "The lowest queue estimate in this dispatcher's picture"),
        Quantity(
            "sparse_jsq_stale_updates_total",
            "Queue updates dropped as older than the last one applied from the same node",
            "counter",
        ),
    )
    frontier = (
        Curve("JSQ on asynchronous updates", "rate", RATES, {"updates": "asynchronous"}),
        Curve("JSQ on synchronous updates", "rate", RATES, {"updates": "synchronous"}),
    )

    def messages(self, exp: Experiment) -> MessageCost:
        params = exp.policy
        assert isinstance(params, SparseJSQParams)
        rate = params.rate
        return MessageCost(
            rate,
            f"rate = {rate:g}: each of n nodes updates every one of K dispatchers at delta = rate Lambda / "
            "(n K) updates per model second, n K delta = rate Lambda messages per Lambda tasks",
            SENDS,
            own=rate,  # every update on a request of its own
        )

    def make_node_sides(
        self, exp: Experiment, rng: random.Random, nodes: Sequence[int], dispatchers: int, replication: int
    ) -> list[NodeSide]:
        # every node's schedule from its own stream, whatever K: the simulator, its twin and the node hosts
        # then update at the same times
        return [QueueReporter(exp, k, node_random(exp.seed, k, replication), dispatchers) for k in nodes]


POLICIES = (SparseJSQ(),)
