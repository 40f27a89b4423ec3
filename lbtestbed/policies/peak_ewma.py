"""Peak-EWMA power-of-two-choices, as Finagle's ``PeakEwma`` and Linkerd's (tower's) ``PeakEwma`` define it.

Each dispatcher keeps, per node, an estimate of the latency it observes itself (model seconds from
forwarding a task to its answer: ``DispatcherSide.on_task_done``), and the node's tasks in flight from it.
docs/spec.md, "peak_ewma", states the rules; in short, with tau = ``decay_time``:

* an observation ``rtt`` at time t, the last one (or the last read) at t0: w = exp(-(t - t0) / tau); the
  estimate becomes ``rtt`` if rtt > estimate (the peak, at once), else estimate * w + rtt * (1 - w);
* reading a node's load first observes 0 at the current time (the estimate decays towards 0), then gives
  estimate * (in flight + 1); Finagle's node that has no estimate (0) but tasks in flight costs a
  penalty of 2^47 - 1 ns plus 1 ns per task instead, tower's starts at ``default_rtt`` and has none;
* a task goes to the cheaper of two distinct nodes drawn uniformly (Finagle's ``P2CPick``: the first
  drawn on a tie); with a single node up, to that node without a draw.

No messages: everything is what the dispatcher sees of its own tasks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lbtestbed.model.experiment import Experiment, NodeClass, PolicyParams
from lbtestbed.model.reader import TableReader
from lbtestbed.policies.base import DispatcherSide, Message, Route, State, sample_distinct
from lbtestbed.policies.sampling import PENDING_TASKS
from lbtestbed.policies.unit import Policy

#: Finagle's ``Penalty``, Long.MaxValue >> 16 nanoseconds, in (model) seconds
PENALTY = ((2**63 - 1) >> 16) * 1e-9
NANOSECOND = 1e-9


@dataclass(frozen=True)
class PeakEwmaParams(PolicyParams):
    """Model seconds: the estimate's time constant, and tower's (Linkerd's) starting estimate of a node
    never observed (None: Finagle's, 0 with a penalty while it has requests)."""

    name: str = "peak_ewma"
    decay_time: float = 10.0
    default_rtt: float | None = None

    KEYS = ("decay_time", "default_rtt")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> PeakEwmaParams:
        default_rtt = r.number("default_rtt") if r.has("default_rtt") else None
        return cls(**common, decay_time=r.number("decay_time", 10.0), default_rtt=default_rtt)


class PeakEwmaDispatcher(DispatcherSide):
    """P2C on Peak-EWMA latency estimates times tasks in flight + 1."""

    name = "peak_ewma"
    uses_clock = True

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        pol = exp.policy
        assert isinstance(pol, PeakEwmaParams)
        self.tau = pol.decay_time
        self.penalize = pol.default_rtt is None  # Finagle's rule for a node never observed
        self.estimate = [pol.default_rtt or 0.0] * self.n  # Finagle's ``cost``, tower's ``rtt_ns``
        self.stamp = [self.now] * self.n  # when each estimate was last updated
        self.pending = [0] * self.n

    def _observe(self, k: int, rtt: float) -> None:
        """Finagle's ``observe`` (tower's ``RttEstimate.update``) at the current time."""
        t = self.now
        w = math.exp(-max(t - self.stamp[k], 0.0) / self.tau)
        cost = self.estimate[k]
        self.estimate[k] = rtt if rtt > cost else cost * w + rtt * (1.0 - w)
        self.stamp[k] = t

    def load(self, k: int) -> float:
        """Finagle's ``Metric.get`` (tower's ``load``): decay to now, then the cost of one more task."""
        self._observe(k, 0.0)
        pending = self.pending[k]
        if self.penalize and self.estimate[k] == 0.0 and pending != 0:
            return PENALTY + pending * NANOSECOND
        return self.estimate[k] * (pending + 1)

    def dispatch(self) -> Route:
        up = self.live.up
        if len(up) == 1:
            k = up[0]
        else:
            a, b = (
                sample_distinct(self.rng, self.n, 2) if not self.live.down else self.live.sample(self.rng, 2)
            )
            k = a if self.load(a) <= self.load(b) else b
        self.pending[k] += 1
        return Route(k, "sampled")

    def on_task_done(self, node: int, latency: float) -> None:
        self.pending[node] -= 1
        self._observe(node, max(latency, 0.0))

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        if fresh:  # the host reports no end of a task routed there before; the estimate stays the node's
            self.pending[node] = 0
        return super().on_node_up(node, report, fresh)

    def gauges(self) -> State:
        return {"pending_tasks": float(sum(self.pending))}


class PeakEwma(Policy):
    name = "peak_ewma"
    summary = "P2C on Peak-EWMA latency estimates times tasks in flight (Finagle, Linkerd)"
    params = PeakEwmaParams
    dispatcher = PeakEwmaDispatcher
    exported = (PENDING_TASKS,)


POLICIES = (PeakEwma(),)
