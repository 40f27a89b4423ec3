"""``lbt run``: one experiment on a real cluster, measured batch by batch, beside simulator and theory.

The cluster comes up (or an existing one is used), the open-loop generator sends the spec's tasks (the
simulator's own tasks for the same seed, recorded to ``trace.csv``) and the metrics are read at the batch
boundaries of the measured window [warmup, warmup + duration]: scraped from every process (the default) or
queried from a Prometheus server. Then the simulator runs the same spec on the same tasks and the theory
predicts it; ``analysis.compare`` gives the verdicts and ``analysis.report`` writes the report directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from lbtestbed.analysis.comparison.compare import Side
from lbtestbed.analysis.measurement.cpu import cpu_per_task
from lbtestbed.analysis.measurement.legs import (
    LegCheck,
    MachineCost,
    SchedStat,
    busiest,
    hold,
    read_schedstat,
    unavailable,
)
from lbtestbed.analysis.measurement.measure import NODE_CLOCK, cluster_raw
from lbtestbed.analysis.measurement.overhead import overhead_of, write_records
from lbtestbed.analysis.measurement.scrape import Snapshot, from_query, scrape
from lbtestbed.analysis.report import run_report as report
from lbtestbed.analysis.report.run_report import RunReport
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result, summarize
from lbtestbed.analysis.results.statistics import ratio_estimate
from lbtestbed.analysis.simulator.twin import Emulation, simulate_twin
from lbtestbed.cluster.launcher import Cluster
from lbtestbed.dispatcher.core import DISPATCHER_STREAM
from lbtestbed.experiment import machine
from lbtestbed.experiment.fault_injector import FaultCollector, Injector, check
from lbtestbed.loadgen.openloop import LoadReport, drive, poisson_tasks, write_trace
from lbtestbed.model.conditions import speed_changes, speed_varies
from lbtestbed.model.document import document
from lbtestbed.model.experiment import GRAY_FAULTS, Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.model.workload import DispatcherSplit
from lbtestbed.policies import policy_of
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile

Say = Callable[[str], None]
#: wall seconds between samples of what the policy learns (unit.Learned), for its time series
R_SAMPLE_WALL = 0.1
#: wall seconds given to the processes between the health check and the first task
LEAD_IN = 0.3


@dataclass
class Measurement:
    """What the cluster side of a run produced."""

    snapshots: list[Snapshot]
    load: LoadReport
    direct: list[Snapshot] = field(default_factory=list)  # scraped beside Prometheus, as a check
    r_series: list[tuple[float, float]] = field(default_factory=list)  # (model time, r) samples
    source: str = "scrape"  # or the Prometheus URL the counters came from
    cluster: dict[str, Any] = field(default_factory=dict)  # endpoints, processes
    faults: list[dict[str, Any]] = field(default_factory=list)  # what the injector did, when
    health_events: list[dict[str, Any]] = field(default_factory=list)  # the dispatchers' down/up
    tasks: list[tuple[float, float]] = field(default_factory=list)  # the trace sent
    # the ages every process measured for the messages it applied, pooled by kind, as (model time it was
    # sent, age in model seconds) in sending order: sent on their own request, and riding on the reply to one
    message_ages: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    rider_ages: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    keyed_ages: dict[str, float] = field(default_factory=dict)  # by wire.message_key
    generator_cpu: list[float] = field(default_factory=list)  # this process's CPU seconds at each boundary
    cpu: dict[str, Any] = field(default_factory=dict)  # analysis.measurement.cpu.cpu_per_task
    machine: MachineCost | None = None  # what the machine cost its probe over the window
    unavailable: float | None = None  # the least available cluster process's running-or-waiting share


def warmup_warning(exp: Experiment) -> str | None:
    """A warning when the spec's warm-up is shorter than the JLMU fluid model says pools need."""
    from lbtestbed.analysis.theory.fluid import describes, warmup_needed

    if not describes(exp):
        return None

    try:
        need = warmup_needed(exp)
    except (ValueError, ZeroDivisionError, ArithmeticError):
        return None
    if exp.run.warmup < need:
        return (
            f"warm-up {exp.run.warmup:g} model s is shorter than the {need:.3g} s the fluid model needs to "
            f"come within a tenth of a standard deviation of equilibrium (docs/theory.md, warm-up rule); "
            f"early batches may be biased: --set run.warmup={math.ceil(need)}"
        )
    return None


def ejection_warning(exp: Experiment) -> str | None:
    """A warning when speed schedules or antagonists slow a node below the share of its speed at which
    the dispatchers eject it as an outlier (health.slow_share): the simulator and the twin eject nothing."""
    if not speed_varies(exp) or exp.health.slow_share == 0:
        return None
    slowest = min(c.factor for c in speed_changes(dataclasses.replace(exp, faults=())))  # slow faults aside
    if slowest >= exp.health.slow_share:
        return None
    return (
        f"the speed schedules and antagonists slow a node to {slowest:.3g} of its speed, below "
        f"health.slow_share = {exp.health.slow_share:g}: the dispatchers' outlier detection may eject it, "
        f"which the simulator and the twin do not model (--set health.slow_share=0 turns that rule off)"
    )


def scrape_interval(exp: Experiment) -> float:
    """Prometheus's scrape interval for a run: five scrapes a batch, between 0.1 s and 1 s of wall time.

    Prometheus reads each boundary from its last scrape before it, so a batch shorter than the interval
    would measure nothing; at five scrapes a batch the shift is at most a fifth of a batch.
    """
    batch_wall = exp.run.duration * exp.run.time_scale / exp.run.batches
    return round(min(1.0, max(0.1, batch_wall / 5)), 3)


def drain_arrivals(exp: Experiment) -> float:
    """Model seconds of arrivals after the window, so that its last tasks are served as the simulator
    serves them: the simulator keeps arrivals coming until every measured task has left. That matters only
    where later arrivals slow earlier tasks, on processor-sharing nodes; pools and FCFS nodes serve a task
    the same whatever arrives after it."""
    if "ps" not in {c.discipline for c in exp.classes}:
        return 0.0
    return 0.2 * exp.run.duration


def boundaries(exp: Experiment) -> list[float]:
    """Model times of the snapshots: the batch boundaries of the measured window."""
    B = exp.run.batches
    return [exp.run.warmup + exp.run.duration * b / B for b in range(B + 1)]


def excluded_batches(exp: Experiment) -> list[bool]:
    """Which batches of the measured window a fault may have disturbed: those overlapping
    [at, until + settle] of some fault."""
    marks = boundaries(exp)
    return [
        any(f.at < hi and lo < f.until + f.settle for f in exp.faults) for lo, hi in itertools.pairwise(marks)
    ]


async def _sample_r(
    session: aiohttp.ClientSession, url: str, origin: float, scale: float, quantity: str, out: list
) -> None:
    """What the policy learns (its gauge ``quantity``) from the dispatcher, for the plot (its time average
    comes from the exact integral)."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            snap = await scrape(session, [url], origin)
            r = snap.by("lbtestbed_dispatcher_policy_state", "quantity").get((quantity,))
            if r is not None:
                out.append((snap.at / scale, r))
        await asyncio.sleep(R_SAMPLE_WALL)


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """The JSON object at ``url``; empty when the process does not answer (a fault may have taken it)."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            body = await resp.json()
        if isinstance(body, dict):
            return body
    return {}


async def _health_events(
    session: aiohttp.ClientSession, f: ClusterFile, origin_unix: float, scale: float
) -> list[dict[str, Any]]:
    """Every dispatcher's node transitions, with the model time of each."""
    out = []
    for d in f.dispatchers:
        for e in (await _get_json(session, f"{d.url}/v1/health")).get("events", []):
            out.append({"dispatcher": d.index, "model_time": (e["unix_time"] - origin_unix) / scale, **e})
    return sorted(out, key=lambda e: e["model_time"])


Timeline = dict[str, list[tuple[float, float]]]


async def _timings(
    session: aiohttp.ClientSession, f: ClusterFile, origin: float, scale: float
) -> tuple[Timeline, Timeline, dict[str, float]]:
    """Every process's recent message ages (``GET /v1/timings``): pooled by kind as (model time sent, age),
    in sending order, for messages on their own requests and for riders; and message by message
    (wire.message_key). ``origin``: the monotonic instant of model time 0."""
    own: Timeline = {}
    riders: Timeline = {}
    keyed: dict[str, float] = {}
    for e in f.dispatchers + f.node_hosts:
        body = await _get_json(session, f"{e.url}/v1/timings")
        for into, key in ((own, "message"), (riders, "rider")):
            sent = body.get(f"{key}_sent") or {}
            for kind, ages in (body.get(f"{key}_ages") or {}).items():
                times = [(float(t) - origin) / scale for t in sent.get(kind, ())]
                into.setdefault(kind, []).extend(zip(times, map(float, ages), strict=True))
        keyed.update((k, float(a)) for k, a in (body.get("keyed_ages") or {}).items())
    for timeline in (own, riders):
        for pairs in timeline.values():
            pairs.sort()
    return own, riders, keyed


@dataclass
class _Window:
    """What ``measure`` collects at the batch boundaries of the measured window."""

    snapshots: list[Snapshot] = field(default_factory=list)
    instants: list[tuple[float, float]] = field(default_factory=list)  # (unix time, wall s since model 0)
    generator_cpu: list[float] = field(default_factory=list)
    # the kernel's account of every cluster process (by pid) at the window's first and last boundary
    sched: list[dict[int, SchedStat]] = field(default_factory=list)


async def measure(
    exp: Experiment,
    f: ClusterFile,
    tasks: Sequence[tuple[float, float]],
    say: Say,
    prometheus: str | None = None,
    max_outstanding: int = 10_000,
    cluster_path: Path | None = None,
    report: LoadReport | None = None,
    registry: Any = None,
) -> Measurement:
    """Drive the cluster with ``tasks`` and read its counters at the batch boundaries; apply the spec's
    faults (``cluster_path``: the cluster file, to restart killed processes). ``report``: the generator's
    report to fill (its metrics read it); ``registry``: where the faults' metric joins them. Beside the
    cluster a probe measures what the machine itself costs over the window (``experiment.machine``).
    Every task started here is awaited before this returns, also when something fails."""
    scale = exp.run.time_scale
    marks = boundaries(exp)
    window = _Window()
    r_series: list[tuple[float, float]] = []
    async with aiohttp.ClientSession() as session, machine.started() as probe:
        origin = time.monotonic() + LEAD_IN
        origin_unix = time.time() + LEAD_IN
        injector = Injector(exp, f, cluster_path or Path("cluster.json"), origin, say)
        if registry is not None and exp.faults:
            registry.register(FaultCollector(injector))
        if speed_varies(exp) or any(fault.kind in GRAY_FAULTS for fault in exp.faults):
            # the node hosts apply speed schedules, antagonists and gray faults on the run's clock
            await injector.set_origin(session, origin_unix)  # within the lead-in, before the first task
        try:
            async with asyncio.TaskGroup() as group:
                load = group.create_task(
                    drive(
                        [d.url for d in f.dispatchers],
                        tasks,
                        scale,
                        max_outstanding,
                        start=origin,
                        routes=DispatcherSplit(exp).take(len(tasks)),
                        report=report,
                    )
                )
                background = _background(group, exp, f, session, probe, injector, origin, r_series)
                await _boundaries(exp, f, session, load, origin, marks, window, prometheus is not None, say)
                say(f"draining: waiting for the last of {len(tasks)} tasks")
                report = await load
                for task in background:  # the samplers run until told; the injector ends by itself
                    if task.get_name() != "faults":
                        task.cancel()
        except BaseExceptionGroup as group_error:
            raise _first(group_error) from None
        finally:
            injector.restore()
        events = await _health_events(session, f, origin_unix, scale) if exp.faults else []
        own_ages, rider_ages, keyed_ages = await _timings(session, f, origin, scale)
        cost = await probe.cost(origin + marks[0] * scale, origin + marks[-1] * scale)
    extra: dict[str, Any] = {
        "faults": injector.to_json(),
        "health_events": events,
        "tasks": list(tasks),
        "message_ages": own_ages,
        "rider_ages": rider_ages,
        "keyed_ages": keyed_ages,
        "generator_cpu": window.generator_cpu,
        "machine": cost,
        "unavailable": _unavailable(window, exp.run.duration * scale),
    }
    if prometheus is None:
        return Measurement(window.snapshots, report, r_series=r_series, **extra)
    read = _from_prometheus(prometheus, window.instants, say)
    return Measurement(read, report, direct=window.snapshots, r_series=r_series, source=prometheus, **extra)


def _background(
    group: asyncio.TaskGroup,
    exp: Experiment,
    f: ClusterFile,
    session: aiohttp.ClientSession,
    probe: machine.Probe,
    injector: Injector,
    origin: float,
    r_series: list[tuple[float, float]],
) -> list[asyncio.Task[None]]:
    """The tasks beside the load: the fault injector, the machine probe's echoes over the window, and the
    sampler of what the policy learns."""
    tasks = []
    if exp.faults:
        tasks.append(group.create_task(injector.run(session), name="faults"))
    end = origin + (exp.run.warmup + exp.run.duration) * exp.run.time_scale
    tasks.append(group.create_task(probe.ping(end), name="machine"))
    learned = policy_of(exp).learned
    if learned is not None:
        url, scale = f.dispatchers[0].url, exp.run.time_scale
        sampler = _sample_r(session, url, origin, scale, learned.name, r_series)
        tasks.append(group.create_task(sampler, name="learned"))
    return tasks


async def _boundaries(
    exp: Experiment,
    f: ClusterFile,
    session: aiohttp.ClientSession,
    load: asyncio.Task[LoadReport],
    origin: float,
    marks: Sequence[float],
    window: _Window,
    instants: bool,
    say: Say,
) -> None:
    """Scrape every process at each batch boundary (``instants``: also note when, for Prometheus)."""
    urls = [e.url for e in f.dispatchers + f.node_hosts]
    pids = [e for e in f.dispatchers + f.node_hosts if e.pid]
    faulty = bool(exp.faults)
    say(f"warm-up: {exp.run.warmup:g} model s = {exp.run.warmup * exp.run.time_scale:.1f} s wall")
    for b, t in enumerate(marks):
        delay = origin + t * exp.run.time_scale - time.monotonic()
        if delay > 0:
            await asyncio.wait([load], timeout=delay)  # wakes early only if the load failed
        if load.done() and load.exception() is not None:
            raise load.exception()  # type: ignore[misc]
        if instants:
            window.instants.append((time.time(), time.monotonic() - origin))
        cpu = os.times()
        window.generator_cpu.append(cpu.user + cpu.system)  # the generator's process: this one
        if b in (0, len(marks) - 1):
            window.sched.append({e.pid: s for e in pids if (s := read_schedstat(e.pid)) is not None})
        # with faults a process may be down at a boundary: its batches are dropped
        wait = 3.0 if faulty else 10.0
        window.snapshots.append(await scrape(session, urls, origin, missing_ok=faulty, timeout=wait))
        if b < len(marks) - 1:
            say(f"measuring: batch {b + 1}/{len(marks) - 1} (model time {t:.4g} of {marks[-1]:.4g})")


def _unavailable(window: _Window, wall: float) -> float | None:
    """The least available cluster process's running-or-waiting share of the window (legs.unavailable)."""
    return unavailable(window.sched[0], window.sched[-1], wall) if len(window.sched) == 2 else None


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first error of a task group that is not a cancellation (the one the run reports)."""
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            return _first(e)
        if not isinstance(e, asyncio.CancelledError):
            return e
    return group.exceptions[0]


def _from_prometheus(url: str, instants: Sequence[tuple[float, float]], say: Say) -> list[Snapshot]:
    """The counters as the Prometheus server saw them at each boundary instant (its last scrape before)."""
    from lbtestbed.cluster.prometheus import instant_query

    last = instants[-1][0]
    wait = last + 2.5 - time.time()  # a scrape after the last boundary, at the longest interval (1 s)
    if wait > 0:
        say(f"waiting {wait:.1f} s for Prometheus's scrape after the window")
        time.sleep(wait)
    return [from_query(instant_query(url, '{__name__=~"lbtestbed_.+"}', at), wall) for at, wall in instants]


def _wait_for_targets(url: str, count: int, timeout: float = 30.0) -> None:
    """Until Prometheus has scraped every process once (its first scrapes take a few seconds)."""
    from lbtestbed.cluster.prometheus import PrometheusError, instant_query

    deadline = time.monotonic() + timeout
    while sum(1 for _, v in instant_query(url, "up") if v == 1.0) < count:
        if time.monotonic() > deadline:
            raise PrometheusError(
                f"Prometheus at {url} has not scraped all {count} processes in {timeout:g} s"
            )
        time.sleep(0.25)


def existing_cluster(exp: Experiment, endpoints: Path) -> ClusterFile:
    """The cluster file ``endpoints``, after checking that its processes run ``exp`` (ClusterError if not)."""
    f = ClusterFile.load(endpoints)
    try:
        running = f.experiment()
    except SpecError as e:
        raise ClusterError(f"{endpoints}: the cluster's own experiment does not load: {e}") from None
    # the processes took their experiment when they started: what they apply must be what the run assumes
    ours, theirs_doc = document(exp), document(running)
    for what, mine, theirs in (
        ("classes", ours["classes"], theirs_doc["classes"]),
        ("seed", exp.seed, running.seed),  # speeds drawn from a distribution depend on it
        ("policy", ours["policy"], theirs_doc["policy"]),
        ("run.time_scale", exp.run.time_scale, running.run.time_scale),
        ("network", ours["network"], theirs_doc["network"]),
    ):
        if mine != theirs:
            raise ClusterError(
                f"{endpoints}: the cluster's processes run {what} = {theirs}, the spec asks for {mine}; "
                f"start the cluster with the same spec and overrides"
            )
    if len(f.dispatchers) != exp.policy.dispatchers:
        raise ClusterError(
            f"{endpoints}: the cluster has {len(f.dispatchers)} dispatcher(s), the spec runs "
            f"{exp.policy.dispatchers} (policy.dispatchers)"
        )
    check_faults(exp, f, local=False)
    return f


@contextlib.contextmanager
def cluster_for(
    exp: Experiment,
    directory: Path,
    endpoints: Path | None,
    node_processes: int | None,
    say: Say,
    netns: bool = False,
    bandwidth: str = "",
) -> Iterator[ClusterFile]:
    """A cluster for the run: the one described by ``endpoints``, or a new local one stopped afterwards."""
    if endpoints is not None:
        yield existing_cluster(exp, endpoints)
        return
    cluster = Cluster(directory / "cluster.json")
    where = " in network namespaces" if netns else ""
    say(f"starting the cluster{where}: {exp.n} nodes, {exp.policy.dispatchers} dispatcher(s)")
    try:
        f = cluster.up(
            exp,
            node_processes=node_processes,
            netns=netns,
            bandwidth=bandwidth,
        )
        check_faults(exp, f, local=True)
        yield f
    finally:
        cluster.down()


def check_faults(exp: Experiment, f: ClusterFile, local: bool) -> None:
    """Refuse faults the cluster cannot take or that leave too little to compare (ClusterError)."""
    check(exp, f, local)
    if exp.faults and sum(not x for x in excluded_batches(exp)) < 2:
        raise ClusterError(
            "the faults (with the settle time after each) disturb all but fewer than two batches of the "
            "measured window: nothing would be left to compare; lengthen run.duration or move the faults"
        )


def run_cluster(
    exp: Experiment,
    directory: Path,
    say: Say,
    *,
    endpoints: Path | None = None,
    node_processes: int | None = None,
    prometheus: str | None = None,
    with_prometheus: bool = False,
    netns: bool = False,
    bandwidth: str = "",
) -> Measurement:
    """Start (or use) the cluster, record and send the workload, and measure the window."""
    tasks = list(poisson_tasks(exp, exp.run.warmup + exp.run.duration + drain_arrivals(exp)))
    write_trace(directory / "trace.csv", tasks)
    with cluster_for(exp, directory, endpoints, node_processes, say, netns, bandwidth) as f:
        path = endpoints if endpoints is not None else directory / "cluster.json"
        info = {
            "dispatchers": [d.url for d in f.dispatchers],
            "node_hosts": [h.url for h in f.node_hosts],
        }
        roles = {e.url: ("dispatcher", e.index) for e in f.dispatchers}
        roles |= {e.url: ("nodes", e.index) for e in f.node_hosts}
        if with_prometheus and prometheus is None:
            from lbtestbed.cluster.prometheus import start_prometheus

            interval = scrape_interval(exp)
            with start_prometheus(exp, f, directory / "cluster.json", interval) as server:
                say(f"Prometheus at {server.url}, scraping every {interval:g} s")
                _wait_for_targets(server.url, len(f.dispatchers) + len(f.node_hosts))
                m = _measure_served(exp, f, tasks, say, server.url, path, server.directory, linger=False)
        else:
            from lbtestbed.cluster.prometheus import config_dir

            # a cluster of its own with a Prometheus (lbt cluster up --with-prometheus): join its targets
            joined = config_dir(endpoints) if endpoints is not None and f.prometheus_url else None
            m = _measure_served(exp, f, tasks, say, prometheus, path, joined)
    m.cluster = info
    direct = m.direct or m.snapshots  # scraped from every process (keyed by URL), also beside Prometheus
    m.cpu = cpu_per_task(direct[0], direct[-1], roles, m.generator_cpu[:1] + m.generator_cpu[-1:])
    return m


def _measure_served(
    exp: Experiment,
    f: ClusterFile,
    tasks: Sequence[tuple[float, float]],
    say: Say,
    prometheus: str | None,
    path: Path,
    directory: Path | None,
    linger: bool = True,
) -> Measurement:
    """``measure``, with the generator's metrics and the faults' served to the Prometheus configured in
    ``directory`` (docs/load.md, "Monitoring the generator"), if any."""
    from lbtestbed.cluster.prometheus import serve_generator

    report = LoadReport(scheduled=len(tasks))  # from the first scrape on
    with serve_generator(report, exp, None, directory, say, linger=linger) as server:
        registry = server.registry if server is not None else None
        return asyncio.run(
            measure(exp, f, tasks, say, prometheus, cluster_path=path, report=report, registry=registry)
        )


def clock_shift(a: Snapshot, b: Snapshot) -> float | None:
    """The largest difference between two snapshots' model clocks of the same node process."""

    def clocks(s: Snapshot) -> dict[str, float]:
        out = {}
        for key, proc in s.processes.items():
            if any(n == NODE_CLOCK for n, _, _ in proc.samples):
                out[key.rpartition("/")[2]] = proc.value(NODE_CLOCK)  # URL or Prometheus instance
        return out

    ca, cb = clocks(a), clocks(b)
    return max((abs(ca[k] - cb[k]) for k in ca.keys() & cb.keys()), default=None)


def unanswered_batches(snaps: Sequence[Snapshot]) -> list[int]:
    """The batches at one of whose ends a process did not answer the scrape (the fault's target, or any
    process too slow for the scrape's deadline on a busy machine)."""
    return [b for b in range(len(snaps) - 1) if snaps[b].missing or snaps[b + 1].missing]


def batches_kept(exp: Experiment, snaps: Sequence[Snapshot]) -> list[bool]:
    """The batches to compare: not disturbed by a fault, and every process answered at both ends."""
    excluded = excluded_batches(exp) if exp.faults else [False] * (len(snaps) - 1)
    unanswered = set(unanswered_batches(snaps))
    return [not (excluded[b] or b in unanswered) for b in range(len(snaps) - 1)]


def cluster_result(exp: Experiment, m: Measurement) -> tuple[Result, RawRun]:
    """The cluster's measurements as the shared result object (source: cluster)."""
    keep = batches_kept(exp, m.snapshots)
    raw = cluster_raw(exp, m.snapshots, m.load.records, keep)
    if m.r_series:
        raw.r_series = [(t, int(r)) for t, r in m.r_series]
    result = summarize(exp, [raw], source="cluster")
    for key in ("events", "wall_seconds", "censored_tasks"):  # simulator bookkeeping
        result.extras.pop(key, None)
    num, den = raw.ratios["network_overhead"]
    if m.direct:  # the same window scraped directly: the time averages should match Prometheus's
        direct = summarize(exp, [cluster_raw(exp, m.direct, m.load.records, keep)], source="cluster")
        checked = ("mean_tasks_per_node", "tasks_in_system", "utility", "idle_nodes", "messages_per_task")
        result.extras["direct_scrape"] = {k: direct.metrics[k]["value"] for k in checked}
        result.extras["direct_scrape"]["occupancy_tail"] = {
            name: [e["value"] for e in tail] for name, tail in direct.metrics["occupancy_tail"].items()
        }
        # how far apart the two windows' ends are, in model seconds (the largest over the node processes)
        result.extras["direct_scrape"]["window_shift"] = [
            clock_shift(m.snapshots[0], m.direct[0]),
            clock_shift(m.snapshots[-1], m.direct[-1]),
        ]
    if exp.faults:
        result.extras["faults"] = {
            "actions": m.faults,
            "health_events": m.health_events,
            "batches_excluded": [b for b, k in enumerate(keep) if not k],
            "batches_unanswered": unanswered_batches(m.snapshots),  # of those, for want of an answer
        }
        # per task, for the timeline: (intended arrival, node) of each completed task, and the others
        result.extras["fault_timeline"] = {
            "completed": [(round(r.t, 6), r.node) for r in m.load.records],
            "failures": [(round(t, 6), outcome, node) for t, outcome, node in m.load.failures],
        }
    touched = excluded_batches(exp) if exp.faults else [False] * len(keep)
    result.extras["batches"] = {  # the batch set of every row of the report (run_report.batch_note)
        "window": len(keep),
        "kept": [b for b, k in enumerate(keep) if k],
        "faults": [b for b, t in enumerate(touched) if t],
        # left out for want of an answer alone (the target of a fault does not answer either)
        "unanswered": [b for b in unanswered_batches(m.snapshots) if not touched[b]],
    }
    result.extras |= {
        "decisions": raw.decisions,
        "network_overhead": ratio_estimate(num, den).to_json(),
        "load": m.load.summary(),
        "metrics_source": m.source,
        "endpoints": m.cluster,
        "cpu": m.cpu,
    }
    return result, raw


def emulation_of(exp: Experiment, m: Measurement) -> Emulation:
    """What the twin replays of a cluster run: its trace, every completed task's legs, message ages."""
    legs = {r.t: (r.arrive, r.decide, r.forward, r.notify, r.reply, r.leave) for r in m.load.records}
    # messages for a task's dispatcher ride on the task's reply unless the network is emulated
    return Emulation(
        m.tasks,
        legs,
        m.message_ages,
        m.rider_ages,
        m.keyed_ages,
        riders=exp.network.delay is None,
        policy_stream=DISPATCHER_STREAM,
    )


def _how_close(preflight: dict[str, Any], cluster: Result, rep: RunReport) -> str:
    """How close the pre-flight's estimate came: its live calibration at the scale picked where it made one,
    else its table's."""
    from lbtestbed.experiment.calibration import how_close

    measured_ms = cluster.extras["overhead"]["legs"]["total"]["p50_ms"]
    costs = {c.metric: c.cost for c in rep.representative.costs} if rep.representative else {}
    picked = preflight.get("time_scale", {}).get("picked")
    live = [x for x in preflight.get("live", []) if x["time_scale"] == picked]
    if live:
        x = live[-1]
        return how_close("live", x["overhead_p50_ms"], x["cost"], measured_ms, costs.get("mean_sojourn"))
    est = preflight["estimate"]["overhead_ms"]
    return how_close("the machine's table", est, None, measured_ms, costs.get("mean_sojourn"))


def _legs_held(exp: Experiment, m: Measurement) -> LegCheck | None:
    """Each leg of the run's tasks against what its machine probe measured over the window."""
    if m.machine is None:
        return None
    busy = (
        m.unavailable if m.unavailable is not None else busiest(m.cpu, exp.run.duration * exp.run.time_scale)
    )
    return hold(m.load.records, m.machine, busy, exp.run.time_scale)


def run_experiment(
    exp: Experiment,
    directory: Path,
    say: Say,
    *,
    simulate: bool = True,
    twin: bool = True,
    preflight: dict[str, Any] | None = None,
    **cluster_options: Any,
) -> tuple[RunReport, list[Path]]:
    """The whole of ``lbt run``: cluster, simulation, theory, verdicts and the report directory. ``twin``
    False leaves the twin out (the simulation of the same tasks without the cluster's delays stays, when
    ``simulate``): ``lbt frontier``'s cluster points, where the twin would cost as much as the run."""
    from lbtestbed.analysis.simulator import simulate_once
    from lbtestbed.analysis.theory.predict import predict

    warnings = [w for w in (warmup_warning(exp), ejection_warning(exp)) if w]
    for w in warnings:
        say(f"warning: {w}")
    directory.mkdir(parents=True, exist_ok=True)
    m = run_cluster(exp, directory, say, **cluster_options)
    cluster, raw = cluster_result(exp, m)
    ages = [{k: [a for _, a in v] for k, v in t.items()} for t in (m.message_ages, m.rider_ages)]
    kinds = exp.policy.message_kinds()
    cluster.extras["overhead"] = overhead_of(m.load.records, exp.run.time_scale, ages[0], ages[1], kinds)
    write_records(directory / "tasks.csv", m.load.records)
    raws = {"cluster": raw}
    # one batch set for every column: the simulation and the twin are cut to the batches the cluster
    # keeps (a fault, or a scrape unanswered, leaves the others out), so that a row's values, its gap and
    # its verdict are all over the same batches
    kept = raw.positions()
    simulation = twin_result = None
    if simulate:
        say("simulating the same tasks")
        sim_raw = simulate_once(exp).only(kept)
        simulation = summarize(exp, [sim_raw])
        raws["simulation"] = sim_raw
    if simulate and twin:
        say("simulating the twin: the same tasks with the delays the cluster measured")
        twin_raw, replayed = simulate_twin(exp, emulation_of(exp, m))
        twin_raw = twin_raw.only(kept)
        twin_result = summarize(exp, [twin_raw], source="twin")
        # every kind of the policy (0 and 0 where none was sent): the same keys in every run of the spec
        twin_result.extras["message_ages_replayed"] = {
            k: dict(zip(("own", "drawn"), replayed.get(k, [0, 0]), strict=True))
            for k in sorted({*kinds, *replayed})
        }
        raws["twin"] = twin_raw
    theory = predict(exp)
    warnings += [f"theory: {w}" for w in theory.extras.get("warnings", [])]
    load = m.load.summary()
    if load["late_sends"] or load["dropped"]:
        warnings.append(
            f"the load generator could not keep its schedule: {load['late_sends']} late sends, "
            f"{load['dropped']} dropped"
        )
    lost = sum(int(load[k]) for k in ("refused", "lost", "failed", "expired"))  # type: ignore[call-overload]
    if lost:
        warnings.append(f"{lost} tasks did not complete (refused, lost, failed or expired): see results.json")
    context: dict[str, Any] = {"metrics_source": m.source, "directory": str(directory)}
    if preflight:
        context["preflight"] = preflight
        if "time_scale" in preflight:
            warnings.insert(0, preflight["time_scale"]["why"])
    rep = report.build(
        exp,
        Side(cluster, raw),
        Side(simulation, raws["simulation"]) if simulation is not None else None,
        theory,
        context,
        warnings,
        twin=Side(twin_result, raws["twin"]) if twin_result is not None else None,
        legs=_legs_held(exp, m),
    )
    if preflight and "estimate" in preflight:
        preflight["how_close"] = _how_close(preflight, cluster, rep)
        say(preflight["how_close"])
    overhead = cluster.extras["network_overhead"]["value"]
    sojourn_off = [v for v in rep.verdicts if v.metric.startswith("sojourn") or v.metric == "mean_sojourn"]
    if overhead and any(v.counts and v.agrees is False for v in sojourn_off):
        rep.warnings.append(
            f"sojourn times are measured at the client and include {overhead:.3g} model s "
            f"({1e3 * overhead * exp.run.time_scale:.2g} ms wall) of network and dispatch overhead per "
            f"task; a larger run.time_scale makes it smaller against the work"
        )
    say("writing the report")
    completed = [(rec.t, rec.node) for rec in m.load.records]
    files = report.write(directory, rep, raws, m.r_series, (completed, m.load.failures))
    return rep, files
