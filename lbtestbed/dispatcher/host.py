"""A dispatcher process: accepts tasks, runs the dispatcher side of the policy, forwards over HTTP.

Completion is synchronous: the client's ``POST /v1/tasks`` stays open until the node has served the task, and
the reply carries the node and the times. This costs an open connection per task in flight but no completion
message, lets the client measure sojourn directly, and lets least_request count tasks in flight exactly as a
proxy does. State messages from nodes arrive on ``POST /v1/messages``; probes and threshold updates go out to
the nodes' endpoints. Every task ends completed, refused (the node answered 503) or lost (the node failed or
vanished); the three counters add up to the tasks accepted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lbtestbed.dispatcher.health import Health, failure_kind
from lbtestbed.model.distributions import BlockSampler
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.streams import seed_sequence, seeded_random
from lbtestbed.policies import DispatcherSide, Message, Probe, Route, make_dispatcher, policy_of
from lbtestbed.transport import wire
from lbtestbed.transport.http import Peers
from lbtestbed.transport.message_faults import MessageFaults
from lbtestbed.transport.process import ConnectionGuard
from lbtestbed.transport.signing import Signer, Verifier

log = logging.getLogger("lbtestbed.dispatcher")

OUTCOMES = ("completed", "refused", "lost")
#: why a dispatcher refused a task itself (503), rather than its node: it was starting, no node was up, it
#: held its limit of tasks in flight, or it could not forward the task for want of a local resource
OWN_REFUSALS = ("starting", "no_node_up", "limit", "local")
#: the status ``_forward`` gives a task this process could not send (no descriptor, no memory)
LOCAL_FAILURE = -1
#: dispatcher i draws its policy's random numbers from stream DISPATCHER_STREAM + i of the experiment
DISPATCHER_STREAM = 1000


class TimeIntegral:
    """The integral over model time of a quantity that changes in steps (monotonic wall clock)."""

    def __init__(self, start: float, scale: float, value: float = 0.0) -> None:
        self.value, self._since, self._scale, self._area = value, start, scale, 0.0

    def set(self, value: float, now: float) -> None:
        self._area += self.value * (now - self._since) / self._scale
        self.value, self._since = value, now

    def add(self, delta: float, now: float) -> None:
        self.set(self.value + delta, now)

    def area(self, now: float) -> float:
        """The integral up to ``now`` (not before the last change)."""
        return self._area + self.value * max(0.0, now - self._since) / self._scale


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
        self.node_urls = list(node_urls)  # base URL of node k: .../v1/nodes/k
        self.signer = Signer(token)  # what it sends the nodes, and their answers
        self.verifier = Verifier(token, url)  # what the nodes send it, and its answers
        self.scale = exp.run.time_scale
        self.max_work = wire.MAX_WORK_MEANS * exp.workload.service.mean
        self.declared = policy_of(exp)
        self.accepts = self.declared.dispatcher_bound
        rng = seeded_random(exp.seed, "policy", DISPATCHER_STREAM + index)
        self.policy = make_dispatcher(exp, rng, index, dispatchers)
        self.delay = None
        if exp.network.delay is not None:
            self.delay = BlockSampler(
                exp.network.delay, np.random.default_rng(seed_sequence(exp.seed, "network", 2000 + index))
            )
        self.delay_tasks = exp.network.forward_tasks and self.delay is not None
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
        # tasks accepted and not answered at most (503 beyond; transport.process.Budget), and the
        # listener's guard for its metrics: both set by the process that serves this host
        self.max_in_flight = 1 << 30
        self.guard: ConnectionGuard | None = None
        self.lost_by_node: Counter[int] = Counter()
        self.in_flight = 0
        self.started = time.monotonic()
        # integrals over model time, so that a window's time averages are exact (docs/design.md, principle 5):
        # the tasks accepted and not yet answered (probes, forwarding and service included), and what the
        # policy learns (unit.Learned), if it learns anything
        self.present = TimeIntegral(self.started, self.scale)
        self.learned = self.declared.learned
        start = self.policy.learned_value() if self.learned is not None else 0
        self.r = TimeIntegral(self.started, self.scale, start)
        # the task path's requests (forwards, probes, messages): lean kept-alive connections per process
        self.peers = Peers(signer=self.signer)
        self.node_peer = [
            (self.peers.pool(url.rsplit(f"{wire.PREFIX}/nodes/", 1)[0]), f"{wire.PREFIX}/nodes/{k}")
            for k, url in enumerate(self.node_urls)
        ]
        self.background: set[asyncio.Task[None]] = set()
        self.registry = CollectorRegistry(auto_describe=False)
        wire.standard_collectors(self.registry)  # process CPU, memory, descriptors, GC
        self.sojourn = Histogram(
            "lbtestbed_dispatcher_sojourn_model_seconds",
            "Time from accepting a task to its completion, model seconds",
            buckets=wire.sojourn_buckets(exp),
            registry=self.registry,
        )
        self.latency = Histogram(
            "lbtestbed_dispatcher_dispatch_latency_seconds",
            "Wall time from accepting a task to forwarding it (probes included)",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )
        self.legs = Histogram(
            "lbtestbed_dispatcher_leg_seconds",
            "Wall time of each leg of a task's way at this dispatcher (docs/run.md, Where the time goes): "
            "decide (accept to decision, probes included), to_node (forward to the node's arrival), "
            "node_reply (the node's completion instant to its reply: timer error included), from_node "
            "(the node's reply to the dispatcher reading it)",
            ["leg"],
            buckets=wire.WALL_BUCKETS,
            registry=self.registry,
        )
        self.leg = {name: self.legs.labels(name) for name in ("decide", "to_node", "node_reply", "from_node")}
        self.ages = wire.MessageAges("dispatcher", self.registry, self.scale)
        self.faults = MessageFaults(exp, index)
        self.health = Health(self, journal)  # journal: its node transitions, kept across restarts
        self.registry.register(_DispatcherCollector(self))

    async def start(self) -> None:
        self.health.start()

    async def stop(self) -> None:
        await self.health.stop()
        for t in list(self.background):
            t.cancel()
        self.peers.close()

    def side(self, at: float | None = None) -> DispatcherSide:
        """The policy, for a call into it: one that reads the model time (``uses_clock``) finds in ``now``
        the model seconds since this process started, at ``at`` (monotonic; now by default)."""
        policy = self.policy
        if policy.uses_clock:
            policy.now = ((time.monotonic() if at is None else at) - self.started) / self.scale
        return policy

    def track_r(self) -> None:
        """Follow what the policy learns; called after every policy call that can change it."""
        if self.learned is not None:
            self.r.set(self.policy.learned_value(), time.monotonic())

    async def _sleep_delay(self) -> None:
        if self.delay is not None:
            await asyncio.sleep(self.delay() * self.scale)

    # ------------------------------------------------------------------------------------ tasks

    async def _probe(self, k: int) -> int:
        """One probe and its reply (each delayed like any state message); an unreachable node looks full
        and is marked down (a paused one after the health timeout)."""
        await self._sleep_delay()
        self.sent["probe"] += 1
        pool, path = self.node_peer[k]
        began = time.monotonic()
        try:
            _, raw = await pool.post(f"{path}/probe", b"{}", timeout=self.exp.health.timeout)
            x = int(orjson.loads(raw)["x"])
        except (OSError, TimeoutError, ValueError, KeyError, TypeError) as e:
            self.failures["probe"] += 1
            if isinstance(e, OSError | TimeoutError):
                reason = f"probe failed: {str(e) or type(e).__name__}"
                self.health.unreachable(k, reason, failure_kind(e), began)
            return 1 << 30
        await self._sleep_delay()
        self.received["probe_reply"] += 1
        return x

    async def post_task(self, request: web.Request) -> web.Response:
        accepted = time.monotonic()  # not the loop clock: uvloop's has millisecond resolution
        try:
            body = await wire.read_json(request)
            work = wire.number(body, "work", positive=True)
            if work > self.max_work:
                raise wire.BadRequest(
                    f"work above {self.max_work:g} ({wire.MAX_WORK_MEANS:g} mean works)", "work"
                )
        except wire.BadRequest as e:
            return wire.error(e.status, str(e), e.field)
        if not self.health.ready.is_set() or not self.health.up_count:
            ready = self.health.ready.is_set()
            why = "no node is up" if ready else "waiting for the nodes' first answers"
            return self._refuse("no_node_up" if ready else "starting", f"takes no tasks now: {why}")
        if self.present.value >= self.max_in_flight:
            return self._refuse("limit", f"holds its limit of {self.max_in_flight} tasks")
        self.present.add(1, accepted)
        released = None
        try:
            response, released = await self._route(work, accepted)
            return response
        finally:
            # the task leaves the dispatcher's count when its answer is ready (the twin's "leave")
            self.present.add(-1, released if released is not None else time.monotonic())

    def _refuse(self, reason: str, why: str) -> web.Response:
        """A task this dispatcher refuses itself (``reason``: one of OWN_REFUSALS)."""
        self.outcomes["refused"] += 1
        self.own_refusals[reason] += 1
        return wire.error(503, f"dispatcher {self.index} {why}")

    async def _route(self, work: float, accepted: float) -> tuple[web.Response, float]:
        """Route, forward and answer one task; the answer and the monotonic instant it was ready."""
        decision = self.side(accepted).dispatch()
        if isinstance(decision, Probe):
            replies = await asyncio.gather(*(self._probe(k) for k in decision.nodes))
            decision = self.side().resolve(decision, list(replies))
        route: Route = decision
        decided = time.monotonic()  # it is forwarded: its latency at the dispatcher starts
        self.track_r()
        self.decisions[route.outcome] += 1
        self.in_flight += 1
        generation = self.health.generation[route.node]
        forward = asyncio.ensure_future(self._forward(route, generation, work, accepted, decided))
        self.send(route.messages)  # threshold updates follow the task they were decided with
        status, reply, forwarded, answered = await forward
        if status == 200:
            self.outcomes["completed"] += 1
            sojourn = (time.monotonic() - accepted) / self.scale
            self.sojourn.observe(sojourn)
            legs = self._legs(reply, accepted, decided, forwarded, answered)
            answer = {"node": route.node, "sojourn": sojourn, **reply, "legs": legs}
            return web.Response(body=orjson.dumps(answer), content_type="application/json"), legs["released"]
        if status == 503:
            self.outcomes["refused"] += 1
            why = f"node {route.node} refused the task: {reply.get('error', '')}"
            return wire.error(503, why, node=route.node), time.monotonic()
        if status == LOCAL_FAILURE:  # not the node's fault: nothing reached it
            why = f"could not forward the task: {reply.get('error', '')}"
            return self._refuse("local", why), time.monotonic()
        self.outcomes["lost"] += 1
        self.lost_by_node[route.node] += 1
        why = f"task lost with node {route.node}: {reply.get('error', '')}"
        return wire.error(502, why, node=route.node), time.monotonic()

    async def _forward(
        self, route: Route, generation: int, work: float, accepted: float, decided: float
    ) -> tuple[int, dict[str, Any], float, float]:
        """Forward the task and take in what its reply says (``_settle``); (status, reply, monotonic
        instant it left, instant its reply was read). ``generation``: the node's when it was chosen;
        ``accepted`` and ``decided``: the instants the task was accepted and decided."""
        try:
            if self.delay_tasks:
                await self._sleep_delay()
            self.latency.observe(decided - accepted)
            body = orjson.dumps({"work": work, "origin": self.index, "piggyback": list(route.piggyback)})
            pool, path = self.node_peer[route.node]
            forwarded = time.monotonic()
            try:
                status, raw = await pool.post(f"{path}/tasks", body)
                reply = orjson.loads(raw)
                if not isinstance(reply, dict):
                    reply = {}
            except (OSError, TimeoutError, ValueError) as e:
                status = LOCAL_FAILURE if failure_kind(e) == "local" else 0
                reply = {"error": str(e) or type(e).__name__}
            if self.delay_tasks:
                await self._sleep_delay()  # the completion's way back, as in the simulator
        except asyncio.CancelledError:  # the dispatcher is stopping: the task's count ends with it
            self._release(route, generation, decided, time.monotonic())
            raise
        answered = time.monotonic()
        self._settle(route, generation, status, reply, decided, answered, work)
        return status, reply, forwarded, answered

    def _settle(
        self,
        route: Route,
        generation: int,
        status: int,
        reply: dict[str, Any],
        decided: float,
        answered: float,
        work: float,
    ) -> None:
        """The task's reply, read at ``answered`` (it was forwarded at ``decided``), reaches the policy at
        once: the decisions that follow
        see its messages, as the twin's do (docs/run.md, "The twin"), and never a loop turn later. Its
        outcome and its stay at the node feed outlier detection (docs/faults.md, "Gray failures")."""
        if status == 200:
            self._apply_riders(reply.pop("messages", None), answered)
            try:
                stay = float(reply["completed"]) - float(reply["arrived"])
            except (KeyError, TypeError, ValueError):  # a node that does not say (an older version)
                stay = -1.0
            self.health.task_served(route.node, work, stay, reply.get("waited") is True)
        elif status not in (0, 503, LOCAL_FAILURE):  # it answered, with an error
            self.health.task_failed(route.node, str(reply.get("error", status)))
        if self._release(route, generation, decided, answered) and status != 200:
            self.side(answered).on_task_failed(route.node)
        if status == 0:
            self.health.unreachable(route.node, f"forward failed: {reply.get('error', '')}")

    def _release(self, route: Route, generation: int, decided: float, answered: float) -> bool:
        """The task is no longer in flight: the policy counts it done (with its latency from the instant
        it was forwarded, ``decided``, to its answer, ``answered``, in model seconds), unless the node
        came back fresh since it was chosen (the policy then counts the node from its report: earlier
        tasks are not its own). Whether it was still the policy's to count."""
        self.in_flight -= 1
        ours = generation == self.health.generation[route.node]
        if ours:
            self.side(answered).on_task_done(route.node, (answered - decided) / self.scale)
        return ours

    def _legs(
        self, reply: dict[str, Any], accepted: float, decided: float, forwarded: float, answered: float
    ) -> dict[str, float]:
        """The task's way through this dispatcher and its node as monotonic instants (one machine's clock;
        docs/run.md, "Where the time goes"), observed into the leg histograms on the way."""
        legs = {"accepted": accepted, "decided": decided, "forwarded": forwarded, "answered": answered}
        legs["released"] = time.monotonic()  # the answer is ready: the task leaves the dispatcher
        try:
            t0, scale = float(reply.pop("t0")), self.scale
            arrived = t0 + float(reply["arrived"]) * scale
            due = t0 + float(reply["completed"]) * scale
            replied = float(reply.pop("replied"))
            legs |= {"node_arrived": arrived, "node_due": due, "node_fired": float(reply.pop("fired"))}
            legs["node_replied"] = replied
        except (KeyError, TypeError, ValueError):
            return legs  # a node that does not stamp (an older version): the legs it would give are missing
        leg = self.leg
        leg["decide"].observe(decided - accepted)
        leg["to_node"].observe(max(0.0, arrived - forwarded))
        leg["node_reply"].observe(max(0.0, replied - due))
        leg["from_node"].observe(max(0.0, answered - replied))
        return legs

    # --------------------------------------------------------------------------------- messages

    def send(self, msgs: Sequence[Message]) -> None:
        # a message's age runs from now, the instant it is decided: emulated delays and the loop turn
        # before its request leaves are part of its way (the twin replays ages from the decision)
        at = time.monotonic()
        for m in msgs:
            self.health.sent(m.node)
            copies = self.faults.copies(m.kind)
            if not copies:  # dropped on the way: sent, never received
                self.sent[m.kind] += 1
            for extra in copies:
                t = asyncio.ensure_future(self._post_message(m, at, extra))
                self.background.add(t)
                t.add_done_callback(self.background.discard)

    async def _post_message(self, m: Message, at: float, extra: float = 0.0) -> None:
        if extra:
            await asyncio.sleep(extra * self.scale)
        await self._sleep_delay()
        self.sent[m.kind] += 1
        pool, path = self.node_peer[m.node]
        try:
            body = orjson.dumps({"messages": [wire.message_to_json(m, at)]})
            status, raw = await pool.post(f"{path}/messages", body)
            if status != 200:
                self.failures[m.kind] += 1
                return
            reply = orjson.loads(raw)
            self._apply_riders(reply.get("messages") if isinstance(reply, dict) else None, time.monotonic())
        except (OSError, TimeoutError, ValueError):
            self.failures[m.kind] += 1

    def _apply_riders(self, raw: Any, received: float) -> None:
        """State messages that came back on the reply to a task or to a message of ours (read at
        ``received``, monotonic)."""
        if not isinstance(raw, list):
            return
        try:
            msgs = wire.parse_messages({"messages": raw}, self.accepts)
        except wire.BadRequest as e:
            self.rejected["reply"] += 1
            log.warning("bad messages on a reply: %s", e)
            return
        for m, obj in zip(msgs, raw, strict=True):
            self.ages.observe(m, wire.sent_at(obj), received, rider=True)
            if not 0 <= m.node < self.exp.n:
                self.rejected[m.kind] += 1
                log.warning("rejected %s message from unknown node %d on a reply", m.kind, m.node)
                continue
            if not self.health.node_up[m.node]:
                self.health.ignored[m.kind] += 1  # its state is read afresh when it is back
                continue
            try:
                out = self.side(received).on_message(m)
            except (ValueError, TypeError, AssertionError) as e:
                self.rejected[m.kind] += 1
                log.warning("rejected %s message on a reply: %s", m.kind, e)
                continue
            self.received[m.kind] += 1
            self.piggybacked[m.kind] += 1
            self.track_r()
            self.send(out)

    async def post_messages(self, request: web.Request) -> web.Response:
        try:
            body = await wire.read_json(request)
            msgs = wire.parse_messages(body, self.accepts)
        except wire.BadRequest as e:
            return wire.error(e.status, str(e), e.field)
        for i, m in enumerate(msgs):
            if not 0 <= m.node < self.exp.n:
                return wire.error(400, f"no node {m.node} in this cluster", f"messages[{i}].node")
        now = time.monotonic()
        for i, m in enumerate(msgs):
            self.ages.observe(m, wire.sent_at(body["messages"][i]), now)
            if not self.health.node_up[m.node]:
                self.health.ignored[m.kind] += 1  # its state is read afresh when it is back
                continue
            try:
                out = self.side(now).on_message(m)
            except (ValueError, TypeError, AssertionError) as e:
                self.rejected[m.kind] += 1
                return wire.error(
                    400, f"{m.kind}: {e} ({i} of {len(msgs)} messages applied)", f"messages[{i}]"
                )
            self.received[m.kind] += 1
            self.track_r()
            self.send(out)
        return web.json_response({"ok": True, "applied": len(msgs)})

    async def get_health(self, request: web.Request) -> web.Response:
        ready = self.health.ready.is_set()
        return web.json_response(
            {
                "status": "ok" if ready else "starting",
                "dispatcher": self.index,
                "policy": self.policy.name,
                "in_flight": self.in_flight,
                **self.health.snapshot(),
            },
            status=200 if ready else 503,  # not ready before every node process has answered once
        )

    async def post_faults(self, request: web.Request) -> web.Response:
        return await self.faults.handle(request)


class _DispatcherCollector(Collector):
    def __init__(self, host: DispatcherHost) -> None:
        self.host = host

    def collect(self) -> Iterator[Metric]:
        h = self.host
        policy = h.policy.name
        decisions = CounterMetricFamily(
            "lbtestbed_dispatcher_decisions", "Routing decisions by rule", labels=["policy", "outcome"]
        )
        for outcome, v in sorted(h.decisions.items()):
            decisions.add_metric([policy, outcome], v)
        yield decisions
        tasks = CounterMetricFamily(
            "lbtestbed_dispatcher_tasks",
            "Tasks by how they ended: completed, refused (503), lost",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            tasks.add_metric([outcome], h.outcomes[outcome])
        yield tasks
        for name, doc, counts in (
            ("lbtestbed_dispatcher_messages_sent", "State messages sent, by kind", h.sent),
            ("lbtestbed_dispatcher_messages_received", "State messages received, by kind", h.received),
            (
                "lbtestbed_dispatcher_messages_piggybacked",
                "State messages received on a reply to a task or a message instead of a request of their own",
                h.piggybacked,
            ),
            (
                "lbtestbed_dispatcher_message_failures",
                "State messages that could not be delivered",
                h.failures,
            ),
            ("lbtestbed_dispatcher_messages_rejected", "State messages received and refused", h.rejected),
        ):
            yield wire.counters_by_kind(name, doc, counts)
        in_flight = GaugeMetricFamily("lbtestbed_dispatcher_tasks_in_flight", "Tasks forwarded and not done")
        in_flight.add_metric([], h.in_flight)
        yield in_flight
        state = GaugeMetricFamily(
            "lbtestbed_dispatcher_policy_state",
            "Policy state: what the policy learns, its tokens, its picture's idle nodes, ...",
            labels=["quantity"],
        )
        for quantity, amount in sorted(h.policy.gauges().items()):
            state.add_metric([quantity], amount)
        yield state
        now = time.monotonic()  # one instant for the clock and the integrals it divides
        clock = CounterMetricFamily(
            "lbtestbed_dispatcher_model_seconds", "Model time since the process started"
        )
        clock.add_metric([], (now - h.started) / h.scale)
        yield clock
        present = CounterMetricFamily(
            "lbtestbed_dispatcher_task_model_seconds",
            "Integral over model time of the tasks accepted and not yet answered (increase / model seconds "
            "= mean tasks in the system, probes and forwarding included)",
        )
        present.add_metric([], h.present.area(now))
        yield present
        if h.learned is not None:
            area = CounterMetricFamily(
                f"lbtestbed_dispatcher_{h.learned.name}_model_seconds",
                f"Integral of {h.learned.label} over model time (increase / model seconds = its mean)",
            )
            area.add_metric([], h.r.area(now))
            yield area
        yield wire.time_scale_gauge(h.scale)
        yield from _health_metrics(h)


def _health_metrics(h: DispatcherHost) -> Iterator[Metric]:
    health = h.health
    up = GaugeMetricFamily("lbtestbed_dispatcher_nodes_up", "Nodes this dispatcher routes to (not down)")
    up.add_metric([], health.up_count)
    yield up
    transitions = CounterMetricFamily(
        "lbtestbed_dispatcher_node_transitions",
        "Node processes marked down (failed forward or health check) and up again",
        labels=["to"],
    )
    for to, v in sorted(health.transitions.items()):
        transitions.add_metric([to], v)
    yield transitions
    beats = CounterMetricFamily(
        "lbtestbed_dispatcher_health_checks", "Health checks of node processes by outcome", labels=["outcome"]
    )
    for outcome, v in sorted(health.heartbeats.items()):
        beats.add_metric([outcome], v)
    yield beats
    yield wire.counters_by_kind(
        "lbtestbed_dispatcher_messages_resent",
        "Messages sent again because their answer was overdue (also counted as sent)",
        health.resent,
    )
    yield wire.counters_by_kind(
        "lbtestbed_dispatcher_messages_ignored",
        "State messages from nodes marked down (their state is read afresh when they are back)",
        health.ignored,
    )
    yield h.faults.metric("dispatcher")
    refusals = CounterMetricFamily(
        "lbtestbed_dispatcher_refusals",
        "Tasks the dispatcher refused itself (503), by reason: starting, no_node_up, limit (its tasks in "
        "flight), local (no resource to forward it)",
        labels=["reason"],
    )
    for reason in OWN_REFUSALS:
        refusals.add_metric([reason], h.own_refusals[reason])
    yield refusals
    ejections = CounterMetricFamily(
        "lbtestbed_dispatcher_ejections",
        "Nodes ejected as outliers: they answered, but failed tasks in a row or served too slowly",
    )
    ejections.add_metric([], health.ejections)
    yield ejections
    spared = CounterMetricFamily(
        "lbtestbed_dispatcher_ejections_spared",
        "Timeouts not acted on because they would have left more than health.max_ejection of the nodes "
        "down by judgment",
    )
    spared.add_metric([], health.spared)
    yield spared
    yield from wire.listener_metrics("dispatcher", h.guard, h.verifier.refused)
