"""Snapshots of a cluster's metrics: every process's counters at one instant.

A snapshot comes from scraping each process's ``/metrics`` directly (the default of ``lbt run``) or from a
Prometheus server queried at an instant. Either way it keeps the samples per process, because a node's time
integrals are only comparable with the model clock of the process that exported them in the same scrape:
the ratio of two such increases is an exact time average whatever the instant of the scrape.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]


class ScrapeError(RuntimeError):
    """A process's metrics could not be read; the message names the process."""


@dataclass
class ProcessSamples:
    """The samples of one process's ``/metrics`` page."""

    samples: list[tuple[str, Labels, float]] = field(default_factory=list)

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when there is none)."""
        return sum(
            v for n, lab, v in self.samples if n == name and all(lab.get(k) == x for k, x in labels.items())
        )

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """Samples of ``name`` summed by the values of the labels ``keys``."""
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for n, lab, v in self.samples:
            if n == name:
                out[tuple(lab.get(k, "") for k in keys)] += v
        return dict(out)


@dataclass
class Snapshot:
    """All processes at (about) one instant; ``at`` is wall seconds since the load's model time 0."""

    at: float
    processes: dict[str, ProcessSamples]
    missing: list[str] = field(default_factory=list)  # processes that did not answer (a fault's target)

    def value(self, name: str, **labels: str) -> float:
        return sum(p.value(name, **labels) for p in self.processes.values())

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for p in self.processes.values():
            for k, v in p.by(name, *keys).items():
                out[k] += v
        return dict(out)

    def to_json(self) -> dict[str, Any]:
        """The snapshot as a JSON object (``from_json`` reads it back): a run keeps each one as it is
        taken, so that its report can be written again from its directory."""
        return {
            "at": self.at,
            "missing": self.missing,
            "processes": {key: p.samples for key, p in self.processes.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        """A snapshot from ``to_json``'s object (ValueError, KeyError or TypeError if it is not one)."""
        processes = {
            str(key): ProcessSamples([(str(n), dict(lab), float(v)) for n, lab, v in samples])
            for key, samples in data["processes"].items()
        }
        return cls(float(data["at"]), processes, [str(u) for u in data["missing"]])


def parse(text: str) -> ProcessSamples:
    """One ``/metrics`` page in the Prometheus text format."""
    out = ProcessSamples()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.samples.append((s.name, dict(s.labels), float(s.value)))
    return out


async def scrape(
    session: aiohttp.ClientSession,
    urls: Sequence[str],
    origin: float,
    missing_ok: bool = False,
    timeout: float = 10.0,
) -> Snapshot:
    """Scrape every process at once; ``origin`` is the monotonic instant of model time 0.
    ``missing_ok``: a process that does not answer (killed or paused by a fault) is listed in
    ``missing`` instead of failing the scrape."""

    async def one(url: str) -> tuple[str, ProcessSamples | None]:
        try:
            async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"{url}/metrics answered {resp.status}")
                return url, parse(await resp.text())
        except (aiohttp.ClientError, TimeoutError, ScrapeError) as e:
            if missing_ok:
                return url, None
            raise ScrapeError(f"{url}/metrics: {e or type(e).__name__}") from None

    at = time.monotonic() - origin
    pages = await asyncio.gather(*(one(u) for u in urls))
    return Snapshot(
        at, {u: page for u, page in pages if page is not None}, [u for u, page in pages if page is None]
    )


def from_query(rows: Iterable[tuple[Labels, float]], at: float) -> Snapshot:
    """A snapshot from the rows of an instant query ``{__name__=~"lbtestbed_.+"}`` (one process per
    ``instance`` label)."""
    processes: dict[str, ProcessSamples] = defaultdict(ProcessSamples)
    for labels, value in rows:
        labels = dict(labels)
        name = labels.pop("__name__")
        instance = labels.pop("instance", "")
        for extra in ("job", "role", "cluster"):  # added by the scrape configuration, not by the process
            labels.pop(extra, None)
        processes[instance].samples.append((name, labels, value))
    return Snapshot(at, dict(processes))
