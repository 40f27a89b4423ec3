"""A randomized nemesis: many seeded schedules of overlapping faults on one supervised cluster, each checked
by invariants on both sides of the wire (docs/faults.md, "The nemesis").

A *schedule* (``schedule``, drawn from its seed) holds faults of the spec (``[[faults]]``: kill, pause and
restart node processes, restart dispatchers, slow and failing nodes, lost, duplicated and delayed state
messages; a *restart* is a kill of a node process started again at once) and *strikes* the nemesis deals
itself outside the spec: a ``crash`` (SIGKILL) or a ``stall`` (SIGSTOP, then SIGCONT) of any process, which
the run must observe, and work around by supervision (``health.restart``: a dead process is started again,
one stalled longer than ``health.restart_after`` is killed and started again). Faults overlap in time
across processes; some begin with the segment (the load's first tasks), and a ``crash`` may hit a process
while it starts again after a planned kill or dispatcher restart.

``run_nemesis`` runs the schedules one after the other on one cluster, as *segments* of one run (one batch
each): each segment's load lasts ``LOAD_SHARE`` of it and its faults fall in the first half of that, the
rest is quiet so that the load drains and the dispatchers heal before the segment's boundary, where every
process is scraped. ``segment_problems`` then checks, segment by segment:

- task by task from the journal, every task sent has exactly one fate: ``sent`` = completed + refused + lost
  + failed + expired, none expired, dropped, cancelled or left without a fate;
- every task that did not complete was hit by a fault: lost with a node whose process was out around its
  time or that was failing, failed or refused at a dispatcher that was out (or starting) around its time,
  or refused when no node process served;
- the generator against the dispatchers: a dispatcher that served the whole segment counted exactly the
  tasks the journal says it answered, by outcome (completed, refused, lost);
- the dispatchers against the nodes: a node process that served the whole segment admitted exactly the
  tasks it completed, and completed what the journal says completed at its nodes (at least that, when a
  dispatcher died with answers it could not give);
- at the boundary, the policy's state has healed: every process answers, every dispatcher has every node
  up and its picture equals the nodes' truth (``chaos.healed``), and no node holds a task.

tests/test_chaos.py runs 20 schedules (two clusters of ten); benchmarks/bench_soak.py and
benchmarks/bench_chaos.py run more.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from lbtestbed.analysis.measurement.scrape import ProcessSamples, Snapshot
from lbtestbed.cluster.launcher import Cluster, split_nodes, started
from lbtestbed.experiment.chaos import faults_toml, healed, picture
from lbtestbed.experiment.fault_injector import check
from lbtestbed.experiment.run_record import RunRecord
from lbtestbed.experiment.runner import measure
from lbtestbed.loadgen.journal import FATES, read_events
from lbtestbed.loadgen.openloop import poisson_tasks
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import load_spec, parse_spec
from lbtestbed.transport.cluster_file import ClusterFile, Endpoint

Say = Callable[[str], None]

#: the share of a segment its load lasts; its faults and strikes fall in the first half of that
LOAD_SHARE = 0.4
#: kinds of the spec's faults a schedule draws (a restart is a kill started again at once)
PLANNED = ("kill", "restart", "pause", "restart_dispatcher", "slow", "fail", "drop", "duplicate", "delay")
#: model seconds around an outage within which a task it hit may have been sent (its sojourn, at most)
IN_FLIGHT = 30.0
#: wall seconds from a segment's start to its first fault: the boundary's scrape comes first
LEAD = 0.2
#: the base spec of tests/test_chaos.py and benchmarks/bench_nemesis.py (``{policy}``: its policy): six
#: FCFS nodes in three node processes, two dispatchers, supervised (a process that dies is started again,
#: one silent for a second is killed and started again), checks every 0.2 s wall
BASE = """
name = "nemesis"
seed = 21
[[classes]]
name = "servers"
count = 6
discipline = "fcfs"
[workload]
load = 0.5
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "{policy}"
dispatchers = 2
[health]
outlier_interval = 0.5
ejection_time = 0.5
restart = true
restart_after = 1.0
[run]
time_scale = 0.02
"""
#: model seconds a segment lasts with BASE: 5 wall s, of which 2 of load (its faults in the first 1) and 3
#: quiet, in which every process started again has time to come up and the dispatchers to heal
SEGMENT = 250.0


@dataclass(frozen=True)
class Strike:
    """An unplanned fault the nemesis deals itself: ``crash`` (SIGKILL at ``at``) or ``stall`` (SIGSTOP at
    ``at``, SIGCONT at ``until``) of process ``process`` ("dispatcher-0", "nodes-1"); model seconds."""

    kind: str
    process: str
    at: float
    until: float
    starting: bool = False  # dealt to a process starting again after a kill or a dispatcher restart


@dataclass
class Schedule:
    """One seeded schedule: its segment (model seconds), the spec's faults (and the kind each was drawn
    as: a restart is a kill), whether the first came with the segment's first tasks, and the strikes."""

    seed: int
    start: float
    end: float
    faults: list[dict[str, Any]] = field(default_factory=list)
    drawn: list[str] = field(default_factory=list)
    at_start: bool = False
    strikes: list[Strike] = field(default_factory=list)


def _process_of(kind: str, fault: dict[str, Any], groups: Sequence[Sequence[int]]) -> str | None:
    """The process a fault of the spec acts on, as the watch names it (None: no process)."""
    if kind in ("kill", "pause"):
        return f"nodes-{next(i for i, g in enumerate(groups) if fault['node'] in g)}"
    if kind == "restart_dispatcher":
        return f"dispatcher-{fault['dispatcher']}"
    return None


def schedule(
    exp: Experiment, node_processes: int, seed: int, start: float, length: float, one_way: Sequence[str]
) -> Schedule:
    """The schedule of ``seed`` over the segment [start, start + length) of ``exp``'s run (module
    docstring); ``one_way``: the message kinds the policy sends on their own (none: no message faults)."""
    rng = random.Random(seed)
    load = LOAD_SHARE * length
    groups = split_nodes(exp.n, node_processes)
    busy: dict[str, list[tuple[float, float]]] = {}  # per process, and per node and gray kind
    out = Schedule(seed, start, start + length)
    kinds = [k for k in PLANNED if k not in ("drop", "duplicate", "delay") or one_way]
    at_start = out.at_start = rng.random() < 0.4  # the first fault with the segment's first tasks
    first = start + LEAD / exp.run.time_scale  # after the boundary's scrape at the segment's start
    for kind in rng.sample(kinds, rng.randint(3, 6)):
        for _ in range(20):  # a window free on its target
            span = rng.uniform(0.05, 0.25) * load
            at = first if at_start else first + rng.uniform(0.0, 0.5 * load - span)
            at_start = False
            fault = _draw(kind, rng, exp, groups, one_way, at, span)
            key = _process_of(fault["kind"], fault, groups) or f"{kind}-{fault.get('node', '')}"
            if all(
                fault["until"] + 0.05 * length <= a or b + 0.05 * length <= fault["at"]
                for a, b in busy.get(key, [])
            ):
                busy.setdefault(key, []).append((fault["at"], fault["until"]))
                out.faults.append(fault)
                out.drawn.append(kind)
                break
    out.strikes = _strikes(rng, exp, groups, out, busy, load)
    return out


def _draw(
    kind: str,
    rng: random.Random,
    exp: Experiment,
    groups: Sequence[Sequence[int]],
    one_way: Sequence[str],
    at: float,
    span: float,
) -> dict[str, Any]:
    """One fault of the spec of ``kind`` over [at, at + span) (a restart: a kill of a twentieth of it)."""
    fault: dict[str, Any] = {"kind": "kill" if kind == "restart" else kind, "at": round(at, 3)}
    fault["until"] = round(at + (0.05 * span if kind == "restart" else span), 3)
    if kind in ("kill", "restart", "pause"):
        fault["node"] = rng.choice(groups)[0]
    elif kind == "restart_dispatcher":
        fault["dispatcher"] = rng.randrange(exp.policy.dispatchers)
    elif kind in ("slow", "fail"):
        fault["node"] = rng.randrange(exp.n)
        if kind == "slow":
            fault["speed"] = round(rng.uniform(0.1, 0.4), 3)
        else:
            fault["fraction"] = round(rng.uniform(0.3, 1.0), 3)
    else:
        fault["messages"] = list(one_way)
        if kind == "delay":
            fault["delay"] = {"dist": "exponential", "mean": round(rng.uniform(0.5, 3.0), 3)}
        else:
            fault["fraction"] = round(rng.uniform(0.2, 1.0), 3)
    fault["settle"] = 0.0  # the segments are checked by invariants, not compared
    return fault


def _strikes(
    rng: random.Random,
    exp: Experiment,
    groups: Sequence[Sequence[int]],
    out: Schedule,
    busy: dict[str, list[tuple[float, float]]],
    load: float,
) -> list[Strike]:
    """Up to two crashes or stalls on processes free at their time, and with some schedules a crash of a
    process while it starts again after a planned kill or dispatcher restart."""
    processes = [f"dispatcher-{d}" for d in range(exp.policy.dispatchers)] + [
        f"nodes-{j}" for j in range(len(groups))
    ]
    strikes = []
    restarts = [f for f in out.faults if f["kind"] in ("kill", "restart_dispatcher")]
    if restarts and rng.random() < 0.5:  # while it starts again: its first answers not given yet
        f = rng.choice(restarts)
        process = _process_of(f["kind"], f, groups)
        assert process is not None
        at = f["until"] + 0.6 / exp.run.time_scale  # 0.6 s wall after its start: still starting
        strikes.append(Strike("crash", process, at, at, starting=True))
        busy.setdefault(process, []).append((at, at + 0.3 * load))
    for j in range(rng.randint(1, 2)):
        kind = ("crash", "stall")[(out.seed + j) % 2]  # each kind in every other schedule at least
        for _ in range(10):  # a time its process is free
            process = rng.choice(processes)
            span = rng.uniform(0.3, 1.5) / exp.run.time_scale if kind == "stall" else 0.0  # wall s of a stall
            at = out.start + LEAD / exp.run.time_scale + rng.uniform(0.0, 0.5 * load)
            margin = 2.0 / exp.run.time_scale  # its restart, and its dispatchers' first contact
            if all(at + span + margin <= a or b + margin <= at for a, b in busy.get(process, [])):
                strikes.append(Strike(kind, process, at, at + span))
                busy.setdefault(process, []).append((at, at + span))
                break
    return sorted(strikes, key=lambda s: s.at)


def loaded(t: float, length: float, scale: float) -> bool:
    """Whether model time ``t`` falls in the load of its segment: from LEAD after the segment's start (its
    boundary's scrape sees no task in flight) for LOAD_SHARE of the segment."""
    into = t % length - LEAD / scale
    return 0.0 <= into < LOAD_SHARE * length


def endpoint(f: ClusterFile, process: str) -> Endpoint:
    role, _, index = process.rpartition("-")
    ends = f.dispatchers if role == "dispatcher" else f.node_hosts
    return ends[int(index)]


async def strike(f: ClusterFile, strikes: Sequence[Strike], origin: float, scale: float, say: Say) -> None:
    """Deal ``strikes`` on the run's clock (model time 0 at the monotonic instant ``origin``), each to the
    process its endpoint records at that instant (one the watch started again is another)."""
    actions = sorted(
        [(s.at, "kill" if s.kind == "crash" else "stop", s) for s in strikes]
        + [(s.until, "cont", s) for s in strikes if s.kind == "stall"],
        key=lambda a: a[0],
    )
    for at, action, s in actions:
        delay = origin + at * scale - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}[action]
        done = started(endpoint(f, s.process)).signal(sig)
        say(f"nemesis: {action} {s.process} at model time {at:.4g}{'' if done else ' (it was gone)'}")


@dataclass
class NemesisOutcome:
    """What the run of the schedules left: its experiment, the schedules, every boundary's snapshot, the
    journal's events, what the watch saw, what the injector did, and the processes left after ``down``."""

    exp: Experiment
    schedules: list[Schedule]
    snapshots: list[Snapshot]
    events: list[dict[str, Any]]
    outages: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    leftover: list[int]
    dispatchers: list[str]  # their URLs (the snapshots' keys), in index order
    node_hosts: list[str]


def plan(base: str, seeds: Sequence[int], node_processes: int, length: float) -> tuple[str, list[Schedule]]:
    """The spec of a run of one segment of ``length`` model seconds per seed, and the schedules: ``base`` is
    a spec's TOML whose nodes, policy, time scale and health the run takes, ``[run]`` its last table (the
    run is replaced); every schedule's faults go into ``[[faults]]``."""
    head = base[: base.index("[run]")]
    scale = tomllib.loads(base)["run"]["time_scale"]
    run = (
        f"[run]\nwarmup = 0.0\nduration = {length * len(seeds)!r}\ntime_scale = {scale!r}\n"
        f'batches = {len(seeds)}\ntolerance = "off"\n'
    )
    exp = parse_spec(tomllib.loads(head + run))
    one_way = [k for k in exp.policy.message_kinds() if k not in ("probe", "probe_reply")]
    schedules = [schedule(exp, node_processes, s, i * length, length, one_way) for i, s in enumerate(seeds)]
    return head + run + faults_toml([f for sch in schedules for f in sch.faults]), schedules


def run_nemesis(
    base: str, seeds: Sequence[int], node_processes: int, length: float, directory: Path, say: Say
) -> NemesisOutcome:
    """Run one segment of ``length`` model seconds per seed on one cluster (module docstring)."""
    directory.mkdir(parents=True, exist_ok=True)
    text, schedules = plan(base, seeds, node_processes, length)
    (directory / "spec.toml").write_text(text)
    exp = load_spec(directory / "spec.toml")
    tasks = [t for t in poisson_tasks(exp, exp.run.duration) if loaded(t[0], length, exp.run.time_scale)]
    path = directory / "cluster.json"
    record = RunRecord(directory)
    strikes = [s for sch in schedules for s in sch.strikes]
    try:
        with Cluster(path) as cluster:
            f = cluster.up(exp, node_processes=node_processes)
            check(exp, f, local=True)
            urls = [d.url for d in f.dispatchers], [h.url for h in f.node_hosts]

            async def deal(origin: float) -> None:
                await strike(f, strikes, origin, exp.run.time_scale, say)

            m = asyncio.run(measure(exp, f, tasks, say, cluster_path=path, record=record, beside=[deal]))
    finally:
        record.close()
    leftover = [
        p.pid for p in psutil.process_iter(["cmdline"]) if str(path) in " ".join(p.info["cmdline"] or [])
    ]
    events = list(read_events(record.journal.path))
    return NemesisOutcome(exp, schedules, m.snapshots, events, m.outages, m.faults, leftover, *urls)


# ------------------------------------------------------------------------------------------------ checks


def _out_windows(outages: Sequence[dict[str, Any]], process: str, end: float) -> list[tuple[float, float]]:
    """When ``process`` was out: from the last check that saw it serving to the first that saw it again."""
    return [
        (o["last_seen"], o["end"] if o["end"] is not None else end)
        for o in outages
        if o["process"] == process
    ]


def _hit(windows: Sequence[tuple[float, float]], at: float, after: float) -> bool:
    """Whether a task's fate, known at model time ``at``, fell in one of ``windows`` (from the last check
    that saw the process serve) or within ``after`` of its end (before the dispatchers saw it again)."""
    return any(a - 1.0 <= at <= b + after for a, b in windows)


def segment_problems(outcome: NemesisOutcome) -> list[list[str]]:
    """What did not hold, segment by segment (module docstring); a list of empty lists when all did."""
    exp, snaps = outcome.exp, outcome.snapshots
    end = exp.run.duration
    if len(snaps) != len(outcome.schedules) + 1:
        return [[f"{len(snaps)} boundaries scraped, not {len(outcome.schedules) + 1}"]]
    fates = task_fates(outcome.events)
    out = []
    for k, sch in enumerate(outcome.schedules):
        mine = {i: f for i, f in fates.items() if sch.start <= f.t < sch.end}
        problems = _accounting(mine)
        problems += _attribution(outcome, sch, mine, end)
        problems += _counters(outcome, sch, mine, snaps[k], snaps[k + 1], end)
        problems += _healed(exp, snaps[k + 1])
        out.append([f"seed {sch.seed}: {p}" for p in problems[:10]])
    if outcome.leftover:
        out[-1].append(f"processes left after down: {outcome.leftover}")
    return out


class TaskFate(NamedTuple):
    """A task sent, as the journal tells it: intended time, its dispatcher, its fates (one, if all is
    well), the node its fate names, and the model time the generator learned it (the intended time plus
    its sojourn: a task out at a stopped dispatcher learns it late)."""

    t: float
    dispatcher: int
    ends: list[str]
    node: int
    known: float


def task_fates(events: Sequence[dict[str, Any]]) -> dict[int, TaskFate]:
    """Every task sent, by its index in the trace."""
    fates: dict[int, TaskFate] = {}
    for e in events:
        if e["e"] == "sent":
            fates[e["i"]] = TaskFate(e["t"], e["d"], [], -1, e["t"])
        elif e["e"] in FATES and e["i"] in fates:
            f = fates[e["i"]]
            known = e["t"] + (e.get("sojourn") or 0.0)
            fates[e["i"]] = f._replace(ends=[*f.ends, e["e"]], node=e.get("node", -1), known=known)
    return fates


def _accounting(mine: dict[int, TaskFate]) -> list[str]:
    problems = [
        f"task {i} ({f.t:.4g}) ended {f.ends or 'never'}" for i, f in mine.items() if len(f.ends) != 1
    ]
    ended = Counter(f.ends[0] for f in mine.values() if len(f.ends) == 1)
    return problems + [f"{ended[fate]} tasks {fate}" for fate in ("expired", "cancelled") if ended[fate]]


def _attribution(outcome: NemesisOutcome, sch: Schedule, mine: dict[int, TaskFate], end: float) -> list[str]:
    """Every task that did not complete was hit by a fault where and when its fate was known (module
    docstring)."""
    exp, outages = outcome.exp, outcome.outages
    hosts = range(len(outcome.node_hosts))
    host_of = {k: j for j, g in enumerate(split_nodes(exp.n, len(hosts))) for k in g}
    # the dispatchers see a process serve again up to a heartbeat and a check's timeout after the watch
    lag = (exp.health.heartbeat + exp.health.timeout) / exp.run.time_scale
    failing = [(f["node"], f["at"], f["until"] + lag) for f in sch.faults if f["kind"] == "fail"]
    problems = []
    for i, f in mine.items():
        fate = f.ends[0] if len(f.ends) == 1 else "completed"
        if fate == "completed":
            continue
        dispatcher_out = _hit(_out_windows(outages, f"dispatcher-{f.dispatcher}", end), f.known, lag)
        what = f"task {i} ({f.t:.4g}) {fate} at {f.known:.4g}"
        if fate == "lost":
            windows = _out_windows(outages, f"nodes-{host_of[f.node]}", end) if f.node in host_of else []
            fails = any(k == f.node and a <= f.known <= u for k, a, u in failing)
            if not (_hit(windows, f.known, lag) or fails):
                problems.append(f"{what} with node {f.node}, which served and was not failing")
        elif fate == "failed" and not dispatcher_out:
            problems.append(f"{what} at dispatcher {f.dispatcher}, which served")
        elif fate == "refused":
            nobody = all(_hit(_out_windows(outages, f"nodes-{j}", end), f.known, lag) for j in hosts)
            if not (dispatcher_out or nobody):
                problems.append(f"{what} by dispatcher {f.dispatcher}, which served, with node processes up")
    return problems


def _served_through(outages: Sequence[dict[str, Any]], process: str, sch: Schedule, end: float) -> bool:
    return not any(
        a <= sch.end and sch.start - IN_FLIGHT <= b for a, b in _out_windows(outages, process, end)
    )


def _one_process_through(
    outcome: NemesisOutcome,
    url: str,
    process: str,
    sch: Schedule,
    end: float,
    before: Snapshot,
    after: Snapshot,
) -> tuple[ProcessSamples, ProcessSamples] | None:
    """The process's pages at both ends when one and the same process (one start time) served all
    through the schedule, so that its counters' difference counts the schedule's tasks; else None."""
    a, b = before.processes.get(url), after.processes.get(url)
    if (
        a is None
        or b is None
        or a.value("process_start_time_seconds") != b.value("process_start_time_seconds")
    ):
        return None
    return (a, b) if _served_through(outcome.outages, process, sch, end) else None


def _counters(
    outcome: NemesisOutcome,
    sch: Schedule,
    mine: dict[int, TaskFate],
    before: Snapshot,
    after: Snapshot,
    end: float,
) -> list[str]:
    """The generator against the dispatchers, the dispatchers against the nodes (module docstring)."""
    exp = outcome.exp
    problems = []
    answered = Counter((f.dispatcher, f.ends[0]) for f in mine.values() if len(f.ends) == 1)
    any_dispatcher_out = False
    for d, url in enumerate(outcome.dispatchers):
        pages = _one_process_through(outcome, url, f"dispatcher-{d}", sch, end, before, after)
        if pages is None:
            any_dispatcher_out = True
            continue
        a, b = pages
        for fate in ("completed", "refused", "lost"):
            counted = b.value("lbtestbed_dispatcher_tasks_total", outcome=fate) - a.value(
                "lbtestbed_dispatcher_tasks_total", outcome=fate
            )
            if counted != answered[(d, fate)]:
                problems.append(
                    f"dispatcher {d} counted {counted:g} {fate}, the journal {answered[(d, fate)]}"
                )
    completed_at = Counter(f.node for f in mine.values() if f.ends == ["completed"])
    groups = split_nodes(exp.n, len(outcome.node_hosts))
    for j, url in enumerate(outcome.node_hosts):
        pages = _one_process_through(outcome, url, f"nodes-{j}", sch, end, before, after)
        if pages is None:
            continue
        a, b = pages
        arrived = b.value("lbtestbed_node_arrivals_total") - a.value("lbtestbed_node_arrivals_total")
        done = b.value("lbtestbed_node_completions_total") - a.value("lbtestbed_node_completions_total")
        if arrived != done:
            problems.append(f"node process {j} admitted {arrived:g} tasks and completed {done:g}")
        journal = sum(completed_at[k] for k in groups[j])
        if done < journal or (done != journal and not any_dispatcher_out):
            problems.append(f"node process {j} completed {done:g} tasks, the journal {journal} at its nodes")
    return problems


def _healed(exp: Experiment, snap: Snapshot) -> list[str]:
    """At the boundary: every process answered, every dispatcher's picture is the nodes' truth, no node
    holds a task."""
    if snap.missing:
        return [f"{', '.join(snap.missing)} did not answer at the boundary"]
    pictures = []
    for proc in snap.processes.values():
        if any(name == "lbtestbed_dispatcher_nodes_up" for name, _, _ in proc.samples):  # a dispatcher's page
            pictures.append(picture(exp, proc))
    problems = [] if healed(exp, pictures) else [f"the pictures {pictures} are not the nodes' truth"]
    held = snap.value("lbtestbed_node_tasks")
    return problems + ([f"the nodes still held {held:g} tasks"] if held else [])
