"""What a simulation measures: the window's batches, exact time integrals, sojourns, messages, decisions.

The measured window [warmup, warmup + duration] is cut into equal batches. Time averages are exact: the
nodes integrate their own occupancy (``model.nodes``), the kernel the number of tasks in the system (and
its square), this the policy's learned quantity (``policies.unit.Learned``: a learned index), each at every
change, and each batch boundary takes a snapshot of every integral; a batch's value is the difference of two
snapshots. A task counts in the batch of its arrival, and every task that arrives in the window is
followed to its end (``outstanding`` counts those still in the system), so sojourn times are not censored
unless the run's drain ends first.
"""

from __future__ import annotations

from array import array
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import NodeModel
from lbtestbed.policies import DispatcherSide, policy_of


class Measurement:
    """The measured quantities of one run, batch by batch (module docstring)."""

    def __init__(self, exp: Experiment, dispatchers: Sequence[DispatcherSide]) -> None:
        self.exp = exp
        run = exp.run
        self.t_start = run.warmup
        self.t_end = run.warmup + run.duration
        self.B = B = run.batches
        self.batch_len = run.duration / run.batches
        self.batch = -1  # the current batch, -1 outside the window
        self.outstanding = 0  # tasks that arrived in the window and are still in the system
        self.in_system = 0  # tasks in the system when the run ended (the kernel integrates them as it runs)
        # per batch
        self.kinds = exp.policy.message_kinds()
        self.msg_counts = {kind: [0] * B for kind in self.kinds}
        self.arrivals = [0] * B
        self.fcfs_arrivals = [0] * B
        self.fcfs_waits = [0] * B
        # sojourns by batch (and by class and batch): appended to plain lists as tasks leave (the fastest
        # append there is), moved at every batch boundary into arrays of doubles, 8 bytes a sojourn instead
        # of the 40 of a float object in a list (a million nodes make 16 million sojourns in 20 s)
        self.recent: list[list[float]] = [[] for _ in range(B)]
        self.recent_class: list[list[list[float]]] = [[[] for _ in range(B)] for _ in exp.classes]
        self.sojourn: list[array[float]] = [array("d") for _ in range(B)]
        self.sojourn_class: list[list[array[float]]] = [[array("d") for _ in range(B)] for _ in exp.classes]
        self.decisions: Counter[str] = Counter()
        self.snapshots: list[dict[str, object]] = []
        # the learned quantity, called r here: ``learner`` is dispatcher 0; with several, ``learners``
        # holds them all and the measured r is their mean, which any message may change (a full view
        # adopts r from tokens)
        self.learned = policy_of(exp).learned
        # untyped: learned_value() is declared float, and compiled code would turn a learned integer into
        # a float there; the measurement keeps the value the policy gives (an int prints as one)
        self.learner: Any = dispatchers[0] if self.learned is not None else None
        self.learners: list[Any] = (
            list(dispatchers) if self.learned is not None and len(dispatchers) > 1 else []
        )
        self.r: int | float = (
            1  # an int while one dispatcher learns it (or several agree): r_time keys print so
        )
        self.r_last = 0.0
        self.r_area = 0.0
        self.r_time: defaultdict[int | float, float] = defaultdict(float)
        self.r_series: list[tuple[float, int | float]] = []

    def window(self) -> tuple[list[float], float]:
        """The batch boundaries of the measured window, and the model time the run may drain until."""
        boundaries = [self.t_start + b * self.batch_len for b in range(self.B)] + [self.t_end]
        return boundaries, self.t_end + self.exp.run.duration

    # ------------------------------------------------------------------------------------- changes

    def count(self, kind: str, times: int = 1) -> None:
        """``times`` messages of ``kind`` sent now."""
        if self.batch >= 0:
            self.msg_counts[kind][self.batch] += times

    def r_changes(self, t: float, r: int | float) -> None:
        """The learned quantity is ``r`` from ``t`` on."""
        dt = t - self.r_last
        self.r_area += self.r * dt
        if self.batch >= 0:
            self.r_time[self.r] += dt
            if r != self.r:
                self.r_series.append((t, r))
        self.r_last = t
        self.r = r

    def follow_learners(self, t: float) -> None:
        """Several learning dispatchers: integrate their mean, if it changed since the last event."""
        total, k = sum(d.learned_value() for d in self.learners), len(self.learners)
        r = total // k if total % k == 0 else total / k  # an integer while they agree
        if r != self.r:
            self.r_changes(t, r)

    # ------------------------------------------------------------------------------------ snapshots

    def boundary(self, t: float, nodes: Sequence[NodeModel], tot: float, tot2: float) -> None:
        """Close the batch that ends at t (or open the first one) and step to the next; ``tot`` and
        ``tot2`` are the integrals of the number of tasks in the system and of its square up to ``t``."""
        # per-class sums of the nodes' time_at, node by node in order; plain floats add exactly as numpy
        # would, without a numpy call per node
        sums: list[list[float]] = [[0.0] for _ in self.exp.classes]
        task_s = util_s = idle_speed = idle = 0.0
        node_class = self.exp.node_class
        for k, node in enumerate(nodes):
            node.advance(t)
            ta = node.time_at
            acc = sums[node_class[k]]
            if len(ta) > len(acc):
                acc.extend([0.0] * (len(ta) - len(acc)))
            for j, v in enumerate(ta):
                acc[j] += v
            task_s += node.task_seconds
            util_s += node.utility_seconds
            idle_speed += node.idle_capacity_seconds()  # exact under speed changes too
            idle += ta[0]
        self.snapshot(t, sums, task_s, util_s, idle_speed, idle, tot, tot2)

    def snapshot(
        self,
        t: float,
        time_at: list[list[float]],
        task_s: float,
        util_s: float,
        idle_speed: float,
        idle: float,
        tot: float,
        tot2: float,
    ) -> None:
        """``boundary`` with the integrals up to ``t`` summed already: per class, the node-seconds at
        exactly j tasks (``time_at``), task-seconds, utility-seconds, speed x idle seconds and idle
        node-seconds of all nodes, and the tasks in the system's two integrals."""
        if self.learner is not None:
            self.r_changes(t, self.r)
        self.snapshots.append(
            {
                "time_at": [np.array(acc) for acc in time_at],
                "task_s": task_s,
                "util_s": util_s,
                "idle_speed": idle_speed,
                "idle": idle,
                "tot": tot,
                "tot2": tot2,
                "r": self.r_area,
            }
        )
        # snapshot b opens batch b; snapshot B closes the window
        self.batch = len(self.snapshots) - 1 if len(self.snapshots) <= self.B else -1
        if self.learner is not None and len(self.snapshots) in (1, self.B + 1):
            self.r_series.append((t, self.r))  # the series starts and ends with the window
        self._keep()

    def count_instant_probes(self, probes: int, outcome: str) -> None:
        """A driver's instant probes (``policies.sampling.InstantProbe``): every task of the window probed
        ``probes`` nodes, each answered, and was routed by the one rule ``outcome``."""
        for kind in ("probe", "probe_reply"):
            counts = self.msg_counts[kind]
            for b, a in enumerate(self.arrivals):
                counts[b] += probes * a
        if any(self.arrivals):
            self.decisions[outcome] += sum(self.arrivals)

    def sojourns(self) -> tuple[list[list[float]], list[list[list[float]]] | None]:
        """Where a driver appends each sojourn: by batch, and by class and batch unless there is one class
        (a single class's sojourns are all the sojourns)."""
        return self.recent, self.recent_class if len(self.recent_class) > 1 else None

    def _keep(self) -> None:
        """Move the sojourns appended since the last boundary into the arrays."""
        for kept, recent in zip(self.sojourn, self.recent, strict=True):
            kept.extend(recent)
            recent.clear()
        if len(self.recent_class) > 1:
            for by_batch, recent_by_batch in zip(self.sojourn_class, self.recent_class, strict=True):
                for kept, recent in zip(by_batch, recent_by_batch, strict=True):
                    kept.extend(recent)
                    recent.clear()

    def finish(self) -> None:
        """The run is over: every sojourn into the arrays."""
        self._keep()
        if len(self.sojourn_class) == 1:
            self.sojourn_class[0] = self.sojourn

    # ------------------------------------------------------------------------------------------ raw

    def raw(self, events: int, wall: float) -> RawRun:
        """The run's record, batch by batch."""
        exp, B, T = self.exp, self.B, self.batch_len
        snaps = self.snapshots
        raw = RawRun(batches=B, message_kinds=self.kinds)

        def diff(key: str) -> np.ndarray:
            return np.array([float(snaps[b + 1][key]) - float(snaps[b][key]) for b in range(B)])  # type: ignore[arg-type]

        ones = np.full(B, T)
        n = exp.n
        raw.ratios["mean_tasks_per_node"] = (diff("task_s"), ones * n)
        if all(c.utility is not None for c in exp.classes):
            raw.ratios["utility"] = (diff("util_s"), ones * n)
        if "pool" not in {c.discipline for c in exp.classes}:  # a pool has no capacity to leave idle
            raw.ratios["idle_capacity"] = (diff("idle_speed"), ones)
            raw.ratios["idle_nodes"] = (diff("idle"), ones)
        raw.ratios["tasks_in_system"] = (diff("tot"), ones)
        raw.ratios["tasks_in_system_sq"] = (diff("tot2"), ones)
        for c, cls in enumerate(exp.classes):
            self._tails(raw, c, cls.count, ones)
        arrivals = np.array(self.arrivals, dtype=float)
        total_msgs = np.zeros(B)
        for kind, counts in self.msg_counts.items():
            a = np.array(counts, dtype=float)
            total_msgs += a
            raw.ratios[f"messages:{kind}"] = (a, arrivals)
        raw.ratios["messages_per_task"] = (total_msgs, arrivals)
        if any(c.discipline == "fcfs" for c in exp.classes):
            raw.ratios["wait_probability"] = (
                np.array(self.fcfs_waits, float),
                np.array(self.fcfs_arrivals, float),
            )
        raw.ratios["mean_sojourn"] = (
            np.array([sum(s) for s in self.sojourn]),
            np.array([len(s) for s in self.sojourn], float),
        )
        for c in range(len(exp.classes)):
            sc = self.sojourn_class[c]
            raw.ratios[f"sojourn:{c}"] = (
                np.array([sum(s) for s in sc]),
                np.array([len(s) for s in sc], float),
            )
        if self.learner is not None and self.learned is not None:
            raw.ratios[self.learned.name] = (diff("r"), ones)
            raw.r_time = dict(self.r_time)
            raw.r_series = self.r_series
            raw.stale_tokens = self.learner.stale_tokens
        raw.sojourns = self.sojourn
        raw.decisions = dict(self.decisions)
        raw.censored = self.outstanding
        raw.events = events
        raw.wall_seconds = wall
        return raw

    def _tails(self, raw: RawRun, c: int, count: int, ones: np.ndarray) -> None:
        """Class ``c``'s time at x or more tasks per node, batch by batch (``tail:c:x``)."""
        snaps = self.snapshots
        width = max(len(s["time_at"][c]) for s in snaps)  # type: ignore[index]
        padded = [np.pad(s["time_at"][c], (0, width - len(s["time_at"][c]))) for s in snaps]  # type: ignore[index]
        per_batch = np.array(
            [padded[b + 1] - padded[b] for b in range(self.B)]
        )  # (B, width): time at exactly x
        tails = np.cumsum(per_batch[:, ::-1], axis=1)[:, ::-1]  # time at x or more
        for j in range(width):
            raw.ratios[f"tail:{c}:{j}"] = (tails[:, j], ones * count)
