"""What a ``_created`` beside every counter and histogram series would cost a node host's page (issue 30).

Every process's page has none (``lbtestbed/transport/registry.py`` says why). This measures the
alternative on one node host of ``--pools`` pools that have each held up to ``--levels`` - 1 tasks (a
series per level in ``lbtestbed_node_occupancy_model_seconds_total``): the page as served, and the same
collectors with a ``_created`` beside every series of every counter and histogram (one timestamp per
scrape, as cheap as it can be made). The two are timed in turn, ``--rounds`` times each, and the ratio of
their best times is printed with the ratio of their sizes: the scrape runs on the host's event loop, the
task path's, so its time is time the node's completions wait.

    .venv/bin/python benchmarks/bench_created_series.py --pools 100 --levels 26
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from lbtestbed.server_node.host import NodeHost
from lbtestbed.spec import parse_spec


def with_created(families: Iterable[Metric]) -> Iterator[Metric]:
    """Every series of every counter and histogram given a ``_created`` (the alternative measured)."""
    now = time.time()
    for f in families:
        count = {"counter": "_total", "histogram": "_count"}.get(f.type)
        if count is not None and not any(s.name == f"{f.name}_created" for s in f.samples):
            name = f"{f.name}_created"
            f.samples.extend([Sample(name, s.labels, now) for s in f.samples if s.name == f.name + count])
        yield f


class AllCreated(CollectorRegistry):
    def __init__(self, served: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self.served = served

    def collect(self) -> Iterator[Metric]:
        return with_created(self.served.collect())


async def measure(pools: int, levels: int, rounds: int) -> None:
    exp = parse_spec(
        {
            "name": "created",
            "seed": 1,
            "classes": [
                {"name": "p", "count": pools, "discipline": "pool", "utility": {"kind": "xlog", "r": 20}}
            ],
            "workload": {"load": pools / 2, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "jlmu"},
            "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.01},
        }
    )
    host = NodeHost(exp, list(range(pools)), ["http://127.0.0.1:9"], "token")
    await host.start()
    try:
        for model in host.models.values():
            model.time_at.extend([0.0] * (levels - len(model.time_at)))  # a series per level seen
        pages = {"as served": host.registry, "all _created": AllCreated(host.registry)}
        best = dict.fromkeys(pages, float("inf"))
        size = dict.fromkeys(pages, 0)
        for _ in range(rounds):
            for name, registry in pages.items():
                t = time.perf_counter()
                size[name] = len(generate_latest(registry))
                best[name] = min(best[name], time.perf_counter() - t)
    finally:
        await host.stop()
    for name in pages:
        ms, kb = best[name] * 1e3, size[name] / 1e3
        print(f"{name:>13}: {ms:7.1f} ms per scrape (best of {rounds}), {kb:6.0f} kB")
    a, b = pages
    print(f"all _created / as served: time {best[b] / best[a]:.2f}x, size {size[b] / size[a]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--levels", type=int, default=26)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    asyncio.run(measure(args.pools, args.levels, args.rounds))


if __name__ == "__main__":
    main()
