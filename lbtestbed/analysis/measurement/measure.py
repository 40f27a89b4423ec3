"""What a cluster run measured, in the simulator's terms: a ``RawRun`` built from metric snapshots.

The snapshots are taken at the batch boundaries of the measured window, so every ratio the simulator estimates
by batch means has its cluster counterpart batch by batch: time averages from the increase of the nodes'
integral counters over the increase of their processes' model clocks (exact: docs/design.md, principle 5),
messages per task from the increase of the per-kind counters over the dispatchers' decisions, what the policy
learns from the dispatchers' integral of it. Sojourn times come from the load generator's per-task records,
batched by intended arrival time, as the simulator batches its tasks. ``summarize`` then turns it into the
same result object as a simulation.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lbtestbed.analysis.measurement.scrape import ScrapeError, Snapshot
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.loadgen.openloop import TaskRecord
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import policy_of

NODE_CLOCK = "lbtestbed_node_model_seconds_total"
OCCUPANCY = "lbtestbed_node_occupancy_model_seconds_total"
IDLE_CAPACITY = "lbtestbed_node_idle_capacity_model_seconds_total"
DISPATCHER_CLOCK = "lbtestbed_dispatcher_model_seconds_total"


@dataclass
class Totals:
    """Cluster-wide sums at one snapshot, each a cumulative quantity whose increase is measured."""

    node_time: float  # sum over nodes of the model time their occupancy integrals cover
    class_time: np.ndarray  # the same per class
    task_s: float
    util_s: float
    idle: float  # node-seconds with no task
    idle_speed: float  # the same weighted by speed
    time_at: list[np.ndarray]  # per class: node-seconds with exactly x tasks
    decisions: float
    outcomes: dict[str, float]
    messages: dict[str, float]
    r_area: float
    dispatcher_time: float  # sum over dispatchers of their model clocks
    dispatcher_tasks: float  # sum over dispatchers of their integrals of tasks accepted and not answered


def totals(exp: Experiment, snap: Snapshot) -> Totals:
    classes = {c.name: i for i, c in enumerate(exp.classes)}
    C = len(exp.classes)
    class_time = np.zeros(C)
    node_time = task_s = util_s = idle = idle_speed = 0.0
    at: list[dict[int, float]] = [defaultdict(float) for _ in range(C)]
    decisions = r_area = dispatcher_time = dispatcher_tasks = 0.0
    learned = policy_of(exp).learned  # integrated by the dispatchers: its time average is a metric
    outcomes: dict[str, float] = defaultdict(float)
    messages: dict[str, float] = defaultdict(float)
    for key, proc in snap.processes.items():
        speeds = {node: v for (node, _), v in proc.by("lbtestbed_node_speed", "node", "class").items()}
        idle_capacity = {node: v for (node,), v in proc.by(IDLE_CAPACITY, "node").items()}
        for (node, cls, tasks), seconds in proc.by(OCCUPANCY, "node", "class", "tasks").items():
            if cls not in classes or node not in speeds or node not in idle_capacity:
                raise ScrapeError(
                    f"{key}: node {node} of class {cls!r} is not a node of {exp.source}: is this its cluster?"
                )
            # the node's own occupancy integrals sum to the model time they cover (exactly the window)
            c = classes[cls]
            at[c][int(tasks)] += seconds
            node_time += seconds
            class_time[c] += seconds
            if tasks == "0":
                idle += seconds
                # the node's own integral of its speed while idle: exact when its speed changes too
                idle_speed += idle_capacity[node]
        task_s += proc.value("lbtestbed_node_task_model_seconds_total")
        util_s += proc.value("lbtestbed_node_utility_model_seconds_total")
        for (kind,), v in proc.by("lbtestbed_node_messages_sent_total", "kind").items():
            messages[kind] += v
        for (kind,), v in proc.by("lbtestbed_dispatcher_messages_sent_total", "kind").items():
            messages[kind] += v
        decisions += proc.value("lbtestbed_dispatcher_decisions_total")
        for (outcome,), v in proc.by("lbtestbed_dispatcher_decisions_total", "outcome").items():
            outcomes[outcome] += v
        if learned is not None:
            r_area += proc.value(f"lbtestbed_dispatcher_{learned.name}_model_seconds_total")
        dispatcher_time += proc.value(DISPATCHER_CLOCK)
        dispatcher_tasks += proc.value("lbtestbed_dispatcher_task_model_seconds_total")
    time_at = []
    for c in range(C):
        width = max(at[c], default=-1) + 1
        time_at.append(np.array([at[c].get(x, 0.0) for x in range(width)]))
    return Totals(
        node_time,
        class_time,
        task_s,
        util_s,
        idle,
        idle_speed,
        time_at,
        decisions,
        dict(outcomes),
        dict(messages),
        r_area,
        dispatcher_time,
        dispatcher_tasks,
    )


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    width = max(len(a), len(b))
    return np.pad(b, (0, width - len(b))) - np.pad(a, (0, width - len(a)))


def cluster_raw(
    exp: Experiment,
    snaps: Sequence[Snapshot],
    records: Sequence[TaskRecord],
    keep: Sequence[bool] | None = None,
) -> RawRun:
    """The measurements of the window [snaps[0], snaps[-1]], one batch between consecutive snapshots.

    The snapshots are meant to fall at model times warmup + b * duration / B of the load's schedule.
    ``records`` are the load generator's completed tasks; a task belongs to the batch its intended arrival
    time ``t`` (model seconds from the start of the load) falls in. ``keep``: the batches to report (the
    others are dropped: a fault disturbed them); all by default.
    """
    raw = _all_batches(exp, snaps, records)
    if keep is None or all(keep):
        return raw
    if len(keep) != raw.batches or sum(keep) < 2:
        raise ValueError(f"keep {sum(keep)} of {raw.batches} batches: at least two must remain")
    return raw.only([b for b, k in enumerate(keep) if k])


def _all_batches(exp: Experiment, snaps: Sequence[Snapshot], records: Sequence[TaskRecord]) -> RawRun:
    B = len(snaps) - 1
    if B < 1:
        raise ValueError("a measured window needs at least two snapshots")
    kinds = exp.policy.message_kinds()
    raw = RawRun(batches=B, message_kinds=kinds)
    tot = [totals(exp, s) for s in snaps]
    pairs = list(itertools.pairwise(tot))
    n = exp.n

    def d(attr: str) -> np.ndarray:
        return np.array([getattr(b, attr) - getattr(a, attr) for a, b in pairs], dtype=float)

    node_time = d("node_time")
    T = node_time / n  # model seconds per batch, averaged over the node processes
    raw.ratios["mean_tasks_per_node"] = (d("task_s"), node_time)
    if all(c.utility is not None for c in exp.classes):
        raw.ratios["utility"] = (d("util_s"), node_time)
    if "pool" not in {c.discipline for c in exp.classes}:
        raw.ratios["idle_capacity"] = (d("idle_speed"), T)
        raw.ratios["idle_nodes"] = (d("idle"), T)
    # from acceptance to answer at every dispatcher, as the simulator counts it (probes, forwarding included)
    dispatchers = max(1, sum(1 for p in snaps[0].processes.values() if p.value(DISPATCHER_CLOCK) > 0))
    raw.ratios["tasks_in_system"] = (d("dispatcher_tasks"), d("dispatcher_time") / dispatchers)
    for c in range(len(exp.classes)):
        per_batch = [_diff(a.time_at[c], b.time_at[c]) for a, b in pairs]
        width = max(len(x) for x in per_batch)
        grid = np.array([np.pad(x, (0, width - len(x))) for x in per_batch])
        tails = np.cumsum(grid[:, ::-1], axis=1)[:, ::-1]
        den = np.array([b.class_time[c] - a.class_time[c] for a, b in pairs])
        for j in range(width):
            raw.ratios[f"tail:{c}:{j}"] = (tails[:, j], den)
    decisions = d("decisions")
    total_msgs = np.zeros(B)
    for kind in kinds:
        a = np.array([b.messages.get(kind, 0.0) - a.messages.get(kind, 0.0) for a, b in pairs])
        total_msgs += a
        raw.ratios[f"messages:{kind}"] = (a, decisions)
    raw.ratios["messages_per_task"] = (total_msgs, decisions)
    learned = policy_of(exp).learned
    if learned is not None:
        raw.ratios[learned.name] = (d("r_area"), d("dispatcher_time"))
    raw.decisions = {
        k: int(tot[-1].outcomes.get(k, 0.0) - tot[0].outcomes.get(k, 0.0)) for k in tot[-1].outcomes
    }

    # tasks, batched by intended arrival time
    batch_len = exp.run.duration / B
    node_class = exp.node_class
    fcfs = [exp.classes[node_class[k]].discipline == "fcfs" for k in range(n)]
    sojourn: list[list[float]] = [[] for _ in range(B)]
    by_class: list[list[list[float]]] = [[[] for _ in range(B)] for _ in exp.classes]
    waits, fcfs_arrivals = np.zeros(B), np.zeros(B)
    overhead = np.zeros(B)
    for rec in records:
        b = int((rec.t - exp.run.warmup) // batch_len)
        if not 0 <= b < B or not 0 <= rec.node < n:
            continue
        sojourn[b].append(rec.sojourn)
        by_class[node_class[rec.node]][b].append(rec.sojourn)
        overhead[b] += rec.sojourn - rec.stay
        if fcfs[rec.node]:
            fcfs_arrivals[b] += 1
            waits[b] += rec.waited
    counts = np.array([len(s) for s in sojourn], float)
    raw.ratios["mean_sojourn"] = (np.array([sum(s) for s in sojourn]), counts)
    raw.ratios["network_overhead"] = (overhead, counts)
    for c, sc in enumerate(by_class):
        raw.ratios[f"sojourn:{c}"] = (np.array([sum(s) for s in sc]), np.array([len(s) for s in sc], float))
    if any(fcfs):
        raw.ratios["wait_probability"] = (waits, fcfs_arrivals)
    raw.sojourns = sojourn
    return raw
