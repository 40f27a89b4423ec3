"""Before a run starts: what the spec asks of this machine, and the time scale that suits it.

At its ``run.time_scale`` a spec asks for tasks, probes and state messages at some rate per *wall* second.
This module estimates what that costs each process (CPU per task, per probe, per message: measured once
per machine by a short calibration and cached), and refuses a run that would saturate the machine (exit 2;
``--force`` goes on anyway) or warns when it comes close. With ``run.time_scale = "auto"`` it picks the
smallest time scale at which the expected transport-and-dispatch overhead stays under 1 % of the mean
service time and every process keeps its CPU below the warning level (docs/run.md, "Before it starts").

The model: a process busy a fraction u of its core answers late by its idle latency times 1 / (1 - u)
(the M/M/1 inflation), so the overhead is the calibrated overhead at low load over (1 - u) of the busiest
process, and the CPU of each process is its calibrated cost per event times the events per wall second.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lbtestbed.cluster.launcher import Cluster, default_node_processes
from lbtestbed.experiment.calibration import AUTO_GRID, at_scale, auto_scale, mean_service
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import policy_of
from lbtestbed.spec import load_spec
from lbtestbed.transport.cluster_file import ClusterFile

#: a process busier than this (fraction of a core) makes the run's verdict about the machine: warned
WARN_LOAD = 0.5
#: busier than this: refused (without --force)
REFUSE_LOAD = 0.85
#: the same for the machine as a whole (fraction of all its cores): its processes compete for them
WARN_MACHINE = 0.4
REFUSE_MACHINE = 0.7
#: the overhead ``time_scale = "auto"`` allows, against the mean service time
AUTO_OVERHEAD = 0.01
CALIBRATION_ENV = "LBT_CALIBRATION"  # a calibration file to use instead of the machine's cached one
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class Calibration:
    """What one task, probe and message cost on this machine (CPU µs) and the overhead at low load."""

    dispatcher_us: float  # per task at the dispatcher (no probes, replies carry the messages)
    probe_us: float  # per probe (or message on a request of its own): sender and receiver together
    node_us: float  # per task at a node host
    generator_us: float  # per task at the load generator
    overhead_ms: float  # p50 of sojourn minus stay at low load, wall ms
    cores: int
    machine: str
    version: int = CALIBRATION_VERSION

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def fingerprint() -> str:
    """Which machine a calibration belongs to."""
    python = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    return f"{platform.node()}/{platform.machine()}/{os.cpu_count()}cpu/{python}"


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lbtestbed" / "calibration.json"


def load_calibration(say: Callable[[str], None] | None = None, refresh: bool = False) -> Calibration:
    """The calibration of ``$LBT_CALIBRATION``, or this machine's cached one (calibrating it first)."""
    given = os.environ.get(CALIBRATION_ENV)
    path = Path(given) if given else cache_path()
    if not refresh and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("version") == CALIBRATION_VERSION and (given or data.get("machine") == fingerprint()):
                return Calibration(**data)
        except (OSError, ValueError, TypeError):
            pass  # unreadable or from another version: measure again
    if given:
        raise ValueError(f"{CALIBRATION_ENV}={given}: not a calibration file of this version")
    if say is not None:
        say("calibrating this machine (once, about 15 s): what a task, a probe and a message cost")
    cal = calibrate()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.to_json(), indent=1) + "\n")
    return cal


POOLS_SPEC = """
name = "lbt-pools"
seed = 1
[[classes]]
name = "pools"
count = 8
discipline = "pool"
[workload]
arrival_rate = {rate}
service = {{ dist = "exponential", mean = 1.0 }}
[policy]
{policy}
[run]
warmup = 0.0
duration = {duration}
time_scale = {scale}
batches = 2
"""


def pools_spec(rate: float, seconds: float, scale: float, policy: str = 'name = "random"') -> str:
    """A spec of 8 pool nodes (nothing queues: what is measured is the way there and back) that sends
    ``rate`` tasks per wall second for ``seconds``, tasks of ``scale`` wall seconds on average."""
    return POOLS_SPEC.format(rate=rate * scale, duration=seconds / scale, scale=scale, policy=policy)


def calibrate(rate: float = 600.0, seconds: float = 2.5) -> Calibration:
    """Run a small cluster (one dispatcher, one node process, pools: no queueing) at ``rate`` tasks per
    wall second under random routing, then under power-of-2, and measure every process's CPU per task
    beyond what it spends idle (heartbeats, timers: measured over a second before the load)."""
    import psutil

    from lbtestbed.loadgen.openloop import drive, poisson_tasks

    scale = 0.01
    costs: dict[str, list[float]] = {}
    overhead = math.nan
    with tempfile.TemporaryDirectory(prefix="lbt-calibrate-") as tmp:
        # a policy without messages, then one that probes: the probe's cost is their difference
        for name, policy in (("plain", 'name = "random"'), ("probes", 'name = "power_of_d"\nd = 2')):
            spec = Path(tmp) / "spec.toml"
            spec.write_text(pools_spec(rate, seconds, scale, policy))
            exp = load_spec(spec)
            tasks = list(poisson_tasks(exp, exp.run.duration))
            with Cluster(Path(tmp) / "cluster.json") as cluster:
                f = cluster.up(exp, node_processes=1)
                procs = [psutil.Process(e.pid) for e in (*f.dispatchers, *f.node_hosts)]
                me = psutil.Process()

                def cpu_now(procs: list[psutil.Process] = [*procs, me]) -> list[float]:  # noqa: B006
                    return [sum(p.cpu_times()[:2]) for p in procs]

                idle0, t0 = cpu_now(), time.monotonic()
                time.sleep(1.0)
                idle1, t1 = cpu_now(), time.monotonic()
                report = asyncio.run(drive([d.url for d in f.dispatchers], tasks, scale))
                busy, t2 = cpu_now(), time.monotonic()
            n = max(1, len(report.records))
            idle = [(b - a) / (t1 - t0) for a, b in zip(idle0, idle1, strict=True)]  # CPU s per s, idle
            cpu = [
                max(0.0, 1e6 * (c - b - i * (t2 - t1)) / n) for b, c, i in zip(idle1, busy, idle, strict=True)
            ]
            costs[name] = cpu
            if name == "plain":
                overhead = 1e3 * scale * float(np.median([r.sojourn - r.stay for r in report.records]))
    d_random, n_random, g_random = costs["plain"]
    d_probe, n_probe, _ = costs["probes"]
    probe = max(0.0, (d_probe - d_random + n_probe - n_random) / 2)
    # the overhead was measured with the busiest process busy u: the idle latency is that times (1 - u)
    u = min(0.9, max(d_random, n_random, g_random) * rate * 1e-6)
    idle_overhead = overhead * (1.0 - u)
    return Calibration(d_random, probe, n_random, g_random, idle_overhead, os.cpu_count() or 1, fingerprint())


@dataclass(frozen=True)
class Estimate:
    """What a spec asks of the machine per wall second, and what it costs each process."""

    time_scale: float
    tasks_per_s: float
    probes_per_s: float
    messages_per_s: float  # state messages on requests of their own
    dispatcher_load: float  # fraction of a core, the busiest dispatcher
    node_load: float  # fraction of a core, the busiest node process
    generator_load: float
    total_load: float  # cores
    overhead_ms: float  # expected p50 transport-and-dispatch overhead, wall ms
    overhead_fraction: float  # of the mean service time

    @property
    def busiest(self) -> float:
        return max(self.dispatcher_load, self.node_load, self.generator_load)

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def probes_per_task(exp: Experiment) -> float:
    """Probe round trips per task: each a request of its own, answered on it."""
    return policy_of(exp).messages(exp).probes


def own_messages_per_task(exp: Experiment) -> float:
    """State messages per task sent on a request of their own (the others ride on replies sent anyway), as
    the policy counts them (``unit.MessageCost.own``)."""
    return policy_of(exp).messages(exp).own


def estimate(
    exp: Experiment,
    cal: Calibration,
    time_scale: float | None = None,
    node_processes: int | None = None,
) -> Estimate:
    ts = exp.run.time_scale if time_scale is None else time_scale
    processes = node_processes or default_node_processes(exp.n, cal.cores)
    dispatchers = exp.policy.dispatchers
    tasks = exp.workload.arrival_rate / ts
    probes = tasks * probes_per_task(exp)
    messages = tasks * own_messages_per_task(exp)
    disp = (tasks * cal.dispatcher_us + (probes + messages) * cal.probe_us / 2) / dispatchers * 1e-6
    node = (tasks * cal.node_us + (probes + messages) * cal.probe_us / 2) / processes * 1e-6
    gen = tasks * cal.generator_us * 1e-6
    total = disp * dispatchers + node * processes + gen
    busiest = max(disp, node, gen, total / cal.cores)
    inflation = 1.0 / (1.0 - busiest) if busiest < 1.0 else math.inf
    overhead = cal.overhead_ms * inflation
    fraction = overhead * 1e-3 / (mean_service(exp) * ts)
    return Estimate(ts, tasks, probes, messages, disp, node, gen, total, overhead, fraction)


def judge(est: Estimate, cal: Calibration) -> tuple[str, str]:
    """("ok" | "warn" | "refuse", one line saying why)."""
    per_core = est.total_load / cal.cores
    what = (
        f"{est.tasks_per_s:.0f} tasks/s, {est.probes_per_s:.0f} probes/s and {est.messages_per_s:.0f} state "
        f"messages/s at time_scale {est.time_scale:g} load the busiest process {100 * est.busiest:.0f} % "
        f"and the machine's {cal.cores} cores {100 * per_core:.0f} % (calibrated per task: dispatcher "
        f"{cal.dispatcher_us:.0f} µs, node {cal.node_us:.0f} µs, generator {cal.generator_us:.0f} µs)"
    )
    if est.busiest > REFUSE_LOAD or per_core > REFUSE_MACHINE:
        return "refuse", what + "; the emulation would measure the machine, not the policy"
    if est.busiest > WARN_LOAD or per_core > WARN_MACHINE:
        return "warn", what + f"; expect about {est.overhead_ms:.2g} ms of overhead per task"
    return "ok", what


def auto_time_scale(
    exp: Experiment, cal: Calibration, node_processes: int | None = None
) -> tuple[float, str]:
    """The smallest time scale (on a 1-2-5 grid) whose expected overhead is at most 1 % of the mean
    service time and whose load stays below the warning level; the reason, in one line."""
    for ts in AUTO_GRID:
        est = estimate(exp, cal, ts, node_processes)
        if judge(est, cal)[0] == "ok" and est.overhead_fraction <= AUTO_OVERHEAD:
            why = (
                f"time_scale = auto picked {ts:g}: {est.tasks_per_s:.0f} tasks/s load the busiest process "
                f"{100 * est.busiest:.0f} %, and the expected overhead ({est.overhead_ms:.2g} ms per "
                f"task) is {100 * est.overhead_fraction:.2g} % of the mean service "
                f"({1e3 * mean_service(exp) * ts:.3g} ms wall)"
            )
            return ts, why
    ts = AUTO_GRID[-1]
    return ts, f"time_scale = auto: no time scale up to {ts:g} keeps the overhead under 1 %; using {ts:g}"


def resolve(exp: Experiment, time_scale: float) -> Experiment:
    """``exp`` with its time scale set (the cluster file carries it to the processes)."""
    return at_scale(exp, time_scale)


def at_cluster_scale(exp: Experiment, cluster: Path) -> Experiment:
    """``exp`` at the time scale of the cluster of the file ``cluster`` where ``exp`` leaves it to
    ``"auto"`` (the cluster's processes run at the scale picked when it started; ClusterError or
    SpecError when its file or its spec does not load)."""
    if not exp.run.auto_time_scale:
        return exp
    return resolve(exp, ClusterFile.load(cluster).experiment().run.time_scale)


def prepare(
    exp: Experiment, node_processes: int | None, force: bool, say: Callable[[str], None]
) -> tuple[Experiment, dict[str, Any], str | None]:
    """Resolve ``time_scale = "auto"`` and judge what the spec asks of this machine, before anything
    starts: (the experiment to run, what the report records, a refusal or None)."""
    cal = load_calibration(say)
    record: dict[str, Any] = {"calibration": cal.to_json()}
    if exp.run.auto_time_scale:
        first, _ = auto_time_scale(exp, cal, node_processes)
        scale, live, why = auto_scale(exp, first, node_processes, say)
        exp = resolve(exp, scale)
        record["time_scale"] = {"auto": True, "picked": scale, "why": why}
        record["live"] = [x.to_json() for x in live]
        say(why)
    est = estimate(exp, cal, None, node_processes)
    level, line = judge(est, cal)
    record["estimate"] = {**est.to_json(), "level": level, "why": line}
    if level == "refuse" and not force:
        hint = 'raise run.time_scale (time_scale = "auto" picks one) or pass --force'
        return exp, record, f"{exp.source}: {line}; {hint}"
    if level != "ok":
        say(f"warning: {line}")
    return exp, record, None
