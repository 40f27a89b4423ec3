"""Node health as a dispatcher sees it: heartbeats, down and up, re-admission and reconciliation.

Every node process is asked for its state (``GET /v1/state``) every ``health.heartbeat`` wall seconds. A
process that does not answer within ``health.timeout``, or a forward to it that fails on the connection,
marks all its nodes down: the policy hears ``on_node_down`` and routes nothing there. A connection refused
or broken, or an answer not signed with the cluster's key, is evidence that the process is gone and acts at
once. A timeout is a judgment: it counts only if the check had its time (this process's own event loop
was not stopped or starved for half of it: ``LoopWatch``; otherwise the check is asked again), and it is
not applied when it would leave more than ``health.max_ejection`` of the nodes ejected by judgment (the
cluster's nodes do not all fail at once; a dispatcher that thinks so is more likely wrong itself). A
failure that is this process's own shortage (no file descriptor) blames nobody. The first answer
after that brings them back (``on_node_up``): *fresh* when the process restarted (its incarnation changed:
its tasks and counters are gone, and the ends of tasks routed to its earlier life are not reported to the
policy), otherwise with the state it kept (a paused process). A dispatcher's first contact with a process
is fresh too, so a restarted dispatcher rebuilds its picture from the nodes' own reports.

Between transitions the answers serve reconciliation: the policy gets each node's report from at least
``reconcile_age`` ago, old enough that every message the node sent before it has arrived unless it was
lost, and applies what it shows that no message brought. Under exact delivery this changes nothing.
Answers overdue to a message of ours (a policy's ``resends``) are asked again after ``health.timeout``.

This module is the bookkeeping only, as ``outliers`` is: it reads no clock (every event carries its
monotonic instant) and calls nobody. Its methods return decisions: what the policy is to hear (``NodeDown``,
``NodeUp``, ``Reconcile``), which the dispatcher's core applies in order, and what the shell is to log
(``Transition``, ``Note``). The checks themselves (requests, timers) are ``dispatcher.checks``'.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from lbtestbed.dispatcher.outliers import OutlierDetector
from lbtestbed.model.clock import ModelClock
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import policy_of
from lbtestbed.transport.actions import Note
from lbtestbed.transport.wire import PREFIX

#: wall seconds a dispatcher waits at its start for every node process to answer once before it takes
#: tasks; processes still silent then start out down
FIRST_CONTACT = 15.0
#: why a request to a node process failed: it is gone (refused, broken, an impostor), it timed out, or this
#: process ran short (nobody's fault)
FAILURE_KINDS = ("gone", "timeout", "local")

Report = tuple[int, ...]


class NodeDown(NamedTuple):
    """The policy is to hear that ``node`` is down."""

    node: int


class NodeUp(NamedTuple):
    """The policy is to hear that ``node`` is up with ``report`` (``fresh``: a new life of its process)."""

    node: int
    report: Report
    fresh: bool


class Reconcile(NamedTuple):
    """The policy is to reconcile its picture of ``node`` with an old enough ``report``."""

    node: int
    report: Report


class Transition(NamedTuple):
    """Process ``process`` (or the node ``nodes`` names, an outlier) went ``to`` down or up: logged and
    journaled by the shell."""

    process: int
    url: str
    nodes: list[int]  # first and last node
    to: str
    reason: str
    fresh: bool


Decision = NodeDown | NodeUp | Reconcile | Transition | Note


class LoopWatch:
    """How long this process's event loop could not run: a tick every ``TICK`` wall seconds (the shell's
    timer calls ``tick``) notes how late it woke. A health deadline that passed while the loop stood still
    (SIGSTOP, a long GC pause, CPU starvation) says nothing about the peer."""

    TICK = 0.05
    #: a tick later than this is a stall (the loop's own jitter stays far below)
    LATE = 0.02

    def __init__(self, started: float) -> None:
        self.last = started
        self.stalls: deque[tuple[float, float]] = deque(maxlen=256)  # (ended, seconds)

    def tick(self, now: float) -> None:
        late = now - self.last - self.TICK
        if late > self.LATE:
            self.stalls.append((now, late))
        self.last = now

    def lost_since(self, since: float, now: float) -> float:
        """Wall seconds from ``since`` to ``now`` the loop could not run, the stall going on now included."""
        lost = sum(min(length, end - since) for end, length in self.stalls if end > since)
        current = now - self.last - self.TICK
        return lost + (current if current > self.LATE else 0.0)

    def had(self, since: float, wanted: float, now: float) -> bool:
        """Whether a deadline ``wanted`` seconds after ``since`` had at least half that time to run."""
        return (now - since) - self.lost_since(since, now) >= wanted / 2


def processes_of(node_urls: Sequence[str]) -> list[tuple[str, list[int]]]:
    """The node processes behind ``node_urls`` (``.../v1/nodes/k``): each one's base URL and its nodes."""
    by_url: dict[str, list[int]] = {}
    for k, url in enumerate(node_urls):
        by_url.setdefault(url.rsplit(f"{PREFIX}/nodes/", 1)[0], []).append(k)
    return list(by_url.items())


class NodeProcess:
    """One node process as the dispatcher tracks it."""

    def __init__(self, index: int, url: str, nodes: list[int]) -> None:
        self.index, self.url, self.nodes = index, url, nodes
        self.up = True  # the policy starts with every node up
        self.judged = False  # down by a judgment (timeouts), which max_ejection bounds
        self.contacted = False
        self.incarnation: int | None = None
        self.reports: deque[tuple[float, dict[int, Report]]] = deque()  # (received at, reports)


class Health:
    """The liveness of every node process behind one dispatcher, on its ``clock`` (whose origin is the
    instant the dispatcher started)."""

    def __init__(
        self, exp: Experiment, processes: Sequence[tuple[str, list[int]]], clock: ModelClock
    ) -> None:
        self.interval, self.timeout = exp.health.heartbeat, exp.health.timeout
        self.spec = exp.health
        #: nodes that may be down by judgment at once (timeouts, outliers)
        self.max_judged = exp.health.max_ejection * exp.n
        started = clock.origin
        self.watch = LoopWatch(started)
        # old enough that a report's messages have arrived: the timeout, or far into the emulated delay's
        # tail (20 means: e^-20 of an exponential delay), whichever is longer
        delay = clock.wall_span(exp.network.delay.mean) if exp.network.delay is not None else 0.0
        self.reconcile_age = max(self.timeout, 20 * delay)
        self.processes = [NodeProcess(i, url, list(nodes)) for i, (url, nodes) in enumerate(processes)]
        self.process_of = [0] * exp.n
        for p in self.processes:
            for k in p.nodes:
                self.process_of[k] = p.index
        self.node_up = [True] * exp.n
        self.up_count = exp.n
        self.generation = [0] * exp.n  # bumped at a fresh up: ends of earlier tasks are not the policy's
        self.last_sent = [0.0] * exp.n  # monotonic instant of the last message to each node
        self.ready = False  # every process answered once, or FIRST_CONTACT passed
        self.started = started
        self.transitions: Counter[str] = Counter({"down": 0, "up": 0})
        self.heartbeats: Counter[str] = Counter({"ok": 0, "failed": 0, "local": 0, "stalled": 0})
        self.spared = 0  # timeouts not acted on: they would have ejected more than max_ejection
        self.outliers = OutlierDetector(exp.node_speeds, exp.health)
        self.ejections = 0  # outliers ejected
        # from 0 for what the policy may resend (unit.Policy.resends), so that the first resend is an increase
        self.resent: Counter[str] = Counter(dict.fromkeys(policy_of(exp).resends, 0))
        self.ignored: Counter[str] = Counter()  # messages from nodes that were down

    # --------------------------------------------------------------------------------- heartbeats

    def first_contact(self, at: float) -> list[Decision]:
        """After a check: ready once every process has answered, or once ``FIRST_CONTACT`` has passed
        (those still silent are down)."""
        if self.ready:
            return []
        if all(p.contacted for p in self.processes):
            self.ready = True
            return []
        if at - self.started < FIRST_CONTACT:
            return []
        out: list[Decision] = []
        for p in self.processes:
            if not p.contacted and p.up:
                out += self.down(p, f"no answer in the first {FIRST_CONTACT:g} s")
        self.ready = True
        return out

    def stalled(self, kind: str, began: float, at: float) -> bool:
        """Whether a request begun at ``began`` that failed with ``kind`` at ``at`` timed out because this
        process's own loop stood still (then it says nothing of the node)."""
        return kind == "timeout" and not self.watch.had(began, self.timeout, at)

    def check_failed(self, p: NodeProcess, kind: str, reason: str) -> list[Decision]:
        """A health check of ``p`` without an answer (``kind``: one of FAILURE_KINDS; not a stall)."""
        if kind == "local":
            self.heartbeats["local"] += 1
            return [Note(f"health check of node process {p.index} skipped: {reason}")]
        self.heartbeats["failed"] += 1
        if p.contacted and p.up:
            return self.down(p, f"health check failed: {reason}", kind == "timeout")
        return []

    def answered(
        self, p: NodeProcess, incarnation: int, reports: dict[int, Report], at: float
    ) -> Iterator[Decision]:
        """A health check's answer: ``p``'s incarnation and every node's report, read at ``at``.

        A generator: it yields each decision for the policy when its bookkeeping reaches it and goes on
        when the caller has applied it, so that a report the policy refuses (the caller stops, with the
        policy's exception) leaves the bookkeeping where the policy stopped; then ``unreadable``."""
        fresh = incarnation != p.incarnation
        if fresh and p.contacted and p.up:  # restarted between two checks: it was down all the same
            yield from self.down(p, "restarted")
        if fresh or not p.up:
            for k in p.nodes:
                if fresh:
                    self.generation[k] += 1
                    self.outliers.back(k)  # a restarted process serves new nodes: their ejection ends
                if k in self.outliers.until:
                    continue  # ejected as an outlier: taken back when its time is up
                yield NodeUp(k, reports[k], fresh)
                if not self.node_up[k]:
                    self.node_up[k] = True
                    self.up_count += 1
            if p.contacted or not p.up:
                yield self._event(p, "up", "restarted" if fresh and p.contacted else "answers again", fresh)
            p.up, p.judged, p.contacted, p.incarnation = True, False, True, incarnation
            p.reports.clear()
        else:
            while len(p.reports) > 1 and p.reports[1][0] <= at - self.reconcile_age:
                p.reports.popleft()
            if p.reports and p.reports[0][0] <= at - self.reconcile_age:
                _, old = p.reports.popleft()
                for k in p.nodes:
                    yield Reconcile(k, old[k])
        p.reports.append((at, reports))
        self.heartbeats["ok"] += 1

    def unreadable(self, p: NodeProcess, error: Exception) -> list[Decision]:
        """``p`` answered with a report the policy cannot read (another version, a broken peer): the
        check failed, and the watch goes on."""
        self.heartbeats["unreadable"] += 1
        out: list[Decision] = []
        if p.up:  # once, not at every heartbeat
            out.append(Note(f"node process {p.index}: unreadable state report: {error}"))
            out += self.down(p, f"unreadable state report: {error}")
        p.contacted = True  # it answered: no first-contact wait for it
        return out

    # -------------------------------------------------------------------------------- transitions

    def unreachable(
        self, node: int, reason: str, kind: str = "gone", began: float = 0.0, at: float = 0.0
    ) -> list[Decision]:
        """A forward or probe to ``node`` begun at ``began`` failed at ``at`` (``kind``: one of
        FAILURE_KINDS): its process is down until it answers, unless the failure was this process's own."""
        p = self.processes[self.process_of[node]]
        if kind == "local" or not p.up:
            return []
        if self.stalled(kind, began, at):
            return []  # our own stall, not the node's
        return self.down(p, reason, kind == "timeout")

    def judged_down(self) -> int:
        """Nodes down by judgment now: of processes that timed out, and outliers of processes that are up."""
        timed_out = sum(len(p.nodes) for p in self.processes if not p.up and p.judged)
        outliers = sum(1 for k in self.outliers.until if self.processes[self.process_of[k]].up)
        return timed_out + outliers

    def down(self, p: NodeProcess, reason: str, judged: bool = False) -> list[Decision]:
        """Mark ``p`` down. A judgment (``judged``: a timeout) is not applied when it would leave more than
        ``health.max_ejection`` of the nodes down by judgment: then the dispatcher keeps routing there."""
        if judged and self.judged_down() + len(p.nodes) > self.max_judged:
            self.spared += 1
            return [
                Note(
                    f"node process {p.index} ({p.url}) not marked down ({reason}): more than "
                    f"{self.spec.max_ejection:g} of the nodes would be ejected"
                )
            ]
        p.up, p.judged = False, judged
        p.reports.clear()
        out: list[Decision] = []
        for k in p.nodes:
            if self.node_up[k]:  # an outlier ejected before is down already
                self.node_up[k] = False
                out.append(NodeDown(k))
                self.up_count -= 1
        out.append(self._event(p, "down", reason, False))
        return out

    # ----------------------------------------------------------------------------- outliers

    def task_served(self, node: int, work: float, stay: float, waited: bool) -> None:
        """A task completed at ``node`` (``stay``: model seconds there), for outlier detection."""
        self.outliers.success(node, work, stay, waited)

    def task_failed(self, node: int, reason: str, at: float) -> list[Decision]:
        """``node`` answered a task with an error: enough of them in a row eject it."""
        if self.outliers.failure(node):
            return self.eject(node, f"{self.spec.consecutive_failures} tasks failed in a row: {reason}", at)
        return []

    def eject(self, node: int, reason: str, at: float) -> list[Decision]:
        """Route nothing to ``node`` (it answers, but badly) for its ejection time from ``at``, within the
        bound on judgments (``health.max_ejection``)."""
        p = self.processes[self.process_of[node]]
        if not self.node_up[node] or not p.up:
            return []
        if self.judged_down() + 1 > self.max_judged:
            self.spared += 1
            return [
                Note(
                    f"node {node} not ejected ({reason}): more than {self.max_judged:g} of the nodes would be"
                )
            ]
        until = self.outliers.eject(node, at)
        self.node_up[node] = False
        self.up_count -= 1
        self.ejections += 1
        why = f"ejected as an outlier for {until - at:.3g} s: {reason}"
        return [NodeDown(node), self._event(p, "down", why, False, [node, node])]

    def take_back(self, node: int) -> list[Decision]:
        """An ejected node whose time is up routes again, from its process's latest report."""
        p = self.processes[self.process_of[node]]
        if not p.up:
            self.outliers.back(node)  # it comes back with its process
            return []
        if not p.reports:
            return []  # not yet a report since its process came back: at the next interval
        self.outliers.back(node)
        report = p.reports[-1][1][node]
        self.node_up[node] = True
        self.up_count += 1
        return [NodeUp(node, report, False), self._event(p, "up", "ejection over", False, [node, node])]

    def outlier_interval(self, at: float) -> list[Decision]:
        """An outlier interval ended at ``at``: eject the slow nodes, take back those whose time is up."""
        out: list[Decision] = []
        if self.spec.slow_share > 0:
            for k, why in self.outliers.slow():
                out += self.eject(k, why, at)
        for k in self.outliers.due(at):
            out += self.take_back(k)
        return out

    def _event(
        self, p: NodeProcess, to: str, reason: str, fresh: bool, nodes: list[int] | None = None
    ) -> Transition:
        """A transition of process ``p`` (``nodes``: first and last node; one node for an outlier)."""
        self.transitions[to] += 1
        return Transition(p.index, p.url, nodes or [p.nodes[0], p.nodes[-1]], to, reason, fresh)

    # ----------------------------------------------------------------------------------- answers

    def sent(self, node: int, at: float) -> None:
        self.last_sent[node] = at

    def overdue(self, node: int, at: float) -> bool:
        """Whether an answer from ``node`` to our last message is overdue at ``at``."""
        return self.node_up[node] and at - self.last_sent[node] > self.timeout

    def snapshot(self) -> dict[str, object]:
        """For ``GET /v1/health`` (the shell adds the transitions it logged)."""
        return {
            "nodes_up": self.up_count,
            "nodes_down": [k for k, up in enumerate(self.node_up) if not up],
            "ready": self.ready,
        }
