"""Prometheus metrics of a server-node process: its histograms (the core's ``Recorder``) and the families read
from the node models at scrape time.

The time integrals of docs/design.md, principle 5, are exported as counters in model seconds, advanced to the
scrape instant, so ``increase()`` over a window gives exact time averages: seconds with exactly k tasks per
node, task-seconds and utility-seconds. Labels: node id, class name, k (bounded by the largest occupancy seen)
and message kind (bounded by the policy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lbtestbed.model.clock import ModelClock
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import NodeModel
from lbtestbed.server_node.core import NodeCore
from lbtestbed.transport.metrics import (
    WALL_BUCKETS,
    Histogram,
    MessageAges,
    counter,
    counters_by_kind,
    message_faults_metric,
    standard_collectors,
    time_scale_gauge,
)
from lbtestbed.transport.registry import Registry


class NodeMetrics:
    """The registry of a node host's ``/metrics`` and the histograms its core observes into."""

    def __init__(self, exp: Experiment, clock: ModelClock) -> None:
        self.registry: CollectorRegistry = Registry()  # no _created series (transport.registry)
        standard_collectors(self.registry)  # process CPU, memory, descriptors, GC
        self.lateness = Histogram(
            "lbtestbed_node_timer_lateness_seconds",
            "Wall time from a task's completion instant to the moment the node completed it (timer error)",
            buckets=WALL_BUCKETS,
            registry=self.registry,
        )
        self.ages = MessageAges("node", self.registry, clock)

    def collect_from(
        self,
        core: NodeCore,
        snapshot: Callable[[], dict[str, Any]],
        listener: Callable[[], Iterator[Metric]],
    ) -> None:
        """Export what ``core`` counts at every scrape: the node models as ``snapshot`` advances them to
        the scrape instant, and the listener's families (``listener``)."""
        self.registry.register(NodeCollector(core, snapshot, listener))


class NodeCollector(Collector):
    def __init__(
        self,
        core: NodeCore,
        snapshot: Callable[[], dict[str, Any]],
        listener: Callable[[], Iterator[Metric]],
    ) -> None:
        self.core, self.snapshot, self.listener = core, snapshot, listener

    def collect(self) -> Iterator[Metric]:
        core = self.core
        snap = self.snapshot()
        yield from _node_families(core, snap["models"])
        yield counter("lbtestbed_node_model_seconds", "Model time since the process started", snap["time"])
        yield time_scale_gauge(core.clock.time_scale)
        for name, doc, counts in (
            ("lbtestbed_node_messages_sent", "State messages sent, by kind", core.sent),
            ("lbtestbed_node_messages_received", "State messages received, by kind", core.received),
            (
                "lbtestbed_node_messages_piggybacked",
                "State messages sent on a reply (to a task or a message) instead of a request of their own",
                core.piggybacked,
            ),
            (
                "lbtestbed_node_message_failures",
                "State messages that could not be delivered",
                core.send_failures,
            ),
        ):
            yield counters_by_kind(name, doc, counts)
        yield message_faults_metric(core.faults, "node")
        yield counter(
            "lbtestbed_node_state_reports",
            "State reports served to the dispatchers' health checks",
            core.heartbeats,
        )
        yield from self.listener()


def _node_families(core: NodeCore, models: dict[int, NodeModel]) -> Iterator[Metric]:
    """The families of every node, read from its model advanced to the scrape instant."""
    names = [c.name for c in core.exp.classes]
    cls = core.exp.node_class
    occupancy = CounterMetricFamily(
        "lbtestbed_node_occupancy_model_seconds",
        "Model seconds the node spent holding exactly `tasks` tasks",
        labels=["node", "class", "tasks"],
    )
    task_s = CounterMetricFamily(
        "lbtestbed_node_task_model_seconds",
        "Integral of the number of tasks over model time",
        labels=["node", "class"],
    )
    util_s = CounterMetricFamily(
        "lbtestbed_node_utility_model_seconds",
        "Integral of the pool's utility over model time",
        labels=["node", "class"],
    )
    arrivals = CounterMetricFamily("lbtestbed_node_arrivals", "Tasks accepted", labels=["node", "class"])
    completions = CounterMetricFamily(
        "lbtestbed_node_completions", "Tasks completed", labels=["node", "class"]
    )
    refused = CounterMetricFamily(
        "lbtestbed_node_refused", "Tasks refused at the task limit (503)", labels=["node", "class"]
    )
    failed = CounterMetricFamily(
        "lbtestbed_node_failed",
        "Tasks the node failed (500, not admitted): an injected fail fault",
        labels=["node", "class"],
    )
    idle_capacity = CounterMetricFamily(
        "lbtestbed_node_idle_capacity_model_seconds",
        "Integral of the node's speed over the model time it held no task: the work it could have served",
        labels=["node", "class"],
    )
    tasks = GaugeMetricFamily("lbtestbed_node_tasks", "Tasks present now", labels=["node", "class"])
    speed = GaugeMetricFamily(
        "lbtestbed_node_speed", "Work units served per model second", labels=["node", "class"]
    )
    for k, m in models.items():
        labels = [str(k), names[cls[k]]]
        for x, seconds in enumerate(m.time_at):
            occupancy.add_metric([*labels, str(x)], seconds)
        task_s.add_metric(labels, m.task_seconds)
        util_s.add_metric(labels, m.utility_seconds)
        idle_capacity.add_metric(labels, m.idle_capacity_seconds())
        arrivals.add_metric(labels, m.arrivals)
        completions.add_metric(labels, m.completions)
        refused.add_metric(labels, core.refused[k])
        failed.add_metric(labels, core.failed[k])
        tasks.add_metric(labels, m.x)
        speed.add_metric(labels, m.speed)
    yield from (
        occupancy,
        task_s,
        util_s,
        idle_capacity,
        arrivals,
        completions,
        refused,
        failed,
        tasks,
        speed,
    )
