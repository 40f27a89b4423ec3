"""The discrete-event simulator: one event loop over the spec's nodes and both halves of its policy.

No policy rule lives here. The kernel takes tasks from its *arrivals*, hands each to the dispatcher side,
carries probes, tasks, answers and state messages between the policy objects through its *delays*, and
its *measurement* observes what happens:

* arrivals: ``PoissonArrivals``, the spec's seeded workload; the twin's trace of the tasks a cluster
  accepted (``twin.TraceArrivals``);
* delays (``delays.py``): none, the spec's network delay, or the delays a cluster run measured
  (``twin.MeasuredDelays``): the twin is this kernel with measured delays;
* measurement (``measure.Measurement``): batches, exact time integrals, sojourns, messages and the
  policy's learned quantity.

Pending events (completions, and whatever is on its way) wait in a calendar queue in (time, sequence)
order (``calendar_queue.py``); arrivals come first at equal times. Speed comes from the mypyc build of
these modules (``compiled.py``), not from copies of the loop; the one specialisation is the arrival
handler of a policy that decides by an instant probe (``policies.sampling.InstantProbe``), which the
loop takes in place of the general one.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from heapq import heappop, heappush, heapreplace
from typing import cast

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.calendar_queue import DAY_OVER, CalendarQueue
from lbtestbed.analysis.simulator.delays import Delays, NetworkDelays
from lbtestbed.analysis.simulator.measure import Measurement
from lbtestbed.model.conditions import fail_windows, failing, speed_changes
from lbtestbed.model.experiment import MAX_DISPATCHERS, Experiment
from lbtestbed.model.nodes import NodeModel, make_node
from lbtestbed.model.streams import seeded_random
from lbtestbed.model.workload import DispatcherSplit, PoissonWorkload, Task
from lbtestbed.policies import (
    DispatcherSide,
    Message,
    NodeSide,
    Probe,
    Route,
    make_dispatcher,
    make_node_sides,
)
from lbtestbed.policies.sampling import InstantProbe, instant_probe_of

INF = math.inf

Progress = Callable[[float], None]  # called with the fraction of model time done
#: what an event that is not a completion carries: its handler and the handler's two arguments
Handler = Callable[[object, object], None]


class Arrivals:
    """Where the kernel's tasks come from: their arrival times and works in blocks, and each task itself."""

    #: tasks of the measured window still to come: the run waits for them as for those in the system
    ahead = 0

    def next_block(self) -> tuple[list[float], list[float]]:
        """Arrival times and works of the next tasks, in order; ``[inf]`` when there are no more."""
        raise NotImplementedError

    def task(self, i: int, t: float, work: float, batch: int) -> Task:
        """Task ``i`` (from 0, in arrival order), arriving at ``t`` while the current batch is ``batch``."""
        raise NotImplementedError


class PoissonArrivals(Arrivals):
    """The spec's workload (``model.workload``): Poisson times and seeded works, each task to the
    dispatcher the spec's split gives it. None of the window's tasks is ever ahead: the run does not end
    before the window does, and none come after it."""

    def __init__(self, exp: Experiment, replication: int = 0) -> None:
        self.workload = PoissonWorkload(exp, replication)
        self.split = DispatcherSplit(exp, replication)

    def next_block(self) -> tuple[list[float], list[float]]:
        return self.workload.next_block()

    def task(self, i: int, t: float, work: float, batch: int) -> Task:
        return Task(i, work, t, self.split.next(), batch)


class Simulator:
    """One replication of an experiment: the kernel (module docstring).

    ``arrivals`` and ``delays`` default to the spec's; ``policy_stream``, when not 0, gives dispatcher i
    the policy stream ``policy_stream + i`` (the twin's: the streams a cluster's dispatchers draw from).
    """

    #: whether the instant-probe arrival handler may be used (a subclass that watches every routing
    #: decision says no)
    instant_arrivals = True

    def __init__(
        self,
        exp: Experiment,
        replication: int = 0,
        progress: Progress | None = None,
        *,
        arrivals: Arrivals | None = None,
        delays: Delays | None = None,
        policy_stream: int = 0,
    ) -> None:
        self.exp = exp
        self.progress = progress
        self._policy_halves(exp, replication, policy_stream)
        self.nodes: list[NodeModel] = [
            make_node(exp.classes[c].discipline, s, exp.classes[c].utility)
            for c, s in zip(exp.node_class, exp.node_speeds, strict=True)
        ]
        self.occupancy = [0] * exp.n  # nodes[k].x, as a list the instant probe reads
        self.is_fcfs = [n.discipline == "fcfs" for n in self.nodes]
        self.arrivals: Arrivals = arrivals if arrivals is not None else PoissonArrivals(exp, replication)
        if delays is None:
            delays = NetworkDelays(exp, replication) if exp.network.delay is not None else Delays()
        self.delays = delays
        delays.bind(self)
        self.plain = type(delays) is Delays  # nothing travels: no leg to ask the delays for
        self.node_class = exp.node_class
        # gray failures (model.conditions): timed speed changes, and nodes that fail some of their tasks
        self.speed_changes = speed_changes(exp, replication)
        self.fail_windows = fail_windows(exp)
        self.fault_rng = seeded_random(exp.seed, "faults", replication) if self.fail_windows else None
        self.failed = 0  # tasks a failing node refused
        self.queue = _calendar(exp)
        self.today = self.queue.today  # pushed to directly on the hot paths (CalendarQueue)
        self.seq = 0  # the sequence number of the last event pushed: ties in time go in pushing order
        self.now = 0.0
        self.count = 0  # tasks arrived
        # whether a completion has anything to tell the delays (messages, or an answer someone hears)
        self.answers = not (self.plain and self.ignores_done)
        self.events = 0  # model events: arrivals, completions and deliveries
        self.left = 0  # tasks that left the system outside the loop during the current event (_loop)
        self.measure = Measurement(exp, self.dispatchers)
        self.clocked = [d for d in self.dispatchers if d.uses_clock]  # they read the model time
        self.stale_integrates = self._stale_integrates()

    def _policy_halves(self, exp: Experiment, replication: int, policy_stream: int) -> None:
        """The dispatcher sides and the node sides. Dispatcher 0 shares the policy stream with the node
        sides, as one alone does; the others have streams of their own."""
        k = exp.policy.dispatchers
        policy_rng = seeded_random(exp.seed, "policy", replication)
        first = make_dispatcher(exp, policy_rng, 0, k)  # built first: what it draws, the sides do not
        if policy_stream:  # the cluster's dispatcher i draws from stream policy_stream + i
            streams = [seeded_random(exp.seed, "policy", policy_stream + i) for i in range(k)]
            self.dispatchers = [make_dispatcher(exp, streams[i], i, k) for i in range(k)]
        else:
            own = (
                seeded_random(exp.seed, "dispatchers", replication * MAX_DISPATCHERS + i) for i in range(1, k)
            )
            self.dispatchers = [first] + [make_dispatcher(exp, rng, i, k) for i, rng in enumerate(own, 1)]
        self.dispatcher = self.dispatchers[0]
        self.sides = make_node_sides(exp, policy_rng, dispatchers=k, replication=replication)
        # node sides that learn from each task's latency (NodeSide.records_latency): what each task found
        # on arrival, and when
        self.records_latency = any(type(s).records_latency for s in self.sides)
        self.at_node: dict[int, tuple[int, float]] = {}
        self.quiet_departure = all(type(s).on_departure is NodeSide.on_departure for s in self.sides)
        # node sides that speak at times of their own (NodeSide.timed): events of their own, the others none
        self.timed = [k for k, s in enumerate(self.sides) if type(s).timed]
        # dispatcher sides that do not want to hear of their tasks' ends are not told
        self.ignores_done = all(type(d).on_task_done is DispatcherSide.on_task_done for d in self.dispatchers)

    # ------------------------------------------------------------------------------------- the loop

    def run(self) -> RawRun:
        wall = time.perf_counter()
        boundaries, drain_until = self.measure.window()
        instant = self._instant_probe()
        for c in self.speed_changes:
            self.schedule(c.at, self._speed_change, c.node, c.factor)
        for k in self.timed:  # on the run's clock (NodeSide.start_timer): clock 1, from model time 0
            self._own_event_at(k, self.sides[k].start_timer(1, 0.0))
        self.report_at = time.perf_counter() + 1.0
        for k, node in enumerate(self.nodes):
            node.index = k
        collecting = gc.isenabled()
        gc.disable()  # the kernel leaves no cycles behind, and a full collection walks every node and task
        try:
            self._loop(boundaries, drain_until, None if instant is None else instant.pick)
        finally:
            if collecting:
                gc.enable()
        if instant is not None:
            self.measure.count_instant_probes(instant.probes, instant.outcome)
        self.measure.finish()
        return self.measure.raw(self.events, time.perf_counter() - wall)

    def _loop(self, boundaries: list[float], drain_until: float, pick: Callable[[], int] | None) -> None:
        """The next arrival or queued event, whichever is first (arrivals first at equal times), until the
        window's tasks are done (or the drain ends); arrivals (an instant probe's too), completions and the
        tasks in the system (integrated at each change) are handled here, without a call."""
        queue, today, measure, arrivals = self.queue, self.today, self.measure, self.arrivals
        nodes, occupancy = self.nodes, self.occupancy
        is_fcfs, node_class, sojourn, sojourn_class = self.is_fcfs, self.node_class, *measure.sojourns()
        arrived, fcfs_arrivals, fcfs_waits = measure.arrivals, measure.fcfs_arrivals, measure.fcfs_waits
        plain, quiet = self.plain, self.delays.leaves_at_completion and not self._talks()
        times, works, block, ai = self._next_block(0.0, drain_until)
        t_arr, count, batch = times[0], self.count, -1
        nb, bi, next_boundary = len(boundaries), 0, boundaries[0]
        n_sys, tot_last, tot_area, tot_area2 = 0, 0.0, 0.0, 0.0  # tasks in the system, and its integrals
        while True:
            top = today[0]
            t_heap = top[0]
            t = t_arr if t_arr <= t_heap else t_heap
            if t >= next_boundary:  # after the window next_boundary is -inf: every event comes here
                if bi < nb:
                    t = self.now = next_boundary
                    dt, tot_last = t - tot_last, t  # the integrals up to the boundary, as below
                    tot_area += n_sys * dt
                    tot_area2 += n_sys * n_sys * dt
                    measure.boundary(t, nodes, tot_area, tot_area2)
                    batch, bi = measure.batch, bi + 1
                    next_boundary = boundaries[bi] if bi < nb else -INF
                    continue
                # past the window: done once its tasks are (or the drain ends, or nothing is left to happen)
                if measure.outstanding + arrivals.ahead == 0 or t > drain_until:
                    break
            if t_arr <= t_heap:
                work, ai = works[ai], ai + 1
                if ai == block:
                    times, works, block, ai = self._next_block(t, drain_until)
                t_arr = times[ai]
                if pick is None:
                    step = 1 - self._arrival(t, work)
                else:  # the instant probe's arrival: what _arrival, dispatch, route and task_at_node do
                    task = Task(count, work, t, 0, batch)  # for such a policy, in the same order
                    count, step, k = count + 1, 1, pick()
                    node = nodes[k]
                    waits = node.arrive(task, t)
                    if not waits:  # a task that waits leaves the next completion alone (NodeModel.arrive)
                        nc = node.next_completion()
                        if nc != node.due:  # _reschedule(node)
                            node.due = nc
                            if nc < INF:
                                self.seq += 1
                                node.live = self.seq
                                if nc < queue.end:
                                    heappush(today, (nc, self.seq, node, None))
                                else:
                                    queue.file((nc, self.seq, node, None))
                    occupancy[k] = node.x
                    if batch >= 0:
                        arrived[batch] += 1
                        measure.outstanding += 1
                        if is_fcfs[k]:
                            fcfs_arrivals[batch] += 1
                            fcfs_waits[batch] += waits
            else:
                _, seq, owner, what = top
                if owner is None or seq != owner.live:  # a delivery, a stale completion or the end of the day
                    heappop(today)
                    aside = self._aside(t, owner, what)
                    if aside is None:
                        continue
                    step = aside
                else:  # the owner completes its task (its live event is on top)
                    node = owner
                    task = node.complete(t)
                    k = node.index
                    occupancy[k] = node.x
                    nc = node.due = node.next_completion()
                    if nc < INF:  # the top event was its only live one: its successor replaces it
                        self.seq += 1
                        node.live = self.seq
                        if nc < queue.end:
                            heapreplace(today, (nc, self.seq, node, None))
                        else:
                            heappop(today)
                            queue.file((nc, self.seq, node, None))
                    else:
                        heappop(today)
                    b = task.batch
                    if b >= 0:  # the way of its answer to the client is part of its sojourn (Delays.reply)
                        s = t - task.arrived if plain else t + self.delays.reply(task) - task.arrived
                        sojourn[b].append(s)
                        if sojourn_class is not None:
                            sojourn_class[node_class[k]][b].append(s)
                        measure.outstanding -= 1
                    if not (quiet or self._departed(task, k, t)):
                        continue
                    step = -1
            dt, tot_last = t - tot_last, t
            tot_area += n_sys * dt
            tot_area2 += n_sys * n_sys * dt
            n_sys += step
        self._finish_loop(n_sys, count if pick is not None else self.count, tot_last)

    def _finish_loop(self, n_sys: int, count: int, last: float) -> None:
        """After the loop: what it kept to itself. Its events are the arrivals, the completions (each node
        counts its own) and the deliveries; the clock shows the last of them. The window's tasks still to
        come when the drain ended are censored, as those still in the system are."""
        self.measure.in_system, self.count = n_sys, count
        self.measure.outstanding += self.arrivals.ahead
        self.events += count + sum(node.completions for node in self.nodes)
        self.now = max(self.now, last)

    def _aside(self, t: float, node: NodeModel | None, payload: object) -> int | None:
        """The event on top at ``t`` is neither an arrival nor a completion: a stale completion of
        ``node``, the end of the day (``DAY_OVER``), or a delivery of something that was on its way
        (``payload``: a handler and its arguments, ``schedule``). How many tasks joined the system in it
        (< 0: left it); None when the number in the system is not integrated at it."""
        if node is not None:  # stale: integrated in the runs that always did (_stale_integrates)
            return 0 if self.stale_integrates else None
        if payload is DAY_OVER:
            self.queue.next_day()
            return None
        self._clock(t)
        self.events += 1
        handler, a, b = cast(tuple[Handler, object, object], payload)
        handler(a, b)
        if self.measure.learners:
            self.measure.follow_learners(t)
        left, self.left = self.left, 0
        return -left if left else None

    def _clock(self, t: float) -> None:
        """Something happens at ``t`` outside the loop's own arrivals and completions: clocks show it."""
        self.now = t
        for d in self.clocked:
            d.now = t

    def _talks(self) -> bool:
        """Whether a completion may call on anything beyond the node: a node side that learns latencies
        or speaks on departures, a dispatcher that hears of its tasks' ends, delays that carry them, or
        dispatchers whose learned mean the measurement follows."""
        return self.records_latency or not self.quiet_departure or self.answers or bool(self.measure.learners)

    def _departed(self, task: Task, k: int, t: float) -> bool:
        """What follows a completion beyond the node (``_talks``); whether the task left the system."""
        self._clock(t)
        if self.records_latency:
            found, at = self.at_node.pop(task.id)
            self.sides[k].on_served(found, t - at)
        msgs = () if self.quiet_departure else self.sides[k].on_departure(self.nodes[k].x, task.origin)
        if msgs or self.answers:
            self.delays.departed(task, k, t, msgs)
        if self.measure.learners:
            self.measure.follow_learners(t)
        return self.delays.leaves_at_completion

    def _stale_integrates(self) -> bool:
        """Whether a stale completion integrates the tasks in the system up to its time. It changes nothing
        but the last bits of ``tasks_in_system``; the runs without delays, faults or several dispatchers
        always did (they integrated at every event they took from the heap), the others never did, and
        both keep their results to the bit."""
        return (
            type(self.delays) is Delays
            and type(self.arrivals) is PoissonArrivals
            and len(self.dispatchers) == 1
            and not (self.speed_changes or self.fail_windows or self.records_latency)
            and self.instant_arrivals
        )

    def _next_block(self, t: float, horizon: float) -> tuple[list[float], list[float], int, int]:
        """The arrivals' next block of times and works, its length, and 0; ``progress`` hears how far the
        run is (at ``t`` of ``horizon``), once a second at most."""
        times, works = self.arrivals.next_block()
        self._tick(t, horizon)
        return times, works, len(times), 0

    def _tick(self, t: float, horizon: float) -> None:
        if self.progress is not None and time.perf_counter() > self.report_at:
            self.report_at = time.perf_counter() + 1.0
            self.progress(min(1.0, t / horizon))

    def schedule(self, t: float, handler: Handler, a: object, b: object = None) -> None:
        """Call ``handler(a, b)`` at model time ``t``."""
        self.seq += 1
        self.queue.push((t, self.seq, None, (handler, a, b)))

    def _reschedule(self, node: NodeModel) -> None:
        """The node's next completion may have moved: queue it (its earlier event goes stale)."""
        t = node.next_completion()
        if t != node.due:
            node.due = t
            self.seq += 1
            node.live = self.seq  # also when idle: no event of it is live then
            if t < INF:
                self.queue.push((t, self.seq, node, None))

    # ----------------------------------------------------------------------------- a task's way

    def _arrival(self, t: float, work: float) -> int:
        """A task arrives at ``t`` (it is in the system from now); the tasks that left it as it did."""
        self._clock(t)
        measure = self.measure
        task = self.arrivals.task(self.count, t, work, measure.batch)
        self.count += 1
        if measure.batch >= 0:
            measure.arrivals[measure.batch] += 1  # counted when the dispatcher takes it, as its decisions are
        if task.batch >= 0:
            measure.outstanding += 1
        self.dispatch(task)
        if measure.learners:
            measure.follow_learners(t)
        left, self.left = self.left, 0
        return left

    def dispatch(self, task: Task) -> None:
        """``task`` reaches its dispatcher now, which routes it or probes first."""
        decision = self.dispatchers[task.origin].dispatch()
        if isinstance(decision, Probe):
            self.delays.probe(task, decision)
        else:
            self.route(task, decision)

    def route(self, task: Task, route: Route, probed: bool = False) -> None:
        """The dispatcher decided: ``task`` goes to ``route.node`` (``probed``: on probe replies)."""
        measure = self.measure
        if task.batch >= 0:
            measure.decisions[route.outcome] += 1
        learner = measure.learner
        if learner is not None and not measure.learners and learner.learned_value() != measure.r:
            measure.r_changes(self.now, learner.learned_value())
        self.delays.forward(task, route, probed)

    def task_at_node(self, task: object, route: object) -> None:
        """``task`` reaches its node now."""
        assert isinstance(task, Task) and isinstance(route, Route)
        k = route.node
        if self.fault_rng is not None:
            fraction = failing(self.fail_windows, k, self.now)
            if fraction and self.fault_rng.random() < fraction:
                self._failed_at_node(task, k)
                return
        node = self.nodes[k]
        waits = node.arrive(task, self.now)
        self.occupancy[k] = node.x
        if self.records_latency:
            self.at_node[task.id] = (node.x - 1, self.now)
        if task.batch >= 0 and self.is_fcfs[k]:
            self.measure.fcfs_arrivals[task.batch] += 1
            self.measure.fcfs_waits[task.batch] += waits
        self._reschedule(node)
        msgs = self.sides[k].on_arrival(node.x, task.origin, route.piggyback)
        if msgs:
            self.to_dispatcher(msgs)
        if route.messages:
            self.to_nodes(route.messages)

    def _failed_at_node(self, task: Task, k: int) -> None:
        """Node ``k`` failed ``task`` (a fail fault): never admitted, it leaves the system now, and its
        dispatcher hears of it with the node's answer, as the cluster's does: the task is done, and it
        failed."""
        self.failed += 1
        self.left += 1
        if task.batch >= 0:
            self.measure.outstanding -= 1
        dispatcher = self.dispatchers[task.origin]
        dispatcher.on_task_done(k, self.now - task.forwarded)
        dispatcher.on_task_failed(k)

    def _own_event_at(self, k: int, t: float) -> None:
        if t < INF:
            self.schedule(t, self._own_event, k)

    def _own_event(self, k: object, _: object) -> None:
        """Node ``k``'s own event (its timer, ``NodeSide.on_timer``) is due now."""
        assert isinstance(k, int)
        msgs, after = self.sides[k].on_timer(self.now, self.nodes[k].x)
        if msgs:
            self.to_dispatcher(msgs)
        self._own_event_at(k, after)

    def _speed_change(self, node: object, factor: object) -> None:
        assert isinstance(node, int) and isinstance(factor, float)
        self.nodes[node].set_speed(self.now, self.exp.node_speeds[node] * factor)
        self._reschedule(self.nodes[node])

    # ------------------------------------------------------------------------------------- messages

    def to_dispatcher(self, msgs: tuple[Message, ...], answer: bool = False) -> None:
        """Node sides' messages to dispatchers (``answer``: they answer the receivers' own messages)."""
        self._send(msgs, answer, self.at_dispatcher)

    def to_nodes(self, msgs: tuple[Message, ...]) -> None:
        """Dispatcher sides' messages to node sides."""
        self._send(msgs, False, self._at_node)

    def _send(self, msgs: tuple[Message, ...], answer: bool, deliver: Handler) -> None:
        for m in msgs:
            self.measure.count(m.kind)
            delay = self.delays.message(m, answer)
            if delay is not None:
                self.schedule(self.now + delay, deliver, m)
            else:
                deliver(m, None)

    def at_dispatcher(self, m: object, _: object = None) -> None:
        """The state message ``m`` reaches its dispatcher now."""
        assert isinstance(m, Message)
        out = self.dispatchers[m.dispatcher].on_message(m)
        if out:
            self.to_nodes(out)

    def _at_node(self, m: object, _: object = None) -> None:
        assert isinstance(m, Message)
        out = self.sides[m.node].on_message(m, self.nodes[m.node].x)
        if out:
            self.to_dispatcher(out, answer=True)

    # ------------------------------------------------------------------- the instant probe's arrivals

    def _instant_probe(self) -> InstantProbe | None:
        """The policy's fast path, when nothing else in the run talks: a dispatcher side that decides by
        one probe answered at once (``InstantProbe``), whose node sides say nothing, that wants no
        completions back and learns nothing, with no delays, faults or latencies to record."""
        # Poisson arrivals, one dispatcher, no delays or faults; then the policy's side of the rule
        if not self._stale_integrates() or self.measure.learner is not None:
            return None
        return instant_probe_of(self.dispatcher, self.sides, self.occupancy)


#: whether this module runs compiled (mypyc): see _calendar
COMPILED = not __file__.endswith(".py")


def _calendar(exp: Experiment) -> CalendarQueue:
    """The event queue for ``exp``: days of about 32 completions (the arrival rate's), and a ring of days
    over 8 mean service times at the slowest node's speed, beyond which few tasks last. Interpreted, one
    day holds everything (a plain heap): filing an event under a later day is a call of the interpreter,
    dearer there than the cache misses of a deeper heap."""
    if not COMPILED:
        return CalendarQueue(INF, 1)
    width = 32.0 / exp.workload.arrival_rate
    longest = 8.0 * exp.workload.service.mean / min(exp.node_speeds)
    return CalendarQueue(width, min(1 << 20, int(longest / width) + 1))
