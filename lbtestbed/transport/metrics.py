"""Prometheus helpers every process shares (docs/protocol.md, "Metrics"): histogram buckets, the message
ages each process keeps, the client library's standard collectors, and the families every role exports
alike (counters by message kind, the time scale, the listener's connections, the message faults)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

from lbtestbed.model.clock import ModelClock
from lbtestbed.model.experiment import MESSAGE_FAULTS, Experiment
from lbtestbed.policies.base import Message
from lbtestbed.transport.message_faults import MessageFaults
from lbtestbed.transport.wire import message_key

#: the most recent message ages each process keeps per kind for ``GET /v1/timings``
AGES_KEPT = 200_000
#: the most recent ages it keeps message by message (``message_key``), for the twin to replay each one
KEYED_KEPT = 500_000
#: histogram buckets of wall-second legs and ages: 50 µs to 2.5 s
WALL_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Series:
    """One series of a ``Histogram``: the count in each bucket (not cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose upper bound is at least it (Prometheus's ``le``)."""
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class Histogram(Collector):
    """A Prometheus histogram for one event loop: the families and samples of ``prometheus_client``'s
    ``Histogram`` (``_bucket{le}``, ``_count``, ``_sum``, ``_created``; children by label values), at a fifth
    of its cost per observation (no lock, no per-bucket objects: a bisect and two additions). The task path
    observes several per task."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = WALL_BUCKETS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        bounds = tuple(sorted(float(b) for b in buckets))
        self.bounds = bounds if bounds and bounds[-1] == INF else (*bounds, INF)
        self.children: dict[tuple[str, ...], Series] = {}
        self._series = None if self.labelnames else self.labels()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> Series:
        """The series of these label values (made on first use, as prometheus_client does)."""
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {key}")
        series = self.children.get(key)
        if series is None:
            series = self.children[key] = Series(self.bounds)
        return series

    def observe(self, amount: float) -> None:
        assert self._series is not None, f"{self.name} has labels: observe one of its series"
        self._series.observe(amount)

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "histogram")
        les = [floatToGoString(b) for b in self.bounds]
        for key, series in self.children.items():
            labels = dict(zip(self.labelnames, key, strict=True))
            total = 0
            for le, count in zip(les, series.counts, strict=True):
                total += count
                family.add_sample(f"{self.name}_bucket", {**labels, "le": le}, total)
            family.add_sample(f"{self.name}_count", labels, total)
            family.add_sample(f"{self.name}_sum", labels, series.sum)
            family.add_sample(f"{self.name}_created", labels, series.created)
        yield family


def sojourn_buckets(exp: Experiment) -> list[float]:
    """Histogram buckets in model seconds, spread around the mean service time (the dispatcher's and the
    load generator's sojourn histograms)."""
    m = exp.workload.service.mean / min(exp.node_speeds)
    return [round(m * f, 6) for f in (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 50)]


class MessageAges:
    """The age of every state message a process applied (its apply instant minus the sender's ``sent``),
    by kind: the histogram ``lbtestbed_<role>_message_age_seconds{kind}`` in wall seconds, and the most
    recent ages in model seconds for ``GET /v1/timings``, by kind (the twin draws from them) and message
    by message (``message_key``: the twin replays each message's own age where it sends the same one)."""

    def __init__(self, role: str, registry: CollectorRegistry, clock: ModelClock) -> None:
        self.histogram = Histogram(
            f"lbtestbed_{role}_message_age_seconds",
            f"Wall time from a state message's send to its apply at this {role}, by kind",
            ["kind"],
            buckets=WALL_BUCKETS,
            registry=registry,
        )
        self.clock = clock  # for its scale only: ages are durations
        # (sent, age in model seconds) of messages sent on a request of their own, and of those that rode
        # on the reply to a request
        self.recent: dict[str, deque[tuple[float, float]]] = {}
        self.riders: dict[str, deque[tuple[float, float]]] = {}
        self.keyed: dict[str, float] = {}  # by message_key, oldest first

    def observe(self, m: Message, sent: float | None, now: float, rider: bool = False) -> None:
        if sent is None:
            return
        age = max(0.0, now - sent)
        self.histogram.labels(m.kind).observe(age)
        into = self.riders if rider else self.recent
        kept = into.get(m.kind)
        if kept is None:
            kept = into[m.kind] = deque(maxlen=AGES_KEPT)
        model_age = self.clock.model_span(age)
        kept.append((sent, model_age))
        keyed = self.keyed
        keyed[message_key(m)] = model_age
        if len(keyed) > KEYED_KEPT:
            del keyed[next(iter(keyed))]

    def to_json(self) -> dict[str, Any]:
        """``GET /v1/timings``'s body (ages in model seconds, and the time scale that converts them)."""
        return {
            "message_ages": {kind: [a for _, a in kept] for kind, kept in sorted(self.recent.items())},
            "message_sent": {kind: [s for s, _ in kept] for kind, kept in sorted(self.recent.items())},
            "rider_ages": {kind: [a for _, a in kept] for kind, kept in sorted(self.riders.items())},
            "rider_sent": {kind: [s for s, _ in kept] for kind, kept in sorted(self.riders.items())},
            "keyed_ages": self.keyed,
            "time_scale": self.clock.time_scale,
        }


def standard_collectors(registry: CollectorRegistry) -> None:
    """The client library's own collectors on a registry of ours (every process's ``/metrics``): the
    process (``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_open_fds``, ...,
    read from ``/proc`` at the scrape), the platform (``python_info``) and the garbage collector
    (``python_gc_collections_total{generation}``, ...). docs/protocol.md, "Every process"."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def counters_by_kind(name: str, doc: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter family with one series per message kind (kinds are checked per policy: bounded)."""
    family = CounterMetricFamily(name, doc, labels=["kind"])
    for kind, value in sorted(counts.items()):
        family.add_metric([kind], value)
    return family


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """A counter family of one series without labels."""
    family = CounterMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """A gauge family of one series without labels."""
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def time_scale_gauge(scale: float) -> GaugeMetricFamily:
    """``lbtestbed_time_scale``: every process exports it so that dashboards can convert model seconds."""
    return gauge("lbtestbed_time_scale", "Wall seconds per model second", scale)


def message_faults_metric(faults: MessageFaults, role: str) -> CounterMetricFamily:
    """``lbtestbed_<role>_message_faults_total{fault, kind}``: messages each fault kind hit."""
    family = CounterMetricFamily(
        f"lbtestbed_{role}_message_faults",
        "State messages hit by an injected fault (drop, duplicate, delay), by message kind",
        labels=["fault", "kind"],
    )
    kinds = {(f.kind, k) for f in faults.faults if f.kind in MESSAGE_FAULTS for k in f.messages}
    for fault, kind in sorted(kinds | set(faults.hits)):
        family.add_metric([fault, kind], faults.hits[fault, kind])
    return family


class Guard(Protocol):
    """What a listener's guard counts (``transport.process.ConnectionGuard``)."""

    @property
    def open(self) -> int: ...

    @property
    def refused(self) -> int: ...

    @property
    def shed(self) -> int: ...


def listener_metrics(role: str, guard: Guard | None, unauthorized: int) -> Iterator[Metric]:
    """The listener's own families (``transport.process``, ``transport.signing``): connections open now,
    new connections closed at once because the process held its limit, silent ones closed to make room
    (all 0 for a host served without a guard, in a test), and requests refused with 401."""
    open_now, refused, shed = (guard.open, guard.refused, guard.shed) if guard is not None else (0, 0, 0)
    yield gauge(f"lbtestbed_{role}_connections_open", "Connections open to this process now", open_now)
    yield counter(
        f"lbtestbed_{role}_connections_refused",
        "Connections closed at once: the process held its limit of open connections",
        refused,
    )
    yield counter(
        f"lbtestbed_{role}_connections_shed",
        "Connections that had sent nothing since they opened, closed at the limit to make room for a new one",
        shed,
    )
    yield counter(
        f"lbtestbed_{role}_unauthorized",
        "Peer requests refused with 401: not signed with the cluster's key, replayed, or signed before "
        "this process started",
        unauthorized,
    )
