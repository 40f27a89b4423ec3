"""A server-node process: one or more virtual nodes of a spec behind one HTTP server.

Each virtual node runs the spec's node model in wall time (``time_scale`` wall seconds per model second) and
the node side of the policy. A forwarded task's request stays open until the task completes (synchronous
completion: the dispatcher and the client see the completion without an extra message). Completions fire from
event-loop timers; a timer that wakes early is re-armed and one that wakes late completes the task at its
scheduled model time, so a task's service lasts exactly its work / speed in model time whatever the timer
error (only the HTTP reply carries the lateness).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram

from lbtestbed.model.conditions import fail_windows, failing, speed_changes
from lbtestbed.model.distributions import BlockSampler
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import INF, NodeModel, make_node
from lbtestbed.model.streams import seed_sequence, seeded_random
from lbtestbed.model.workload import Task
from lbtestbed.policies import Message, NodeSide, make_node_sides, policy_of
from lbtestbed.transport import wire
from lbtestbed.transport.http import Peers
from lbtestbed.transport.message_faults import MessageFaults
from lbtestbed.transport.process import ConnectionGuard
from lbtestbed.transport.signing import Signer, Verifier

log = logging.getLogger("lbtestbed.server_node")

EARLY_WAKE = 0.0002  # wall seconds: a timer that fires earlier than this before its target is re-armed


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
        self.max_tasks = max_tasks
        self.scale = exp.run.time_scale
        rng = seeded_random(exp.seed, "nodes", self.ids[0])
        self.sides: dict[int, NodeSide] = dict(
            zip(self.ids, make_node_sides(exp, rng, self.ids, max(1, len(dispatchers))), strict=True)
        )
        self.models: dict[int, NodeModel] = {}
        # node sides that learn from each task's latency (records_latency): the tasks each found on arrival
        self.records_latency = any(type(s).records_latency for s in self.sides.values())
        self.found: dict[int, int] = {}
        self.delay = None
        if exp.network.delay is not None:
            self.delay = BlockSampler(
                exp.network.delay,
                np.random.default_rng(seed_sequence(exp.seed, "network", 1000 + self.ids[0])),
            )
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.scheduled: dict[int, float] = {}
        # a task's request waits for (model completion time, messages riding on the reply, wall time the
        # completion ran: the timer's lateness is that minus the completion's own wall time)
        self.waiting: dict[int, asyncio.Future[tuple[float, list[Message], float]]] = {}
        self.task_ids = itertools.count(1)
        self.sent: Counter[str] = Counter()
        self.piggybacked: Counter[str] = Counter()  # of those sent, how many rode on a task's reply
        # every kind it sends starts at 0: the first failure is then an increase Prometheus sees
        self.send_failures: Counter[str] = Counter(
            {k: 0 for k in exp.policy.message_kinds() if k in policy_of(exp).dispatcher_bound}
        )
        self.received: Counter[str] = Counter()
        self.refused: Counter[int] = Counter()
        self.peers = Peers(signer=self.signer)  # to the dispatchers: state messages
        self.loop: asyncio.AbstractEventLoop | None = None
        self.t0 = 0.0
        self.background: set[asyncio.Task[None]] = set()
        # a new number at every start, larger than the last (microseconds: exact in JSON): dispatchers
        # tell a restarted process, which has lost its tasks and counters, from one that was paused
        self.incarnation = time.time_ns() // 1000
        self.faults = MessageFaults(exp, 1000 + self.ids[0])
        self.heartbeats = 0  # state reports served
        # the run's clock (set_origin): its model time 0 as a Unix time, node model time minus run model time,
        # the timed speed changes still to come per node (node model time, speed), the fail faults
        self.origin = 0.0
        self.origin_monotonic = 0.0  # the origin on this machine's monotonic clock, when known (0: not)
        self.machine = wire.machine()
        self.offset = 0.0
        self.t0_unix = 0.0
        self.changes: dict[int, deque[tuple[float, float]]] = {}
        self.speed_plan = speed_changes(exp, nodes=self.ids)  # drawn once: set_origin only arms them
        self.fail_windows = tuple(w for w in fail_windows(exp) if w.node in self.ids)
        self.fault_rng = seeded_random(exp.seed, "faults", 1 + self.ids[0])
        self.failed: Counter[int] = Counter()
        self.guard: ConnectionGuard | None = None  # the listener's, set by the process that serves it
        # the collector of metrics.py reads the rest of the state at scrape time; these observe events
        self.registry = CollectorRegistry(auto_describe=False)
        wire.standard_collectors(self.registry)  # process CPU, memory, descriptors, GC
        self.collected = False  # whether metrics.registry_for registered its collector
        self.lateness = Histogram(
            "lbtestbed_node_timer_lateness_seconds",
            "Wall time from a task's completion instant to the moment the node completed it (timer error)",
            buckets=wire.WALL_BUCKETS,
            registry=self.registry,
        )
        self.ages = wire.MessageAges("node", self.registry, self.scale)

    # ------------------------------------------------------------------------------------------ clock

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.t0 = time.monotonic()
        self.t0_unix = time.time()  # the same instant on the clock other processes (and machines) share
        for k in self.ids:
            c = self.exp.node_class[k]
            self.models[k] = make_node(
                self.exp.classes[c].discipline, self.exp.node_speeds[k], self.exp.classes[c].utility, 0.0
            )
        if self.origin:
            self.set_origin(self.origin, self.origin_monotonic)

    # ------------------------------------------------------------------------------- the run's clock

    def set_origin(self, origin: float, monotonic: float = 0.0) -> int:
        """The run's model time 0 is the Unix time ``origin`` (``monotonic`` on this machine's monotonic
        clock, when not 0): arm the spec's timed speed changes of this host's nodes (``model.conditions``)
        at their model times from it, and judge its fail faults on it. Returns how many speed changes are
        still to come (those already past apply at once)."""
        self.origin, self.origin_monotonic = origin, monotonic
        # node model time = run model time + offset; through the monotonic clock exactly, the clock this
        # host's own times are on; through Unix time, off by the time between two readings of two clocks
        if monotonic:
            self.offset = (monotonic - self.t0) / self.scale
        else:
            self.offset = (origin - self.t0_unix) / self.scale
        if not self.models:
            return 0  # start() arms them
        now = self.now()
        for k, model in self.models.items():  # a new run starts from the nodes' own speeds
            if model.speed != self.exp.node_speeds[k]:
                self._catch_up(k, max(now, model.last))
                model.set_speed(max(now, model.last), self.exp.node_speeds[k])
        self.changes = {}
        for c in self.speed_plan:
            if c.node in self.models:
                at = c.at + self.offset
                self.changes.setdefault(c.node, deque()).append((at, self.exp.node_speeds[c.node] * c.factor))
        for k in self.changes:
            self._catch_up(k, max(self.now(), self.models[k].last))
        return sum(len(q) for q in self.changes.values())

    async def stop(self) -> None:
        for h in self.timers.values():
            h.cancel()
        for t in list(self.background):
            t.cancel()
        self.peers.close()

    def now(self) -> float:
        """Model time, from the monotonic clock (uvloop's loop clock has only millisecond resolution)."""
        return (time.monotonic() - self.t0) / self.scale

    def _next_event(self, k: int) -> float:
        """Model time of node k's next event: a completion, or a timed speed change."""
        t = self.models[k].next_completion()
        changes = self.changes.get(k)
        return min(t, changes[0][0]) if changes else t

    def _schedule(self, k: int) -> None:
        t = self._next_event(k)
        if t == self.scheduled.get(k):
            return
        old = self.timers.pop(k, None)
        if old is not None:
            old.cancel()
        self.scheduled[k] = t
        if t < INF:
            assert self.loop is not None
            wait = self.t0 + t * self.scale - time.monotonic()
            self.timers[k] = self.loop.call_later(max(0.0, wait), self._fire, k, t)

    def _fire(self, k: int, t: float) -> None:
        assert self.loop is not None
        self.timers.pop(k, None)
        early = self.t0 + t * self.scale - time.monotonic()
        if early > EARLY_WAKE:
            self.timers[k] = self.loop.call_later(early, self._fire, k, t)
            return
        self.scheduled.pop(k, None)
        self._catch_up(k, t)

    def _catch_up(self, k: int, now: float) -> None:
        """Complete every task of node k that is due by ``now`` but whose timer has not fired yet, and apply
        the speed changes due by then, in model-time order.

        Called before an arrival, a probe or a scrape at node k, so that events apply in model-time order:
        a timer that fires late must not let a later arrival overtake the completion it stands for.
        """
        model = self.models[k]
        changes = self.changes.get(k)
        while True:
            t = model.next_completion()
            change = changes[0][0] if changes else INF
            if min(t, change) > now:
                break
            handle = self.timers.pop(k, None)
            if handle is not None:
                handle.cancel()
            if change <= t:
                assert changes is not None
                _, speed = changes.popleft()
                model.set_speed(max(change, model.last), speed)
            else:
                self._complete(k, t)
        self._schedule(k)

    def _complete(self, k: int, t: float) -> None:
        """The departure scheduled at model time t: exactly then, whenever the timer ran."""
        model = self.models[k]
        task = model.complete(max(t, model.last))
        self.scheduled.pop(k, None)
        fut = self.waiting.pop(task.id, None)
        if self.records_latency and task.id in self.found:
            self.sides[k].on_served(self.found.pop(task.id), model.last - task.arrived)
        msgs = self.sides[k].on_departure(model.x, task.origin)
        # without an emulated delay, messages for the dispatcher that routed this task ride on its reply
        if fut is not None and not fut.done() and self._riders():
            # messages for the dispatcher that routed this task ride on its reply, sent anyway
            ride = [m for m in msgs if m.dispatcher == task.origin]
            for m in ride:
                self.sent[m.kind] += 1
                self.piggybacked[m.kind] += 1
            fut.set_result((t, ride, time.monotonic()))
            msgs = tuple(m for m in msgs if m.dispatcher != task.origin)
        elif fut is not None and not fut.done():
            fut.set_result((t, [], time.monotonic()))
        self._send(msgs, self.t0 + t * self.scale)

    # --------------------------------------------------------------------------------------- messages

    def _riders(self) -> bool:
        """Whether messages for a task's dispatcher may ride on the reply: not when the network is
        emulated (a delay, or message faults active), which applies to messages sent on their own."""
        return self.delay is None and not self.faults.active

    def _send(self, msgs: Sequence[Message], at: float | None = None) -> None:
        """Send ``msgs`` on requests of their own. Their age runs from ``at`` (monotonic; default now): the
        instant of the model event that made them, so that the timer's lateness, emulated delays and the
        loop turn before the request leaves count in it, as the twin, which sends them at the event,
        needs."""
        at = time.monotonic() if at is None else at
        for m in msgs:
            copies = self.faults.copies(m.kind)
            if not copies:  # dropped on the way: sent, never received
                self.sent[m.kind] += 1
            for extra in copies:
                task = asyncio.ensure_future(self._post_message(m, at, extra))
                self.background.add(task)
                task.add_done_callback(self.background.discard)

    async def _post_message(self, m: Message, at: float, extra: float = 0.0) -> None:
        wait = extra + (self.delay() if self.delay is not None else 0.0)
        if wait > 0:
            await asyncio.sleep(wait * self.scale)
        if not 0 <= m.dispatcher < len(self.dispatchers):
            self.send_failures[m.kind] += 1
            return
        url = self.dispatchers[m.dispatcher]
        self.sent[m.kind] += 1
        try:
            body = orjson.dumps({"messages": [wire.message_to_json(m, at)]})
            status, _ = await self.peers.pool(url).post(f"{wire.PREFIX}/messages", body, timeout=30.0)
            if status != 200:
                self.send_failures[m.kind] += 1
                log.warning("dispatcher %s refused a %s message: %s", url, m.kind, status)
        except (OSError, TimeoutError) as e:
            self.send_failures[m.kind] += 1
            log.warning("cannot reach dispatcher %s: %s", url, e)

    # --------------------------------------------------------------------------------------- handlers

    def _node(self, request: web.Request) -> int:
        text = request.match_info["node"]  # the route admits digits only
        k = int(text) if len(text) <= 18 else -1  # int() refuses thousands of digits with ValueError
        if k not in self.sides:
            shown = text if len(text) <= 64 else f"{text[:20]}...({len(text)} digits)"
            raise web.HTTPNotFound(
                text=f'{{"error": "no node {shown} here"}}', content_type="application/json"
            )
        return k

    async def post_task(self, request: web.Request) -> web.Response:
        k = self._node(request)
        try:
            body = await wire.read_json(request)
            work = wire.number(body, "work", positive=True)
            origin = wire.integer(body, "origin", 0)
            piggyback = wire.small_tuple(body.get("piggyback", []), "piggyback")
            if origin >= max(1, len(self.dispatchers)):
                raise wire.BadRequest(f"no dispatcher {origin} in this cluster", "origin")
        except wire.BadRequest as e:
            return wire.error(e.status, str(e), e.field)
        model = self.models[k]
        assert self.loop is not None
        t = max(self.now(), model.last)
        self._catch_up(k, t)  # departures due by now come first, so they may free a place
        if self.fail_windows and self.origin:
            fraction = failing(self.fail_windows, k, t - self.offset)
            if fraction and self.fault_rng.random() < fraction:
                self.failed[k] += 1
                return wire.error(500, f"node {k} failed the task (a fail fault)")
        if model.x >= self.max_tasks:
            self.refused[k] += 1
            return wire.error(503, f"node {k} holds its limit of {self.max_tasks} tasks")
        task = Task(next(self.task_ids), work, t, origin)
        fut: asyncio.Future[tuple[float, list[Message], float]] = self.loop.create_future()
        self.waiting[task.id] = fut
        waited = model.arrive(task, t)
        if self.records_latency:
            self.found[task.id] = model.x - 1
        self._schedule(k)
        try:
            self._send(self.sides[k].on_arrival(model.x, origin, piggyback), self.t0 + t * self.scale)
        except (ValueError, TypeError, AssertionError) as e:  # the task is admitted and served regardless
            self.send_failures["piggyback"] += 1
            log.warning("node %d: bad piggyback %r: %s", k, piggyback, e)
        try:
            done, ride, fired = await fut
        finally:
            self.waiting.pop(task.id, None)
        self.lateness.observe(max(0.0, fired - self.t0 - done * self.scale))
        # model times, and the monotonic instants that place them on the other processes' clocks (one
        # machine's CLOCK_MONOTONIC: docs/run.md, "Where the time goes"): model time x is t0 + x * scale
        reply: dict[str, Any] = {
            "node": k,
            "arrived": t,
            "completed": done,
            "waited": waited,
            "t0": self.t0,
            "fired": fired,
        }
        if ride:
            reply["messages"] = [wire.message_to_json(m, fired) for m in ride]
        reply["replied"] = time.monotonic()
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def post_probe(self, request: web.Request) -> web.Response:
        k = self._node(request)
        self._catch_up(k, max(self.now(), self.models[k].last))
        self.received["probe"] += 1
        self.sent["probe_reply"] += 1
        return web.json_response({"node": k, "x": self.sides[k].probe_reply(self.models[k].x)})

    async def post_messages(self, request: web.Request) -> web.Response:
        k = self._node(request)
        try:
            body = await wire.read_json(request)
            msgs = wire.parse_messages(body, policy_of(self.exp).node_bound)
        except wire.BadRequest as e:
            return wire.error(e.status, str(e), e.field)
        for i, m in enumerate(msgs):
            if m.node != k:
                return wire.error(400, f"message for node {m.node} posted to node {k}", f"messages[{i}].node")
        ride: list[Message] = []
        now = time.monotonic()
        if (
            self.records_latency
        ):  # a probe answered from the node's latencies reads its state now: departures due come first
            self._catch_up(k, max(self.now(), self.models[k].last))
        for i, m in enumerate(msgs):
            self.ages.observe(m, wire.sent_at(body["messages"][i]), now)
            try:
                out = self.sides[k].on_message(m, self.models[k].x)
            except (ValueError, TypeError, AssertionError) as e:
                return wire.error(
                    400, f"{m.kind}: {e} ({i} of {len(msgs)} messages applied)", f"messages[{i}]"
                )
            self.received[m.kind] += 1
            if self._riders():  # answers to the sender ride on this reply
                ride.extend(a for a in out if a.dispatcher == m.dispatcher)
                out = tuple(a for a in out if a.dispatcher != m.dispatcher)
            self._send(out)
        for a in ride:
            self.sent[a.kind] += 1
            self.piggybacked[a.kind] += 1
        reply: dict[str, Any] = {"ok": True, "applied": len(msgs)}
        if ride:
            sent = time.monotonic()
            reply["messages"] = [wire.message_to_json(a, sent) for a in ride]
        return web.json_response(reply)

    async def get_health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "nodes": self.ids, "model_time": self.now()})

    async def get_state(self, request: web.Request) -> web.Response:
        """The dispatchers' heartbeat: this process's incarnation and every node's report (its node
        side's account of itself, after the departures due by now)."""
        t = self.now()
        reports = {}
        for k, side in self.sides.items():
            self._catch_up(k, max(t, self.models[k].last))
            reports[str(k)] = list(side.report(self.models[k].x))
        self.heartbeats += 1
        return web.json_response({"incarnation": self.incarnation, "model_time": t, "reports": reports})

    async def post_faults(self, request: web.Request) -> web.Response:
        return await self.faults.handle(request)

    async def post_origin(self, request: web.Request) -> web.Response:
        """``POST /v1/origin {"origin": unix seconds, "monotonic": seconds, "machine": boot id}``: the run's
        model time 0 (``set_origin``); on the monotonic clock too when the sender is on this machine."""
        try:
            body = await wire.read_json(request)
            origin = wire.number(body, "origin", positive=True)
            monotonic = wire.number(body, "monotonic", default=0.0)
            same = body.get("machine") == self.machine != ""
        except wire.BadRequest as e:
            return wire.error(e.status, str(e), e.field)
        return web.json_response(
            {"ok": True, "speed_changes": self.set_origin(origin, monotonic if same else 0.0)}
        )

    def snapshot(self) -> dict[str, Any]:
        """Exact integrals of every node up to now (advancing them is harmless: it is exact integration)."""
        t = self.now()
        out = {}
        for k, m in self.models.items():
            self._catch_up(k, max(t, m.last))
            m.advance(max(t, m.last))
            out[k] = m
        return {"time": t, "models": out}
