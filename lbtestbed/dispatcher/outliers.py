"""Outlier detection: nodes that answer, but badly (docs/faults.md, "Gray failures").

A node process that is killed or stopped stops answering, and health checks find it. A node that answers
but serves slowly, or fails some of its tasks, answers every health check; its dispatchers must tell it
from its tasks' outcomes and latencies, as a proxy's outlier detection does (Envoy's, whose rules and
names this follows: consecutive failures, an interval, an ejection time that grows with each ejection, and
a bound on the share of hosts ejected at once). Two rules, each on one node's own record:

- **failures**: ``consecutive_failures`` tasks in a row that the node failed (it answered, with an error
  other than "at my task limit") eject it at once;
- **slowness**: over each ``interval``, the fastest service the node gave a task that did not wait for
  service (work / stay: a task that had the node to itself in FCFS, every task of a pool, every task of
  a processor-sharing node, whose stay sharing can only lengthen) is its observed speed. With at least
  ``min_tasks`` such tasks and an observed speed below ``slow_share`` of its spec speed, it is ejected. A
  healthy pool or FCFS node is observed at exactly its speed (a task's stay is its work / speed, whatever
  the timer's error), so this rule cannot eject one; a processor-sharing node could only be taken for slow
  if every task it served in an interval shared it with others the whole time.

An ejected node gets no tasks for ``ejection_time`` times the number of times it was ejected in a row, then
is taken back (the count starts over once it has served a whole interval without being ejected). This class
is the bookkeeping only: it reads no clock and routes nothing; ``dispatcher.health`` applies its decisions
within the bound on ejections (``health.max_ejection``).
"""

from __future__ import annotations

from collections.abc import Sequence

from lbtestbed.model.experiment import HealthSpec


class OutlierDetector:
    """The record of every node's recent outcomes; times are the caller's clock, in wall seconds."""

    def __init__(self, speeds: Sequence[float], spec: HealthSpec) -> None:
        self.speeds = list(speeds)
        self.spec = spec
        n = len(self.speeds)
        self.failures = [0] * n  # consecutive failures
        self.fastest = [0.0] * n  # this interval: the fastest service seen of a task that did not wait
        self.observed = [0] * n  # this interval: tasks whose service was seen
        self.times_ejected = [0] * n  # ejections in a row (sets the next ejection's length)
        self.until: dict[int, float] = {}  # ejected nodes: when each is taken back

    def success(self, node: int, work: float, stay: float, waited: bool) -> None:
        """A task of ``work`` completed at ``node`` after ``stay`` model seconds there."""
        self.failures[node] = 0
        if waited or stay <= 0.0:
            return
        self.observed[node] += 1
        speed = work / stay
        if speed > self.fastest[node]:
            self.fastest[node] = speed

    def failure(self, node: int) -> bool:
        """``node`` failed a task; whether that makes it an outlier now."""
        self.failures[node] += 1
        return self.failures[node] >= self.spec.consecutive_failures

    def slow(self) -> list[tuple[int, str]]:
        """The nodes the interval that ends now found slow, with why; starts the next interval."""
        out = []
        share = self.spec.slow_share
        for k, count in enumerate(self.observed):
            if count >= self.spec.outlier_min_tasks and self.fastest[k] < share * self.speeds[k]:
                why = f"served at {self.fastest[k]:.3g} at best, its speed {self.speeds[k]:.3g}"
                out.append((k, f"{why} ({count} tasks)"))
            elif count and k not in self.until:
                self.times_ejected[k] = 0  # a whole interval of service without ejection
        self.fastest = [0.0] * len(self.speeds)
        self.observed = [0] * len(self.speeds)
        return out

    def eject(self, node: int, now: float) -> float:
        """Record the ejection of ``node`` at ``now``; when it is to be taken back."""
        self.times_ejected[node] += 1
        length = self.spec.ejection_time * min(self.times_ejected[node], 10)
        self.until[node] = now + length
        self.failures[node] = 0
        return self.until[node]

    def due(self, now: float) -> list[int]:
        """Ejected nodes whose time is up (the caller takes them back and calls ``back``)."""
        return [k for k, t in self.until.items() if t <= now]

    def back(self, node: int) -> None:
        self.until.pop(node, None)
        self.failures[node] = 0
