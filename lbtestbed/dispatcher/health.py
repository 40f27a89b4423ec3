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
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from lbtestbed.dispatcher.outliers import OutlierDetector
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import DispatcherSide, Message, policy_of
from lbtestbed.transport import wire
from lbtestbed.transport.http import LOCAL_ERRNOS, LocalError
from lbtestbed.transport.signing import SIGNATURE, Signer


class Owner(Protocol):
    """What health tracking needs of the dispatcher it serves (``DispatcherHost``)."""

    exp: Experiment
    node_urls: list[str]
    signer: Signer
    policy: DispatcherSide

    def send(self, msgs: Sequence[Message]) -> None: ...

    def side(self, at: float | None = None) -> DispatcherSide:
        """The policy for a call into it, its clock set (``DispatcherHost.side``)."""
        ...

    def track_r(self) -> None: ...


log = logging.getLogger("lbtestbed.dispatcher")

#: wall seconds a dispatcher waits at its start for every node process to answer once before it takes
#: tasks; processes still silent then start out down
FIRST_CONTACT = 15.0
#: transitions kept for /v1/health
EVENTS_KEPT = 1000

Report = tuple[int, ...]


class CheckFailed(Exception):
    """A health check or probe without an answer: ``kind`` is ``gone`` (refused, broken, an impostor),
    ``timeout`` or ``local`` (this process ran short: nobody's fault)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


class LoopWatch:
    """How long this process's event loop could not run: a tick every ``TICK`` wall seconds notes how late
    it woke. A health deadline that passed while the loop stood still (SIGSTOP, a long GC pause, CPU
    starvation) says nothing about the peer."""

    TICK = 0.05
    #: a tick later than this is a stall (the loop's own jitter stays far below)
    LATE = 0.02

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.stalls: deque[tuple[float, float]] = deque(maxlen=256)  # (ended, seconds)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.TICK)
            now = time.monotonic()
            late = now - self.last - self.TICK
            if late > self.LATE:
                self.stalls.append((now, late))
            self.last = now

    def lost_since(self, since: float) -> float:
        """Wall seconds since ``since`` the loop could not run, the stall going on now included."""
        now = time.monotonic()
        lost = sum(min(length, end - since) for end, length in self.stalls if end > since)
        current = now - self.last - self.TICK
        return lost + (current if current > self.LATE else 0.0)

    def had(self, since: float, wanted: float) -> bool:
        """Whether a deadline ``wanted`` seconds after ``since`` had at least half that time to run."""
        return (time.monotonic() - since) - self.lost_since(since) >= wanted / 2


def failure_kind(e: BaseException) -> str:
    """``gone``, ``timeout`` or ``local`` for an exception of a request to a node process."""
    if isinstance(e, CheckFailed):
        return e.kind
    if isinstance(e, TimeoutError):
        return "timeout"
    code = getattr(getattr(e, "os_error", None), "errno", None) or getattr(e, "errno", None)
    if isinstance(e, LocalError) or code in LOCAL_ERRNOS:
        return "local"
    return "gone"


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
    """Heartbeats and transitions of every node process behind one dispatcher."""

    def __init__(self, host: Owner, journal: Path | None = None) -> None:
        self.host = host
        # every transition is also appended here (JSON lines), and read back when the dispatcher starts
        self.journal = journal
        self.started_unix = time.time()
        exp = host.exp
        self.interval, self.timeout = exp.health.heartbeat, exp.health.timeout
        #: nodes that may be down by judgment at once (timeouts, outliers)
        self.max_judged = exp.health.max_ejection * exp.n
        self.watch = LoopWatch()
        # old enough that a report's messages have arrived: the timeout, or far into the emulated delay's
        # tail (20 means: e^-20 of an exponential delay), whichever is longer
        delay = exp.network.delay.mean * exp.run.time_scale if exp.network.delay is not None else 0.0
        self.reconcile_age = max(self.timeout, 20 * delay)
        by_url: dict[str, list[int]] = {}
        for k, url in enumerate(host.node_urls):
            by_url.setdefault(url.rsplit(f"{wire.PREFIX}/nodes/", 1)[0], []).append(k)
        self.processes = [NodeProcess(i, url, nodes) for i, (url, nodes) in enumerate(by_url.items())]
        self.process_of = [0] * exp.n
        for p in self.processes:
            for k in p.nodes:
                self.process_of[k] = p.index
        self.node_up = [True] * exp.n
        self.up_count = exp.n
        self.generation = [0] * exp.n  # bumped at a fresh up: ends of earlier tasks are not the policy's
        self.last_sent = [0.0] * exp.n  # wall time of the last message to each node
        self.ready = asyncio.Event()
        self.started = time.monotonic()
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
        self._read_journal()
        self.transitions: Counter[str] = Counter({"down": 0, "up": 0})
        self.heartbeats: Counter[str] = Counter({"ok": 0, "failed": 0, "local": 0, "stalled": 0})
        self.spared = 0  # timeouts not acted on: they would have ejected more than max_ejection
        self.outliers = OutlierDetector(exp.node_speeds, exp.health)
        self.ejections = 0  # outliers ejected
        # from 0 for what the policy may resend (unit.Policy.resends), so that the first resend is an increase
        self.resent: Counter[str] = Counter(dict.fromkeys(policy_of(exp).resends, 0))
        self.ignored: Counter[str] = Counter()  # messages from nodes that were down
        self.tasks: list[asyncio.Task[None]] = []
        # health checks ride on kept-alive connections to processes that answer, and on a fresh connection
        # each to a process that is down, so that a check never rides on a connection to whatever holds its
        # address now (a squatter on a dead process's port keeps its connections open)
        self.session: aiohttp.ClientSession | None = None
        self.fresh: aiohttp.ClientSession | None = None

    def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None), timeout=timeout
        )
        self.fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, force_close=True), timeout=timeout
        )
        self.tasks = [asyncio.ensure_future(self._watch(p)) for p in self.processes]
        self.tasks.append(asyncio.ensure_future(self._resend_overdue()))
        self.tasks.append(asyncio.ensure_future(self.watch.run()))
        self.tasks.append(asyncio.ensure_future(self._watch_outliers()))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for session in (self.session, self.fresh):
            if session is not None:
                await session.close()

    # --------------------------------------------------------------------------------- heartbeats

    async def _watch(self, p: NodeProcess) -> None:
        while True:
            began = time.monotonic()
            await self._check(p)
            if not self.ready.is_set() and self._all_contacted():
                self.ready.set()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - began)))

    def _all_contacted(self) -> bool:
        if all(p.contacted for p in self.processes):
            return True
        if time.monotonic() - self.started < FIRST_CONTACT:
            return False
        for p in self.processes:
            if not p.contacted and p.up:
                self.down(p, f"no answer in the first {FIRST_CONTACT:g} s")
        return True

    async def _check(self, p: NodeProcess) -> None:
        """Ask ``p`` for its state; a timeout that this process's own stall caused is asked again."""
        while True:
            began = time.monotonic()
            try:
                incarnation, reports = await self._ask(p)
                break
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, CheckFailed) as e:
                kind = failure_kind(e)
                if kind == "timeout" and not self.watch.had(began, self.timeout):
                    self.heartbeats["stalled"] += 1  # our loop stood still: the node was not judged
                    continue
                if kind == "local":
                    self.heartbeats["local"] += 1
                    log.warning("health check of node process %d skipped: %s", p.index, e)
                    return
                self.heartbeats["failed"] += 1
                if p.contacted and p.up:
                    self.down(p, f"health check failed: {str(e) or type(e).__name__}", kind == "timeout")
                return
        try:
            self._answered(p, incarnation, reports)
        except (ValueError, TypeError, AssertionError) as e:
            # a report the policy cannot read (another version, a broken peer): the check failed, and
            # the watch goes on (an exception here used to end it for good)
            self.heartbeats["unreadable"] += 1
            if p.up:  # once, not at every heartbeat
                log.warning("node process %d: unreadable state report: %s", p.index, e)
                self.down(p, f"unreadable state report: {e}")
            p.contacted = True  # it answered: no first-contact wait for it
            return
        self.heartbeats["ok"] += 1

    async def _ask(self, p: NodeProcess) -> tuple[int, dict[int, Report]]:
        session = self.session if p.up and p.contacted else self.fresh
        assert session is not None
        url = f"{p.url}{wire.PREFIX}/state"
        headers, tag = self.host.signer.headers("GET", url)
        async with session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout)
        ) as resp:
            raw = await resp.read()
            if not self.host.signer.answer_ok(tag, resp.status, raw, resp.headers.get(SIGNATURE)):
                raise CheckFailed("gone", f"an answer without the cluster's signature (status {resp.status})")
            if resp.status != 200:
                raise ValueError(f"status {resp.status}")
        body = orjson.loads(raw)
        incarnation = int(body["incarnation"])
        got = body["reports"]
        return incarnation, {k: tuple(int(v) for v in got[str(k)]) for k in p.nodes}

    def _answered(self, p: NodeProcess, incarnation: int, reports: dict[int, Report]) -> None:
        host = self.host
        now = time.monotonic()
        fresh = incarnation != p.incarnation
        if fresh and p.contacted and p.up:  # restarted between two checks: it was down all the same
            self.down(p, "restarted")
        if fresh or not p.up:
            for k in p.nodes:
                if fresh:
                    self.generation[k] += 1
                    self.outliers.back(k)  # a restarted process serves new nodes: their ejection ends
                if k in self.outliers.until:
                    continue  # ejected as an outlier: taken back when its time is up
                host.send(host.side().on_node_up(k, reports[k], fresh))
                if not self.node_up[k]:
                    self.node_up[k] = True
                    self.up_count += 1
            if p.contacted or not p.up:
                self._event(p, "up", "restarted" if fresh and p.contacted else "answers again", fresh)
            p.up, p.judged, p.contacted, p.incarnation = True, False, True, incarnation
            p.reports.clear()
        else:
            while len(p.reports) > 1 and p.reports[1][0] <= now - self.reconcile_age:
                p.reports.popleft()
            if p.reports and p.reports[0][0] <= now - self.reconcile_age:
                _, old = p.reports.popleft()
                for k in p.nodes:
                    host.send(host.side().reconcile(k, old[k]))
        p.reports.append((now, reports))
        host.track_r()

    # -------------------------------------------------------------------------------- transitions

    def unreachable(self, node: int, reason: str, kind: str = "gone", began: float = 0.0) -> None:
        """A forward or probe to ``node`` failed (``kind`` as ``failure_kind``; ``began``: when, for a
        timeout): its process is down until it answers, unless the failure was this process's own."""
        p = self.processes[self.process_of[node]]
        if kind == "local" or not p.up:
            return
        if kind == "timeout" and not self.watch.had(began, self.timeout):
            return  # our own stall, not the node's
        self.down(p, reason, kind == "timeout")

    def judged_down(self) -> int:
        """Nodes down by judgment now: of processes that timed out, and outliers of processes that are up."""
        timed_out = sum(len(p.nodes) for p in self.processes if not p.up and p.judged)
        outliers = sum(1 for k in self.outliers.until if self.processes[self.process_of[k]].up)
        return timed_out + outliers

    def down(self, p: NodeProcess, reason: str, judged: bool = False) -> None:
        """Mark ``p`` down. A judgment (``judged``: a timeout) is not applied when it would leave more than
        ``health.max_ejection`` of the nodes down by judgment: then the dispatcher keeps routing there."""
        if judged and self.judged_down() + len(p.nodes) > self.max_judged:
            self.spared += 1
            log.warning(
                "node process %d (%s) not marked down (%s): more than %g of the nodes would be ejected",
                p.index,
                p.url,
                reason,
                self.host.exp.health.max_ejection,
            )
            return
        p.up, p.judged = False, judged
        p.reports.clear()
        for k in p.nodes:
            if self.node_up[k]:  # an outlier ejected before is down already
                self.node_up[k] = False
                self.host.side().on_node_down(k)
                self.up_count -= 1
        self.host.track_r()
        self._event(p, "down", reason, False)

    # ----------------------------------------------------------------------------- outliers

    def task_served(self, node: int, work: float, stay: float, waited: bool) -> None:
        """A task completed at ``node`` (``stay``: model seconds there), for outlier detection."""
        self.outliers.success(node, work, stay, waited)

    def task_failed(self, node: int, reason: str) -> None:
        """``node`` answered a task with an error: enough of them in a row eject it."""
        if self.outliers.failure(node):
            self.eject(node, f"{self.host.exp.health.consecutive_failures} tasks failed in a row: {reason}")

    def eject(self, node: int, reason: str) -> None:
        """Route nothing to ``node`` (it answers, but badly) for its ejection time, within the bound on
        judgments (``health.max_ejection``)."""
        p = self.processes[self.process_of[node]]
        if not self.node_up[node] or not p.up:
            return
        if self.judged_down() + 1 > self.max_judged:
            self.spared += 1
            log.warning(
                "node %d not ejected (%s): more than %g of the nodes would be", node, reason, self.max_judged
            )
            return
        until = self.outliers.eject(node, time.monotonic())
        self.node_up[node] = False
        self.host.side().on_node_down(node)
        self.up_count -= 1
        self.ejections += 1
        self.host.track_r()
        wait = until - time.monotonic()
        self._event(p, "down", f"ejected as an outlier for {wait:.3g} s: {reason}", False, [node, node])

    def _take_back(self, node: int) -> None:
        """An ejected node whose time is up routes again, from its process's latest report."""
        p = self.processes[self.process_of[node]]
        if not p.up:
            self.outliers.back(node)  # it comes back with its process
            return
        if not p.reports:
            return  # not yet a report since its process came back: at the next interval
        self.outliers.back(node)
        report = p.reports[-1][1][node]
        self.host.send(self.host.side().on_node_up(node, report, False))
        self.node_up[node] = True
        self.up_count += 1
        self.host.track_r()
        self._event(p, "up", "ejection over", False, [node, node])

    async def _watch_outliers(self) -> None:
        interval = self.host.exp.health.outlier_interval
        while True:
            await asyncio.sleep(interval)
            if self.host.exp.health.slow_share > 0:
                for k, why in self.outliers.slow():
                    self.eject(k, why)
            for k in self.outliers.due(time.monotonic()):
                self._take_back(k)

    def _event(
        self, p: NodeProcess, to: str, reason: str, fresh: bool, nodes: list[int] | None = None
    ) -> None:
        """A transition of process ``p`` (``nodes``: first and last node; one node for an outlier)."""
        self.transitions[to] += 1
        log.warning("node process %d (%s) %s: %s", p.index, p.url, to, reason)
        event = {
            "unix_time": time.time(),
            "process": p.index,
            "url": p.url,
            "nodes": nodes or [p.nodes[0], p.nodes[-1]],
            "to": to,
            "reason": reason,
            "fresh": fresh,
            "dispatcher_started": self.started_unix,
        }
        self.events.append(event)
        if self.journal is not None:
            try:
                with open(self.journal, "a") as f:
                    f.write(json.dumps(event) + "\n")
            except OSError as e:  # the events stay in memory: only a restart would lose them
                log.warning("cannot write %s: %s", self.journal, e)

    def _read_journal(self) -> None:
        """The transitions this dispatcher's earlier lives saw (a restart must not erase them)."""
        if self.journal is None or not self.journal.exists():
            return
        for line in self.journal.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short when the process was killed mid-write
            if isinstance(event, dict):
                self.events.append(event)

    # ----------------------------------------------------------------------------------- answers

    def sent(self, node: int) -> None:
        self.last_sent[node] = time.monotonic()

    async def _resend_overdue(self) -> None:
        """Ask again where an answer to a message of ours is overdue (a lost message or its answer)."""
        host = self.host
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            for k in list(host.side(now).awaiting()):
                if self.node_up[k] and now - self.last_sent[k] > self.timeout:
                    msgs = host.side(now).resend(k)
                    for m in msgs:
                        self.resent[m.kind] += 1
                    self.host.send(msgs)

    def snapshot(self) -> dict[str, Any]:
        """For ``GET /v1/health``."""
        return {
            "nodes_up": self.up_count,
            "nodes_down": [k for k, up in enumerate(self.node_up) if not up],
            "ready": self.ready.is_set(),
            "events": list(self.events),
        }
