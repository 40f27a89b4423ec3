"""The twin: a simulation of the system that actually ran, with the delays the cluster measured.

The zero-delay simulation is the model; the cluster is the model plus a network, an operating system and
software that take time. The twin replays the cluster's own measurements of that time, task by task, on
the same policy objects and node models (docs/run.md, "The twin"):

* task i (of the run's trace) reaches the dispatcher at its intended time plus the delay the cluster
  measured for it (the generator's lateness and the way to the dispatcher), is decided after the
  dispatch time measured for it (for a probing policy, the probes read the nodes halfway through it),
  and reaches its node after the forwarding time measured for it;
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
  cut as the cluster cuts them, so that the cluster and its twin are compared batch by batch.

Tasks the cluster did not complete (refused, lost, dropped) get the median of each delay. What the twin
leaves out is what nobody measured: faults (their batches are left out of any comparison anyway), health
checks, and whatever the cluster did that its legs do not show.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.engine import (
    _TASK_AT_NODE,
    INF,
    Progress,
    Simulator,
)
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.streams import seeded_random
from lbtestbed.model.workload import DispatcherSplit, Task
from lbtestbed.policies import Message, Probe, Route, make_dispatcher
from lbtestbed.transport.wire import message_key

# the twin's own events in the heap (the engine's are 0..6)
_ACCEPT, _PROBE_READ, _RESOLVE, _NOTIFY, _LEAVE = range(10, 15)

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


class TwinSimulator(Simulator):
    """One run of the twin of a cluster run (``Emulation``) of ``exp``."""

    def __init__(self, exp: Experiment, emulation: Emulation, progress: Progress | None = None) -> None:
        super().__init__(exp, 0, progress)
        self.emulation = emulation
        if emulation.policy_stream:  # cluster dispatcher i draws from stream policy_stream + i
            k = exp.policy.dispatchers
            self.dispatchers = [
                make_dispatcher(exp, seeded_random(exp.seed, "policy", emulation.policy_stream + i), i, k)
                for i in range(k)
            ]
            self.dispatcher = self.dispatchers[0]
            self._bind_learner()
        self.delay = None  # the measured delays replace the spec's emulated ones: they include them
        self.delay_tasks = False
        median = emulation.median_legs()
        self.task_legs: list[Legs] = []
        for t, _ in emulation.tasks:
            legs = emulation.legs.get(t)
            if legs is None or not all(math.isfinite(x) for x in legs):
                legs = median
            self.task_legs.append(tuple(max(0.0, x) for x in legs))  # type: ignore[arg-type]
        self.ages = {k: _Timeline(v) for k, v in emulation.message_ages.items() if len(v)}
        self.rider_ages = {k: _Timeline(v) for k, v in emulation.rider_ages.items() if len(v)}
        # per kind: [messages given their own measured age, messages given a drawn one]
        self.replayed: dict[str, list[int]] = {}
        self.workload = _NoArrivals()  # type: ignore[assignment]
        # task i of the trace reached the dispatcher the generators sent it to: the spec's split, in order
        self.origins = DispatcherSplit(exp).take(len(emulation.tasks))

    # ----------------------------------------------------------------------------- message delays

    def _message_delay(self, m: Message, answer: bool) -> float | None:
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
            age = timeline.nearest(self.now)
        return age if age > 0.0 else None

    # --------------------------------------------------------------------------------------- tasks

    def _batch_of(self, t: float) -> int:
        if not self.t_start <= t < self.t_end:
            return -1
        return min(self.B - 1, int((t - self.t_start) // self.batch_len))

    def _accept(self, i: int) -> None:
        t, work = self.emulation.tasks[i]
        # batched by intended arrival, as the cluster does
        task = Task(i, work, t, self.origins[i], self._batch_of(t))
        self._total_changes(self.now, +1)
        if self.batch >= 0:
            self.arrivals[self.batch] += 1  # counted when the dispatcher takes it, as its decisions are
        if task.batch >= 0:
            self.outstanding += 1
        _, decide, *_ = self.task_legs[i]
        decision = self.dispatchers[task.origin].dispatch()
        if isinstance(decision, Probe):
            self._push(self.now + decide / 2, _PROBE_READ, task, decision)
        else:
            self._decided(task, decision, decide)

    def _decided(self, task: Task, route: Route, still: float) -> None:
        """The decision is made: the task leaves for its node ``still`` model s of dispatch time later
        (the dispatch time that remains), plus its measured forwarding time."""
        if task.batch >= 0:
            self.decisions[route.outcome] += 1
        if self.learner is not None and not self.learners and self.learner.learned_value() != self.r:
            self._r_changes(self.now, self.learner.learned_value())
        forward = self.task_legs[task.id][2]
        self.forwarded[task.id] = self.now + still  # when the cluster's dispatcher forwarded it
        self._push(self.now + still + forward, _TASK_AT_NODE, task, route)

    def _completion(self, t: float, k: int) -> None:
        node = self.nodes[k]
        task = node.complete(t)
        self.scheduled[k] = INF
        self._reschedule(k)
        _, _, _, notify, reply, leave = self.task_legs[task.id]
        if task.batch >= 0:
            s = t + reply - task.arrived  # from the intended send to the client's receipt
            self.sojourn[task.batch].append(s)
            self.sojourn_class[self.exp.node_class[k]][task.batch].append(s)
            self.outstanding -= 1
        if self.records_latency:
            found, at = self.at_node.pop(task.id)
            self.sides[k].on_served(found, t - at)
        msgs = self.sides[k].on_departure(node.x, task.origin)
        ride: tuple[Message, ...] = ()
        if self.emulation.riders:
            ride = tuple(m for m in msgs if m.dispatcher == task.origin)
            msgs = tuple(m for m in msgs if m.dispatcher != task.origin)
        for m in ride:
            self._count(m.kind)  # sent now, applied with the reply
        if msgs:
            self._to_dispatcher(msgs)
        latency = t + notify - self.forwarded.pop(task.id)  # forwarded to its answer read
        self._push(t + notify, _NOTIFY, (k, task.origin, latency), ride)
        self._push(t + max(notify, leave), _LEAVE, k)

    def _heap_event(self, kind: int, a: object, b: object) -> None:
        if kind == _ACCEPT:
            assert isinstance(a, int)
            self._accept(a)
        elif kind == _PROBE_READ:
            assert isinstance(a, Task) and isinstance(b, Probe)
            d = len(b.nodes)
            self._count("probe", d)
            self._count("probe_reply", d)
            replies = [self.sides[k].probe_reply(self.nodes[k].x) for k in b.nodes]
            _, decide, *_ = self.task_legs[a.id]
            self._push(self.now + decide / 2, _RESOLVE, a, (b, replies))
        elif kind == _RESOLVE:
            assert isinstance(a, Task) and isinstance(b, tuple)
            probe, replies = b
            self._decided(a, self.dispatchers[a.origin].resolve(probe, replies), 0.0)
        elif kind == _LEAVE:
            self._total_changes(self.now, -1)  # the dispatcher's answer is ready: the task leaves it
        elif kind == _NOTIFY:
            assert isinstance(a, tuple) and isinstance(b, tuple)
            k, origin, latency = a
            for m in b:
                out = self.dispatchers[m.dispatcher].on_message(m)
                if out:
                    self._to_nodes(out)
            self.dispatchers[origin].on_task_done(k, latency)
        else:
            super()._heap_event(kind, a, b)

    # ----------------------------------------------------------------------------------------- run

    def run(self) -> RawRun:
        """The engine's general loop, its arrivals the accept events of the run's trace."""
        wall = time.perf_counter()
        for i, (t, _) in enumerate(self.emulation.tasks):
            self._push(t + self.task_legs[i][0], _ACCEPT, i)
        self._run_general(*self._window())
        return self._raw(time.perf_counter() - wall)


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


class _NoArrivals:
    """The workload of the twin's engine loop: none of its own (the trace's tasks come as events)."""

    count = 0

    def next(self) -> tuple[float, float]:
        return INF, 0.0


def simulate_twin(
    exp: Experiment, emulation: Emulation, progress: Progress | None = None
) -> tuple[RawRun, dict[str, list[int]]]:
    """The twin of a cluster run of ``exp`` (pure Python: the compiled engine does not take one), and per
    message kind how many messages it gave their own measured age and how many a drawn one."""
    twin = TwinSimulator(exp, emulation, progress)
    return twin.run(), twin.replayed
