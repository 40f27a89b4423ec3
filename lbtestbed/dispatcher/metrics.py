"""Prometheus metrics of a dispatcher process: its histograms (the core's ``Recorder``) and the families read
from its core at scrape time (docs/protocol.md, "Dispatcher metrics")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lbtestbed.dispatcher.core import LEGS, OUTCOMES, OWN_REFUSALS, DispatcherCore
from lbtestbed.dispatcher.health import Health
from lbtestbed.model.clock import ModelClock
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import policy_of
from lbtestbed.policies.base import State
from lbtestbed.policies.unit import Quantity
from lbtestbed.transport.metrics import (
    WALL_BUCKETS,
    Histogram,
    MessageAges,
    counter,
    counters_by_kind,
    gauge,
    message_faults_metric,
    sojourn_buckets,
    standard_collectors,
    time_scale_gauge,
)
from lbtestbed.transport.registry import Registry


class DispatcherMetrics:
    """The registry of a dispatcher's ``/metrics`` and the histograms its core observes into."""

    def __init__(self, exp: Experiment, clock: ModelClock) -> None:
        self.registry: CollectorRegistry = Registry()  # no _created series (transport.registry)
        standard_collectors(self.registry)  # process CPU, memory, descriptors, GC
        self.sojourn = Histogram(
            "lbtestbed_dispatcher_sojourn_model_seconds",
            "Time from accepting a task to its completion, model seconds",
            buckets=sojourn_buckets(exp),
            registry=self.registry,
        )
        self.latency = Histogram(
            "lbtestbed_dispatcher_dispatch_latency_seconds",
            "Wall time from accepting a task to forwarding it (probes included)",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )
        self.legs = Histogram(
            "lbtestbed_dispatcher_leg_seconds",
            "Wall time of each leg of a task's way at this dispatcher (docs/run.md, Where the time goes): "
            "decide (accept to decision, probes included), to_node (forward to the node's arrival), "
            "node_reply (the node's completion instant to its reply: timer error included), from_node "
            "(the node's reply to the dispatcher reading it)",
            ["leg"],
            buckets=WALL_BUCKETS,
            registry=self.registry,
        )
        self.leg = {name: self.legs.labels(name) for name in LEGS}
        self.ages = MessageAges("dispatcher", self.registry, clock)

    def collect_from(self, core: DispatcherCore, listener: Callable[[], Iterator[Metric]]) -> None:
        """Export what ``core`` counts at every scrape, and the listener's families (``listener``)."""
        self.registry.register(_DispatcherCollector(core, listener))


class _DispatcherCollector(Collector):
    def __init__(self, core: DispatcherCore, listener: Callable[[], Iterator[Metric]]) -> None:
        self.core, self.listener = core, listener

    def collect(self) -> Iterator[Metric]:
        core = self.core
        policy = core.policy.name
        decisions = CounterMetricFamily(
            "lbtestbed_dispatcher_decisions", "Routing decisions by rule", labels=["policy", "outcome"]
        )
        for outcome, v in sorted(core.decisions.items()):
            decisions.add_metric([policy, outcome], v)
        yield decisions
        tasks = CounterMetricFamily(
            "lbtestbed_dispatcher_tasks",
            "Tasks by how they ended: completed, refused (503), lost",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            tasks.add_metric([outcome], core.outcomes[outcome])
        yield tasks
        for name, doc, counts in (
            ("lbtestbed_dispatcher_messages_sent", "State messages sent, by kind", core.sent),
            ("lbtestbed_dispatcher_messages_received", "State messages received, by kind", core.received),
            (
                "lbtestbed_dispatcher_messages_piggybacked",
                "State messages received on a reply to a task or a message instead of a request of their own",
                core.piggybacked,
            ),
            (
                "lbtestbed_dispatcher_message_failures",
                "State messages that could not be delivered",
                core.failures,
            ),
            ("lbtestbed_dispatcher_messages_rejected", "State messages received and refused", core.rejected),
        ):
            yield counters_by_kind(name, doc, counts)
        yield gauge("lbtestbed_dispatcher_tasks_in_flight", "Tasks forwarded and not done", core.in_flight)
        yield from _policy_state(policy_of(core.exp).exported, core.policy.gauges())
        yield from _integrals(core, time.monotonic())
        yield time_scale_gauge(core.clock.time_scale)
        yield from _health_metrics(core.health)
        yield message_faults_metric(core.faults, "dispatcher")
        yield from _refusals_and_ejections(core)
        yield from self.listener()


def _policy_state(declared: Sequence[Quantity], values: State) -> Iterator[Metric]:
    """A family per quantity the policy exports (``unit.Quantity``), with the values its side gives."""
    for q in declared:
        family: CounterMetricFamily | GaugeMetricFamily
        labels = [q.label] if q.label is not None else None
        if q.kind == "counter":
            family = CounterMetricFamily(q.metric, q.help, labels=labels)
        else:
            family = GaugeMetricFamily(q.metric, q.help, labels=labels)
        value = values[q.name]
        if isinstance(value, dict):
            for at, v in sorted(value.items()):
                family.add_metric([at], v)
        else:
            family.add_metric([], value)
        yield family


def _integrals(core: DispatcherCore, now: float) -> Iterator[Metric]:
    """The model clock and the integrals it divides, at one instant ``now``."""
    yield counter(
        "lbtestbed_dispatcher_model_seconds", "Model time since the process started", core.clock.to_model(now)
    )
    yield counter(
        "lbtestbed_dispatcher_task_model_seconds",
        "Integral over model time of the tasks accepted and not yet answered (increase / model seconds "
        "= mean tasks in the system, probes and forwarding included)",
        core.present.area(now),
    )
    if core.learned is not None:
        yield counter(
            f"lbtestbed_dispatcher_{core.learned.name}_model_seconds",
            f"Integral of {core.learned.label} over model time (increase / model seconds = its mean)",
            core.r.area(now),
        )


def _health_metrics(health: Health) -> Iterator[Metric]:
    yield gauge(
        "lbtestbed_dispatcher_nodes_up", "Nodes this dispatcher routes to (not down)", health.up_count
    )
    transitions = CounterMetricFamily(
        "lbtestbed_dispatcher_node_transitions",
        "Node processes marked down (failed forward or health check) and up again",
        labels=["to"],
    )
    for to, v in sorted(health.transitions.items()):
        transitions.add_metric([to], v)
    yield transitions
    beats = CounterMetricFamily(
        "lbtestbed_dispatcher_health_checks", "Health checks of node processes by outcome", labels=["outcome"]
    )
    for outcome, v in sorted(health.heartbeats.items()):
        beats.add_metric([outcome], v)
    yield beats
    yield counters_by_kind(
        "lbtestbed_dispatcher_messages_resent",
        "Messages sent again because their answer was overdue (also counted as sent)",
        health.resent,
    )
    yield counters_by_kind(
        "lbtestbed_dispatcher_messages_ignored",
        "State messages from nodes marked down (their state is read afresh when they are back)",
        health.ignored,
    )


def _refusals_and_ejections(core: DispatcherCore) -> Iterator[Metric]:
    refusals = CounterMetricFamily(
        "lbtestbed_dispatcher_refusals",
        "Tasks the dispatcher refused itself (503), by reason: starting, no_node_up, limit (its tasks in "
        "flight), local (no resource to forward it)",
        labels=["reason"],
    )
    for reason in OWN_REFUSALS:
        refusals.add_metric([reason], core.own_refusals[reason])
    yield refusals
    yield counter(
        "lbtestbed_dispatcher_ejections",
        "Nodes ejected as outliers: they answered, but failed tasks in a row or served too slowly",
        core.health.ejections,
    )
    yield counter(
        "lbtestbed_dispatcher_ejections_spared",
        "Timeouts not acted on because they would have left more than health.max_ejection of the nodes "
        "down by judgment",
        core.health.spared,
    )
