"""Soak benchmark (issue 8, not in CI): a cluster at a steady rate for a long run, measured over time.

A local cluster (dispatcher and node processes, as ``lbt cluster up`` starts them) is driven by the open-loop
generator at a steady Poisson rate for ``--minutes``. Every ``--sample-seconds`` the benchmark records, per
process (each dispatcher, each node host and the generator itself): resident memory, open file descriptors
and CPU seconds, from /proc; the rate the generator sent in the interval, its send lateness, and the sojourn
percentiles of the tasks that completed in the interval; and the task balance, from the generator's own
counts and from the dispatchers' and nodes' counters. At the end it prints a summary (rate asked against
rate held, tasks lost, memory and fd growth per process as a least-squares slope, p99 over time) and writes
``samples.csv``, ``summary.json`` and ``soak.png`` to ``--out``.

    .venv/bin/python benchmarks/bench_soak.py                         # 30 minutes, 500 tasks/s
    .venv/bin/python benchmarks/bench_soak.py --minutes 0.5 --rate 100 --sample-seconds 5   # a smoke run
    .venv/bin/python benchmarks/bench_soak.py SPEC --rate 300 --out /tmp/soak --json

The generator sends one chunk of tasks per sample interval, each chunk continuing the previous one's model
times (one ``drive`` call per chunk, started before the previous one ends so no send is delayed), so its
memory does not grow with a task list: what grows is the generator's own doing. Exit status: 0 when every
task is accounted for and none was lost; 1 when a task was lost or failed, the balance does not add up or a
process died; 2 for bad arguments; 130 when interrupted (Ctrl-C or SIGTERM: the cluster is stopped).
Nothing here judges speed: the numbers are the output (benchmarks/README.md, "bench_soak.py").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import gc
import json
import math
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import numpy as np
import uvloop

from lbtestbed.analysis.measurement.scrape import ScrapeError, Snapshot, scrape
from lbtestbed.cluster.launcher import Cluster
from lbtestbed.loadgen.openloop import LoadReport, drive
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.model.workload import PoissonWorkload
from lbtestbed.spec import load_spec
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile
from lbtestbed.transport.http import HttpPool

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
LEAD_IN = 0.5  # wall seconds between the first sample of the idle cluster and model time 0
LAUNCH_AHEAD = 1.0  # wall seconds before an interval ends that the next chunk's drive() starts waiting
MIN_TASK_WALL = 0.010  # below this a task's service is mostly timer error and network (README, time_scale)
CLK_TCK = os.sysconf("SC_CLK_TCK")
Say = Callable[[str], None]

# A built-in spec: JIQ over 40 FCFS servers at load 0.5, exponential work of mean 1 model second, 20 tasks
# per model second. time_scale 0.04 makes that 500 tasks per wall second, tasks of 40 ms wall on average;
# --rate R changes only time_scale (to 20 / R), so the model and its tasks stay the same.
BUILTIN_SPEC = """\
# bench_soak.py's built-in spec: JIQ, 40 FCFS servers, load 0.5, 500 tasks/s wall at time_scale 0.04
name = "soak"
seed = 8

[[classes]]
name = "servers"
count = 40
discipline = "fcfs"

[workload]
load = 0.5
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "jiq"

[run]
warmup = 10.0
duration = 100.0
time_scale = 0.04
"""

#: the fields every sample has (``processes`` maps a process name to its rss_mb, fds and cpu_s, or None)
SAMPLE_FIELDS = (
    "interval",
    "t_s",
    "warmup",
    "rate_sent",
    "rate_scheduled",
    "scheduled",
    "sent",
    "dropped",
    "late",
    "lateness_p99_ms",
    "completed_in_interval",
    "sojourn_p50_ms",
    "sojourn_p99_ms",
    "gen_sent",
    "gen_completed",
    "gen_refused",
    "gen_lost",
    "gen_failed",
    "gen_in_flight",
    "disp_completed",
    "disp_refused",
    "disp_lost",
    "disp_in_flight",
    "node_tasks",
    "balance_ok",
    "balance_note",
    "generator_objects",
    "processes",
)
PROCESS_FIELDS = ("rss_mb", "fds", "cpu_s")


# --------------------------------------------------------------------------------------- /proc


def proc_stats(pid: int) -> dict[str, float] | None:
    """Resident memory (MB), open fds and CPU seconds (user + system) of a process; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        # fields after the command name, which may hold spaces and parentheses; utime, stime are fields 14, 15
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / CLK_TCK
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None  # exited (a zombie has no VmRSS) or not ours to read
    return {"rss_mb": rss_kb / 1024, "fds": fds, "cpu_s": cpu}


# ----------------------------------------------------------------------------- the generator's side


class LiveCounts:
    """Requests started and ended by the generator's pools, counted as they happen (their observer).

    ``drive`` reports its counts only when a chunk is done; these give the balance at any instant.
    """

    def __init__(self) -> None:
        self.sent = 0
        self.status: Counter[int] = Counter()
        self.errors = 0

    def started(self) -> None:
        self.sent += 1

    def ended(self, status: int) -> None:
        self.status[status] += 1

    def failed(self) -> None:
        self.errors += 1

    def snapshot(self) -> dict[str, int]:
        c, r, lost = self.status[200], self.status[503], self.status[502]
        failed = self.errors + sum(v for k, v in self.status.items() if k not in (200, 502, 503))
        return {
            "sent": self.sent,
            "completed": c,
            "refused": r,
            "lost": lost,
            "failed": failed,
            "in_flight": self.sent - c - r - lost - failed,
        }


class Arrivals:
    """The spec's Poisson workload, handed out in consecutive chunks of model time (memory stays flat)."""

    def __init__(self, exp: Experiment) -> None:
        self._workload = PoissonWorkload(exp)
        self._next = self._workload.next()

    def until(self, horizon: float) -> list[tuple[float, float]]:
        """(model arrival time, work) of the tasks before ``horizon`` not handed out yet."""
        out = []
        while self._next[0] < horizon:
            out.append(self._next)
            self._next = self._workload.next()
        return out


async def collect_young(stop: asyncio.Event) -> None:
    """The cyclic collector's youngest generation once a second: ``drive``'s own policy for a long run."""
    while not stop.is_set():
        gc.collect(0)
        await asyncio.sleep(1.0)


# ---------------------------------------------------------------------------------- the samples


def quantile_ms(values: Sequence[float], q: float) -> float | None:
    return 1e3 * float(np.quantile(values, q)) if len(values) else None


def dispatcher_counts(snap: Snapshot, urls: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for url in urls:
        proc = snap.processes[url]
        for outcome in ("completed", "refused", "lost"):
            out[outcome] += proc.value("lbtestbed_dispatcher_tasks_total", outcome=outcome)
        out["in_flight"] += proc.value("lbtestbed_dispatcher_tasks_in_flight")
    return dict(out)


def node_counts(snap: Snapshot, urls: Sequence[str]) -> tuple[dict[str, float], list[str]]:
    """Node sums over every host, and the hosts whose arrivals - completions differ from their tasks."""
    out: dict[str, float] = defaultdict(float)
    off = []
    for url in urls:
        proc = snap.processes[url]
        a = proc.value("lbtestbed_node_arrivals_total")
        c = proc.value("lbtestbed_node_completions_total")
        x = proc.value("lbtestbed_node_tasks")
        out["arrivals"] += a
        out["completions"] += c
        out["refused"] += proc.value("lbtestbed_node_refused_total")
        out["tasks"] += x
        if a - c != x:  # one scrape of one host is one consistent state: this must hold exactly
            off.append(f"{url}: arrivals {a:g} - completions {c:g} != tasks {x:g}")
    return dict(out), off


async def read_counters(
    session: aiohttp.ClientSession, dispatchers: Sequence[str], hosts: Sequence[str], origin: float
) -> tuple[dict[str, float] | None, dict[str, float] | None, list[str]]:
    """Dispatcher sums and node sums from one scrape of every process, each None when a process of its
    role did not answer (a dead node host leaves the dispatchers' side readable), and what went wrong."""
    problems: list[str] = []

    async def one(url: str) -> Snapshot | None:
        try:
            return await scrape(session, [url], origin)
        except ScrapeError as e:
            problems.append(str(e))
            return None

    snaps = await asyncio.gather(*(one(u) for u in [*dispatchers, *hosts]))
    answered = {url: p for s in snaps if s is not None for url, p in s.processes.items()}
    snap = Snapshot(0.0, answered)
    d = dispatcher_counts(snap, dispatchers) if all(u in answered for u in dispatchers) else None
    nodes = None
    if all(u in answered for u in hosts):
        nodes, off = node_counts(snap, hosts)
        problems += off
    return d, nodes, problems


def live_balance(g0: dict[str, int], d: dict[str, float], g1: dict[str, int]) -> list[str]:
    """What is wrong with the balance at a sample instant, from generator counts read before (g0) and after
    (g1) the dispatchers' scrape (d). A dispatcher counts an outcome before it answers and cannot accept a
    task before the generator starts its request, so these inequalities hold exactly whatever the timing."""
    problems = []
    for outcome in ("completed", "refused", "lost"):
        if d[outcome] < g0[outcome]:
            problems.append(
                f"dispatchers counted {d[outcome]:g} {outcome}, the generator already {g0[outcome]}"
            )
    accepted = d["completed"] + d["refused"] + d["lost"] + d["in_flight"]
    if accepted > g1["sent"]:
        problems.append(f"dispatchers hold {accepted:g} tasks, the generator had sent {g1['sent']}")
    return problems


@dataclass
class Book:
    """The samples: process figures at each interval's end, the generator's once its chunk is done."""

    sample_seconds: float
    time_scale: float
    names: list[str]
    csv_file: TextIO
    say: Say
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    done: list[dict[str, Any]] = field(default_factory=list)
    sojourns: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))  # by interval
    finished_chunks: set[int] = field(default_factory=set)
    totals: Counter[str] = field(default_factory=Counter)  # over every finished chunk
    late: int = 0

    def __post_init__(self) -> None:
        self.writer = csv.writer(self.csv_file)
        self.writer.writerow(csv_header(self.names))

    def add_sample(self, row: dict[str, Any]) -> None:
        self.rows[row["interval"]] = row

    def add_report(self, k: int, report: LoadReport) -> None:
        """A finished chunk: its tasks' sojourns go to the interval they completed in."""
        scale, S = self.time_scale, self.sample_seconds
        for r in report.records:
            done_at = (r.t + r.sojourn) * scale  # wall seconds from model time 0
            self.sojourns[int(done_at // S)].append(r.sojourn * scale)
        row = self.rows.get(k)
        if row is not None:
            row["scheduled"] = report.scheduled
            row["dropped"] = report.outcomes["dropped"]
            row["sent"] = report.scheduled - report.outcomes["dropped"]
            row["rate_scheduled"] = report.scheduled / S
            row["late"] = report.late
            row["lateness_p99_ms"] = quantile_ms(report.lateness, 0.99)
        self.totals["scheduled"] += report.scheduled
        self.totals.update(report.outcomes)
        self.late += report.late
        self.finished_chunks.add(k)
        report.records.clear()  # only the per-interval figures are kept
        report.lateness.clear()

    def finalize_ready(self) -> None:
        """Rows whose every task that could complete in them has come back, in order."""
        for k in sorted(self.rows):
            if any(j not in self.finished_chunks for j in range(k + 1)):
                break
            row = self.rows.pop(k)
            soj = self.sojourns.pop(k, [])
            row["completed_in_interval"] = len(soj)
            row["sojourn_p50_ms"] = quantile_ms(soj, 0.5)
            row["sojourn_p99_ms"] = quantile_ms(soj, 0.99)
            self.done.append(row)
            self.writer.writerow(csv_row(row, self.names))
            self.csv_file.flush()
            self.say(progress_line(row))


def csv_header(names: Sequence[str]) -> list[str]:
    fixed = [f for f in SAMPLE_FIELDS if f != "processes"]
    return fixed + [f"{name}_{what}" for name in names for what in PROCESS_FIELDS]


def csv_row(row: dict[str, Any], names: Sequence[str]) -> list[Any]:
    out: list[Any] = ["" if row.get(f) is None else row[f] for f in SAMPLE_FIELDS if f != "processes"]
    for name in names:
        p = row["processes"].get(name) or {}
        out += ["" if p.get(what) is None else round(p[what], 3) for what in PROCESS_FIELDS]
    return out


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def short(name: str) -> str:
    """dispatcher-0 -> d0, nodes-2 -> n2, generator -> gen"""
    role, _, index = name.partition("-")
    return f"{role[0]}{index}" if index else role[:3]


def progress_line(row: dict[str, Any]) -> str:
    mem = ", ".join(f"{short(n)} {fmt((p or {}).get('rss_mb'), '.0f')}" for n, p in row["processes"].items())
    return (
        f"[{int(row['t_s']) // 60:3d}:{int(row['t_s']) % 60:02d}] sent {fmt(row['rate_sent'])}/s, "
        f"sojourn p50 {fmt(row['sojourn_p50_ms'])} ms p99 {fmt(row['sojourn_p99_ms'])} ms, "
        f"lateness p99 {fmt(row['lateness_p99_ms'], '.2f')} ms, in flight {row['gen_in_flight']}, "
        f"RSS MB {mem}, balance {'ok' if row['balance_ok'] else 'OFF: ' + row['balance_note']}"
    )


# ---------------------------------------------------------------------------------- the run


@dataclass
class Config:
    spec: str
    overrides: list[str]
    exp: Experiment
    rate: float  # tasks per wall second asked
    time_scale: float
    minutes: float
    sample_seconds: float
    warmup: float  # wall seconds
    out: Path
    dispatchers: int
    node_processes: int
    max_outstanding: int
    drain_seconds: float

    @property
    def intervals(self) -> int:
        return max(1, math.ceil(self.minutes * 60 / self.sample_seconds - 1e-9))


@dataclass
class Outcome:
    samples: list[dict[str, Any]]
    totals: Counter[str]
    late: int
    checks: list[dict[str, Any]]
    interrupted: bool
    wall_seconds: float
    generator_gc: dict[str, Any]


async def wait_until(deadline: float, stop: asyncio.Event) -> bool:
    """Sleep until the monotonic ``deadline``; True if a stop was asked for first."""
    delay = deadline - time.monotonic()
    if delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    return stop.is_set()


async def soak(cfg: Config, f: ClusterFile, book: Book, pids: dict[str, int], say: Say) -> Outcome:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    S, scale = cfg.sample_seconds, cfg.time_scale
    dispatchers = [d.url for d in f.dispatchers]
    hosts = [h.url for h in f.node_hosts]
    arrivals = Arrivals(cfg.exp)
    live = LiveCounts()
    chunks: dict[int, asyncio.Task[LoadReport]] = {}
    collecting = gc.isenabled()
    gc.disable()  # held for the whole run, as drive() holds it for one long run (collect_young instead)
    pools = [HttpPool(d, observer=live) for d in dispatchers]  # every chunk's tasks, counted live
    sessions = (aiohttp.ClientSession(),)  # metrics scrapes: not counted as tasks
    ticker = asyncio.ensure_future(collect_young(stop))
    checks: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        (scrape_session,) = sessions
        origin = time.monotonic() + LEAD_IN

        def launch(k: int) -> None:
            tasks = arrivals.until((k + 1) * S / scale)
            chunks[k] = asyncio.ensure_future(
                drive(dispatchers, tasks, scale, cfg.max_outstanding, start=origin, pools=pools)
            )

        def collect_finished() -> None:
            for k in sorted(chunks):
                if chunks[k].done():
                    book.add_report(k, chunks.pop(k).result())  # drive() raising is a bug: let it show
            book.finalize_ready()

        async def sample(k: int) -> None:
            t = time.monotonic() - origin
            procs = {name: proc_stats(pid) for name, pid in pids.items()}
            g0 = live.snapshot()
            read, nodes, problems = await read_counters(scrape_session, dispatchers, hosts, origin)
            g1 = live.snapshot()
            if read is not None:
                problems += live_balance(g0, read, g1)
            d = read or dict.fromkeys(("completed", "refused", "lost", "in_flight"))
            problems += [f"{name} is gone" for name, p in procs.items() if p is None]
            previous = book.rows.get(k - 1) or (book.done[-1] if book.done else None)
            sent_before = previous["gen_sent"] if previous else 0
            t_before = previous["t_s"] if previous else 0.0
            book.add_sample(
                {
                    "interval": k,
                    "t_s": round(t, 3),
                    "warmup": t <= cfg.warmup,
                    "rate_sent": (g1["sent"] - sent_before) / (t - t_before),
                    **{f"gen_{key}": v for key, v in g1.items()},
                    **{f"disp_{key}": v for key, v in d.items()},
                    "node_tasks": nodes["tasks"] if nodes else None,
                    "balance_ok": not problems,
                    "balance_note": "; ".join(problems),
                    "generator_objects": len(gc.get_objects()),
                    "processes": procs,
                }
            )

        launch(0)
        interrupted = False
        for k in range(cfg.intervals):
            end = origin + (k + 1) * S
            if k + 1 < cfg.intervals:
                if await wait_until(end - min(LAUNCH_AHEAD, S / 2), stop):
                    interrupted = True
                    break
                launch(k + 1)  # waits in drive() for its first task's time, so the schedule has no gap
            if await wait_until(end, stop):
                interrupted = True
                break
            await sample(k)
            collect_finished()
        if not interrupted and chunks:
            say(f"draining: the last {sum(1 for c in chunks.values() if not c.done())} chunk(s)")
            deadline = time.monotonic() + cfg.drain_seconds
            while not all(c.done() for c in chunks.values()) and time.monotonic() < deadline:
                if await wait_until(min(deadline, time.monotonic() + 0.2), stop):
                    interrupted = True
                    break
            still = [k for k, c in chunks.items() if not c.done()]
            if still and not interrupted:
                checks.append(
                    {
                        "check": "drained",
                        "ok": False,
                        "detail": f"tasks of chunk(s) {still} still open {cfg.drain_seconds:g} s after "
                        f"the last send; cancelled",
                    }
                )
            collect_finished()
        for c in chunks.values():
            c.cancel()
        await asyncio.gather(*chunks.values(), return_exceptions=True)
        if not interrupted and not checks:
            checks += await final_checks(scrape_session, dispatchers, hosts, origin, book, live)
    finally:
        stop.set()
        ticker.cancel()
        for s in sessions:
            await s.close()
        for pool in pools:
            pool.close()
        if collecting:
            gc.enable()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return Outcome(
        book.done,
        book.totals,
        book.late,
        checks,
        interrupted,
        time.monotonic() - started,
        {"counts": list(gc.get_count()), "objects": len(gc.get_objects())},
    )


async def final_checks(
    session: aiohttp.ClientSession,
    dispatchers: Sequence[str],
    hosts: Sequence[str],
    origin: float,
    book: Book,
    live: LiveCounts,
) -> list[dict[str, Any]]:
    """The exact balance once every task has come back: generator, dispatchers and nodes agree."""
    tot, g = book.totals, live.snapshot()
    read, nodes, problems = await read_counters(session, dispatchers, hosts, origin)
    sent = tot["scheduled"] - tot["dropped"]
    ended = tot["completed"] + tot["refused"] + tot["lost"] + tot["dropped"] + tot["failed"]

    def check(name: str, ok: bool, detail: str) -> dict[str, Any]:
        return {"check": name, "ok": bool(ok), "detail": detail}

    checks = [
        check(
            "generator: scheduled = completed + refused + lost + dropped + failed",
            ended == tot["scheduled"],
            f"{tot['scheduled']} = {tot['completed']} + {tot['refused']} + {tot['lost']} + {tot['dropped']} "
            f"+ {tot['failed']}",
        ),
        check(
            "generator: requests started = tasks sent, none open",
            g["sent"] == sent and g["in_flight"] == 0,
            f"started {g['sent']}, sent {sent}, open {g['in_flight']}",
        ),
        check(
            "no task lost or failed",
            tot["lost"] + tot["failed"] == 0,
            f"lost {tot['lost']}, failed {tot['failed']}",
        ),
    ]
    if problems:
        checks.append(
            check("final scrape: every process answered and is consistent", False, "; ".join(problems))
        )
    if read is not None:
        d = read
        checks += [
            check(
                f"dispatchers' {o} = generator's", d[o] == tot[o], f"dispatchers {d[o]:g}, generator {tot[o]}"
            )
            for o in ("completed", "refused", "lost")
        ]
        accepted = d["completed"] + d["refused"] + d["lost"]
        checks.append(
            check(
                "dispatchers accepted every task sent that did not fail, none in flight",
                accepted == sent - tot["failed"] and d["in_flight"] == 0,
                f"accepted {accepted:g}, sent - failed {sent - tot['failed']}, in flight {d['in_flight']:g}",
            )
        )
        if nodes is not None:
            checks.append(
                check(
                    "nodes: arrivals = completions = dispatchers' completed, refused = refused, none present",
                    nodes["arrivals"] == nodes["completions"] == d["completed"]
                    and nodes["refused"] == d["refused"]
                    and nodes["tasks"] == 0,
                    f"arrivals {nodes['arrivals']:g}, completions {nodes['completions']:g}, refused "
                    f"{nodes['refused']:g}, present {nodes['tasks']:g}",
                )
            )
    return checks


# -------------------------------------------------------------------------------- the summary


def trend(t: Sequence[float], y: Sequence[float]) -> tuple[float, float | None] | None:
    """Least-squares slope of y over t and its standard error (None with fewer than 3 points)."""
    ok = [(a, b) for a, b in zip(t, y, strict=True) if b is not None and not math.isnan(b)]
    if len(ok) < 2:
        return None
    x, v = np.array(ok, float).T
    if np.ptp(x) == 0:
        return None
    slope, intercept = np.polyfit(x, v, 1)
    if len(x) < 3:
        return float(slope), None
    resid = v - (slope * x + intercept)
    se = math.sqrt(float(resid @ resid) / (len(x) - 2) / float(((x - x.mean()) ** 2).sum()))
    return float(slope), se


def finite(v: float) -> float | None:
    """None for a missing value (a process gone), so that the JSON holds no NaN."""
    return None if math.isnan(v) else v


def summarize(cfg: Config, out: Outcome) -> dict[str, Any]:
    rows = out.samples
    steady = [r for r in rows if not r["warmup"]] or rows[-1:]
    names = list(rows[0]["processes"]) if rows else []
    tot = out.totals
    span = rows[-1]["t_s"] if rows else 0.0
    sent = tot["scheduled"] - tot["dropped"]
    rate_sent = sent / span if span else None
    half = 1.96 * math.sqrt(cfg.rate / span) if span else None  # Poisson count over the span: 95 % band
    memory = {}
    for name in names:
        t = [r["t_s"] for r in steady]

        def series(what: str, name: str = name) -> list[float]:
            return [(r["processes"].get(name) or {}).get(what, math.nan) for r in steady]

        rss, fds, cpu = series("rss_mb"), series("fds"), series("cpu_s")
        rss_trend, fd_trend = trend(t, rss), trend(t, fds)
        dt = t[-1] - t[0] if len(t) > 1 else 0.0
        memory[name] = {
            "rss_first_mb": finite(rss[0]),
            "rss_last_mb": finite(rss[-1]),
            "rss_growth_mb": rss_trend[0] * dt if rss_trend else None,
            "rss_mb_per_hour": rss_trend[0] * 3600 if rss_trend else None,
            "rss_mb_per_hour_se": rss_trend[1] * 3600 if rss_trend and rss_trend[1] is not None else None,
            "fds_first": finite(fds[0]),
            "fds_last": finite(fds[-1]),
            "fds_max": max((v for v in fds if not math.isnan(v)), default=None),
            "fds_per_hour": fd_trend[0] * 3600 if fd_trend else None,
            "cpu_percent": finite(100 * (cpu[-1] - cpu[0]) / dt) if dt else None,
        }
    p50 = [r["sojourn_p50_ms"] for r in steady if r["sojourn_p50_ms"] is not None]
    p99 = [r["sojourn_p99_ms"] for r in steady if r["sojourn_p99_ms"] is not None]
    p99_trend = trend([r["t_s"] for r in steady], [r["sojourn_p99_ms"] for r in steady])
    thirds = np.array_split(np.array(p99, float), 3) if len(p99) >= 3 else []
    lat = [r["lateness_p99_ms"] for r in steady if r["lateness_p99_ms"] is not None]
    return {
        "rate": {
            "asked": cfg.rate,
            "scheduled": tot["scheduled"] / span if span else None,
            "sent": rate_sent,
            "asked_band95": [cfg.rate - half, cfg.rate + half] if half is not None else None,
            "sent_over_scheduled": sent / tot["scheduled"] if tot["scheduled"] else None,
            "late_fraction": out.late / tot["scheduled"] if tot["scheduled"] else None,
            "lateness_p99_ms_median": float(np.median(lat)) if lat else None,
            "lateness_p99_ms_worst": max(lat, default=None),
            "held": tot["dropped"] == 0 and bool(tot["scheduled"]),
        },
        "tasks": {k: tot[k] for k in ("scheduled", "completed", "refused", "lost", "dropped", "failed")}
        | {"sent": sent},
        "memory": memory,
        "latency": {
            "sojourn_p50_ms_median": float(np.median(p50)) if p50 else None,
            "sojourn_p99_ms_median": float(np.median(p99)) if p99 else None,
            "sojourn_p99_ms_by_third": [float(np.median(x)) for x in thirds],
            "sojourn_p99_ms_worst": max(p99, default=None),
            "sojourn_p99_ms_per_hour": p99_trend[0] * 3600 if p99_trend else None,
        },
        "samples": len(rows),
        "steady_samples": len(steady),
        "wall_seconds": out.wall_seconds,
    }


def print_table(cfg: Config, summary: dict[str, Any], checks: list[dict[str, Any]], file: TextIO) -> None:
    r, t, lat = summary["rate"], summary["tasks"], summary["latency"]

    def p(line: str = "") -> None:
        print(line, file=file)

    band = r["asked_band95"]
    p(
        f"rate      asked {cfg.rate:g}/s (Poisson 95 % band over the run {fmt(band and band[0])}-"
        f"{fmt(band and band[1])}), scheduled {fmt(r['scheduled'])}/s, sent {fmt(r['sent'])}/s, "
        f"held: {'yes' if r['held'] else 'NO'} (sent/scheduled {fmt(r['sent_over_scheduled'], '.4%')})"
    )
    p(
        f"lateness late sends {fmt(r['late_fraction'], '.3%')}, p99 per interval: median "
        f"{fmt(r['lateness_p99_ms_median'], '.2f')} ms, worst {fmt(r['lateness_p99_ms_worst'], '.2f')} ms"
    )
    p(
        f"tasks     scheduled {t['scheduled']}, completed {t['completed']}, refused {t['refused']}, "
        f"LOST {t['lost']}, failed {t['failed']}, dropped {t['dropped']}"
    )
    thirds = ", ".join(f"{v:.1f}" for v in lat["sojourn_p99_ms_by_third"]) or "-"
    p(
        f"sojourn   p50 median {fmt(lat['sojourn_p50_ms_median'])} ms; p99 median "
        f"{fmt(lat['sojourn_p99_ms_median'])} ms, by third of the run {thirds} ms, worst "
        f"{fmt(lat['sojourn_p99_ms_worst'])} ms, trend {fmt(lat['sojourn_p99_ms_per_hour'], '+.1f')} ms/h"
    )
    p()
    p(
        f"{'process':<14} {'RSS first':>10} {'RSS last':>9} {'growth':>8} {'MB/hour':>14} "
        f"{'fds first':>9} {'fds last':>8} {'fds max':>7} {'fds/hour':>8} {'CPU %':>6}"
    )
    for name, m in summary["memory"].items():
        se = m["rss_mb_per_hour_se"]
        per_hour = fmt(m["rss_mb_per_hour"], "+.2f") + (f" ±{se:.2f}" if se is not None else "")
        p(
            f"{name:<14} {fmt(m['rss_first_mb']):>10} {fmt(m['rss_last_mb']):>9} "
            f"{fmt(m['rss_growth_mb'], '+.2f'):>8} {per_hour:>14} {fmt(m['fds_first'], '.0f'):>9} "
            f"{fmt(m['fds_last'], '.0f'):>8} {fmt(m['fds_max'], '.0f'):>7} "
            f"{fmt(m['fds_per_hour'], '+.1f'):>8} {fmt(m['cpu_percent']):>6}"
        )
    p("(RSS in MB; growth and slopes by least squares over the samples after warm-up, ± one standard error)")
    p()
    for c in checks:
        p(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']}: {c['detail']}")


def plot(path: Path, cfg: Config, rows: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    t = np.array([r["t_s"] for r in rows]) / 60
    names = list(rows[0]["processes"])

    def col(key: str) -> np.ndarray:
        return np.array([np.nan if r[key] is None else r[key] for r in rows], float)

    def proc(name: str, what: str) -> np.ndarray:
        return np.array([(r["processes"].get(name) or {}).get(what, np.nan) for r in rows], float)

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    (rss_ax, fd_ax), (lat_ax, rate_ax) = axes
    for name in names:
        rss_ax.plot(t, proc(name, "rss_mb"), marker=".", label=name)
        fd_ax.plot(t, proc(name, "fds"), marker=".", label=name)
    rss_ax.set_ylabel("resident memory (MB)")
    rss_ax.set_title("memory per process")
    fd_ax.set_ylabel("open file descriptors")
    fd_ax.set_title("file descriptors per process")
    lat_ax.plot(t, col("sojourn_p50_ms"), marker=".", label="sojourn p50")
    lat_ax.plot(t, col("sojourn_p99_ms"), marker=".", label="sojourn p99")
    lat_ax.plot(t, col("lateness_p99_ms"), marker=".", label="send lateness p99")
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("wall milliseconds")
    lat_ax.set_title("latency per interval (tasks completed in it; sends in it)")
    rate_ax.plot(t, col("rate_sent"), marker=".", label="sent")
    rate_ax.plot(t, col("rate_scheduled"), linestyle=":", label="scheduled (Poisson)")
    rate_ax.axhline(cfg.rate, color="black", linestyle="--", label=f"asked ({cfg.rate:g}/s)")
    rate_ax.set_ylabel("tasks per wall second")
    rate_ax.set_title(f"rate per {cfg.sample_seconds:g} s interval")
    for ax in axes.flat:
        if cfg.warmup > 0:
            ax.axvspan(0, cfg.warmup / 60, color="0.9", label="warm-up")
        ax.set_xlabel("wall minutes since the first task")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"soak: {cfg.exp.policy.name}, {cfg.exp.n} nodes in {cfg.node_processes} processes, "
        f"{cfg.dispatchers} dispatcher(s), {cfg.rate:g} tasks/s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------ the command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_soak.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "spec", nargs="?", help="experiment spec (default: the built-in JIQ spec, 40 FCFS nodes)"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the load (default 30)")
    parser.add_argument(
        "--rate",
        type=float,
        help="tasks per wall second; sets run.time_scale (default: the spec's, 500 built in)",
    )
    parser.add_argument("--sample-seconds", type=float, default=10.0, help="wall seconds between samples")
    parser.add_argument(
        "--warmup",
        type=float,
        help="wall seconds left out of the slopes (default: 10 %% of the run, at most 120)",
    )
    parser.add_argument("--dispatchers", type=int, default=1)
    parser.add_argument("--node-processes", type=int, default=4)
    parser.add_argument("--max-outstanding", type=int, default=10_000, help="per chunk, as in lbt load")
    parser.add_argument("--drain-seconds", type=float, default=60.0, help="longest wait for the last replies")
    parser.add_argument("--out", type=Path, default=Path("reports/soak"), help="output directory")
    parser.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> Config:
    """The run's configuration; a bad value raises ValueError (or SpecError) with one line naming it."""

    def positive(name: str, v: float, most: float) -> None:
        if not (math.isfinite(v) and 0 < v <= most):
            raise ValueError(f"{name} must be a number above 0 and at most {most:g}, got {v:g}")

    positive("--minutes", args.minutes, 24 * 60)
    positive("--sample-seconds", args.sample_seconds, 3600)
    positive("--drain-seconds", args.drain_seconds, 3600)
    if args.rate is not None:
        positive("--rate", args.rate, 100_000)
    for name, v in (("--dispatchers", args.dispatchers), ("--node-processes", args.node_processes)):
        if not 1 <= v <= 64:
            raise ValueError(f"{name} must be from 1 to 64, got {v}")
    if args.max_outstanding < 1:
        raise ValueError(f"--max-outstanding must be at least 1, got {args.max_outstanding}")
    run_seconds = args.minutes * 60
    if args.sample_seconds > run_seconds:
        raise ValueError(
            f"--sample-seconds {args.sample_seconds:g} is longer than the run ({run_seconds:g} s)"
        )
    warmup = min(120.0, 0.1 * run_seconds) if args.warmup is None else args.warmup
    if not (math.isfinite(warmup) and 0 <= warmup < run_seconds):
        raise ValueError(f"--warmup must be from 0 to below the run's {run_seconds:g} s, got {warmup:g}")
    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.spec
    if spec is None:
        spec = str(args.out / "spec.toml")
        Path(spec).write_text(BUILTIN_SPEC)
    overrides = [*args.overrides, f"policy.dispatchers={args.dispatchers}"]
    exp = load_spec(spec, overrides)
    rate = args.rate if args.rate is not None else exp.workload.arrival_rate / exp.run.time_scale
    scale = exp.workload.arrival_rate / rate
    if args.rate is not None:
        overrides.append(f"run.time_scale={scale!r}")  # the node processes read the spec with the overrides
        exp = load_spec(spec, overrides)
    return Config(
        spec,
        overrides,
        exp,
        rate,
        scale,
        args.minutes,
        args.sample_seconds,
        warmup,
        args.out,
        args.dispatchers,
        args.node_processes,
        args.max_outstanding,
        args.drain_seconds,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        cfg = config_from(args)
    except (ValueError, SpecError, OSError) as e:
        print(f"bench_soak.py: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    mean_task = cfg.exp.workload.service.mean / min(cfg.exp.node_speeds) * cfg.time_scale
    if mean_task < MIN_TASK_WALL:
        say(f"warning: a mean task lasts {1e3 * mean_task:.1f} ms wall: timer error and network dominate")
    # SIGTERM (nohup's stop, a CI timeout) as Ctrl-C, so the cluster is stopped whenever the run is
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    config = {
        "spec": cfg.spec,
        "overrides": cfg.overrides,
        "policy": cfg.exp.policy.name,
        "nodes": cfg.exp.n,
        "node_processes": cfg.node_processes,
        "dispatchers": cfg.dispatchers,
        "rate_asked": cfg.rate,
        "time_scale": cfg.time_scale,
        "mean_task_ms": 1e3 * mean_task,
        "minutes": cfg.minutes,
        "intervals": cfg.intervals,
        "sample_seconds": cfg.sample_seconds,
        "warmup_seconds": cfg.warmup,
        "max_outstanding_per_chunk": cfg.max_outstanding,
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
    }
    say(
        f"soak: {cfg.exp.policy.name} on {cfg.exp.n} nodes in {cfg.node_processes} processes, {cfg.rate:g} "
        f"tasks/s (time_scale {cfg.time_scale:.4g}, tasks of {1e3 * mean_task:.0f} ms wall on average), "
        f"{cfg.intervals} samples of {cfg.sample_seconds:g} s, warm-up {cfg.warmup:g} s; output in {cfg.out}"
    )
    outcome: Outcome | None = None
    try:
        with Cluster(cfg.out / "cluster" / "cluster.json") as cluster:
            f = cluster.up(cfg.exp, node_processes=cfg.node_processes)
            pids = {f"dispatcher-{e.index}": e.pid for e in f.dispatchers}
            pids |= {f"nodes-{e.index}": e.pid for e in f.node_hosts}
            pids["generator"] = os.getpid()
            with open(cfg.out / "samples.csv", "w", newline="") as csv_file:
                book = Book(cfg.sample_seconds, cfg.time_scale, list(pids), csv_file, say)
                outcome = uvloop.run(soak(cfg, f, book, pids, say))
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # the loop took it back to SIG_DFL
    except KeyboardInterrupt:
        say("interrupted: the cluster is stopped")
        return EXIT_INTERRUPTED
    except ClusterError as e:
        print(f"bench_soak.py: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if outcome.interrupted:
        say("interrupted: the cluster is stopped; the samples so far are in samples.csv")
    if not outcome.samples:
        print("bench_soak.py: error: no sample was completed", file=sys.stderr)
        return EXIT_INTERRUPTED if outcome.interrupted else EXIT_FAILED
    summary = summarize(cfg, outcome)
    off = [r["interval"] for r in outcome.samples if not r["balance_ok"]]
    checks = list(outcome.checks)
    checks.append(
        {
            "check": "balance at every sample",
            "ok": not off,
            "detail": f"off at interval(s) {off[:10]}" if off else f"{len(outcome.samples)} samples",
        }
    )
    if outcome.interrupted:
        checks.append(
            {
                "check": "run completed",
                "ok": False,
                "detail": f"interrupted after {len(outcome.samples)} of {cfg.intervals} samples: "
                "the exact end-of-run balance was not checked",
            }
        )
    ok = all(c["ok"] for c in checks)
    plot(cfg.out / "soak.png", cfg, outcome.samples)
    result = {
        "config": config,
        "ok": ok and not outcome.interrupted,
        "interrupted": outcome.interrupted,
        "checks": checks,
        "summary": summary,
        "generator_gc": outcome.generator_gc,
        "samples": outcome.samples,
        "files": {
            k: str(cfg.out / v)
            for k, v in (("csv", "samples.csv"), ("plot", "soak.png"), ("json", "summary.json"))
        },
    }
    (cfg.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print_table(cfg, summary, checks, sys.stdout)
        print(
            f"\nsamples: {cfg.out / 'samples.csv'}, plot: {cfg.out / 'soak.png'}, "
            f"all: {cfg.out / 'summary.json'}"
        )
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
