"""A dispatcher process's shell: the I/O around ``DispatcherCore`` (``dispatcher.core``).

It stamps every event with the monotonic clock (not the loop's: uvloop's has millisecond resolution),
hands it to the core and carries out what the core decides: probes, the forward of a task to its node,
state messages (behind the emulated network delay), the health checks (``dispatcher.checks``), the log and
journal of node transitions. Its routes take a request's JSON object and give a ``wire.Reply``, whatever
the server: ``dispatcher.app`` serves the task path on the lean server and the rest with aiohttp. Probes
and threshold updates go out to the nodes' endpoints on lean kept-alive connections (``transport.http``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from prometheus_client.core import Metric

from lbtestbed.dispatcher.checks import HealthChecks, failure_kind, failure_reason
from lbtestbed.dispatcher.core import DISPATCHER_STREAM as DISPATCHER_STREAM
from lbtestbed.dispatcher.core import LOCAL_FAILURE, DispatcherCore, Ticket
from lbtestbed.dispatcher.health import Transition, processes_of
from lbtestbed.dispatcher.metrics import DispatcherMetrics
from lbtestbed.model.clock import ModelClock
from lbtestbed.model.distributions import BlockSampler
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.streams import seed_sequence
from lbtestbed.policies import DispatcherSide, Route
from lbtestbed.transport import wire
from lbtestbed.transport.actions import Send
from lbtestbed.transport.http import Peers
from lbtestbed.transport.lean_http import Stats, stats_metrics
from lbtestbed.transport.metrics import listener_metrics
from lbtestbed.transport.process import ConnectionGuard
from lbtestbed.transport.signing import Signer, Verifier
from lbtestbed.transport.tasks import TaskSet
from lbtestbed.transport.wire import Reply

log = logging.getLogger("lbtestbed.dispatcher")

#: transitions kept for /v1/health
EVENTS_KEPT = 1000


class DispatcherHost:
    def __init__(
        self,
        exp: Experiment,
        index: int,
        dispatchers: int,
        node_urls: Sequence[str],
        token: str,
        url: str | None = None,
        journal: Path | None = None,
    ) -> None:
        if len(node_urls) != exp.n:
            raise ValueError(f"the spec has {exp.n} nodes but {len(node_urls)} node endpoints were given")
        self.exp = exp
        self.index = index
        self.signer = Signer(token)  # what it sends the nodes, and their answers
        self.verifier = Verifier(token, url)  # what the nodes send it, and its answers
        self.started = time.monotonic()
        self.started_unix = time.time()
        self.clock = ModelClock(exp.run.time_scale, self.started)
        self.metrics = DispatcherMetrics(exp, self.clock)
        self.registry = self.metrics.registry
        self.core = DispatcherCore(exp, index, dispatchers, processes_of(node_urls), self.clock, self.metrics)
        self.health = self.core.health
        self.faults = self.core.faults
        self.delay = None
        if exp.network.delay is not None:
            self.delay = BlockSampler(
                exp.network.delay, np.random.default_rng(seed_sequence(exp.seed, "network", 2000 + index))
            )
        self.delay_tasks = exp.network.forward_tasks and self.delay is not None
        # the listener's guard for its metrics: set by the process that serves this host; the lean server
        # of its task path counts into ``http``
        self.guard: ConnectionGuard | None = None
        self.http = Stats()
        # the task path's requests (forwards, probes, messages): lean kept-alive connections per process
        self.peers = Peers(signer=self.signer)
        self.node_peer = [
            (self.peers.pool(u.rsplit(f"{wire.PREFIX}/nodes/", 1)[0]), f"{wire.PREFIX}/nodes/{k}")
            for k, u in enumerate(node_urls)
        ]
        self.background = TaskSet(f"dispatcher {index} messages")
        # every transition is also appended to the journal (JSON lines), read back when the dispatcher starts
        self.journal = journal
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
        self._read_journal()
        self.checks = HealthChecks(self.core, self.signer, self.act)
        self.ready = self.checks.ready  # set once every node process has answered once
        self.metrics.collect_from(self.core, self._listener_metrics)

    def _listener_metrics(self) -> Iterator[Metric]:
        yield from listener_metrics("dispatcher", self.guard, self.verifier.refused)
        yield from stats_metrics("dispatcher", self.http)

    @property
    def policy(self) -> DispatcherSide:
        return self.core.policy

    @policy.setter
    def policy(self, side: DispatcherSide) -> None:
        self.core.policy = side

    async def start(self) -> None:
        self.checks.start()

    async def stop(self) -> None:
        await self.checks.stop()
        await self.background.close()
        self.peers.close()

    def act(self) -> None:
        """Carry out what the core decided since the last call."""
        if not self.core.outbox:
            return
        for action in self.core.take():
            if isinstance(action, Send):
                self.background.spawn(self._post_message(action))
            elif isinstance(action, Transition):
                self._transition(action)
            else:
                log.warning("%s", action.text)

    async def _sleep_delay(self) -> None:
        if self.delay is not None:
            await asyncio.sleep(self.clock.wall_span(self.delay()))

    # ------------------------------------------------------------------------------------ routes

    def task(self, body: Mapping[str, Any], accepted: float) -> Reply | Coroutine[Any, Any, Reply]:
        """``POST /v1/tasks``: the task's JSON object, accepted at ``accepted``; a refusal now, or the
        answer once its node has served it (or could not). The policy decides here, in the step that
        stamped ``accepted``, not when the answer's coroutine first runs: a loop turn later (Python 3.11
        starts a task's coroutine on the next turn), messages read in between (probe replies that fill a
        pool) would reach the decision, while the twin decides at the stamp, before them."""
        ticket = self.core.accept(body, accepted)
        if isinstance(ticket, Reply):
            return ticket
        return self._answer(ticket)

    async def _answer(self, ticket: Ticket) -> Reply:
        try:
            return await self._route(ticket)  # the answer: the task has left the dispatcher
        except BaseException:  # the request ended otherwise (cancelled, a bug): it leaves all the same
            self.core.leave(ticket, time.monotonic())
            raise

    def messages(self, body: Mapping[str, Any]) -> Reply:
        """``POST /v1/messages``: state messages from the nodes."""
        reply = self.core.messages(body, time.monotonic())
        self.act()
        return reply

    def health_reply(self) -> Reply:
        """``GET /v1/health``: 503 before every node process has answered once."""
        return self.core.health_reply(list(self.events))

    # ------------------------------------------------------------------------------------- tasks

    async def _route(self, ticket: Ticket) -> Reply:
        """Probe if the policy asks, forward, and answer the task."""
        core = self.core
        if ticket.probe is not None:
            async with asyncio.TaskGroup() as probes:
                replies = [probes.create_task(self._probe(k)) for k in ticket.probe.nodes]
            core.resolve(ticket, [r.result() for r in replies], time.monotonic())
        route = core.route(ticket, time.monotonic())  # it is forwarded: its latency at the dispatcher starts
        # threshold updates follow the task they were decided with: act() starts their tasks, which run
        # once this one waits, and the forward's request is written before it waits (unless it has to
        # open a connection first, or sleep an emulated delay, as the messages do too)
        self.act()
        await self._forward(ticket, route)
        return core.answer(ticket, time.monotonic())

    async def _probe(self, k: int) -> int:
        """One probe and its reply (each delayed like any state message)."""
        await self._sleep_delay()
        core = self.core
        core.probe_sent(k)
        pool, path = self.node_peer[k]
        began = time.monotonic()
        try:
            _, raw = await pool.post(f"{path}/probe", b"{}", timeout=self.exp.health.timeout)
            x = int(orjson.loads(raw)["x"])
        except (OSError, TimeoutError) as e:
            full = core.probe_failed(k, failure_reason(e), failure_kind(e), began, time.monotonic())
            self.act()
            return full
        except (ValueError, KeyError, TypeError) as e:  # an answer, but not a probe reply
            return core.probe_failed(k, failure_reason(e), None, began, time.monotonic())
        await self._sleep_delay()
        return core.probe_answered(k, x)

    async def _forward(self, ticket: Ticket, route: Route) -> None:
        """Forward the task to its node and hand the core what its reply says."""
        try:
            if self.delay_tasks:
                await self._sleep_delay()
            body = orjson.dumps(
                {"work": ticket.work, "origin": self.index, "piggyback": list(route.piggyback)}
            )
            pool, path = self.node_peer[route.node]
            forwarded = time.monotonic()
            reply: dict[str, Any]
            try:
                status, raw = await pool.post(f"{path}/tasks", body)
                reply = orjson.loads(raw)
                if not isinstance(reply, dict):
                    reply = {}
            except (OSError, TimeoutError, ValueError) as e:
                status = LOCAL_FAILURE if failure_kind(e) == "local" else 0
                reply = {"error": failure_reason(e)}
            if self.delay_tasks:
                await self._sleep_delay()  # the completion's way back, as in the simulator
        except asyncio.CancelledError:  # the dispatcher is stopping: the task's count ends with it
            self.core.release(ticket, time.monotonic())
            raise
        self.core.settle(ticket, status, reply, forwarded, time.monotonic())
        self.act()

    # --------------------------------------------------------------------------------- messages

    async def _post_message(self, send: Send) -> None:
        m, core = send.message, self.core
        if send.extra:
            await asyncio.sleep(self.clock.wall_span(send.extra))
        await self._sleep_delay()
        core.message_left(m)
        pool, path = self.node_peer[m.node]
        try:
            body = orjson.dumps({"messages": [wire.message_to_json(m, send.at)]})
            status, raw = await pool.post(f"{path}/messages", body)
            if status != 200:
                core.message_failed(m)
                return
            reply = orjson.loads(raw)
            core.riders(reply.get("messages") if isinstance(reply, dict) else None, time.monotonic())
            self.act()
        except (OSError, TimeoutError, ValueError):
            core.message_failed(m)

    # ------------------------------------------------------------------------------ transitions

    def _transition(self, t: Transition) -> None:
        """Log a node transition, keep it for /v1/health and append it to the journal."""
        log.warning("node process %d (%s) %s: %s", t.process, t.url, t.to, t.reason)
        event = {
            "unix_time": time.time(),
            "process": t.process,
            "url": t.url,
            "nodes": t.nodes,
            "to": t.to,
            "reason": t.reason,
            "fresh": t.fresh,
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
