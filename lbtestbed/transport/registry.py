"""The registry every process serves its ``/metrics`` from: the dispatcher's, the node host's and the load
generator's (docs/protocol.md, "Metrics").

One rule for every page: no counter or histogram carries a ``_created`` series. prometheus_client gives
one to each series of a counter or histogram it makes itself (``Histogram``: the hosts' sojourns, legs,
message ages, timer lateness), shown in the text format as a gauge ``<name>_created``; the families our
collectors build (``CounterMetricFamily``, ``HistogramMetricFamily``) and the library's process and
garbage-collector counters have none, so the pages disagreed. Giving every series one instead would cost
more than it tells here: in the text format the processes serve, each ``_created`` is a series of its own
(Prometheus reads created timestamps as such only from OpenMetrics or protobuf scrapes, behind a feature
flag), which more than doubles the largest families (a node's occupancy per level: a node host's page of
100 pools at 26 levels would grow 2.2 times, and the scrape that holds its event loop 1.7 to 2.4 times:
benchmarks/bench_created_series.py), and nothing reads them: a count that began again (a restarted process,
a new run of the generator) shows as a counter reset, and ``process_start_time_seconds`` says when a
process started.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

#: the family types whose series prometheus_client may give a ``_created`` sample
_COUNTS = ("counter", "histogram")


class Registry(CollectorRegistry):
    """A process's registry: its collectors' families, each counter's and histogram's ``_created`` samples
    left out (module docstring)."""

    def __init__(self) -> None:
        super().__init__(auto_describe=False)

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            if family.type in _COUNTS:
                created = f"{family.name}_created"
                family.samples = [s for s in family.samples if s.name != created]
            yield family
