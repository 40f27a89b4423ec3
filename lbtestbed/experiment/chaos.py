"""A seeded storm of overlapping faults on a real cluster, and what must hold after it (docs/faults.md,
"Many faults at once").

``chaos_faults`` draws a schedule of faults of every kind (kill and pause node processes, restart
dispatchers, slow nodes and failing nodes, drop, duplicate and delay state messages; each kind once before
any kind twice) that overlap in time wherever the spec allows it (two process faults of one process may
not overlap, nor two gray failures of one kind on one node), and leaves the last fifth of the run free of
faults. ``run_chaos`` starts a cluster,
sends the spec's load through the storm as ``lbt run`` does, waits for the dispatchers to heal once the load
has drained, stops the cluster, and ``problems`` says what did not hold:

- every task the generator scheduled ended in exactly one outcome; none expired or was dropped; a task
  lost with a node was routed to a node that was killed or failing; a task that failed at its dispatcher
  (the connection refused or broken) or that its dispatcher refused was sent to a dispatcher that was
  restarted, before it was back and had heard from every node process;
- once the load has drained, every dispatcher's picture equals the nodes' truth: every node up again,
  and every node idle in the policy's state as it is in fact (JSQ's ``idle_nodes`` = n, JIQ's tokens);
- no process of the cluster is left after ``down``.

tests/test_chaos.py runs a short storm in CI; benchmarks/bench_chaos.py long ones over many seeds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from lbtestbed.analysis.measurement.scrape import ProcessSamples, Snapshot, scrape
from lbtestbed.cluster.launcher import Cluster, split_nodes
from lbtestbed.dispatcher.health import FIRST_CONTACT
from lbtestbed.experiment.runner import measure
from lbtestbed.loadgen.openloop import LoadReport, poisson_tasks
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.workload import DispatcherSplit
from lbtestbed.policies import policy_of

Say = Callable[[str], None]

#: kinds a storm draws from, each equally likely (those the spec's policy and cluster can take)
KINDS = ("kill", "pause", "restart_dispatcher", "slow", "fail", "drop", "duplicate", "delay")
#: wall seconds after the load within which the dispatchers must have healed (a liveness bound)
HEAL_WITHIN = 30.0


def chaos_faults(
    exp: Experiment, node_processes: int, seed: int, count: int, one_way: Sequence[str]
) -> list[dict[str, Any]]:
    """``count`` faults as ``[[faults]]`` tables, drawn with ``seed`` over the first four fifths of the run
    (each lasting 4 to 12% of it), for a cluster of ``node_processes`` node processes; ``one_way``: the
    message kinds the policy sends on their own (empty: no message faults)."""
    rng = random.Random(seed)
    end = exp.run.warmup + exp.run.duration
    groups = split_nodes(exp.n, node_processes)
    kinds = [k for k in KINDS if k not in ("drop", "duplicate", "delay") or one_way]
    faults: list[dict[str, Any]] = []
    busy: dict[str, list[tuple[float, float]]] = {}  # what may not overlap: a process, a node's gray failure
    attempts = 0
    order: list[str] = []
    while len(faults) < count and attempts < 100 * count:
        attempts += 1
        if not order:  # every kind once, in a random order, before any kind again
            order = rng.sample(kinds, len(kinds))
        kind = order[-1]
        length = rng.uniform(0.04, 0.12) * end
        at = round(rng.uniform(0.05 * end, 0.8 * end - length), 3)
        until = round(at + length, 3)
        fault: dict[str, Any] = {"kind": kind, "at": at, "until": until}
        if kind in ("kill", "pause"):
            p = rng.randrange(len(groups))
            key, fault["node"] = f"process-{p}", groups[p][0]
        elif kind == "restart_dispatcher":
            fault["dispatcher"] = rng.randrange(exp.policy.dispatchers)
            key = f"dispatcher-{fault['dispatcher']}"
        elif kind in ("slow", "fail"):
            fault["node"] = rng.randrange(exp.n)
            key = f"{kind}-{fault['node']}"
            if kind == "slow":
                fault["speed"] = round(rng.uniform(0.1, 0.4), 3)
            else:
                fault["fraction"] = round(rng.uniform(0.3, 1.0), 3)
        else:
            key = ""
            fault["messages"] = list(one_way)
            if kind == "delay":
                fault["delay"] = {"dist": "exponential", "mean": round(rng.uniform(0.5, 3.0), 3)}
            else:
                fault["fraction"] = round(rng.uniform(0.2, 1.0), 3)
        if key and any(at < b and a < until for a, b in busy.get(key, [])):
            continue  # drawn again, the same kind
        order.pop()
        if key:
            busy.setdefault(key, []).append((at, until))
        faults.append(fault)
    return sorted(faults, key=lambda f: f["at"])


def faults_toml(faults: Sequence[dict[str, Any]]) -> str:
    """The ``[[faults]]`` tables of ``chaos_faults`` as TOML, to append to a spec (the cluster's processes
    read their spec from a file)."""

    def value(v: Any) -> str:
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return repr(v)

    return "".join(
        "\n[[faults]]\n" + "".join(f"{k} = {value(v)}\n" for k, v in fault.items()) for fault in faults
    )


@dataclass
class ChaosOutcome:
    """What a storm left: the load, what the injector did, each dispatcher's picture once healed (or at the
    deadline), and the processes of the cluster still running after ``down``."""

    exp: Experiment
    load: LoadReport
    actions: list[dict[str, Any]]
    routes: dict[float, int]  # the dispatcher each task was sent to, by its arrival time
    pictures: list[dict[str, float]] = field(default_factory=list)
    heal_seconds: float = 0.0
    leftover: list[int] = field(default_factory=list)
    nodes_busy: float = 0.0  # tasks the node hosts still held when the pictures were read


async def _read(urls: Sequence[str]) -> Snapshot:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await scrape(session, urls, time.monotonic(), missing_ok=True)


def pictures_of(exp: Experiment, urls: Sequence[str]) -> list[dict[str, float]]:
    """Each dispatcher's picture: its nodes up (-1 when it does not answer), and the quantities without a
    label that its policy exports, by name."""
    snap = asyncio.run(_read(urls))
    out = []
    for url in urls:
        proc = snap.processes.get(url)
        out.append({"nodes_up": -1.0} if proc is None else picture(exp, proc))
    return out


def picture(exp: Experiment, proc: ProcessSamples) -> dict[str, float]:
    """A dispatcher's picture from its page: its nodes up, and the quantities without a label that its
    policy exports, by name."""
    state = {q.name: proc.value(q.metric) for q in policy_of(exp).exported if q.label is None}
    return {"nodes_up": proc.value("lbtestbed_dispatcher_nodes_up"), **state}


def healed(exp: Experiment, pictures: Sequence[dict[str, float]]) -> bool:
    """Whether every dispatcher has every node up and idle in its picture. A picture split among the
    dispatchers (JIQ's idle tokens) holds every idle node at least once: a node that became idle with its
    token at one dispatcher, then took a task from another (which routes at random when it holds no
    token) and became idle again with its token elsewhere leaves a stale token behind, which stays until it
    is used, as in the paper's JIQ with several dispatchers (with no fault at all); a token lost is what
    must not last."""
    declared = policy_of(exp)
    gauge = declared.picture
    if gauge is not None and declared.picture_split:  # every idle node is in some dispatcher's picture
        held = sum(p.get(gauge, 0.0) for p in pictures)
        return held >= exp.n and all(p["nodes_up"] == exp.n for p in pictures)
    return all(p["nodes_up"] == exp.n and (gauge is None or p.get(gauge) == exp.n) for p in pictures)


def run_chaos(exp: Experiment, directory: Path, node_processes: int, say: Say) -> ChaosOutcome:
    """Start a cluster for ``exp`` (its ``[[faults]]`` the storm), send its load through the faults, wait
    for the dispatchers to heal, stop the cluster."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cluster.json"
    tasks = list(poisson_tasks(exp, exp.run.warmup + exp.run.duration))
    routes = dict(zip((t for t, _ in tasks), DispatcherSplit(exp).take(len(tasks)), strict=True))
    with Cluster(path) as cluster:
        f = cluster.up(exp, node_processes=node_processes)
        m = asyncio.run(measure(exp, f, tasks, say, cluster_path=path))
        urls = [d.url for d in f.dispatchers]
        began = time.monotonic()
        pictures = pictures_of(exp, urls)
        while not healed(exp, pictures) and time.monotonic() - began < HEAL_WITHIN:
            time.sleep(0.2)
            pictures = pictures_of(exp, urls)
        heal = time.monotonic() - began
        say(f"healed in {heal:.2f} s" if healed(exp, pictures) else f"not healed after {heal:.1f} s")
        busy = asyncio.run(_read([h.url for h in f.node_hosts])).value("lbtestbed_node_tasks")
    leftover = [p.pid for p in psutil.process_iter(["cmdline"]) if str(path) in (p.info["cmdline"] or [])]
    return ChaosOutcome(exp, m.load, m.faults, routes, pictures, heal, leftover, busy)


def problems(outcome: ChaosOutcome) -> list[str]:
    """What did not hold after the storm (module docstring); empty when everything did."""
    exp, load = outcome.exp, outcome.load
    out = []
    ends = {k: load.outcomes[k] for k in ("completed", "refused", "lost", "dropped", "failed", "expired")}
    if sum(ends.values()) != load.scheduled:
        out.append(f"outcomes {ends} add up to {sum(ends.values())}, not the {load.scheduled} scheduled")
    if ends["expired"] or ends["dropped"]:
        out.append(f"{ends['expired']} expired and {ends['dropped']} dropped tasks")
    faults = exp.faults
    lossy = {f.node for f in faults if f.kind == "fail"}  # and every node of a process killed
    lossy |= {k for a in outcome.actions if a["kind"] == "kill" for k in a["nodes"]}
    # a restarted dispatcher is back once it has heard from every node process (FIRST_CONTACT at most)
    back = (FIRST_CONTACT + 2.0) / exp.run.time_scale
    restarted = {(f.dispatcher, f.until + back) for f in faults if f.kind == "restart_dispatcher"}
    for t, how, node in load.failures:
        if how == "lost" and node not in lossy:
            out.append(f"a task lost with node {node} at model time {t:.4g}: neither killed nor failing")
        d = outcome.routes.get(t, -1)
        if how in ("failed", "refused") and not any(d == r and t <= b for r, b in restarted):
            out.append(f"a task {how} at dispatcher {d} at model time {t:.4g}: it was not being restarted")
    if not healed(exp, outcome.pictures):
        truth = f"all {exp.n} nodes up and idle"
        out.append(f"the dispatchers' pictures {outcome.pictures} are not the nodes' truth ({truth})")
    if outcome.nodes_busy:
        out.append(f"the nodes still held {outcome.nodes_busy:g} tasks after the load")
    if outcome.leftover:
        out.append(f"processes left after down: {outcome.leftover}")
    return out[:20]
