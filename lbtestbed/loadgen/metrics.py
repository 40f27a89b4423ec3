"""The load generator's own ``/metrics``: its summary, live (docs/load.md, "Monitoring the generator").

``LoadCollector`` reads a ``LoadReport`` while ``drive`` fills it, at every scrape: the counts of the
summary (scheduled, sent, every outcome, late sends), the lateness of every send and the sojourn of every
task that ended, as histograms, the tasks out, and how far the send loop is behind its schedule now. The
histograms bin only what arrived since the last scrape (the report's lists only grow), so a scrape costs
nothing on the send path and little beside it. ``MetricsServer`` serves a registry over HTTP in a thread
of its own (prometheus_client's ``start_http_server``), on loopback. The registry carries the client
library's process, platform and GC collectors too (``transport.metrics.standard_collectors``).

Units: ``lbtestbed_loadgen_lateness_seconds`` and ``lbtestbed_loadgen_behind_seconds`` are *wall* seconds
(the lateness is the generator's own, whatever the time scale); ``lbtestbed_loadgen_sojourn_model_seconds``
is in *model* seconds, as the summary's sojourns are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from lbtestbed.loadgen.openloop import LATE, OUTCOMES, LoadReport
from lbtestbed.transport.metrics import standard_collectors, time_scale_gauge
from lbtestbed.transport.registry import Registry

#: wall seconds; 0.002 is LATE, so that ``_count - _bucket{le="0.002"}`` is the summary's late sends
LATENESS_BUCKETS = (0.0005, 0.001, LATE, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: the outcomes a sojourn is measured for: the task got an answer, or was given up (expired)
ANSWERED = ("completed", "refused", "lost", "failed", "expired")


class Binned:
    """A histogram over a list that only grows: the values after ``seen`` are binned at each read."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = np.asarray(buckets, dtype=float)
        self.counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # the last: above every bound
        self.sum = 0.0
        self.seen = 0

    def add(self, values: Sequence[float]) -> None:
        if len(values):
            v = np.asarray(values, dtype=float)
            # bucket le=b holds the values <= b: the first bound not below v
            slot = np.searchsorted(self.bounds, v, side="left")
            self.counts += np.bincount(slot, minlength=len(self.counts))
            self.sum += float(v.sum())

    def buckets(self) -> list[tuple[str, float]]:
        cumulative = np.cumsum(self.counts)
        return [(_le(b), float(c)) for b, c in zip(self.bounds, cumulative, strict=False)] + [
            ("+Inf", float(cumulative[-1]))
        ]


def _le(bound: float) -> str:
    return repr(float(bound))


class LoadCollector:
    """The metrics of one run of the generator, read from its ``LoadReport`` at every scrape."""

    def __init__(self, report: LoadReport, time_scale: float, sojourn_buckets: Sequence[float]) -> None:
        self.report, self.time_scale = report, time_scale
        self.lateness = Binned(LATENESS_BUCKETS)
        self.sojourn = {outcome: Binned(sojourn_buckets) for outcome in ANSWERED}
        self.others_seen = 0
        self.lock = threading.Lock()  # two scrapes at once must not bin the same values twice
        self.scraped = threading.Condition(self.lock)
        self.last_scrape = 0.0  # monotonic instant the last scrape began

    def _update(self) -> None:
        r = self.report
        n = len(r.lateness)
        self.lateness.add(r.lateness[self.lateness.seen : n])
        self.lateness.seen = n
        done = self.sojourn["completed"]
        n = len(r.sojourns)
        done.add(r.sojourns[done.seen : n])
        done.seen = n
        n = len(r.other_sojourns)
        new = r.other_sojourns[self.others_seen : n]
        self.others_seen = n
        for outcome in ANSWERED[1:]:
            self.sojourn[outcome].add([s for o, s in new if o == outcome])

    def collect(self) -> list[Metric]:
        with self.lock:
            began = time.monotonic()
            self._update()
            families = list(self._families(began))
            self.last_scrape = began
            self.scraped.notify_all()
        return families

    def _families(self, now: float) -> Iterator[Metric]:
        r = self.report
        # one key at a time: the loop's thread adds keys to the Counter meanwhile
        outcomes = {k: r.outcomes.get(k, 0) for k in OUTCOMES}
        reached = self.lateness.seen  # tasks the loop reached: sent or dropped
        sent = reached - outcomes.get("dropped", 0)
        ended = sum(outcomes.get(k, 0) for k in ("completed", "refused", "lost", "failed", "expired"))
        name = "lbtestbed_loadgen"
        gauge = GaugeMetricFamily(f"{name}_tasks_scheduled", "Tasks in the run's plan")
        gauge.add_metric([], r.scheduled)
        yield gauge
        count = CounterMetricFamily(f"{name}_tasks_sent", "Tasks sent (requests started)")
        count.add_metric([], sent)
        yield count
        family = CounterMetricFamily(
            f"{name}_tasks",
            "Tasks by how they ended: completed, refused (503), lost (502), dropped (too many outstanding), "
            "failed, expired (no answer within the deadline), cancelled and unsent (an interrupted run)",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            family.add_metric([outcome], outcomes.get(outcome, 0))
        yield family
        late = CounterMetricFamily(
            f"{name}_late_sends",
            f"Sends (or drops) that left more than {LATE * 1e3:g} ms wall after their intended time",
        )
        late.add_metric([], r.late)
        yield late
        gauge = GaugeMetricFamily(f"{name}_tasks_outstanding", "Tasks sent and not ended yet")
        gauge.add_metric([], max(0, sent - ended - outcomes.get("cancelled", 0)))
        yield gauge
        due = r.due
        gauge = GaugeMetricFamily(
            f"{name}_behind_seconds",
            "Wall seconds the send loop is behind its schedule now: how long ago the next task was due to "
            "leave (0 when it is not due yet, or nothing is left to send)",
        )
        gauge.add_metric([], max(0.0, now - due) if due is not None else 0.0)
        yield gauge
        hist = HistogramMetricFamily(
            f"{name}_lateness_seconds",
            "Wall seconds from a task's intended send time to its request's start (or its drop), every task "
            "the loop reached",
        )
        hist.add_metric([], self.lateness.buckets(), self.lateness.sum)
        yield hist
        hist = HistogramMetricFamily(
            f"{name}_sojourn_model_seconds",
            "Model seconds from a task's intended send time to its answer (expired: to giving it up), by how "
            "it ended",
            labels=["outcome"],
        )
        for outcome, binned in self.sojourn.items():
            hist.add_metric([outcome], binned.buckets(), binned.sum)
        yield hist
        yield time_scale_gauge(self.time_scale)

    def wait_for_scrape(self, after: float, timeout: float) -> bool:
        """Until a scrape that began after the monotonic instant ``after`` is done (the run's last counts
        are then in Prometheus), at most ``timeout`` seconds; True if there was one."""
        deadline = time.monotonic() + timeout
        with self.scraped:
            while self.last_scrape <= after:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.scraped.wait(left)
        return True

    def wait_until_unscraped(self, quiet: float, timeout: float) -> bool:
        """Until no scrape has begun for ``quiet`` seconds (Prometheus dropped the target), at most
        ``timeout`` seconds; True if it went quiet."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            with self.lock:
                since = now - self.last_scrape
            if since >= quiet:
                return True
            if now + quiet - since > deadline:
                return False
            time.sleep(quiet - since)


def registry_for(collector: LoadCollector) -> CollectorRegistry:
    """A registry of its own with the run's collector and the standard ones."""
    registry = Registry()
    registry.register(collector)
    standard_collectors(registry)
    return registry


class MetricsServer:
    """``registry`` over HTTP on ``host:port`` (0: a free port), in a thread of its own; ``close`` ends it."""

    def __init__(self, registry: Any, port: int = 0, host: str = "127.0.0.1") -> None:
        self.registry = registry  # more collectors may join while it serves
        self.server, self.thread = start_http_server(port, addr=host, registry=registry)
        self.host, self.port = host, int(self.server.server_port)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
