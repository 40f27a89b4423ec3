"""The twin: a simulation of the system that actually ran, with the delays the cluster measured.

The zero-delay simulation is the model; the cluster is the model plus a network, an operating system and
software that take time. The twin replays the cluster's own measurements of that time, task by task, on
the same policy objects and node models (docs/run.md, "The twin"):

* task i (of the run's trace) reaches the dispatcher at its intended time plus the delay the cluster
  measured for it (the generator's lateness and the way to the dispatcher), is decided after the
  dispatch time measured for it (for a probing policy, the probes read the nodes halfway through it),
  and reaches its node after the forwarding time measured for it; the messages decided with it leave
  when it is forwarded, as the cluster's dispatcher sends them;
* the node serves it exactly as the model does; the dispatcher hears of its completion (the end of the
  task's request, and the messages that rode on its reply) after the task's own measured delay from its
  completion instant to the dispatcher, and the client after the delay to the client; the task counts
  as in the system (``tasks_in_system``) from the dispatcher's accept until its answer is ready, as the
  dispatcher's own integral counts it;
* a state message reaches its receiver after the age the cluster measured for the same message (the same
  kind, node, dispatcher and event: ``wire.message_key``), where the cluster sent it too; otherwise after
  the age of the cluster's message of that kind sent nearest in model time (so that ages keep their
  correlation with the load of the moment);
* the measured window, its batches and the sojourns (from the intended send to the client's receipt) are
  cut as the cluster cuts them, so that the cluster and its twin are compared batch by batch; every task
  of the window is followed to its end however late the cluster accepted it (a saturated cluster accepts
  some after the window has ended), and is censored only if the drain ends first.

Tasks the cluster did not complete (refused, lost, dropped) get the median of each delay. What the twin
leaves out is what nobody measured: faults (their batches are left out of any comparison anyway), health
checks, and whatever the cluster did that its legs do not show.

The twin is the simulator's kernel (``engine.Simulator``) with the trace as its arrivals
(``TraceArrivals``: each task at its accept), the measured delays as its delays (``MeasuredDelays``) and
the cluster's random streams for its dispatchers.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.delays import Delays
from lbtestbed.analysis.simulator.engine import INF, Arrivals, Progress, Simulator
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.workload import DispatcherSplit, Task
from lbtestbed.policies import Message, Probe, Route
from lbtestbed.transport.wire import message_key

#: (arrive, decide, forward, notify, reply, leave) of one task, model seconds (TaskRecord's legs)
Legs = tuple[float, float, float, float, float, float]


@dataclass(frozen=True)
class Emulation:
    """What a cluster run measured, in model seconds, for its twin."""

    tasks: Sequence[tuple[float, float]]  # the run's trace: (intended arrival time, work), in order
    legs: Mapping[float, Legs]  # by intended arrival time: the legs of each completed task
    # per kind, (model time sent, age) in sending order: on their own request, on the reply to a request
    message_ages: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)
    rider_ages: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)
    keyed_ages: Mapping[str, float] = field(default_factory=dict)  # message by message (wire.message_key)
    riders: bool = True  # messages for a task's dispatcher rode on the task's reply (no emulated delay)
    # the random stream of the dispatcher's policy: the cluster's dispatcher 0 draws from stream 1000, so
    # that the twin breaks ties as it did where their states agree (0: the simulator's own stream)
    policy_stream: int = 0

    def median_legs(self) -> Legs:
        if not self.legs:
            return (0.0,) * 6
        arr = np.array(list(self.legs.values()), float)
        med = np.nanmedian(arr, axis=0) if np.isfinite(arr).any() else np.zeros(6)
        return tuple(float(x) if math.isfinite(x) else 0.0 for x in med)  # type: ignore[return-value]

    def task_legs(self) -> list[Legs]:
        """Every task's legs, in trace order: its own, else the medians; none below 0."""
        median = self.median_legs()
        out: list[Legs] = []
        for t, _ in self.tasks:
            legs = self.legs.get(t)
            if legs is None or not all(math.isfinite(x) for x in legs):
                legs = median
            out.append(tuple(max(0.0, x) for x in legs))  # type: ignore[arg-type]
        return out


class TraceArrivals(Arrivals):
    """The twin's arrivals: the tasks of the run's trace, each at the instant the cluster's dispatcher
    accepted it (its intended time plus its measured arrival leg), in that order (in trace order at
    equal instants). Task i is batched by its intended time, as the cluster batches it, and reaches the
    dispatcher the spec's split gives the i-th arrival, as the generators sent it."""

    BLOCK = 4096

    def __init__(self, exp: Experiment, tasks: Sequence[tuple[float, float]], legs: Sequence[Legs]) -> None:
        run = exp.run
        self.t_start, self.t_end = run.warmup, run.warmup + run.duration
        self.B, self.batch_len = run.batches, run.duration / run.batches
        self.intended = [t for t, _ in tasks]
        self.works = [w for _, w in tasks]
        self.origins = DispatcherSplit(exp).take(len(tasks))
        accepts = [t + legs[i][0] for i, t in enumerate(self.intended)]
        self.order = sorted(range(len(tasks)), key=lambda i: (accepts[i], i))
        self.accepts = [accepts[i] for i in self.order]
        self.given = 0  # tasks handed to the kernel in blocks
        #: tasks of the measured window (by intended time) not accepted yet: the run waits for them,
        #: however late their accept comes, as it waits for those in the system
        self.ahead = sum(1 for t in self.intended if self.batch_of(t) >= 0)

    def batch_of(self, t: float) -> int:
        if not self.t_start <= t < self.t_end:
            return -1
        return min(self.B - 1, int((t - self.t_start) // self.batch_len))

    def next_block(self) -> tuple[list[float], list[float]]:
        start = self.given
        if start >= len(self.order):
            return [INF], [0.0]
        self.given = end = min(start + self.BLOCK, len(self.order))
        return self.accepts[start:end], [self.works[i] for i in self.order[start:end]]

    def task(self, i: int, t: float, work: float, batch: int) -> Task:
        j = self.order[i]
        task = Task(j, work, self.intended[j], self.origins[j], self.batch_of(self.intended[j]))
        if task.batch >= 0:
            self.ahead -= 1
        return task


class MeasuredDelays(Delays):
    """The delays a cluster run measured, task by task and message by message (module docstring)."""

    leaves_at_completion = False  # a task leaves when the dispatcher's answer is ready (departed)

    def __init__(self, emulation: Emulation, legs: Sequence[Legs]) -> None:
        self.emulation = emulation
        self.legs = legs
        self.ages = {k: _Timeline(v) for k, v in emulation.message_ages.items() if len(v)}
        self.rider_ages = {k: _Timeline(v) for k, v in emulation.rider_ages.items() if len(v)}
        # per kind: [messages given their own measured age, messages given a drawn one]
        self.replayed: dict[str, list[int]] = {}

    def probe(self, task: Task, probe: Probe) -> None:
        """The probes read the nodes halfway through the task's measured dispatch time."""
        self.sim.schedule(self.sim.now + self.legs[task.id][1] / 2, self._read, task, probe)

    def _read(self, task: object, probe: object) -> None:
        assert isinstance(task, Task) and isinstance(probe, Probe)
        sim = self.sim
        d = len(probe.nodes)
        sim.measure.count("probe", d)
        sim.measure.count("probe_reply", d)
        replies = [sim.sides[k].probe_reply(sim.nodes[k].x) for k in probe.nodes]
        sim.schedule(sim.now + self.legs[task.id][1] / 2, self._resolve, task, (probe, replies))

    def _resolve(self, task: object, read: object) -> None:
        assert isinstance(task, Task) and isinstance(read, tuple)
        probe, replies = read
        self.sim.route(task, self.sim.dispatchers[task.origin].resolve(probe, replies), probed=True)

    def forward(self, task: Task, route: Route, probed: bool) -> None:
        """The task leaves for its node after the dispatch time that remains (none after probing: the
        probes took it), and travels its measured forwarding time. The messages decided with it (a pool's
        probes, threshold updates) leave with it, as the cluster's dispatcher sends them: their measured
        ages run from that instant, not from the task's arrival at its node."""
        sim = self.sim
        _, decide, forward, *_ = self.legs[task.id]
        still = 0.0 if probed else decide
        task.forwarded = sim.now + still  # when the cluster's dispatcher forwarded it
        if route.messages:
            sim.schedule(task.forwarded, self._send, route.messages)
            route = route._replace(messages=())
        sim.schedule(task.forwarded + forward, sim.task_at_node, task, route)

    def _send(self, msgs: object, _: object) -> None:
        assert isinstance(msgs, tuple)
        self.sim.to_nodes(msgs)

    def message(self, m: Message, answer: bool) -> float | None:
        """The age the cluster measured for ``m`` itself; else the age of its message of the same kind sent
        nearest in time (an answer rides on the reply to its message: the riders first); None, at once,
        where the cluster measured none."""
        age = self.emulation.keyed_ages.get(message_key(m))
        tally = self.replayed.setdefault(m.kind, [0, 0])
        tally[age is None] += 1
        if age is None:
            timeline = self.ages.get(m.kind)
            if answer:
                timeline = self.rider_ages.get(m.kind) or timeline
            timeline = timeline or self.rider_ages.get(m.kind)
            if timeline is None:
                return None
            age = timeline.nearest(self.sim.now)
        return age if age > 0.0 else None

    def reply(self, task: Task) -> float:
        return self.legs[task.id][4]

    def departed(self, task: Task, k: int, t: float, msgs: tuple[Message, ...]) -> None:
        """The task's dispatcher hears of its completion after the task's own measured delay, with the
        messages for it that rode on the reply; the task leaves the system when its answer is ready."""
        sim = self.sim
        _, _, _, notify, _, leave = self.legs[task.id]
        ride: tuple[Message, ...] = ()
        if self.emulation.riders:
            ride = tuple(m for m in msgs if m.dispatcher == task.origin)
            msgs = tuple(m for m in msgs if m.dispatcher != task.origin)
        for m in ride:
            sim.measure.count(m.kind)  # sent now, applied with the reply
        if msgs:
            sim.to_dispatcher(msgs)
        latency = t + notify - task.forwarded  # forwarded to its answer read
        sim.schedule(t + notify, self._notified, (k, task.origin, latency), ride)
        sim.schedule(t + max(notify, leave), self._left, None)

    def _notified(self, done: object, ride: object) -> None:
        assert isinstance(done, tuple) and isinstance(ride, tuple)
        k, origin, latency = done
        for m in ride:
            self.sim.at_dispatcher(m)
        self.sim.dispatchers[origin].on_task_done(k, latency)

    def _left(self, _: object, __: object) -> None:
        self.sim.left += 1  # the dispatcher's answer is ready: the task leaves the system


class TwinSimulator(Simulator):
    """The twin of a cluster run (``Emulation``) of ``exp``: the kernel with the run's trace as its
    arrivals, its measured delays and its dispatchers' random streams."""

    def __init__(self, exp: Experiment, emulation: Emulation, progress: Progress | None = None) -> None:
        legs = emulation.task_legs()
        self.emulation = emulation
        self.measured = MeasuredDelays(emulation, legs)
        super().__init__(
            exp,
            0,
            progress,
            arrivals=TraceArrivals(exp, emulation.tasks, legs),
            delays=self.measured,
            policy_stream=emulation.policy_stream,
        )

    @property
    def replayed(self) -> dict[str, list[int]]:
        """Per message kind: how many messages got their own measured age, and how many a drawn one."""
        return self.measured.replayed


class _Timeline:
    """Measured ages of one kind by the model time their messages were sent."""

    def __init__(self, pairs: Sequence[tuple[float, float]]) -> None:
        pairs = sorted(pairs)
        self.times = [t for t, _ in pairs]
        self.ages = [a for _, a in pairs]

    def nearest(self, t: float) -> float:
        """The age of the message sent nearest to ``t`` (the earlier one of two as near)."""
        i = bisect.bisect_left(self.times, t)
        if i == len(self.times) or (i > 0 and t - self.times[i - 1] <= self.times[i] - t):
            i -= 1
        return self.ages[i]


def simulate_twin(
    exp: Experiment, emulation: Emulation, progress: Progress | None = None
) -> tuple[RawRun, dict[str, list[int]]]:
    """The twin of a cluster run of ``exp`` (on the pure-Python kernel), and per message kind how many
    messages it gave their own measured age and how many a drawn one."""
    twin = TwinSimulator(exp, emulation, progress)
    return twin.run(), twin.replayed
