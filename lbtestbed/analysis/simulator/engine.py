"""The discrete-event simulator: the spec's nodes and both halves of its policy on a virtual clock.

No policy rule lives here. The simulator draws the workload, hands each task to the dispatcher side, carries
probes, tasks and state messages between the policy objects (at once, or after the spec's network delay)
and measures. Time averages are exact: nodes integrate their occupancy (``model.nodes``), the
simulator integrates the number of tasks in the system and SLTA's r. The measured window
[warmup, warmup + duration] is cut into equal batches; every task that arrives in it is followed to its
completion, so sojourn times are not censored.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.model.conditions import fail_windows, failing, speed_changes
from lbtestbed.model.distributions import BlockSampler
from lbtestbed.model.experiment import MAX_DISPATCHERS, Experiment
from lbtestbed.model.nodes import NodeModel, make_node
from lbtestbed.model.streams import seed_sequence, seeded_random
from lbtestbed.model.workload import DispatcherSplit, PoissonWorkload, Task
from lbtestbed.policies import (
    DispatcherSide,
    Message,
    NodeSide,
    Probe,
    Route,
    make_dispatcher,
    make_node_sides,
    policy_of,
)
from lbtestbed.policies.sampling import InstantProbe

INF = math.inf

# event kinds in the heap
(
    _COMPLETE,
    _AT_DISPATCHER,
    _AT_NODE,
    _PROBE_AT_NODE,
    _REPLY_AT_DISPATCHER,
    _TASK_AT_NODE,
    _DONE_AT_DISPATCHER,
    _SPEED,
) = range(8)

Progress = Callable[[float], None]  # called with the fraction of model time done


class _Pending:
    """A task waiting for its probe replies."""

    __slots__ = ("missing", "probe", "replies", "task")

    def __init__(self, task: Task, probe: Probe) -> None:
        self.task, self.probe = task, probe
        self.replies = [0] * len(probe.nodes)
        self.missing = len(probe.nodes)


def _own_stream(exp: Experiment, replication: int, i: int) -> random.Random:
    """The random stream of the simulator's dispatcher ``i`` >= 1 in ``replication``."""
    return seeded_random(exp.seed, "dispatchers", replication * MAX_DISPATCHERS + i)


class Simulator:
    """One replication of an experiment."""

    def __init__(self, exp: Experiment, replication: int = 0, progress: Progress | None = None) -> None:
        self.exp = exp
        self.progress = progress
        self.workload = PoissonWorkload(exp, replication)
        policy_rng = seeded_random(exp.seed, "policy", replication)
        k = exp.policy.dispatchers
        # dispatcher 0 shares its stream with the node sides, as one alone does; the others have theirs
        self.dispatcher = make_dispatcher(exp, policy_rng, 0, k)
        self.dispatchers = [self.dispatcher] + [
            make_dispatcher(exp, _own_stream(exp, replication, i), i, k) for i in range(1, k)
        ]
        self.split = DispatcherSplit(exp, replication)
        self.sides = make_node_sides(exp, policy_rng, dispatchers=k, replication=replication)
        # node sides that learn from each task's latency (Prequal): what each task found on arrival, and when
        self.records_latency = any(type(s).records_latency for s in self.sides)
        self.at_node: dict[int, tuple[int, float]] = {}
        self.nodes: list[NodeModel] = [
            make_node(exp.classes[c].discipline, s, exp.classes[c].utility)
            for c, s in zip(exp.node_class, exp.node_speeds, strict=True)
        ]
        net = exp.network
        self.delay: Callable[[], float] | None = None
        if net.delay is not None:
            self.delay = BlockSampler(
                net.delay, np.random.default_rng(seed_sequence(exp.seed, "network", replication))
            )
        self.delay_tasks = net.forward_tasks and self.delay is not None
        # gray failures (model.conditions): timed speed changes, and nodes that fail some of their tasks
        self.speed_changes = speed_changes(exp, replication)
        self.fail_windows = fail_windows(exp)
        self.fault_rng = seeded_random(exp.seed, "faults", replication) if self.fail_windows else None
        self.failed = 0  # tasks a failing node refused
        self.heap: list[tuple[float, int, int, object, object]] = []
        self.seq = itertools.count()
        self.version = [0] * exp.n
        self.scheduled = [INF] * exp.n
        self.now = 0.0
        # when each task in flight was forwarded, by id: its latency at the dispatcher (on_task_done)
        self.forwarded: dict[int, float] = {}
        # measurement state
        run = exp.run
        self.t_start = run.warmup
        self.t_end = run.warmup + run.duration
        self.B = run.batches
        self.batch_len = run.duration / run.batches
        self.batch = -1  # current batch, -1 outside the window
        self.outstanding = 0  # measured tasks not yet completed
        self.in_system = 0
        self.tot_last = 0.0
        self.tot_area = 0.0
        self.tot_area2 = 0.0
        self._bind_learner()
        self.r: int | float = (
            1  # an int while one dispatcher learns it (or several agree): r_time keys print as such
        )
        self.r_last = 0.0
        self.r_area = 0.0
        self.events = 0
        kinds = exp.policy.message_kinds()
        self.kinds = kinds
        B = self.B
        self.msg_counts = {kind: [0] * B for kind in kinds}
        self.arrivals = [0] * B
        self.fcfs_arrivals = [0] * B
        self.fcfs_waits = [0] * B
        self.sojourn = [[] for _ in range(B)]  # type: list[list[float]]
        self.sojourn_class = [[[] for _ in range(B)] for _ in exp.classes]  # type: list[list[list[float]]]
        self.decisions: Counter[str] = Counter()
        self.r_time: defaultdict[int | float, float] = defaultdict(float)
        self.r_series: list[tuple[float, int | float]] = []
        self.snapshots: list[dict[str, object]] = []
        self.is_fcfs = [n.discipline == "fcfs" for n in self.nodes]

    def _bind_learner(self) -> None:
        """What the policy learns (``unit.Learned``, SLTA's r), called r here: ``learner`` is dispatcher 0;
        with several, ``learners`` holds them all and the measured r is their mean, which any message may
        change (a full view adopts r from tokens)."""
        d0 = self.dispatcher
        self.learner = d0 if policy_of(self.exp).learned is not None else None
        several = self.learner is not None and len(self.dispatchers) > 1
        self.learners = list(self.dispatchers) if several else []

    def _r_follow(self) -> None:
        """Several learning dispatchers: integrate their mean r, if it changed since the last event."""
        total, k = sum(d.learned_value() for d in self.learners), len(self.learners)
        r = total // k if total % k == 0 else total / k  # an integer while they agree
        if r != self.r:
            self._r_changes(self.now, r)

    # ------------------------------------------------------------------------------------- plumbing

    def _push(self, t: float, kind: int, a: object, b: object = None) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, a, b))

    def _count(self, kind: str, times: int = 1) -> None:
        if self.batch >= 0:
            self.msg_counts[kind][self.batch] += times

    def _message_delay(self, m: Message, answer: bool) -> float | None:
        """How long the state message ``m`` travels (None: it arrives at once); ``answer``: it answers a
        message of the receiver's. The spec's network delay; the twin replays measured ages instead."""
        return self.delay() if self.delay is not None else None

    def _to_dispatcher(self, msgs: tuple[Message, ...], answer: bool = False) -> None:
        for m in msgs:
            self._count(m.kind)
            delay = self._message_delay(m, answer)
            if delay is not None:
                self._push(self.now + delay, _AT_DISPATCHER, m)
            else:
                out = self.dispatchers[m.dispatcher].on_message(m)
                if out:
                    self._to_nodes(out)

    def _to_nodes(self, msgs: tuple[Message, ...]) -> None:
        for m in msgs:
            self._count(m.kind)
            delay = self._message_delay(m, False)
            if delay is not None:
                self._push(self.now + delay, _AT_NODE, m)
            else:
                out = self.sides[m.node].on_message(m, self.nodes[m.node].x)
                if out:
                    self._to_dispatcher(out, answer=True)

    def _reschedule(self, k: int) -> None:
        t = self.nodes[k].next_completion()
        if t != self.scheduled[k]:
            self.version[k] += 1
            self.scheduled[k] = t
            if t < INF:
                heapq.heappush(self.heap, (t, next(self.seq), _COMPLETE, k, self.version[k]))

    def _total_changes(self, t: float, step: int) -> None:
        dt = t - self.tot_last
        n = self.in_system
        self.tot_area += n * dt
        self.tot_area2 += n * n * dt
        self.tot_last = t
        self.in_system = n + step

    def _r_changes(self, t: float, r: int | float) -> None:
        dt = t - self.r_last
        self.r_area += self.r * dt
        if self.batch >= 0:
            self.r_time[self.r] += dt
            if r != self.r:
                self.r_series.append((t, r))
        self.r_last = t
        self.r = r

    # --------------------------------------------------------------------------------------- events

    def _arrival(self, t: float, work: float) -> None:
        origin = self.split.next()
        task = Task(self.workload.count, work, t, origin, self.batch)
        self._total_changes(t, +1)
        if self.batch >= 0:
            self.arrivals[self.batch] += 1
            self.outstanding += 1
        decision = self.dispatchers[origin].dispatch()
        if isinstance(decision, Probe):
            self._probe(task, decision)
        else:
            self._route(task, decision)

    def _probe(self, task: Task, probe: Probe) -> None:
        d = len(probe.nodes)
        if self.delay is None:
            # a probe and its reply, delivered at once: the same two messages without the envelopes
            if self.batch >= 0:
                self.msg_counts["probe"][self.batch] += d
                self.msg_counts["probe_reply"][self.batch] += d
            sides, nodes = self.sides, self.nodes
            replies = [sides[k].probe_reply(nodes[k].x) for k in probe.nodes]
            self._route(task, self.dispatchers[task.origin].resolve(probe, replies))
            return
        pending = _Pending(task, probe)
        for i in range(d):
            self._count("probe")
            self._push(self.now + self.delay(), _PROBE_AT_NODE, pending, i)

    def _route(self, task: Task, route: Route) -> None:
        if task.batch >= 0:
            self.decisions[route.outcome] += 1
        if self.learner is not None and not self.learners and self.learner.learned_value() != self.r:
            self._r_changes(self.now, self.learner.learned_value())
        self.forwarded[task.id] = self.now
        if self.delay_tasks:
            assert self.delay is not None
            self._push(self.now + self.delay(), _TASK_AT_NODE, task, route)
        else:
            self._task_at_node(task, route)

    def _task_at_node(self, task: Task, route: Route) -> None:
        k = route.node
        if self.fault_rng is not None:
            fraction = failing(self.fail_windows, k, self.now)
            if fraction and self.fault_rng.random() < fraction:
                self._failed_at_node(task, k)
                return
        node = self.nodes[k]
        waits = node.arrive(task, self.now)
        if self.records_latency:
            self.at_node[task.id] = (node.x - 1, self.now)
        if task.batch >= 0 and self.is_fcfs[k]:
            self.fcfs_arrivals[task.batch] += 1
            self.fcfs_waits[task.batch] += waits
        self._reschedule(k)
        msgs = self.sides[k].on_arrival(node.x, task.origin, route.piggyback)
        if msgs:
            self._to_dispatcher(msgs)
        if route.messages:
            self._to_nodes(route.messages)

    def _failed_at_node(self, task: Task, k: int) -> None:
        """Node ``k`` failed ``task`` (a fail fault): never admitted, it leaves the system now, and its
        dispatcher hears of it with the node's answer, as the cluster's does: the task is done, and it
        failed."""
        self.failed += 1
        self._total_changes(self.now, -1)
        if task.batch >= 0:
            self.outstanding -= 1
        dispatcher = self.dispatchers[task.origin]
        dispatcher.on_task_done(k, self.now - self.forwarded.pop(task.id))
        dispatcher.on_task_failed(k)

    def _completion(self, t: float, k: int) -> None:
        node = self.nodes[k]
        task = node.complete(t)
        self.scheduled[k] = INF
        self._reschedule(k)
        self._total_changes(t, -1)
        if task.batch >= 0:
            s = t - task.arrived
            self.sojourn[task.batch].append(s)
            self.sojourn_class[self.exp.node_class[k]][task.batch].append(s)
            self.outstanding -= 1
        if self.records_latency:
            found, at = self.at_node.pop(task.id)
            self.sides[k].on_served(found, t - at)
        msgs = self.sides[k].on_departure(node.x, task.origin)
        if msgs:
            self._to_dispatcher(msgs)
        forwarded = self.forwarded.pop(task.id)
        if self.delay_tasks:
            assert self.delay is not None
            back = t + self.delay()  # the answer's way back to the dispatcher
            self._push(back, _DONE_AT_DISPATCHER, k, (task.origin, back - forwarded))
        else:
            self.dispatchers[task.origin].on_task_done(k, t - forwarded)

    def _heap_event(self, kind: int, a: object, b: object) -> None:
        if kind == _AT_DISPATCHER:
            assert isinstance(a, Message)
            out = self.dispatchers[a.dispatcher].on_message(a)
            if out:
                self._to_nodes(out)
        elif kind == _AT_NODE:
            assert isinstance(a, Message)
            out = self.sides[a.node].on_message(a, self.nodes[a.node].x)
            if out:
                self._to_dispatcher(out, answer=True)
        elif kind == _PROBE_AT_NODE:
            assert isinstance(a, _Pending) and isinstance(b, int)
            k = a.probe.nodes[b]
            (reply,) = self.sides[k].on_message(Message("probe", k), self.nodes[k].x)
            self._count("probe_reply")
            assert self.delay is not None
            self._push(self.now + self.delay(), _REPLY_AT_DISPATCHER, a, (b, reply.data[0]))
        elif kind == _REPLY_AT_DISPATCHER:
            assert isinstance(a, _Pending) and isinstance(b, tuple)
            a.replies[b[0]] = b[1]
            a.missing -= 1
            if a.missing == 0:
                self._route(a.task, self.dispatchers[a.task.origin].resolve(a.probe, a.replies))
        elif kind == _TASK_AT_NODE:
            assert isinstance(a, Task) and isinstance(b, Route)
            self._task_at_node(a, b)
        elif kind == _DONE_AT_DISPATCHER:
            assert isinstance(a, int) and isinstance(b, tuple)
            origin, latency = b
            self.dispatchers[origin].on_task_done(a, latency)
        elif kind == _SPEED:
            assert isinstance(a, int) and isinstance(b, float)
            self.nodes[a].set_speed(self.now, self.exp.node_speeds[a] * b)
            self._reschedule(a)

    # ---------------------------------------------------------------------------------- measurement

    def _boundary(self, t: float) -> None:
        """Close the batch that ends at t (or open the first one) and step to the next."""
        self.now = t
        self._total_changes(t, 0)
        if self.learner is not None:
            self._r_changes(t, self.r)
        # per-class sums of the nodes' time_at, node by node in order; plain floats add exactly as numpy
        # would, without a numpy call per node
        sums: list[list[float]] = [[0.0] for _ in self.exp.classes]
        task_s = util_s = idle_speed = idle = 0.0
        node_class = self.exp.node_class
        for k, node in enumerate(self.nodes):
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
        self.snapshots.append(
            {
                "time_at": [np.array(acc) for acc in sums],
                "task_s": task_s,
                "util_s": util_s,
                "idle_speed": idle_speed,
                "idle": idle,
                "tot": self.tot_area,
                "tot2": self.tot_area2,
                "r": self.r_area,
            }
        )
        # snapshot b opens batch b; snapshot B closes the window
        self.batch = len(self.snapshots) - 1 if len(self.snapshots) <= self.B else -1
        if self.learner is not None and len(self.snapshots) in (1, self.B + 1):
            self.r_series.append((t, self.r))  # the series starts and ends with the window

    def _window(self) -> tuple[list[float], float]:
        """The batch boundaries of the measured window, and the model time the run may drain until."""
        boundaries = [self.t_start + b * self.batch_len for b in range(self.B)] + [self.t_end]
        return boundaries, self.t_end + self.exp.run.duration

    def run(self) -> RawRun:
        wall = time.perf_counter()
        boundaries, drain_until = self._window()
        gray = self.speed_changes or self.fail_windows  # the fused loops know neither
        fused = not gray and not self.records_latency  # nor a node side that learns latencies
        if self.delay is None and len(self.dispatchers) == 1 and fused:  # and one dispatcher
            self._run_direct(boundaries, drain_until)
        else:
            self._run_general(boundaries, drain_until)
        return self._raw(time.perf_counter() - wall)

    def _tick(self, t: float, horizon: float, report: list[float]) -> None:
        if self.progress is not None and time.perf_counter() > report[0]:
            report[0] = time.perf_counter() + 1.0
            self.progress(min(1.0, t / horizon))

    def _run_general(self, boundaries: list[float], drain_until: float) -> None:
        """Any network delay: every message, probe and (optionally) task travels through the event heap;
        so do the timed speed changes."""
        for c in self.speed_changes:
            self._push(c.at, _SPEED, c.node, c.factor)
        clocked = [d for d in self.dispatchers if d.uses_clock]  # they read the model time
        heap = self.heap
        pop = heapq.heappop
        bi = 0
        next_boundary = boundaries[0]
        t_arr, work = self.workload.next()
        report = [time.perf_counter() + 1.0]
        while True:
            t_heap = heap[0][0] if heap else INF
            t = t_arr if t_arr <= t_heap else t_heap
            # past the window: done once its tasks are (or the drain ends, or nothing is left to happen)
            if bi >= len(boundaries) and (self.outstanding == 0 or t > drain_until):
                break
            if t >= next_boundary:
                self._boundary(next_boundary)
                bi += 1
                next_boundary = boundaries[bi] if bi < len(boundaries) else INF
                continue
            self.now = t
            for d in clocked:
                d.now = t
            self.events += 1
            if t_arr <= t_heap:
                self._arrival(t, work)
                t_arr, work = self.workload.next()
            else:
                _, _, kind, a, b = pop(heap)
                if kind == _COMPLETE:
                    assert isinstance(a, int)
                    if b == self.version[a]:
                        self._completion(t, a)
                    else:
                        self.events -= 1  # a stale completion is no model event
                else:
                    self._heap_event(kind, a, b)
            if self.learners:
                self._r_follow()
            if not self.events & 0xFFFF:
                self._tick(t, drain_until, report)

    def _run_direct(self, boundaries: list[float], drain_until: float) -> None:
        """No network delay: the same steps as the general loop, fused into one function.

        Probes, tasks and messages are delivered at once, so the heap holds only completions, and the
        plumbing methods of the general loop are inlined here. Policy and node objects are called as usual.
        """
        disp, nodes, sides = self.dispatcher, self.nodes, self.sides
        plain_probe = all(type(s).probe_reply is NodeSide.probe_reply for s in sides)
        quiet_arrival = all(type(s).on_arrival is NodeSide.on_arrival for s in sides)
        quiet_departure = all(type(s).on_departure is NodeSide.on_departure for s in sides)
        ignores_done = type(disp).on_task_done is DispatcherSide.on_task_done
        clock = disp.uses_clock  # it reads the model time: set before every call
        instant_probe = getattr(disp, "instant_probe", None)
        if (
            instant_probe is not None
            and not clock
            and plain_probe
            and quiet_arrival
            and quiet_departure
            and ignores_done
            and self.learner is None
        ):
            occupancy = [node.x for node in nodes]
            fast = instant_probe(occupancy)
            if fast is not None:
                self._run_instant(boundaries, drain_until, fast, occupancy)
                return
        heap: list[tuple[float, int, int, int]] = []
        push, pop = heapq.heappush, heapq.heappop
        dispatch, resolve, on_done = disp.dispatch, disp.resolve, disp.on_task_done
        version, scheduled = self.version, self.scheduled
        probe_counts = self.msg_counts.get("probe")
        reply_counts = self.msg_counts.get("probe_reply")
        arrivals, fcfs_arrivals, fcfs_waits = self.arrivals, self.fcfs_arrivals, self.fcfs_waits
        is_fcfs, node_class = self.is_fcfs, self.exp.node_class
        sojourn, sojourn_class, decisions = self.sojourn, self.sojourn_class, self.decisions
        learner = self.learner
        workload = self.workload
        times, works = workload.next_block()
        ai, count = 0, 0
        t_arr, work = times[0], works[0]
        nb = len(boundaries)
        bi, next_boundary = 0, boundaries[0]
        batch = self.batch
        seq = 0
        n_sys, tot_last, tot_area, tot_area2 = self.in_system, self.tot_last, self.tot_area, self.tot_area2
        outstanding = self.outstanding
        events = 0
        report = [time.perf_counter() + 1.0]
        while True:
            t_heap = heap[0][0] if heap else INF
            t = t_arr if t_arr <= t_heap else t_heap
            if t >= next_boundary:
                self.in_system, self.tot_last, self.tot_area, self.tot_area2 = (
                    n_sys,
                    tot_last,
                    tot_area,
                    tot_area2,
                )
                self._boundary(next_boundary)
                n_sys, tot_last, tot_area, tot_area2 = (
                    self.in_system,
                    self.tot_last,
                    self.tot_area,
                    self.tot_area2,
                )
                batch = self.batch
                bi += 1
                next_boundary = boundaries[bi] if bi < nb else INF
                continue
            if bi >= nb and (outstanding == 0 or t > drain_until):
                break
            dt = t - tot_last
            tot_area += n_sys * dt
            tot_area2 += n_sys * n_sys * dt
            tot_last = t
            events += 1
            if t_arr <= t_heap:
                # arrival: dispatch (after probes), forward, let the node side speak
                self.now = t
                if clock:
                    disp.now = t
                count += 1
                task = Task(count, work, t, 0, batch)
                n_sys += 1
                if batch >= 0:
                    arrivals[batch] += 1
                    outstanding += 1
                decision = dispatch()
                if type(decision) is Probe:
                    pn = decision.nodes
                    if plain_probe:
                        replies = [nodes[j].x for j in pn]
                    else:
                        replies = [sides[j].probe_reply(nodes[j].x) for j in pn]
                    if batch >= 0 and probe_counts is not None and reply_counts is not None:
                        probe_counts[batch] += len(pn)
                        reply_counts[batch] += len(pn)
                    decision = resolve(decision, replies)
                assert isinstance(decision, Route)
                if batch >= 0:
                    decisions[decision.outcome] += 1
                if learner is not None and learner.learned_value() != self.r:
                    self._r_changes(t, learner.learned_value())
                k = decision.node
                node = nodes[k]
                waits = node.arrive(task, t)
                if batch >= 0 and is_fcfs[k]:
                    fcfs_arrivals[batch] += 1
                    fcfs_waits[batch] += waits
                nc = node.next_completion()
                if nc != scheduled[k]:
                    v = version[k] = version[k] + 1
                    scheduled[k] = nc
                    if nc < INF:
                        seq += 1
                        push(heap, (nc, seq, k, v))
                if not quiet_arrival:
                    msgs = sides[k].on_arrival(node.x, 0, decision.piggyback)
                    if msgs:
                        self._to_dispatcher(msgs)
                if decision.messages:
                    self._to_nodes(decision.messages)
                ai += 1
                if ai == len(times):
                    times, works = workload.next_block()
                    ai = 0
                t_arr, work = times[ai], works[ai]
            else:
                _, _, k, v = pop(heap)
                if v != version[k]:
                    events -= 1  # a stale completion is no model event
                    continue
                self.now = t
                if clock:
                    disp.now = t
                node = nodes[k]
                task = node.complete(t)
                n_sys -= 1
                nc = node.next_completion()
                v = version[k] = version[k] + 1
                scheduled[k] = nc
                if nc < INF:
                    seq += 1
                    push(heap, (nc, seq, k, v))
                b = task.batch
                if b >= 0:
                    s = t - task.arrived
                    sojourn[b].append(s)
                    sojourn_class[node_class[k]][b].append(s)
                    outstanding -= 1
                if not quiet_departure:
                    msgs = sides[k].on_departure(node.x, task.origin)
                    if msgs:
                        self._to_dispatcher(msgs)
                if not ignores_done:
                    on_done(k, t - task.arrived)  # forwarded at once on arrival
            if not events & 0xFFFF:
                self._tick(t, drain_until, report)
        self.in_system, self.tot_last, self.tot_area, self.tot_area2 = n_sys, tot_last, tot_area, tot_area2
        self.outstanding = outstanding
        self.events = events

    def _run_instant(
        self, boundaries: list[float], drain_until: float, probe: InstantProbe, occupancy: list[int]
    ) -> None:
        """The fused loop specialised for a policy that decides by one instant probe and says nothing else.

        Power-of-d without network delay: ``probe.pick()`` routes each task (see ``InstantProbe``), node
        sides send no messages and the dispatcher wants no completions back. Every step of ``_run_direct``
        that such a policy never takes is left out, and every step it takes is kept in the same order with
        the same arithmetic, so both loops give the same run to the last bit. ``occupancy[k]`` mirrors
        ``nodes[k].x`` for ``pick``. Counts that follow from others (probes and replies per task, the
        single outcome, a single class's sojourns) are filled in after the loop.
        """
        # the sentinel never leaves the heap (arrivals come first at equal times and never end), so
        # heap[0] always exists
        heap: list[tuple[float, int, int, int]] = [(INF, 0, -1, -1)]
        push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
        pick = probe.pick
        nodes = self.nodes
        version, scheduled = self.version, self.scheduled
        arrivals, fcfs_arrivals, fcfs_waits = self.arrivals, self.fcfs_arrivals, self.fcfs_waits
        is_fcfs, node_class = self.is_fcfs, self.exp.node_class
        sojourn, sojourn_class = self.sojourn, self.sojourn_class
        one_class = len(sojourn_class) == 1
        workload = self.workload
        times, works = workload.next_block()
        block = len(times)
        ai, count = 0, 0
        t_arr, work = times[0], works[0]
        nb = len(boundaries)
        bi, next_boundary = 0, boundaries[0]
        batch = self.batch
        seq = 0
        now = self.now
        n_sys, tot_last, tot_area, tot_area2 = self.in_system, self.tot_last, self.tot_area, self.tot_area2
        n_sys0 = n_sys
        outstanding = self.outstanding
        report = [time.perf_counter() + 1.0]
        while True:
            top = heap[0]
            t_heap = top[0]
            t = t_arr if t_arr <= t_heap else t_heap
            if t >= next_boundary:
                self.in_system, self.tot_last, self.tot_area, self.tot_area2 = (
                    n_sys,
                    tot_last,
                    tot_area,
                    tot_area2,
                )
                self._boundary(next_boundary)
                n_sys, tot_last, tot_area, tot_area2 = (
                    self.in_system,
                    self.tot_last,
                    self.tot_area,
                    self.tot_area2,
                )
                now = next_boundary
                batch = self.batch
                bi += 1
                next_boundary = boundaries[bi] if bi < nb else INF
                continue
            if bi >= nb and (outstanding == 0 or t > drain_until):
                break
            dt = t - tot_last
            tot_area += n_sys * dt
            tot_area2 += n_sys * n_sys * dt
            tot_last = t
            if t_arr <= t_heap:
                now = t
                count += 1
                task = Task(count, work, t, 0, batch)
                n_sys += 1
                k = pick()
                node = nodes[k]
                if node.arrive(task, t):
                    waits = True  # a waiting task leaves the next completion alone (NodeModel.arrive)
                else:
                    waits = False
                    nc = node.next_completion()
                    if nc != scheduled[k]:
                        v = version[k] = version[k] + 1
                        scheduled[k] = nc
                        if nc < INF:
                            seq += 1
                            push(heap, (nc, seq, k, v))
                occupancy[k] = node.x
                if batch >= 0:
                    arrivals[batch] += 1
                    outstanding += 1
                    if is_fcfs[k]:
                        fcfs_arrivals[batch] += 1
                        fcfs_waits[batch] += waits
                ai += 1
                if ai == block:
                    times, works = workload.next_block()
                    block, ai = len(times), 0
                    self._tick(t, drain_until, report)
                t_arr, work = times[ai], works[ai]
            else:
                _, _, k, v = top
                if v != version[k]:
                    pop(heap)  # a stale completion is no model event
                    continue
                now = t
                node = nodes[k]
                task = node.complete(t)
                occupancy[k] = node.x
                n_sys -= 1
                nc = node.next_completion()
                scheduled[k] = nc
                if nc < INF:
                    # the top entry was k's only live one: its successor can keep the version, and
                    # replacing the top is one sift instead of two (the order of events is unchanged:
                    # (time, seq) keys are unique)
                    seq += 1
                    replace(heap, (nc, seq, k, v))
                else:
                    pop(heap)
                b = task.batch
                if b >= 0:
                    s = t - task.arrived
                    sojourn[b].append(s)
                    if not one_class:
                        sojourn_class[node_class[k]][b].append(s)
                    outstanding -= 1
        events = 2 * count - (n_sys - n_sys0)  # every arrival, and every arrival that has left
        self.now = now
        self.in_system, self.tot_last, self.tot_area, self.tot_area2 = n_sys, tot_last, tot_area, tot_area2
        self.outstanding = outstanding
        self.events = events
        for kind in ("probe", "probe_reply"):
            counts = self.msg_counts[kind]
            for b, a in enumerate(arrivals):
                counts[b] += probe.probes * a  # every task probes, and every probe is answered
        if any(arrivals):
            self.decisions[probe.outcome] += sum(arrivals)
        if one_class:
            sojourn_class[0] = [list(s) for s in sojourn]

    def _raw(self, wall: float) -> RawRun:
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
            width = max(len(s["time_at"][c]) for s in snaps)  # type: ignore[index]
            padded = [np.pad(s["time_at"][c], (0, width - len(s["time_at"][c]))) for s in snaps]  # type: ignore[index]
            per_batch = np.array(
                [padded[b + 1] - padded[b] for b in range(B)]
            )  # (B, width): time at exactly x
            tails = np.cumsum(per_batch[:, ::-1], axis=1)[:, ::-1]  # time at x or more
            for j in range(width):
                raw.ratios[f"tail:{c}:{j}"] = (tails[:, j], ones * cls.count)
        arrivals = np.array(self.arrivals, dtype=float)
        total_msgs = np.zeros(B)
        for kind, counts in self.msg_counts.items():
            a = np.array(counts, dtype=float)
            total_msgs += a
            raw.ratios[f"messages:{kind}"] = (a, arrivals)
        raw.ratios["messages_per_task"] = (total_msgs, arrivals)
        if any(self.is_fcfs):
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
        if self.learner is not None:
            learned = policy_of(exp).learned
            assert learned is not None
            raw.ratios[learned.name] = (diff("r"), ones)
            raw.r_time = dict(self.r_time)
            raw.r_series = self.r_series
            raw.stale_tokens = self.learner.stale_tokens
        raw.sojourns = self.sojourn
        raw.decisions = dict(self.decisions)
        raw.censored = self.outstanding
        raw.events = self.events
        raw.wall_seconds = wall
        return raw
