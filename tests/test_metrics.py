"""The Prometheus helpers every process shares (lbtestbed/transport/metrics.py): the task path's own
``Histogram`` must expose exactly what ``prometheus_client``'s does, so that Prometheus, the recording
rules and the dashboards read it unchanged."""

from __future__ import annotations

import random
import re

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from lbtestbed.transport.metrics import WALL_BUCKETS, Histogram


def exposition(registry: CollectorRegistry) -> str:
    """The text exposition without the creation times (each histogram stamps its own)."""
    text = generate_latest(registry).decode()
    return re.sub(r"^(\S+_created(?:\{[^}]*\})?) \S+$", r"\1 T", text, flags=re.M)


def test_a_histogram_exposes_what_prometheus_clients_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    kinds = ("decide", "to_node", "node_reply")
    plain = [
        cls("lbt_plain_seconds", "A histogram without labels", buckets=(0.1, 0.5, 1, 2.5), registry=r)
        for cls, r in ((Histogram, ours), (prometheus_client.Histogram, theirs))
    ]
    legs = [
        cls("lbt_leg_seconds", "One with a label", ["leg"], buckets=WALL_BUCKETS, registry=r)
        for cls, r in ((Histogram, ours), (prometheus_client.Histogram, theirs))
    ]
    rng = random.Random(7)
    for _ in range(2000):
        x = rng.choice([rng.expovariate(2.0), *WALL_BUCKETS, 0.5, 1.0, 0.0])  # bucket bounds included
        kind = rng.choice(kinds)
        for h in plain:
            h.observe(x)
        for h in legs:
            h.labels(kind).observe(x / 100)
    assert exposition(ours) == exposition(theirs)


def test_a_histogram_without_observations_exposes_its_zeros() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    Histogram("lbt_empty", "No observations", registry=ours)
    prometheus_client.Histogram("lbt_empty", "No observations", buckets=WALL_BUCKETS, registry=theirs)
    assert exposition(ours) == exposition(theirs)
