"""The node host's core: the virtual nodes of a spec (their models, their policy sides, their time integrals),
as events in and actions out.

It reads no clock and owns no socket. Events carry their time: model seconds (``now``, what the node
models run on; the shell reads it through its ``ModelClock``), and the monotonic instant where a wall
duration is measured (a message's age). What the core wants done it says: a method's return value (a
``wire.Reply``; an ``Admitted`` task whose request waits for its completion) and the actions it leaves in
``outbox`` for the shell to carry out after the call: ``Arm`` node k's timer for model time t (its next
completion, speed change or event of its node side's own, ``NodeSide.timed``), ``Completed`` (a task's
request may answer), ``Send`` a state message, a ``Note`` for the log. The shell (``server_node.host``)
keeps the timers, waits for completions, sends, and stamps the instants; a unit test drives the core with a
handful of events (tests/test_node_core.py).

A task's request: ``arrive(k, body, now)`` (a ``Reply``: 400, 500 a fail fault, 503 the task limit; or
``Admitted``); when its timer fires on time, ``fire(k, t)`` completes it exactly at model time t, whatever
the timer's error, and leaves ``Completed``; ``served(...)`` is the reply (``forget`` the task if its
request went away first). Every event at a node first applies the departures, speed changes and node-side
events due by then (``_catch_up``), so that events apply in model-time order: a timer that fires late must
not let a later arrival overtake the completion it stands for.

A node side's own events (``NodeSide.timed``: sparse_jsq's queue updates) run on a clock: this host's own
start (clock 0) until it hears the run's model time 0 (``set_origin``: clock 1, then 2, ... for later
runs), where their schedule starts afresh, so that the node's events fall where the simulator and the twin
put them (docs/spec.md, "`sparse_jsq`").
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from lbtestbed.model.clock import ModelClock
from lbtestbed.model.conditions import fail_windows, failing, speed_changes
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import INF, NodeModel, make_node
from lbtestbed.model.streams import seeded_random
from lbtestbed.model.workload import Task
from lbtestbed.policies import Message, NodeSide, make_node_sides, policy_of
from lbtestbed.transport import wire
from lbtestbed.transport.actions import AgeObserver, Note, Observer, Send
from lbtestbed.transport.message_faults import MessageFaults
from lbtestbed.transport.wire import Reply, error_reply


class Arm(NamedTuple):
    """Node ``node``'s timer is now for model time ``t`` (its next event; INF: none): the shell drops the
    timer it had and sets this one."""

    node: int
    t: float


class Completed(NamedTuple):
    """The task ``task`` completed at model time ``t``; ``riders``: messages for its dispatcher that ride
    on the reply to its request."""

    task: int
    t: float
    riders: list[Message]


class Admitted(NamedTuple):
    """A task admitted at its node: its id, its arrival (model time) and whether it waits for service."""

    task: int
    arrived: float
    waited: bool


Action = Arm | Completed | Send | Note


class Recorder(Protocol):
    """Where the core's observations go (``server_node.metrics.NodeMetrics``: Prometheus histograms)."""

    @property
    def lateness(self) -> Observer:
        """Wall seconds from a task's completion instant to its completion."""

    @property
    def ages(self) -> AgeObserver:
        """The age of every state message applied."""


class NodeCore:
    """The virtual nodes ``node_ids`` of ``exp`` behind one process, for ``dispatchers`` dispatchers."""

    def __init__(
        self,
        exp: Experiment,
        node_ids: Sequence[int],
        dispatchers: int,
        max_tasks: int,
        incarnation: int,
        recorder: Recorder,
    ) -> None:
        self.exp = exp
        self.ids = list(node_ids)
        self.dispatchers = dispatchers
        self.max_tasks = max_tasks
        self.incarnation = incarnation
        self.recorder = recorder
        self.clock = ModelClock(exp.run.time_scale)  # its origin is set at start
        rng = seeded_random(exp.seed, "nodes", self.ids[0])
        self.sides: dict[int, NodeSide] = dict(
            zip(self.ids, make_node_sides(exp, rng, self.ids, max(1, dispatchers)), strict=True)
        )
        self.accepts = policy_of(exp).node_bound
        self.models: dict[int, NodeModel] = {}
        # node sides that learn from each task's latency (records_latency): the tasks each found on arrival
        self.records_latency = any(type(s).records_latency for s in self.sides.values())
        self.found: dict[int, int] = {}
        self.scheduled: dict[int, float] = {}  # the model time each node's timer is for
        # node sides with events of their own (NodeSide.timed): the time of each one's next on its clock and
        # on this host's, the number of the clock their schedules run on (0: this host's start, n: the n-th
        # run's clock heard) and that clock's model time 0 on this host's
        self.timed = [k for k in self.ids if type(self.sides[k]).timed]
        self.own_next: dict[int, float] = {}
        self.own_at: dict[int, float] = {}
        self.timer_clock = 0
        self.timer_offset = 0.0
        self.waiting: set[int] = set()  # tasks whose request waits for their completion
        self.task_ids = itertools.count(1)
        self.sent: Counter[str] = Counter()
        self.piggybacked: Counter[str] = Counter()  # of those sent, how many rode on a task's reply
        # every kind it sends starts at 0: the first failure is then an increase Prometheus sees
        self.send_failures: Counter[str] = Counter(
            {k: 0 for k in exp.policy.message_kinds() if k in policy_of(exp).dispatcher_bound}
        )
        self.received: Counter[str] = Counter()
        self.refused: Counter[int] = Counter()
        self.failed: Counter[int] = Counter()
        self.heartbeats = 0  # state reports served
        self.delayed = exp.network.delay is not None
        self.faults = MessageFaults(exp, 1000 + self.ids[0])
        # the run's clock (set_origin): whether it is known, node model time minus run model time, and the
        # timed speed changes still to come per node (node model time, speed)
        self.origin_known = False
        self.offset = 0.0
        self.changes: dict[int, deque[tuple[float, float]]] = {}
        self.speed_plan = speed_changes(exp, nodes=self.ids)  # drawn once: set_origin only arms them
        self.fail_windows = tuple(w for w in fail_windows(exp) if w.node in self.ids)
        self.fault_rng = seeded_random(exp.seed, "faults", 1 + self.ids[0])
        self.outbox: list[Action] = []

    def start(self, clock: ModelClock) -> None:
        """The nodes start empty at model time 0 of ``clock``."""
        self.clock = clock
        exp = self.exp
        for k in self.ids:
            c = exp.node_class[k]
            self.models[k] = make_node(
                exp.classes[c].discipline, exp.node_speeds[k], exp.classes[c].utility, 0.0
            )
            self.scheduled[k] = INF  # no timer: nothing to do
        self._start_timers(0.0, 0.0)  # this host's own clock until it hears the run's (set_origin)

    def take(self) -> list[Action]:
        """The actions the calls so far have left, in order; the outbox is empty after."""
        out, self.outbox = self.outbox, []
        return out

    def node_of(self, text: str) -> int | Reply:
        """The node a request's path names (``text``: its digits), or the 404 if this host has none."""
        k = int(text) if len(text) <= 18 else -1  # int() refuses thousands of digits with ValueError
        if k not in self.sides:
            shown = text if len(text) <= 64 else f"{text[:20]}...({len(text)} digits)"
            return error_reply(404, f"no node {shown} here")
        return k

    # ------------------------------------------------------------------------------- the run's clock

    def set_origin(self, offset: float, now: float) -> int:
        """The run's model time 0 is this host's model time ``offset``; ``now``: the model time now. Arm
        the spec's timed speed changes of this host's nodes (``model.conditions``) at their model times,
        and judge its fail faults on the run's clock. Returns how many speed changes are still to come
        (those already past apply at once)."""
        self.origin_known, self.offset = True, offset
        if not self.models:
            return 0  # start() arms them
        for k, model in self.models.items():  # a new run starts from the nodes' own speeds
            if model.speed != self.exp.node_speeds[k]:
                self._catch_up(k, max(now, model.last))
                model.set_speed(max(now, model.last), self.exp.node_speeds[k])
        self.changes = {}
        for c in self.speed_plan:
            if c.node in self.models:
                at = c.at + offset
                self.changes.setdefault(c.node, deque()).append((at, self.exp.node_speeds[c.node] * c.factor))
        for k in self.changes:
            self._catch_up(k, max(now, self.models[k].last))
        if self.timed:
            self.timer_clock += 1
            self._start_timers(offset, now)
        return sum(len(q) for q in self.changes.values())

    def _start_timers(self, offset: float, now: float) -> None:
        """The node sides' own schedules afresh on the clock whose model time 0 is this host's ``offset``;
        their events before ``now`` are skipped (NodeSide.start_timer)."""
        self.timer_offset = offset
        for k in self.timed:
            self._catch_up(k, max(now, self.models[k].last))  # what is due on the old schedule happens first
            self.own_next[k] = t = self.sides[k].start_timer(self.timer_clock, now - offset)
            self.own_at[k] = t + offset
            self._schedule(k)

    # ---------------------------------------------------------------------------------------- tasks

    def arrive(self, k: int, body: Mapping[str, Any], now: float) -> Reply | Admitted:
        """A task's request for node ``k`` (its JSON object) at model time ``now``."""
        try:
            work = wire.number(body, "work", positive=True)
            origin = wire.integer(body, "origin", 0)
            piggyback = wire.small_tuple(body.get("piggyback", []), "piggyback")
            if origin >= max(1, self.dispatchers):
                raise wire.BadRequest(f"no dispatcher {origin} in this cluster", "origin")
        except wire.BadRequest as e:
            return wire.bad_request(e)
        model = self.models[k]
        t = max(now, model.last)
        self._catch_up(k, t)  # departures due by now come first, so they may free a place
        if self.fail_windows and self.origin_known:
            fraction = failing(self.fail_windows, k, t - self.offset)
            if fraction and self.fault_rng.random() < fraction:
                self.failed[k] += 1
                return error_reply(500, f"node {k} failed the task (a fail fault)")
        if model.x >= self.max_tasks:
            self.refused[k] += 1
            return error_reply(503, f"node {k} holds its limit of {self.max_tasks} tasks")
        task = Task(next(self.task_ids), work, t, origin)
        self.waiting.add(task.id)
        waited = model.arrive(task, t)
        if self.records_latency:
            self.found[task.id] = model.x - 1
        self._schedule(k)
        try:
            msgs = self.sides[k].on_arrival(model.x, origin, piggyback)
            if msgs:
                self.send(msgs, self.clock.to_wall(t))
        except (ValueError, TypeError, AssertionError) as e:  # the task is admitted and served regardless
            self.send_failures["piggyback"] += 1
            self.outbox.append(Note(f"node {k}: bad piggyback {piggyback!r}: {e}"))
        return Admitted(task.id, t, waited)

    def forget(self, task: int) -> None:
        """The request of ``task`` is no longer waiting (answered, or gone)."""
        self.waiting.discard(task)

    def served(
        self, k: int, task: Admitted, done: float, riders: list[Message], fired: float, replied: float
    ) -> Reply:
        """The reply to a task's request: it completed at model time ``done`` (``Completed``), the shell
        saw that at the monotonic instant ``fired`` and answers at ``replied``. Model times, and the
        monotonic instants that place them on the other processes' clocks (one machine's
        CLOCK_MONOTONIC: docs/run.md, "Where the time goes"): model time x is t0 + x * time_scale."""
        self.recorder.lateness.observe(max(0.0, fired - self.clock.to_wall(done)))
        reply: dict[str, Any] = {
            "node": k,
            "arrived": task.arrived,
            "completed": done,
            "waited": task.waited,
            "t0": self.clock.origin,
            "fired": fired,
        }
        if riders:
            reply["messages"] = [wire.message_to_json(m, fired) for m in riders]
        reply["replied"] = replied
        return Reply(200, reply, compact=True)

    def probe(self, k: int, now: float) -> Reply:
        """``POST /v1/nodes/k/probe`` at model time ``now``."""
        self._catch_up(k, max(now, self.models[k].last))
        self.received["probe"] += 1
        self.sent["probe_reply"] += 1
        return Reply(200, {"node": k, "x": self.sides[k].probe_reply(self.models[k].x)})

    # ------------------------------------------------------------------------------- node model time

    def fire(self, k: int, t: float) -> None:
        """Node ``k``'s timer for model time ``t`` fired (not early)."""
        self.scheduled.pop(k, None)
        self._catch_up(k, t)

    def _next_event(self, k: int) -> float:
        """Model time of node k's next event: a completion, a timed speed change or its own."""
        t = self.models[k].next_completion()
        changes = self.changes.get(k)
        if changes:
            t = min(t, changes[0][0])
        return min(t, self.own_at.get(k, INF)) if self.timed else t

    def _schedule(self, k: int) -> None:
        t = self._next_event(k)
        if t != self.scheduled.get(k):
            self.scheduled[k] = t
            self.outbox.append(Arm(k, t))

    def _catch_up(self, k: int, now: float) -> None:
        """Complete every task of node k that is due by ``now`` but whose timer has not fired yet, and apply
        the speed changes due by then, in model-time order; then arm its timer for its next event."""
        model = self.models[k]
        changes = self.changes.get(k)
        own_at = self.own_at
        while True:
            t = model.next_completion()
            change = changes[0][0] if changes else INF
            own = own_at.get(k, INF) if self.timed else INF
            if min(t, change, own) > now:
                break
            self.scheduled.pop(k, None)  # its timer stood for this event
            if change <= t and change <= own:
                assert changes is not None
                _, speed = changes.popleft()
                model.set_speed(max(change, model.last), speed)
            elif own < t:  # at equal times the departure first: the node side's event sees it gone
                self._own_event(k, own)
            else:
                self.complete(k, t)
        self._schedule(k)

    def _own_event(self, k: int, t: float) -> None:
        """Node k's own event (``NodeSide.on_timer``), due at model time ``t``: exactly then, whenever
        the timer ran; its messages' ages run from that instant, as a departure's do."""
        msgs, after = self.sides[k].on_timer(self.own_next[k], self.models[k].x)
        self.own_next[k] = after
        self.own_at[k] = after + self.timer_offset
        if msgs:
            self.send(msgs, self.clock.to_wall(t))

    def complete(self, k: int, t: float) -> None:
        """The departure scheduled at model time t: exactly then, whenever the timer ran."""
        model = self.models[k]
        task = model.complete(max(t, model.last))
        self.scheduled.pop(k, None)
        if self.records_latency and task.id in self.found:
            self.sides[k].on_served(self.found.pop(task.id), model.last - task.arrived)
        msgs = self.sides[k].on_departure(model.x, task.origin)
        if task.id in self.waiting:
            self.waiting.discard(task.id)
            ride: list[Message] = []
            if self._riders():  # messages for the dispatcher that routed this task ride on its reply
                ride = [m for m in msgs if m.dispatcher == task.origin]
                for m in ride:
                    self.sent[m.kind] += 1
                    self.piggybacked[m.kind] += 1
                msgs = tuple(m for m in msgs if m.dispatcher != task.origin)
            self.outbox.append(Completed(task.id, t, ride))
        if msgs:
            self.send(msgs, self.clock.to_wall(t))

    def snapshot(self, now: float) -> dict[str, Any]:
        """Exact integrals of every node up to model time ``now`` (advancing them is harmless: it is exact
        integration)."""
        out = {}
        for k, m in self.models.items():
            self._catch_up(k, max(now, m.last))
            m.advance(max(now, m.last))
            out[k] = m
        return {"time": now, "models": out}

    # --------------------------------------------------------------------------------------- messages

    def _riders(self) -> bool:
        """Whether messages for a task's dispatcher may ride on the reply: not when the network is
        emulated (a delay, or message faults active), which applies to messages sent on their own."""
        return not self.delayed and not self.faults.active

    def send(self, msgs: Iterable[Message], at: float) -> None:
        """Send ``msgs`` on requests of their own. Their age runs from ``at`` (monotonic): the instant of
        the model event that made them, so that the timer's lateness, emulated delays and the loop turn
        before the request leaves count in it, as the twin, which sends them at the event, needs."""
        for m in msgs:
            copies = self.faults.copies(m.kind)
            if not copies:  # dropped on the way: sent, never received
                self.sent[m.kind] += 1
            for extra in copies:
                self.outbox.append(Send(m, at, extra))

    def message_left(self, m: Message) -> None:
        """A copy of ``m`` leaves now (after its delays)."""
        self.sent[m.kind] += 1

    def message_failed(self, m: Message) -> None:
        """A copy of ``m`` could not be delivered."""
        self.send_failures[m.kind] += 1

    def messages(self, k: int, body: Mapping[str, Any], at: float) -> Reply:
        """``POST /v1/nodes/k/messages``: state messages for node ``k`` (its JSON object), received at the
        monotonic instant ``at``; answers to the sender ride on the reply."""
        try:
            msgs = wire.parse_messages(body, self.accepts)
        except wire.BadRequest as e:
            return wire.bad_request(e)
        for i, m in enumerate(msgs):
            if m.node != k:
                return error_reply(
                    400, f"message for node {m.node} posted to node {k}", f"messages[{i}].node"
                )
        if self.records_latency:  # a probe answered from the node's latencies reads its state now
            self._catch_up(k, max(self.clock.to_model(at), self.models[k].last))
        ride: list[Message] = []
        for i, m in enumerate(msgs):
            self.recorder.ages.observe(m, wire.sent_at(body["messages"][i]), at)
            try:
                out = self.sides[k].on_message(m, self.models[k].x)
            except (ValueError, TypeError, AssertionError) as e:
                return error_reply(
                    400, f"{m.kind}: {e} ({i} of {len(msgs)} messages applied)", f"messages[{i}]"
                )
            self.received[m.kind] += 1
            if self._riders():  # answers to the sender ride on this reply
                ride.extend(a for a in out if a.dispatcher == m.dispatcher)
                out = tuple(a for a in out if a.dispatcher != m.dispatcher)
            self.send(out, at)
        for a in ride:
            self.sent[a.kind] += 1
            self.piggybacked[a.kind] += 1
        reply: dict[str, Any] = {"ok": True, "applied": len(msgs)}
        if ride:
            reply["messages"] = [wire.message_to_json(a, at) for a in ride]
        return Reply(200, reply)

    # ---------------------------------------------------------------------------------- health, state

    def state(self, now: float) -> Reply:
        """``GET /v1/state``, the dispatchers' heartbeat: this process's incarnation and every node's report
        (its node side's account of itself, after the departures due by model time ``now``)."""
        reports = {}
        for k, side in self.sides.items():
            self._catch_up(k, max(now, self.models[k].last))
            reports[str(k)] = list(side.report(self.models[k].x))
        self.heartbeats += 1
        return Reply(200, {"incarnation": self.incarnation, "model_time": now, "reports": reports})

    def health(self, now: float) -> Reply:
        """``GET /v1/health`` at model time ``now``."""
        return Reply(200, {"status": "ok", "nodes": self.ids, "model_time": now})
