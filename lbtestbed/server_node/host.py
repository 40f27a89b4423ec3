"""A server-node process's shell: the I/O around ``NodeCore`` (``server_node.core``).

Each virtual node runs the spec's node model in wall time (``time_scale`` wall seconds per model second,
through one ``ModelClock``) and the node side of the policy. A forwarded task's request stays open until
the task completes (synchronous completion: the dispatcher and the client see the completion without an
extra message). Completions fire from timers, which the core asks for (``Arm``): an alarm at the
completion's instant (``transport.alarm``), never early; one that wakes late completes the task at its
scheduled model time, so a task's service lasts exactly its work / speed in model time whatever the timer
error (only the HTTP reply carries the lateness). Its routes take a request's JSON object and give a
``wire.Reply``, whatever the server: ``server_node.app`` serves the task path on the lean server and the
rest with aiohttp.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import orjson
from prometheus_client.core import Metric

from lbtestbed.model.clock import ModelClock
from lbtestbed.model.distributions import BlockSampler
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import INF, NodeModel
from lbtestbed.model.streams import seed_sequence
from lbtestbed.server_node.core import Admitted, Arm, Completed, NodeCore
from lbtestbed.server_node.metrics import NodeMetrics
from lbtestbed.transport import wire
from lbtestbed.transport.actions import Send
from lbtestbed.transport.alarm import Alarm
from lbtestbed.transport.http import Peers
from lbtestbed.transport.lean_http import Stats, stats_metrics
from lbtestbed.transport.metrics import listener_metrics
from lbtestbed.transport.process import ConnectionGuard, machine
from lbtestbed.transport.signing import Signer, Verifier
from lbtestbed.transport.tasks import TaskSet
from lbtestbed.transport.wire import Reply

log = logging.getLogger("lbtestbed.server_node")

#: a test-only hook (tests/test_run_legs.py): every completion timer fires late by this share of its wait, a
#: bug of the emulation that its twin replays as measured and that the legs held against the machine catch
TEST_TIMER_LATE = "LBT_TEST_TIMER_LATE"


def _test_timer_late() -> float:
    try:
        return max(0.0, float(os.environ.get(TEST_TIMER_LATE) or 0.0))
    except ValueError:
        log.warning("%s=%r is not a number: ignored", TEST_TIMER_LATE, os.environ.get(TEST_TIMER_LATE))
        return 0.0


class NodeHost:
    """The virtual nodes ``node_ids`` of ``exp``, their timers, and the messages they send."""

    def __init__(
        self,
        exp: Experiment,
        node_ids: Sequence[int],
        dispatchers: Sequence[str],
        token: str,
        max_tasks: int = 100_000,
        url: str | None = None,
    ) -> None:
        self.exp = exp
        self.ids = list(node_ids)
        self.dispatchers = list(dispatchers)
        self.signer = Signer(token)  # what it sends the dispatchers, and their answers
        self.verifier = Verifier(token, url)  # what peers send it, and its answers
        self.scale = exp.run.time_scale
        # a new number at every start, larger than the last (microseconds: exact in JSON): dispatchers
        # tell a restarted process, which has lost its tasks and counters, from one that was paused
        self.incarnation = time.time_ns() // 1000
        self.metrics = NodeMetrics(exp, ModelClock(self.scale))
        self.registry = self.metrics.registry
        self.core = NodeCore(exp, self.ids, len(self.dispatchers), max_tasks, self.incarnation, self.metrics)
        self.faults = self.core.faults
        # the node a request's path names (its digits), or the 404 if this host has none
        self.node_of = self.core.node_of
        self.delay = None
        if exp.network.delay is not None:
            self.delay = BlockSampler(
                exp.network.delay,
                np.random.default_rng(seed_sequence(exp.seed, "network", 1000 + self.ids[0])),
            )
        # each node's completion timer (its next event): an alarm at the instant itself, never early
        # (transport.alarm: the loop's own timers count whole milliseconds and fire up to one early)
        self.alarms: dict[int, Alarm] = {}
        self.late = _test_timer_late()  # 0 but in tests (TEST_TIMER_LATE)
        # the requests of tasks in service, by task: their node, the task as admitted, and the future of
        # their reply, set when the task completes
        self.waiting: dict[int, tuple[int, Admitted, asyncio.Future[Reply]]] = {}
        self.peers = Peers(signer=self.signer)  # to the dispatchers: state messages
        self.loop: asyncio.AbstractEventLoop | None = None
        self.background = TaskSet(f"node host {self.ids[0]} messages")
        # the run's clock (set_origin): its model time 0 as a Unix time, and on this machine's monotonic
        # clock when known (0: not)
        self.origin = 0.0
        self.origin_monotonic = 0.0
        self.machine = machine()
        self.t0_unix = 0.0
        self.guard: ConnectionGuard | None = None  # the listener's, set by the process that serves it
        self.http = Stats()  # what the lean server of its task path did
        self.metrics.collect_from(self.core, self.snapshot, self._listener_metrics)

    def _listener_metrics(self) -> Iterator[Metric]:
        yield from listener_metrics("node", self.guard, self.verifier.refused)
        yield from stats_metrics("node", self.http)

    # ------------------------------------------------------------------------------------------ clock

    @property
    def clock(self) -> ModelClock:
        """Model time on this host's monotonic clock (its origin: the instant it started)."""
        return self.core.clock

    @property
    def t0(self) -> float:
        return self.core.clock.origin

    @t0.setter
    def t0(self, origin: float) -> None:
        self.core.clock = ModelClock(self.scale, origin)

    @property
    def models(self) -> dict[int, NodeModel]:
        return self.core.models

    def now(self) -> float:
        """Model time, from the monotonic clock (uvloop's loop clock has only millisecond resolution)."""
        return self.core.clock.to_model(time.monotonic())

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        self.t0_unix = time.time()  # the same instant on the clock other processes (and machines) share
        self.core.start(ModelClock(self.scale, t0))
        self.act()  # timers of node sides that speak on their own (NodeSide.timed)
        if self.origin:
            self.set_origin(self.origin, self.origin_monotonic)

    async def stop(self) -> None:
        for alarm in self.alarms.values():
            alarm.close()
        self.alarms.clear()
        await self.background.close()
        self.peers.close()

    def set_origin(self, origin: float, monotonic: float = 0.0) -> int:
        """The run's model time 0 is the Unix time ``origin`` (``monotonic`` on this machine's monotonic
        clock, when not 0): the core arms the spec's timed speed changes of this host's nodes from it and
        judges its fail faults on it (``NodeCore.set_origin``). Returns how many speed changes are still
        to come."""
        self.origin, self.origin_monotonic = origin, monotonic
        # node model time = run model time + offset; through the monotonic clock exactly, the clock this
        # host's own times are on; through Unix time, off by the time between two readings of two clocks
        if monotonic:
            offset = self.clock.to_model(monotonic)
        else:
            offset = ModelClock(self.scale, self.t0_unix).to_model(origin)
        due = self.core.set_origin(offset, self.now())
        self.act()
        return due

    # ---------------------------------------------------------------------------------------- actions

    def act(self) -> None:
        """Carry out what the core decided since the last call."""
        core = self.core
        actions = core.outbox
        if not actions:
            return
        core.outbox = []
        for action in actions:
            if isinstance(action, Arm):
                self._arm(action.node, action.t)
            elif isinstance(action, Completed):
                self._completed(action)
            elif isinstance(action, Send):
                self.background.spawn(self._post_message(action))
            else:
                log.warning("%s", action.text)

    def _completed(self, done: Completed) -> None:
        """A task completed: its request's reply, at once (the timer's lateness is this instant minus the
        completion's own)."""
        waiting = self.waiting.pop(done.task, None)
        if waiting is None:
            return
        k, admitted, reply = waiting
        if not reply.done():  # (cancelled: the server is closing)
            now = time.monotonic()
            reply.set_result(self.core.served(k, admitted, done.t, done.riders, now, now))

    def _arm(self, k: int, t: float) -> None:
        """Node ``k``'s timer is now for model time ``t`` (INF: none)."""
        alarm = self.alarms.get(k)
        if alarm is None:
            assert self.loop is not None
            alarm = self.alarms[k] = Alarm(self.loop)
        if t >= INF:
            alarm.cancel()
            return
        due = self.core.clock.to_wall(t)
        if self.late:  # the test hook: late by a share of the wait
            now = time.monotonic()
            due = now + max(0.0, due - now) * (1.0 + self.late)
        alarm.at(due, self._fire, k, t)

    def _fire(self, k: int, t: float) -> None:
        self.core.fire(k, t)
        self.act()

    async def _post_message(self, send: Send) -> None:
        m = send.message
        wait = send.extra + (self.delay() if self.delay is not None else 0.0)
        if wait > 0:
            await asyncio.sleep(self.clock.wall_span(wait))
        if not 0 <= m.dispatcher < len(self.dispatchers):
            self.core.message_failed(m)
            return
        url = self.dispatchers[m.dispatcher]
        self.core.message_left(m)
        try:
            body = orjson.dumps({"messages": [wire.message_to_json(m, send.at)]})
            status, _ = await self.peers.pool(url).post(f"{wire.PREFIX}/messages", body, timeout=30.0)
            if status != 200:
                self.core.message_failed(m)
                log.warning("dispatcher %s refused a %s message: %s", url, m.kind, status)
        except (OSError, TimeoutError) as e:
            self.core.message_failed(m)
            log.warning("cannot reach dispatcher %s: %s", url, e)

    # ----------------------------------------------------------------------------------------- routes

    def task(self, k: int, body: Mapping[str, Any]) -> Reply | asyncio.Future[Reply]:
        """``POST /v1/nodes/k/tasks``: the answer at once (refused), or a future of it, set when the task
        has been served. A future, not a coroutine: the server answers from its done callback, with no task
        per request."""
        admitted = self.core.arrive(k, body, self.now())
        self.act()
        if isinstance(admitted, Reply):
            return admitted
        assert self.loop is not None
        reply: asyncio.Future[Reply] = self.loop.create_future()
        reply.add_done_callback(functools.partial(self._gone, admitted.task))
        self.waiting[admitted.task] = (k, admitted, reply)
        return reply

    def _gone(self, task: int, reply: asyncio.Future[Reply]) -> None:
        """A task's request no longer waits for its reply (the server cancelled it, closing, or the client
        left): the messages that would have ridden on it go on requests of their own."""
        if reply.cancelled():
            self.waiting.pop(task, None)
            self.core.forget(task)

    def probe(self, k: int) -> Reply:
        """``POST /v1/nodes/k/probe``."""
        reply = self.core.probe(k, self.now())
        self.act()
        return reply

    def messages(self, k: int, body: Mapping[str, Any]) -> Reply:
        """``POST /v1/nodes/k/messages``."""
        reply = self.core.messages(k, body, time.monotonic())
        self.act()
        return reply

    def state(self) -> Reply:
        """``GET /v1/state``: the dispatchers' heartbeat."""
        reply = self.core.state(self.now())
        self.act()
        return reply

    def health_reply(self) -> Reply:
        return self.core.health(self.now())

    def origin_reply(self, body: Mapping[str, Any]) -> Reply:
        """``POST /v1/origin {"origin": unix seconds, "monotonic": seconds, "machine": boot id}``: the run's
        model time 0 (``set_origin``); on the monotonic clock too when the sender is on this machine."""
        try:
            origin = wire.number(body, "origin", positive=True)
            monotonic = wire.number(body, "monotonic", default=0.0)
            same = body.get("machine") == self.machine != ""
        except wire.BadRequest as e:
            return wire.bad_request(e)
        return Reply(200, {"ok": True, "speed_changes": self.set_origin(origin, monotonic if same else 0.0)})

    def snapshot(self) -> dict[str, Any]:
        """Exact integrals of every node up to now (``NodeCore.snapshot``), for the metrics."""
        snap = self.core.snapshot(self.now())
        self.act()
        return snap
