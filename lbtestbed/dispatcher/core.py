"""The dispatcher's core: the policy, the nodes' liveness, outlier detection and the accounting, as events in
and actions out (docs/design.md, principle 2, one level up).

It reads no clock and owns no socket. Every event carries its monotonic instant (``at``); what the core
wants done it says: a method's return value (a ``wire.Reply`` to write, a ``Ticket`` whose route names
the node to forward to or probe) and the actions it leaves in ``outbox`` for the shell to carry out after
the call (``Send`` a state message, log a ``Transition`` or a ``Note``). The shell around it
(``dispatcher.host``) parses requests, keeps the timers, sends, and stamps the instants; a unit test drives
the core with a handful of events (tests/test_dispatcher_core.py).

A task's way through it:

1. ``accept(body, at)``: the task's JSON object; a ``Reply`` (400, or the dispatcher's own 503) or a
   ``Ticket`` that holds the policy's decision: a ``route`` (go to 3) or a ``probe`` of some nodes;
2. per probe, ``probe_sent(k)`` then ``probe_answered(k, x)`` or ``probe_failed(...)``; then
   ``resolve(ticket, replies, at)`` sets the route;
3. ``route(ticket, at)``: the instant it is decided and forwarded to ``ticket.route.node`` (its threshold
   updates, ``route.messages``, go to the outbox);
4. ``settle(ticket, status, reply, forwarded, answered)``: the node's answer (``status`` 0: no answer,
   ``LOCAL_FAILURE``: never sent), read at ``answered``; its riders reach the policy at once;
   ``release(ticket, at)`` instead when the forward was cancelled;
5. ``answer(ticket, at)``: the ``Reply`` for the client, ready at ``at``; the task leaves the dispatcher
   (``leave`` does it alone, for a request that ended otherwise).

Completion is synchronous: the client's ``POST /v1/tasks`` stays open until the node has served the task, and
the reply carries the node and the times. This costs an open connection per task in flight but no completion
message, lets the client measure sojourn directly, and lets least_request count tasks in flight exactly as a
proxy does. Every task ends completed, refused (the node answered 503) or lost (the node failed or
vanished); the three counters add up to the tasks accepted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from lbtestbed.dispatcher.health import (
    Decision,
    Health,
    NodeDown,
    NodeUp,
    Reconcile,
    Report,
    Transition,
)
from lbtestbed.model.clock import ModelClock
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.streams import seeded_random
from lbtestbed.policies import DispatcherSide, Message, Probe, Route, make_dispatcher, policy_of
from lbtestbed.transport import wire
from lbtestbed.transport.actions import AgeObserver, Note, Observer, Send
from lbtestbed.transport.message_faults import MessageFaults
from lbtestbed.transport.wire import Reply, error_reply

OUTCOMES = ("completed", "refused", "lost")
#: why a dispatcher refused a task itself (503), rather than its node: it was starting, no node was up, it
#: held its limit of tasks in flight, or it could not forward the task for want of a local resource
OWN_REFUSALS = ("starting", "no_node_up", "limit", "local")
#: the status of a task this process could not send (no descriptor, no memory)
LOCAL_FAILURE = -1
#: dispatcher i draws its policy's random numbers from stream DISPATCHER_STREAM + i of the experiment
DISPATCHER_STREAM = 1000
#: what a probe without an answer reads: a node that looks full
FULL = 1 << 30
#: the legs of a task's way that the recorder observes (docs/run.md, "Where the time goes")
LEGS = ("decide", "to_node", "node_reply", "from_node")


Action = Send | Transition | Note


class Recorder(Protocol):
    """Where the core's observations go (``dispatcher.metrics.DispatcherMetrics``: Prometheus histograms)."""

    @property
    def sojourn(self) -> Observer:
        """Model seconds from acceptance to the answer."""

    @property
    def latency(self) -> Observer:
        """Wall seconds from acceptance to the decision."""

    @property
    def leg(self) -> Mapping[str, Observer]:
        """Wall seconds of each of LEGS."""

    @property
    def ages(self) -> AgeObserver:
        """The age of every state message applied."""


class TimeIntegral:
    """The integral over model time of a quantity that changes in steps at monotonic instants."""

    def __init__(self, clock: ModelClock, value: float = 0.0) -> None:
        self.value, self._since, self._clock, self._area = value, clock.origin, clock, 0.0

    def set(self, value: float, now: float) -> None:
        self._area += self.value * self._clock.model_span(now - self._since)
        self.value, self._since = value, now

    def add(self, delta: float, now: float) -> None:
        self.set(self.value + delta, now)

    def area(self, now: float) -> float:
        """The integral up to ``now`` (not before the last change)."""
        return self._area + self.value * self._clock.model_span(max(0.0, now - self._since))


class Ticket:
    """One task on its way through the dispatcher: its decision and the monotonic instants of its legs."""

    __slots__ = (
        "accepted",
        "answered",
        "decided",
        "forwarded",
        "generation",
        "left",
        "probe",
        "reply",
        "route",
        "status",
        "work",
    )

    def __init__(self, work: float, accepted: float) -> None:
        self.work, self.accepted = work, accepted
        self.probe: Probe | None = None  # the nodes to probe before the route is known
        self.route: Route | None = None
        self.generation = 0  # its node's when it was routed
        self.decided = self.forwarded = self.answered = accepted
        self.status = 0
        self.reply: dict[str, Any] = {}
        self.left = False  # no longer counted among the tasks present


class DispatcherCore:
    """Dispatcher ``index`` of ``dispatchers`` over the node processes ``processes`` (base URL and nodes;
    ``health.processes_of``), on ``clock`` (model time 0 at its origin: the instant the process started)."""

    def __init__(
        self,
        exp: Experiment,
        index: int,
        dispatchers: int,
        processes: Sequence[tuple[str, list[int]]],
        clock: ModelClock,
        recorder: Recorder,
    ) -> None:
        self.exp = exp
        self.index = index
        self.clock = clock
        self.recorder = recorder
        self.max_work = wire.MAX_WORK_MEANS * exp.workload.service.mean
        declared = policy_of(exp)
        self.accepts = declared.dispatcher_bound
        self.policy: DispatcherSide = make_dispatcher(
            exp, seeded_random(exp.seed, "policy", DISPATCHER_STREAM + index), index, dispatchers
        )
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.piggybacked: Counter[str] = Counter()  # of those received, how many rode on a task's reply
        # messages this dispatcher could not deliver; every kind it sends starts at 0, so that the first
        # failure is an increase that Prometheus sees (a series that appears at 1 has no increase)
        self.failures: Counter[str] = Counter(
            {k: 0 for k in exp.policy.message_kinds() if k not in self.accepts and k != "probe_reply"}
        )
        self.rejected: Counter[str] = Counter()  # messages it received and refused
        self.decisions: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.own_refusals: Counter[str] = Counter({r: 0 for r in OWN_REFUSALS})
        # tasks accepted and not answered at most (503 beyond; transport.process.Budget): set by the
        # process that serves this dispatcher
        self.max_in_flight = 1 << 30
        self.lost_by_node: Counter[int] = Counter()
        self.in_flight = 0
        # integrals over model time, so that a window's time averages are exact (docs/design.md, principle 5):
        # the tasks accepted and not yet answered (probes, forwarding and service included), and what the
        # policy learns (unit.Learned), if it learns anything
        self.present = TimeIntegral(self.clock)
        self.learned = declared.learned
        self.r = TimeIntegral(self.clock, self.policy.learned_value() if self.learned is not None else 0)
        self.faults = MessageFaults(exp, index)
        self.health = Health(exp, processes, clock)
        self.outbox: list[Action] = []

    def take(self) -> list[Action]:
        """The actions the calls so far have left, in order; the outbox is empty after."""
        out, self.outbox = self.outbox, []
        return out

    def side(self, at: float) -> DispatcherSide:
        """The policy, for a call into it at ``at``: one that reads the model time (``uses_clock``) finds
        it in ``now``."""
        policy = self.policy
        if policy.uses_clock:
            policy.now = self.clock.to_model(at)
        return policy

    def track_r(self, at: float) -> None:
        """Follow what the policy learns; called after every policy call that can change it."""
        if self.learned is not None:
            self.r.set(self.policy.learned_value(), at)

    # ------------------------------------------------------------------------------------ tasks

    def accept(self, body: Mapping[str, Any], at: float) -> Reply | Ticket:
        """A task's request (its JSON object) at ``at``: refused, or admitted (``admit``)."""
        try:
            work = wire.task_work(body, self.max_work)
        except wire.BadRequest as e:
            return wire.bad_request(e)
        health = self.health
        if not health.ready or not health.up_count:
            why = "no node is up" if health.ready else "waiting for the nodes' first answers"
            return self._refuse("no_node_up" if health.ready else "starting", f"takes no tasks now: {why}")
        if self.present.value >= self.max_in_flight:
            return self._refuse("limit", f"holds its limit of {self.max_in_flight} tasks")
        return self.admit(work, at)

    def admit(self, work: float, at: float) -> Ticket:
        """A task of ``work`` joins the tasks present at ``at`` and the policy decides where it goes."""
        self.present.add(1, at)
        ticket = Ticket(work, at)
        decision = self.side(at).dispatch()
        if isinstance(decision, Probe):
            ticket.probe = decision
        else:
            ticket.route = decision
        return ticket

    def _refuse(self, reason: str, why: str) -> Reply:
        """A task this dispatcher refuses itself (``reason``: one of OWN_REFUSALS)."""
        self.outcomes["refused"] += 1
        self.own_refusals[reason] += 1
        return error_reply(503, f"dispatcher {self.index} {why}")

    def probe_sent(self, node: int) -> None:
        self.sent["probe"] += 1

    def probe_answered(self, node: int, x: int) -> int:
        """``node``'s probe reply ``x`` arrived (after its emulated delay): what the policy reads."""
        self.received["probe_reply"] += 1
        return x

    def probe_failed(self, node: int, reason: str, kind: str | None, began: float, at: float) -> int:
        """A probe begun at ``began`` got no usable reply at ``at``: ``kind`` (``health.FAILURE_KINDS``) if
        the request failed, None if its answer was not one. The node looks full, and an unreachable one is
        marked down (a paused one after the health timeout)."""
        self.failures["probe"] += 1
        if kind is not None:
            self._apply(self.health.unreachable(node, f"probe failed: {reason}", kind, began, at), at)
        return FULL

    def resolve(self, ticket: Ticket, replies: Sequence[int], at: float) -> None:
        """The probes' ``replies`` are in at ``at``: the policy routes the task."""
        assert ticket.probe is not None
        ticket.route = self.side(at).resolve(ticket.probe, replies)

    def route(self, ticket: Ticket, at: float) -> Route:
        """The task is decided at ``at`` and forwarded: it is in flight to ``route.node``; its threshold
        updates follow it (the outbox)."""
        route = ticket.route
        assert route is not None
        ticket.decided = at
        self.track_r(at)
        self.decisions[route.outcome] += 1
        self.in_flight += 1
        ticket.generation = self.health.generation[route.node]
        self.recorder.latency.observe(at - ticket.accepted)
        self.send(route.messages, at)
        return route

    def settle(
        self, ticket: Ticket, status: int, reply: dict[str, Any], forwarded: float, answered: float
    ) -> None:
        """The task left at ``forwarded`` and its node's answer (``status``, ``reply``) was read at
        ``answered``; it reaches the policy at once: the decisions that follow see its messages, as the
        twin's do (docs/run.md, "The twin"), and never a loop turn later. Its outcome and its stay at the
        node feed outlier detection (docs/faults.md, "Gray failures")."""
        ticket.status, ticket.reply, ticket.forwarded, ticket.answered = status, reply, forwarded, answered
        node = ticket.route.node  # type: ignore[union-attr]
        health = self.health
        if status == 200:
            self.riders(reply.pop("messages", None), answered)
            try:
                stay = float(reply["completed"]) - float(reply["arrived"])
            except (KeyError, TypeError, ValueError):  # a node that does not say (an older version)
                stay = -1.0
            health.task_served(node, ticket.work, stay, reply.get("waited") is True)
        elif status not in (0, 503, LOCAL_FAILURE):  # it answered, with an error
            self._apply(health.task_failed(node, str(reply.get("error", status)), answered), answered)
        if self.release(ticket, answered) and status != 200:
            self.side(answered).on_task_failed(node)
        if status == 0:
            self._apply(health.unreachable(node, f"forward failed: {reply.get('error', '')}"), answered)

    def release(self, ticket: Ticket, at: float) -> bool:
        """The task is no longer in flight at ``at``: the policy counts it done (with its latency from the
        instant it was forwarded to ``at``, in model seconds), unless the node came back fresh since it
        was chosen (the policy then counts the node from its report: earlier tasks are not its own).
        Whether it was still the policy's to count."""
        self.in_flight -= 1
        node = ticket.route.node  # type: ignore[union-attr]
        ours = ticket.generation == self.health.generation[node]
        if ours:
            self.side(at).on_task_done(node, self.clock.model_span(at - ticket.decided))
        return ours

    def answer(self, ticket: Ticket, at: float) -> Reply:
        """The client's answer, ready at ``at``; the task leaves the dispatcher then (the twin's "leave")."""
        self.leave(ticket, at)
        status, reply, node = ticket.status, ticket.reply, ticket.route.node  # type: ignore[union-attr]
        if status == 200:
            self.outcomes["completed"] += 1
            sojourn = self.clock.model_span(at - ticket.accepted)
            self.recorder.sojourn.observe(sojourn)
            legs = self._legs(ticket, reply, at)
            return Reply(200, {"node": node, "sojourn": sojourn, **reply, "legs": legs}, compact=True)
        if status == 503:
            self.outcomes["refused"] += 1
            return error_reply(503, f"node {node} refused the task: {reply.get('error', '')}", node=node)
        if status == LOCAL_FAILURE:  # not the node's fault: nothing reached it
            return self._refuse("local", f"could not forward the task: {reply.get('error', '')}")
        self.outcomes["lost"] += 1
        self.lost_by_node[node] += 1
        return error_reply(502, f"task lost with node {node}: {reply.get('error', '')}", node=node)

    def leave(self, ticket: Ticket, at: float) -> None:
        """The task is no longer among those present (once)."""
        if not ticket.left:
            ticket.left = True
            self.present.add(-1, at)

    def _legs(self, t: Ticket, reply: dict[str, Any], released: float) -> dict[str, float]:
        """The task's way through this dispatcher and its node as monotonic instants (one machine's clock;
        docs/run.md, "Where the time goes"), observed into the leg histograms on the way."""
        legs = {
            "accepted": t.accepted,
            "decided": t.decided,
            "forwarded": t.forwarded,
            "answered": t.answered,
        }
        legs["released"] = released
        try:
            # the node's model times on its own clock: same scale as ours, origin t0
            t0, span = float(reply.pop("t0")), self.clock.wall_span
            arrived = t0 + span(float(reply["arrived"]))
            due = t0 + span(float(reply["completed"]))
            replied = float(reply.pop("replied"))
            legs |= {"node_arrived": arrived, "node_due": due, "node_fired": float(reply.pop("fired"))}
            legs["node_replied"] = replied
        except (KeyError, TypeError, ValueError):
            return legs  # a node that does not stamp (an older version): the legs it would give are missing
        leg = self.recorder.leg
        leg["decide"].observe(t.decided - t.accepted)
        leg["to_node"].observe(max(0.0, arrived - t.forwarded))
        leg["node_reply"].observe(max(0.0, replied - due))
        leg["from_node"].observe(max(0.0, t.answered - replied))
        return legs

    # --------------------------------------------------------------------------------- messages

    def send(self, msgs: Iterable[Message], at: float) -> None:
        """Send ``msgs``, decided at ``at``: their age runs from then (emulated delays and the loop turn
        before a request leaves are part of a message's way; the twin replays ages from the decision)."""
        for m in msgs:
            self.health.sent(m.node, at)
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
        self.failures[m.kind] += 1

    def riders(self, raw: Any, received: float) -> None:
        """State messages that came back on the reply to a task or to a message of ours (read at
        ``received``)."""
        if not isinstance(raw, list):
            return
        try:
            msgs = wire.parse_messages({"messages": raw}, self.accepts)
        except wire.BadRequest as e:
            self.rejected["reply"] += 1
            self.outbox.append(Note(f"bad messages on a reply: {e}"))
            return
        for m, obj in zip(msgs, raw, strict=True):
            self.recorder.ages.observe(m, wire.sent_at(obj), received, rider=True)
            if not 0 <= m.node < self.exp.n:
                self.rejected[m.kind] += 1
                self.outbox.append(Note(f"rejected {m.kind} message from unknown node {m.node} on a reply"))
                continue
            if not self.health.node_up[m.node]:
                self.health.ignored[m.kind] += 1  # its state is read afresh when it is back
                continue
            try:
                out = self.side(received).on_message(m)
            except (ValueError, TypeError, AssertionError) as e:
                self.rejected[m.kind] += 1
                self.outbox.append(Note(f"rejected {m.kind} message on a reply: {e}"))
                continue
            self.received[m.kind] += 1
            self.piggybacked[m.kind] += 1
            self.track_r(received)
            self.send(out, received)

    def messages(self, body: Mapping[str, Any], at: float) -> Reply:
        """``POST /v1/messages``: state messages from the nodes (its JSON object), received at ``at``."""
        try:
            msgs = wire.parse_messages(body, self.accepts)
        except wire.BadRequest as e:
            return wire.bad_request(e)
        for i, m in enumerate(msgs):
            if not 0 <= m.node < self.exp.n:
                return error_reply(400, f"no node {m.node} in this cluster", f"messages[{i}].node")
        for i, m in enumerate(msgs):
            self.recorder.ages.observe(m, wire.sent_at(body["messages"][i]), at)
            if not self.health.node_up[m.node]:
                self.health.ignored[m.kind] += 1  # its state is read afresh when it is back
                continue
            try:
                out = self.side(at).on_message(m)
            except (ValueError, TypeError, AssertionError) as e:
                self.rejected[m.kind] += 1
                return error_reply(
                    400, f"{m.kind}: {e} ({i} of {len(msgs)} messages applied)", f"messages[{i}]"
                )
            self.received[m.kind] += 1
            self.track_r(at)
            self.send(out, at)
        return Reply(200, {"ok": True, "applied": len(msgs)})

    # ----------------------------------------------------------------------------------- health

    def tick(self, at: float) -> None:
        """The shell's loop watch timer woke at ``at`` (``health.LoopWatch``)."""
        self.health.watch.tick(at)

    def check_answered(self, process: int, incarnation: int, reports: dict[int, Report], at: float) -> None:
        """A health check of node process ``process`` answered at ``at``."""
        health = self.health
        p = health.processes[process]
        try:
            for decision in health.answered(p, incarnation, reports, at):
                self._apply_one(decision, at)
        except (ValueError, TypeError, AssertionError) as e:  # a report the policy cannot read
            self._apply(health.unreadable(p, e), at)
        else:
            self.track_r(at)
        self._apply(health.first_contact(at), at)

    def check_failed(self, process: int, kind: str, reason: str, began: float, at: float) -> bool:
        """A health check of ``process`` begun at ``began`` got no answer at ``at`` (``kind``: one of
        ``health.FAILURE_KINDS``). Whether to ask again at once: a timeout that this process's own stall
        caused judges nobody."""
        health = self.health
        if health.stalled(kind, began, at):
            health.heartbeats["stalled"] += 1  # our loop stood still: the node was not judged
            return True
        self._apply(health.check_failed(health.processes[process], kind, reason), at)
        self._apply(health.first_contact(at), at)
        return False

    def outlier_interval(self, at: float) -> None:
        """An outlier interval ended at ``at`` (``dispatcher.outliers``)."""
        self._apply(self.health.outlier_interval(at), at)

    def resend_overdue(self, at: float) -> None:
        """Ask again where an answer to a message of ours is overdue at ``at`` (a lost message or its
        answer)."""
        for k in list(self.side(at).awaiting()):
            if self.health.overdue(k, at):
                msgs = self.side(at).resend(k)
                for m in msgs:
                    self.health.resent[m.kind] += 1
                self.send(msgs, at)

    def _apply(self, decisions: Iterable[Decision], at: float) -> None:
        """Health's decisions, in order: the policy's to the policy, the rest to the outbox."""
        for decision in decisions:
            self._apply_one(decision, at)
        self.track_r(at)

    def _apply_one(self, d: Decision, at: float) -> None:
        if isinstance(d, NodeDown):
            self.side(at).on_node_down(d.node)
        elif isinstance(d, NodeUp):
            self.send(self.side(at).on_node_up(d.node, d.report, d.fresh), at)
        elif isinstance(d, Reconcile):
            self.send(self.side(at).reconcile(d.node, d.report), at)
        else:
            self.outbox.append(d)

    def health_reply(self, events: list[dict[str, Any]]) -> Reply:
        """``GET /v1/health``: ready (200) once every node process has answered once, with the transitions
        the shell logged (``events``)."""
        ready = self.health.ready
        body = {
            "status": "ok" if ready else "starting",
            "dispatcher": self.index,
            "policy": self.policy.name,
            "in_flight": self.in_flight,
            **self.health.snapshot(),
            "events": events,
        }
        return Reply(200 if ready else 503, body)
