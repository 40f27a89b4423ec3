"""Prometheus metrics of a server-node process, read from the node models at scrape time.

The time integrals of docs/design.md, principle 5, are exported as counters in model seconds, advanced to the
scrape instant, so ``increase()`` over a window gives exact time averages: seconds with exactly k tasks per
node, task-seconds and utility-seconds. Labels: node id, class name, k (bounded by the largest occupancy seen)
and message kind (bounded by the policy).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lbtestbed.server_node.host import NodeHost
from lbtestbed.transport import wire


class NodeCollector(Collector):
    def __init__(self, host: NodeHost) -> None:
        self.host = host

    def collect(self) -> Iterator[Metric]:
        host = self.host
        snap = host.snapshot()
        names = [c.name for c in host.exp.classes]
        cls = host.exp.node_class
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
        for k, m in snap["models"].items():
            labels = [str(k), names[cls[k]]]
            for x, seconds in enumerate(m.time_at):
                occupancy.add_metric([*labels, str(x)], seconds)
            task_s.add_metric(labels, m.task_seconds)
            util_s.add_metric(labels, m.utility_seconds)
            idle_capacity.add_metric(labels, m.idle_capacity_seconds())
            arrivals.add_metric(labels, m.arrivals)
            completions.add_metric(labels, m.completions)
            refused.add_metric(labels, host.refused[k])
            failed.add_metric(labels, host.failed[k])
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
        clock = CounterMetricFamily("lbtestbed_node_model_seconds", "Model time since the process started")
        clock.add_metric([], snap["time"])
        yield clock
        yield wire.time_scale_gauge(host.scale)
        for name, doc, counts in (
            ("lbtestbed_node_messages_sent", "State messages sent, by kind", host.sent),
            ("lbtestbed_node_messages_received", "State messages received, by kind", host.received),
            (
                "lbtestbed_node_messages_piggybacked",
                "State messages sent on a reply (to a task or a message) instead of a request of their own",
                host.piggybacked,
            ),
            (
                "lbtestbed_node_message_failures",
                "State messages that could not be delivered",
                host.send_failures,
            ),
        ):
            yield wire.counters_by_kind(name, doc, counts)
        yield host.faults.metric("node")
        incarnation = GaugeMetricFamily(
            "lbtestbed_node_incarnation", "When this process started (microseconds since the epoch)"
        )
        incarnation.add_metric([], host.incarnation)
        yield incarnation
        heartbeats = CounterMetricFamily(
            "lbtestbed_node_state_reports", "State reports served to the dispatchers' health checks"
        )
        heartbeats.add_metric([], host.heartbeats)
        yield heartbeats
        yield from wire.listener_metrics("node", host.guard, host.verifier.refused)


def registry_for(host: NodeHost) -> CollectorRegistry:
    """The host's registry (its histograms) with the collector of everything else (registered once)."""
    if not host.collected:
        host.registry.register(NodeCollector(host))
        host.collected = True
    return host.registry
