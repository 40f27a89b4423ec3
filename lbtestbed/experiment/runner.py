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
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from lbtestbed.analysis.measurement.cpu import cpu_per_task
from lbtestbed.analysis.measurement.legs import (
    SchedStat,
    read_schedstat,
    unavailable,
)
from lbtestbed.analysis.measurement.scrape import ScrapeError, Snapshot, from_query, scrape
from lbtestbed.analysis.report.run_report import RunReport
from lbtestbed.cluster.launcher import Cluster, healthy
from lbtestbed.experiment import machine
from lbtestbed.experiment.fault_injector import FaultCollector, Injector, check
from lbtestbed.experiment.run_analysis import analyse, boundaries, drain_arrivals, excluded_batches
from lbtestbed.experiment.run_record import Measurement, RunRecord
from lbtestbed.experiment.watch import Watch
from lbtestbed.loadgen.journal import accounting, read_events
from lbtestbed.loadgen.openloop import Interrupt, LoadReport, drive, poisson_tasks, write_trace
from lbtestbed.model.conditions import speed_changes, speed_varies
from lbtestbed.model.document import document
from lbtestbed.model.experiment import GRAY_FAULTS, Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.model.workload import DispatcherSplit
from lbtestbed.policies import policy_of
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile, Endpoint, journal_of

Say = Callable[[str], None]
#: wall seconds between samples of what the policy learns (unit.Learned), for its time series
R_SAMPLE_WALL = 0.1
#: wall seconds given to the processes between the health check and the first task
LEAD_IN = 0.3
#: wall seconds an interrupted run waits for the tasks it has out before it cancels them
DRAIN = 5.0
#: the signals that stop a run early, its report written (docs/run.md, "Interrupted runs")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


async def _sample_r(
    session: aiohttp.ClientSession,
    url: str,
    origin: float,
    scale: float,
    quantity: str,
    out: list[tuple[float, float]],
    record: RunRecord | None,
) -> None:
    """What the policy learns (its gauge ``quantity``) from the dispatcher, for the plot (its time average
    comes from the exact integral); nothing while the dispatcher does not answer."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, ScrapeError):
            snap = await scrape(session, [url], origin, timeout=1.0)
            r = snap.by(f"lbtestbed_dispatcher_{quantity}").get(())
            if r is not None:
                out.append((snap.at / scale, r))
                if record is not None:
                    record.event({"e": "r", "t": snap.at / scale, "r": r})
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
    """Every dispatcher's node transitions, with the model time of each: from its ``/v1/health``, or from
    its journal where it does not answer (it died and was not started again)."""
    out = []
    for d in f.dispatchers:
        body = await _get_json(session, f"{d.url}/v1/health")
        listed = body.get("events") if "events" in body else _journal_events(d)
        for e in listed if isinstance(listed, list) else []:
            if isinstance(e, dict) and isinstance(e.get("unix_time"), int | float):
                out.append({"dispatcher": d.index, "model_time": (e["unix_time"] - origin_unix) / scale, **e})
    return sorted(out, key=lambda e: e["model_time"])


def _journal_events(d: Endpoint) -> list[Any]:
    """The transitions dispatcher ``d`` appended to its journal (lines cut short are skipped)."""
    path = journal_of(d)
    if path is None or not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


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


class Stop:
    """What stops a run early: the first of ``STOP_SIGNALS`` ends the sending at once (the generator's
    ``Interrupt``) and the measurement at the next boundary; a second cuts short the wait for the tasks
    out."""

    def __init__(self, say: Say) -> None:
        self.signal = 0
        self.interrupt = Interrupt()
        self.event = asyncio.Event()
        self.say = say

    def __call__(self, sig: int) -> None:
        if not self.signal:
            self.signal = sig
            self.say(
                f"{signal.Signals(sig).name}: stopping the load; waiting up to {DRAIN:g} s for the tasks out "
                f"(again to cancel them), then writing a partial report"
            )
        self.interrupt()
        self.event.set()


@contextlib.contextmanager
def _stopped_by_signals(stop: Stop) -> Iterator[None]:
    """While the run's loop runs, ``STOP_SIGNALS`` call ``stop``; the handlers before come back after."""
    loop = asyncio.get_running_loop()
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        yield
    finally:
        for sig, handler in before.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # None: a handler not set from Python, which asyncio's removal keeps
                signal.signal(sig, handler)


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
    record: RunRecord | None = None,
    signals: bool = False,
    local: bool = True,
    beside: Sequence[Callable[[float], Coroutine[Any, Any, None]]] = (),
) -> Measurement:
    """Drive the cluster with ``tasks`` and read its counters at the batch boundaries; apply the spec's
    faults (``cluster_path``: the cluster file, to restart killed processes). ``report``: the generator's
    report to fill (its metrics read it); ``registry``: where the faults' metric joins them; ``record``:
    the run's directory, where every task's fate and every boundary's counters are kept as they come
    (``run_record``); ``signals``: SIGINT, SIGTERM and SIGHUP stop the run early (``Stop``), the
    measurement then says which (``interrupted``) and holds the boundaries reached. Every process is
    watched meanwhile (``experiment.watch``: ``local``, this run started them, and with ``health.restart``
    supervises them). Beside the cluster a probe measures what the machine itself costs over the window
    (``experiment.machine``). ``beside``: more to run meanwhile, each given the monotonic instant of model
    time 0 (a nemesis's own faults) and cancelled once the load is over. Every task started here is
    awaited before this returns, also when something fails."""
    scale = exp.run.time_scale
    marks = boundaries(exp)
    window = _Window()
    r_series: list[tuple[float, float]] = []
    stop = Stop(say)
    note = record.event if record is not None else _ignore
    async with aiohttp.ClientSession() as session, machine.started() as probe:
        origin = time.monotonic() + LEAD_IN
        origin_unix = time.time() + LEAD_IN
        note({"e": "run", "scheduled": len(tasks), "origin_unix": origin_unix, "time_scale": scale})
        path = cluster_path or Path("cluster.json")
        injector = Injector(exp, f, path, origin, say, note)
        watch = Watch(exp, f, path, origin, say, note, local=local)
        if registry is not None and exp.faults:
            registry.register(FaultCollector(injector))
        if (
            speed_varies(exp)
            or any(fault.kind in GRAY_FAULTS for fault in exp.faults)
            or policy_of(exp).node.timed
        ):
            # the node hosts apply speed schedules, antagonists and gray faults on the run's clock, and run
            # their node sides' own schedules on it (NodeSide.timed: sparse_jsq's updates)
            await injector.set_origin(session, origin_unix)  # within the lead-in, before the first task
        try:
            with _stopped_by_signals(stop) if signals else contextlib.nullcontext():
                report = await _load_and_boundaries(
                    exp, f, tasks, session, probe, (injector, watch), origin, window, r_series, stop, say,
                    max_outstanding=max_outstanding, prometheus=prometheus, report=report, record=record,
                    beside=beside,
                )  # fmt: skip
        finally:
            injector.restore()
        if stop.signal:
            note({"e": "interrupted", "signal": stop.signal, "model_time": injector.now()})
        events = await _health_events(session, f, origin_unix, scale)
        own_ages, rider_ages, keyed_ages = await _timings(session, f, origin, scale)
        reached = marks[len(window.snapshots) - 1] if len(window.snapshots) > 1 else marks[0]
        cost = await probe.cost(origin + marks[0] * scale, origin + reached * scale)
    extra: dict[str, Any] = {
        "faults": injector.to_json(),
        "health_events": events,
        "tasks": list(tasks),
        "message_ages": own_ages,
        "rider_ages": rider_ages,
        "keyed_ages": keyed_ages,
        "generator_cpu": window.generator_cpu,
        "machine": cost,
        "unavailable": _unavailable(window, (reached - marks[0]) * scale),
        "interrupted": stop.signal,
        "outages": watch.close(),
    }
    if prometheus is None or len(window.instants) < 2:
        return Measurement(window.snapshots, report, r_series=r_series, **extra)
    read = _from_prometheus(prometheus, window.instants, say)
    return Measurement(read, report, direct=window.snapshots, r_series=r_series, source=prometheus, **extra)


def _ignore(event: dict[str, Any]) -> None:
    """A note to the journal of a run that keeps none."""


async def _load_and_boundaries(
    exp: Experiment,
    f: ClusterFile,
    tasks: Sequence[tuple[float, float]],
    session: aiohttp.ClientSession,
    probe: machine.Probe,
    actors: tuple[Injector, Watch],
    origin: float,
    window: _Window,
    r_series: list[tuple[float, float]],
    stop: Stop,
    say: Say,
    *,
    max_outstanding: int,
    prometheus: str | None,
    report: LoadReport | None,
    record: RunRecord | None,
    beside: Sequence[Callable[[float], Coroutine[Any, Any, None]]] = (),
) -> LoadReport:
    """The load, the tasks beside it and the scrapes at the boundaries, until the load has drained (or
    the run was stopped); the generator's report."""
    try:
        async with asyncio.TaskGroup() as group:
            load = group.create_task(
                drive(
                    [d.url for d in f.dispatchers],
                    tasks,
                    exp.run.time_scale,
                    max_outstanding,
                    start=origin,
                    routes=DispatcherSplit(exp).take(len(tasks)),
                    report=report,
                    interrupt=stop.interrupt,
                    journal=record.journal if record is not None else None,
                    drain=DRAIN,
                )
            )
            background = _background(group, exp, f, session, probe, actors, origin, r_series, record)
            background += [group.create_task(run(origin), name="beside") for run in beside]
            marks = boundaries(exp)
            instants = prometheus is not None
            await _boundaries(exp, f, session, load, origin, marks, window, instants, stop, record, say)
            if not stop.signal:
                say(f"draining: waiting for the last of {len(tasks)} tasks")
            done = await load
            for task in background:  # the samplers run until told; the injector ends by itself
                if task.get_name() != "faults" or stop.signal:
                    task.cancel()
    except BaseExceptionGroup as group_error:
        raise _first(group_error) from None
    if record is not None:
        record.sync()
    return done


def _background(
    group: asyncio.TaskGroup,
    exp: Experiment,
    f: ClusterFile,
    session: aiohttp.ClientSession,
    probe: machine.Probe,
    actors: tuple[Injector, Watch],
    origin: float,
    r_series: list[tuple[float, float]],
    record: RunRecord | None,
) -> list[asyncio.Task[None]]:
    """The tasks beside the load: the fault injector, the watch over the processes, the machine probe's
    echoes over the window, and the sampler of what the policy learns."""
    injector, watch = actors
    tasks = [group.create_task(watch.run(), name="watch")]
    if exp.faults:
        tasks.append(group.create_task(injector.run(session), name="faults"))
    end = origin + (exp.run.warmup + exp.run.duration) * exp.run.time_scale
    tasks.append(group.create_task(probe.ping(end), name="machine"))
    learned = policy_of(exp).learned
    if learned is not None:
        url, scale = f.dispatchers[0].url, exp.run.time_scale
        sampler = _sample_r(session, url, origin, scale, learned.name, r_series, record)
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
    stop: Stop,
    record: RunRecord | None,
    say: Say,
) -> None:
    """Scrape every process at each batch boundary (``instants``: also note when, for Prometheus), until
    the last or until the run is stopped. A process that does not answer is listed missing: the batches
    at its ends are left out (a fault, planned or not, or a machine too slow for the scrape's deadline)."""
    urls = [e.url for e in f.dispatchers + f.node_hosts]
    pids = [e for e in f.dispatchers + f.node_hosts if e.pid]
    stopped = asyncio.ensure_future(stop.event.wait())
    say(f"warm-up: {exp.run.warmup:g} model s = {exp.run.warmup * exp.run.time_scale:.1f} s wall")
    try:
        for b, t in enumerate(marks):
            delay = origin + t * exp.run.time_scale - time.monotonic()
            if delay > 0:
                await asyncio.wait([load, stopped], timeout=delay)  # early only if the load failed or stopped
            if load.done() and load.exception() is not None:
                raise load.exception()  # type: ignore[misc]
            if stop.signal:
                return
            await _boundary(exp, session, urls, pids, origin, b, t, len(marks) - 1, window, instants, record)
            if b < len(marks) - 1:
                say(f"measuring: batch {b + 1}/{len(marks) - 1} (model time {t:.4g} of {marks[-1]:.4g})")
    finally:
        stopped.cancel()


async def _boundary(
    exp: Experiment,
    session: aiohttp.ClientSession,
    urls: Sequence[str],
    pids: Sequence[Any],
    origin: float,
    b: int,
    t: float,
    last: int,
    window: _Window,
    instants: bool,
    record: RunRecord | None,
) -> None:
    """Boundary ``b`` (model time ``t``): every process's counters, the generator's CPU, and at the
    window's ends the kernel's account of every process; kept in the run's record as they are taken."""
    if instants:
        window.instants.append((time.time(), time.monotonic() - origin))
    cpu = os.times()
    window.generator_cpu.append(cpu.user + cpu.system)  # the generator's process: this one
    if b in (0, last):
        window.sched.append({e.pid: s for e in pids if (s := read_schedstat(e.pid)) is not None})
    wait = 3.0 if exp.faults else 10.0
    snap = await scrape(session, urls, origin, missing_ok=True, timeout=wait)
    window.snapshots.append(snap)
    if record is not None:
        record.event(
            {"e": "boundary", "b": b, "model_time": t, "at": snap.at, "cpu": window.generator_cpu[-1],
             "missing": snap.missing}
        )  # fmt: skip
        record.snapshot(b, snap)
        if b in (0, last):
            record.sync()


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


def check_answering(f: ClusterFile, endpoints: Path) -> None:
    """ClusterError unless every process of the cluster file answers its health check: a cluster that is
    not there fails the run before its load starts, not as batches no one answered."""
    silent = [e.url for e in f.dispatchers + f.node_hosts if not healthy(e.url)]
    if silent:
        raise ClusterError(
            f"{endpoints}: {', '.join(silent)} did not answer the health check "
            f"(lbt cluster status --file {endpoints})"
        )


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
    record: RunRecord | None = None,
    endpoints: Path | None = None,
    node_processes: int | None = None,
    prometheus: str | None = None,
    with_prometheus: bool = False,
    netns: bool = False,
    bandwidth: str = "",
) -> Measurement:
    """Start (or use) the cluster, record and send the workload, and measure the window; with ``record``,
    kept in the run's directory as it goes (and SIGINT, SIGTERM, SIGHUP stop it early: ``measure``)."""
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
        served = _Served(exp, f, tasks, say, path, record, local=endpoints is None)
        if with_prometheus and prometheus is None:
            from lbtestbed.cluster.prometheus import start_prometheus

            interval = scrape_interval(exp)
            with start_prometheus(exp, f, directory / "cluster.json", interval) as server:
                say(f"Prometheus at {server.url}, scraping every {interval:g} s")
                _wait_for_targets(server.url, len(f.dispatchers) + len(f.node_hosts))
                m = served.measure(server.url, server.directory, linger=False)
        else:
            from lbtestbed.cluster.prometheus import config_dir

            # a cluster of its own with a Prometheus (lbt cluster up --with-prometheus): join its targets
            joined = config_dir(endpoints) if endpoints is not None and f.prometheus_url else None
            m = served.measure(prometheus, joined)
    m.cluster = info
    direct = m.direct or m.snapshots  # scraped from every process (keyed by URL), also beside Prometheus
    if len(direct) >= 2:
        m.cpu = cpu_per_task(direct[0], direct[-1], roles, m.generator_cpu[:1] + m.generator_cpu[-1:])
    if record is not None:
        record.finish(m)
    return m


@dataclass
class _Served:
    """``measure`` with the generator's metrics and the faults' served to a Prometheus."""

    exp: Experiment
    f: ClusterFile
    tasks: Sequence[tuple[float, float]]
    say: Say
    path: Path
    record: RunRecord | None
    local: bool  # this run started the cluster

    def measure(self, prometheus: str | None, directory: Path | None, linger: bool = True) -> Measurement:
        """``measure``, with the generator's metrics and the faults' served to the Prometheus configured
        in ``directory`` (docs/load.md, "Monitoring the generator"), if any."""
        from lbtestbed.cluster.prometheus import serve_generator

        exp, say = self.exp, self.say
        report = LoadReport(scheduled=len(self.tasks))  # from the first scrape on
        with serve_generator(report, exp, None, directory, say, linger=linger) as server:
            registry = server.registry if server is not None else None
            main = threading.current_thread() is threading.main_thread()
            return asyncio.run(
                measure(
                    exp, self.f, self.tasks, say, prometheus, cluster_path=self.path, report=report,
                    registry=registry, record=self.record, signals=main and self.record is not None,
                    local=self.local,
                )
            )  # fmt: skip


@dataclass
class RunDone:
    """What ``run_experiment`` did: the report (None when fewer than two batches could be compared), the
    files written, and the signal that stopped the run early (0: none)."""

    report: RunReport | None
    files: list[Path]
    interrupted: int = 0


def run_experiment(
    exp: Experiment,
    directory: Path,
    say: Say,
    *,
    simulate: bool = True,
    twin: bool = True,
    preflight: dict[str, Any] | None = None,
    **cluster_options: Any,
) -> RunDone:
    """The whole of ``lbt run``: cluster, simulation, theory, verdicts and the report directory. The run is
    kept in its directory as it goes (``run_record``); SIGINT, SIGTERM and SIGHUP stop it early with a
    partial report (``measure``). ``twin`` False leaves the twin out (the simulation of the same tasks
    without the cluster's delays stays, when ``simulate``): ``lbt frontier``'s cluster points, where the
    twin would cost as much as the run."""
    warnings = [w for w in (warmup_warning(exp), ejection_warning(exp)) if w]
    for w in warnings:
        say(f"warning: {w}")
    directory.mkdir(parents=True, exist_ok=True)
    record = RunRecord(directory)
    try:
        record.begin(exp, preflight or {})
        m = run_cluster(exp, directory, say, record=record, **cluster_options)
    finally:
        record.close()
    m.accounting = accounting(read_events(record.journal.path), len(m.tasks))
    rep, files = analyse(
        exp, m, directory, say, simulate=simulate, twin=twin, preflight=preflight, warnings=warnings
    )
    return RunDone(rep, files, m.interrupted)
