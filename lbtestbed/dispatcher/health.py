"""Node health as a dispatcher sees it: heartbeats, down and up, re-admission and reconciliation.

Every node process is asked for its state (``GET /v1/state``) every ``health.heartbeat`` wall seconds. A
process that does not answer within ``health.timeout``, or a forward to it that fails on the connection,
marks all its nodes down: the policy hears ``on_node_down`` and routes nothing there. The first answer
after that brings them back (``on_node_up``): *fresh* when the process restarted (its incarnation changed:
its tasks and counters are gone, and the ends of tasks routed to its earlier life are not reported to the
policy), otherwise with the state it kept (a paused process). A dispatcher's first contact with a process
is fresh too, so a restarted dispatcher rebuilds its picture from the nodes' own reports.

Between transitions the answers serve reconciliation: the policy gets each node's report from at least
``reconcile_age`` ago, old enough that every message the node sent before it has arrived unless it was
lost, and applies what it shows that no message brought. Under exact delivery this changes nothing.
Answers overdue to a message of ours (SLTA's epochs) are asked again after ``health.timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, Protocol

import aiohttp

from lbtestbed.model.spec import Experiment
from lbtestbed.policies import DispatcherSide, Message
from lbtestbed.transport import wire


class Owner(Protocol):
    """What health tracking needs of the dispatcher it serves (``DispatcherHost``)."""

    exp: Experiment
    node_urls: list[str]
    token: str
    policy: DispatcherSide
    session: aiohttp.ClientSession | None

    def send(self, msgs: Sequence[Message]) -> None: ...

    def track_r(self) -> None: ...


log = logging.getLogger("lbtestbed.dispatcher")

#: wall seconds a dispatcher waits at its start for every node process to answer once before it takes
#: tasks; processes still silent then start out down
FIRST_CONTACT = 15.0
#: transitions kept for /v1/health
EVENTS_KEPT = 1000

Report = tuple[int, ...]


class NodeProcess:
    """One node process as the dispatcher tracks it."""

    def __init__(self, index: int, url: str, nodes: list[int]) -> None:
        self.index, self.url, self.nodes = index, url, nodes
        self.up = True  # the policy starts with every node up
        self.contacted = False
        self.incarnation: int | None = None
        self.reports: deque[tuple[float, dict[int, Report]]] = deque()  # (received at, reports)


class Health:
    """Heartbeats and transitions of every node process behind one dispatcher."""

    def __init__(self, host: Owner) -> None:
        self.host = host
        exp = host.exp
        self.interval, self.timeout = exp.health.heartbeat, exp.health.timeout
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
        self.transitions: Counter[str] = Counter({"down": 0, "up": 0})
        self.heartbeats: Counter[str] = Counter({"ok": 0, "failed": 0})
        # from 0 for what the policy may resend (SLTA's epochs), so that the first resend is an increase
        self.resent: Counter[str] = Counter({"epoch": 0} if exp.policy.name == "slta" else {})
        self.ignored: Counter[str] = Counter()  # messages from nodes that were down
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._watch(p)) for p in self.processes]
        self.tasks.append(asyncio.ensure_future(self._resend_overdue()))

    def stop(self) -> None:
        for t in self.tasks:
            t.cancel()

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
                self._down(p, f"no answer in the first {FIRST_CONTACT:g} s")
        return True

    async def _check(self, p: NodeProcess) -> None:
        session = self.host.session
        assert session is not None
        try:
            async with session.get(
                f"{p.url}{wire.PREFIX}/state",
                headers=wire.bearer(self.host.token),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                body = await resp.json()
            incarnation = int(body["incarnation"])
            raw = body["reports"]
            reports = {k: tuple(int(v) for v in raw[str(k)]) for k in p.nodes}
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as e:
            self.heartbeats["failed"] += 1
            if p.contacted and p.up:
                self._down(p, f"health check failed: {str(e) or type(e).__name__}")
            return
        self.heartbeats["ok"] += 1
        self._answered(p, incarnation, reports)

    def _answered(self, p: NodeProcess, incarnation: int, reports: dict[int, Report]) -> None:
        host, policy = self.host, self.host.policy
        now = time.monotonic()
        fresh = incarnation != p.incarnation
        if fresh and p.contacted and p.up:  # restarted between two checks: it was down all the same
            self._down(p, "restarted")
        if fresh or not p.up:
            for k in p.nodes:
                if fresh:
                    self.generation[k] += 1
                host.send(policy.on_node_up(k, reports[k], fresh))
                self.node_up[k] = True
            self.up_count += len(p.nodes) if not p.up else 0
            if p.contacted or not p.up:
                self._event(p, "up", "restarted" if fresh and p.contacted else "answers again", fresh)
            p.up, p.contacted, p.incarnation = True, True, incarnation
            p.reports.clear()
        else:
            while len(p.reports) > 1 and p.reports[1][0] <= now - self.reconcile_age:
                p.reports.popleft()
            if p.reports and p.reports[0][0] <= now - self.reconcile_age:
                _, old = p.reports.popleft()
                for k in p.nodes:
                    host.send(policy.reconcile(k, old[k]))
        p.reports.append((now, reports))
        host.track_r()

    # -------------------------------------------------------------------------------- transitions

    def unreachable(self, node: int, reason: str) -> None:
        """A forward or probe to ``node`` failed on the connection: its process is down until it answers."""
        p = self.processes[self.process_of[node]]
        if p.up:
            self._down(p, reason)

    def _down(self, p: NodeProcess, reason: str) -> None:
        p.up = False
        p.reports.clear()
        for k in p.nodes:
            self.node_up[k] = False
            self.host.policy.on_node_down(k)
        self.up_count -= len(p.nodes)
        self.host.track_r()
        self._event(p, "down", reason, False)

    def _event(self, p: NodeProcess, to: str, reason: str, fresh: bool) -> None:
        self.transitions[to] += 1
        log.warning("node process %d (%s) %s: %s", p.index, p.url, to, reason)
        self.events.append(
            {
                "unix_time": time.time(),
                "process": p.index,
                "url": p.url,
                "nodes": [p.nodes[0], p.nodes[-1]],
                "to": to,
                "reason": reason,
                "fresh": fresh,
            }
        )

    # ----------------------------------------------------------------------------------- answers

    def sent(self, node: int) -> None:
        self.last_sent[node] = time.monotonic()

    async def _resend_overdue(self) -> None:
        """Ask again where an answer to a message of ours is overdue (a lost SLTA epoch or its answer)."""
        policy = self.host.policy
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            for k in list(policy.awaiting()):
                if self.node_up[k] and now - self.last_sent[k] > self.timeout:
                    msgs = policy.resend(k)
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
