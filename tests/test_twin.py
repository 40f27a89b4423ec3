"""The twin simulation (analysis/simulator/twin.py) against the plain simulator and hand computations.

* With every delay zero the twin is the zero-delay system: it must give the simulator's run to the last
  bit (same tasks, same policy stream, the same events in the same order), for every policy.
* Under random routing delays change nothing the policy sees: each task's twin sojourn is its simulated
  sojourn plus its own delays, exactly.
* Delays the policy does see (JSQ hears of departures late) make it worse, never better.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.simulator.twin import Emulation, TwinSimulator
from lbtestbed.loadgen.openloop import poisson_tasks
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import Message, Probe, Route
from lbtestbed.policies.prequal import PrequalDispatcher
from lbtestbed.spec import parse_spec
from lbtestbed.transport import wire
from lbtestbed.transport.wire import message_key

QUEUES = {
    "name": "twin-queues",
    "seed": 3,
    "classes": [{"name": "s", "count": 8, "discipline": "fcfs"}],
    "workload": {"load": 0.8, "service": {"dist": "exponential", "mean": 1.0}},
    "run": {"warmup": 10.0, "duration": 200.0, "batches": 10},
}
POOLS = {
    "name": "twin-pools",
    "seed": 4,
    "classes": [
        {"name": "small", "count": 4, "discipline": "pool", "utility": {"kind": "xlog", "r": 6}},
        {"name": "large", "count": 4, "discipline": "pool", "utility": {"kind": "xlog", "r": 9}},
    ],
    "workload": {"load": 3.0, "service": {"dist": "exponential", "mean": 1.0}},
    "run": {"warmup": 10.0, "duration": 100.0, "batches": 10},
}
POLICIES = [
    (QUEUES, {"name": "random"}),
    (QUEUES, {"name": "round_robin"}),
    (QUEUES, {"name": "jsq"}),
    (QUEUES, {"name": "jsq", "tie_break": "fastest"}),
    (QUEUES, {"name": "power_of_d", "d": 2}),
    (QUEUES, {"name": "least_request", "d": 2}),
    (QUEUES, {"name": "jiq"}),
    (QUEUES, {"name": "jiq_sparse", "p": 0.5, "dispatchers": 2}),
    (QUEUES, {"name": "sparse_jsq", "rate": 0.5}),
    (QUEUES, {"name": "sparse_jsq", "updates": "synchronous", "rate": 2.0, "dispatchers": 2}),
    (POOLS, {"name": "jlmu"}),
    (POOLS, {"name": "slta", "beta_scale": 1.0}),
]


def experiment(base: dict, policy: dict) -> Experiment:
    return parse_spec({**base, "policy": policy})


def trace(exp: Experiment) -> list[tuple[float, float]]:
    """The cluster's tasks: the spec's workload over the warm-up and the window (what lbt run sends)."""
    return list(poisson_tasks(exp, exp.run.warmup + exp.run.duration))


def emulation(exp: Experiment, legs: tuple[float, ...]) -> Emulation:
    tasks = trace(exp)
    return Emulation(tasks, {t: legs for t, _ in tasks})


@pytest.mark.parametrize(("base", "policy"), POLICIES, ids=[p["name"] + str(len(p)) for _, p in POLICIES])
def test_without_delays_the_twin_is_the_simulation(base: dict, policy: dict) -> None:
    exp = experiment(base, policy)
    sim = Simulator(exp).run()
    twin = TwinSimulator(exp, emulation(exp, (0.0,) * 6)).run()
    assert twin.sojourns == sim.sojourns
    assert twin.decisions == sim.decisions
    assert sorted(twin.ratios) == sorted(sim.ratios)
    for key, (num, den) in sim.ratios.items():
        assert twin.ratios[key][0].tobytes() == num.tobytes(), key
        assert twin.ratios[key][1].tobytes() == den.tobytes(), key


def test_random_routing_adds_each_tasks_own_delays_to_its_sojourn() -> None:
    """Random routing does not look at the nodes: the delays move each task in time and add to its
    sojourn, but on pools (infinite servers) its stay is its service whatever else is there."""
    exp = experiment(POOLS, {"name": "random"})
    tasks = trace(exp)
    rng = np.random.default_rng(9)
    legs = {
        t: (float(a), float(b), float(c), float(d), float(d + e), float(d))
        for (t, _), a, b, c, d, e in zip(tasks, *rng.uniform(0.0, 0.05, (5, len(tasks))), strict=True)
    }
    twin = TwinSimulator(exp, Emulation(tasks, legs)).run()
    sim = Simulator(exp).run()
    # the simulator serves task i for work_i / speed, and so does the twin: the difference per task is
    # exactly its arrive + decide + forward + reply (sojourns are listed per batch in completion order)
    expected = sorted(
        round(w + sum((legs[t][0], legs[t][1], legs[t][2], legs[t][4])), 9)
        for t, w in tasks
        if exp.run.warmup <= t < exp.run.warmup + exp.run.duration
    )
    got = sorted(round(s, 9) for batch in twin.sojourns for s in batch)
    assert got == expected
    assert sum(map(len, twin.sojourns)) == sum(map(len, sim.sojourns))


def test_late_departure_notices_make_jsq_worse() -> None:
    """JSQ routes on counts the departure notices keep: heard 0.3 model s late (a third of a service
    time), they keep nodes looking busy and routing less balanced; the sojourn at the nodes grows."""
    exp = experiment(QUEUES, {"name": "jsq"})
    tasks = trace(exp)
    fast = TwinSimulator(exp, emulation(exp, (0.0,) * 6)).run()
    slow = TwinSimulator(exp, Emulation(tasks, {t: (0.0, 0.0, 0.0, 0.3, 0.0, 0.3) for t, _ in tasks})).run()
    mean = lambda raw: float(raw.ratios["mean_sojourn"][0].sum() / raw.ratios["mean_sojourn"][1].sum())  # noqa: E731
    assert mean(slow) > mean(fast)
    assert slow.ratios["mean_sojourn"][1].sum() == fast.ratios["mean_sojourn"][1].sum()  # the same tasks


def test_a_trace_that_ends_inside_the_window_ends_the_twin() -> None:
    """Nothing arrives after the trace's last task: the twin closes the remaining batches and stops (the
    engine's loop used to need arrivals that never end)."""
    exp = experiment(QUEUES, {"name": "random"})
    tasks = [(t, w) for t, w in trace(exp) if t < exp.run.warmup + exp.run.duration / 2]
    raw = TwinSimulator(exp, Emulation(tasks, {t: (0.0,) * 6 for t, _ in tasks})).run()
    assert raw.batches == exp.run.batches
    counts = raw.ratios["mean_sojourn"][1]
    assert counts[: exp.run.batches // 2].min() > 0 and counts[exp.run.batches // 2 + 1 :].max() == 0


def test_every_task_of_the_window_is_counted_however_late_the_cluster_accepted_it() -> None:
    """Issue 26: under saturation the cluster accepts some of the window's tasks late, after the window
    has ended. The twin follows each of them to its end like any other: measured when it completes
    before the drain ends (window end + duration), censored when it does not, never dropped. Here the
    tasks of [end - 30, end - 5) are accepted 40 model s late, after the window, and those of the last 5 s
    only after the drain has ended."""
    exp = experiment(QUEUES, {"name": "jsq"})
    tasks = trace(exp)
    start, end = exp.run.warmup, exp.run.warmup + exp.run.duration
    beyond = exp.run.duration + 50.0  # past the end of the drain

    def arrive(t: float) -> float:
        return 0.0 if t < end - 30 else 40.0 if t < end - 5 else beyond

    raw = TwinSimulator(
        exp, Emulation(tasks, {t: (arrive(t), 0.0, 0.0, 0.0, 0.0, 0.0) for t, _ in tasks})
    ).run()
    window = [t for t, _ in tasks if start <= t < end]
    late = [t for t in window if arrive(t) == 40.0]
    never = [t for t in window if arrive(t) == beyond]
    assert len(late) > 100 and len(never) > 10
    sojourns = [s for batch in raw.sojourns for s in batch]
    assert len(sojourns) + raw.censored == len(window)
    assert raw.censored == len(never)
    assert sum(1 for s in sojourns if s >= 40.0) == len(late)  # each late one waited 40 s to be accepted


def test_a_message_gets_its_own_measured_age_else_the_age_of_the_message_sent_nearest_in_time() -> None:
    """JIQ with two dispatchers sends tokens on requests of their own. A token the cluster measured (same
    kind, node, dispatcher and arrivals count) arrives after its own age; any other after the age of the
    cluster's token sent nearest in model time: here 0 before t = 100 and 0.4 from then on."""
    exp = experiment(QUEUES, {"name": "jiq", "dispatchers": 2})
    tasks = trace(exp)
    legs = {t: (0.0,) * 6 for t, _ in tasks}
    timeline = {"idle_token": [(t, 0.0 if t < 100 else 0.4) for t in np.arange(0.0, 220.0, 0.5)]}
    seen: list[tuple[float, Message, float | None]] = []

    def watched(emulation: Emulation) -> TwinSimulator:
        """A twin whose measured delays report every message's delay, and when it was sent."""
        twin = TwinSimulator(exp, emulation)
        message = twin.measured.message

        def watch(m: Message, answer: bool) -> float | None:
            delay = message(m, answer)
            seen.append((twin.now, m, delay))
            return delay

        twin.measured.message = watch  # type: ignore[method-assign]
        return twin

    twin = watched(Emulation(tasks, legs, timeline))
    twin.run()
    assert twin.replayed == {"idle_token": [0, len(seen)]} and len(seen) > 100
    assert all((delay is None) == (t < 99.75) for t, _, delay in seen)  # nearest: the switch at 99.75
    first = seen[0][1]
    again = watched(Emulation(tasks, legs, timeline, keyed_ages={message_key(first): 0.123}))
    seen.clear()
    again.run()
    assert seen[0][1] == first and seen[0][2] == 0.123 and again.replayed["idle_token"][0] == 1


def test_the_messages_decided_with_a_task_leave_when_it_is_forwarded() -> None:
    """The cluster's dispatcher sends Prequal's probes as it forwards their task, and their ages run from
    that instant (the ``sent`` stamp is the route's). The twin sends them then too, not when the task
    reaches its node: with a decide leg of 0.01, a forward leg of 0.2 and every probe 0.05 old, each probe
    reaches its node 0.06 after its query, before the task (0.21)."""
    exp = experiment(QUEUES, {"name": "prequal"})
    tasks = trace(exp)
    legs = {t: (0.0, 0.01, 0.2, 0.0, 0.0, 0.0) for t, _ in tasks}
    twin = TwinSimulator(exp, Emulation(tasks, legs, {"prequal_probe": [(0.0, 0.05)]}))
    decided: dict[tuple[int, int], float] = {}  # (node, probe number): the model time of its query
    reached: dict[tuple[int, int], float] = {}  # ... and when it reached its node
    dispatch, at_node = twin.dispatcher.dispatch, twin._at_node

    def watch_dispatch() -> Route | Probe:
        route = dispatch()
        assert isinstance(route, Route)
        decided.update(((m.node, m.data[0]), twin.now) for m in route.messages)
        return route

    def watch_node(m: object, _: object = None) -> None:
        assert isinstance(m, Message)
        reached[m.node, m.data[0]] = twin.now
        at_node(m)

    twin.dispatcher.dispatch = watch_dispatch  # type: ignore[method-assign]
    twin._at_node = watch_node  # type: ignore[method-assign]
    twin.run()
    assert len(reached) > 1000 and reached.keys() <= decided.keys()
    assert all(abs(reached[k] - decided[k] - 0.06) < 1e-9 for k in reached)


# ------------------------------------------------------------------ what the twin assumes of the cluster


async def test_a_replys_messages_reach_the_dispatchers_policy_when_the_reply_is_read() -> None:
    """The twin applies what rode on a task's reply at the instant the dispatcher read the reply (the
    ``answered`` stamp). The dispatcher must do so too, before its loop turns to anything else: a decision
    made in between would see a token the twin's sees. A reply carrying node 1's idle token arrives; a
    callback queued right behind the read finds the token held (it was not, one loop turn late)."""
    import asyncio
    import time

    import orjson

    from lbtestbed.dispatcher.host import DispatcherHost

    exp = experiment(QUEUES, {"name": "jiq"})
    disp = DispatcherHost(exp, 0, 1, ["http://127.0.0.1:9"] * exp.n, "token")
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[tuple[int, bytes]] = loop.create_future()

    class Node:
        async def post(self, path: str, body: bytes, timeout: float | None = None) -> tuple[int, bytes]:
            return await reply

    disp.node_peer = [(Node(), f"/v1/nodes/{k}") for k in range(exp.n)]  # type: ignore[misc]
    for _ in range(exp.n):  # every node's first token taken: no node is known idle
        disp.policy.dispatch()
    assert not disp.policy.held  # type: ignore[attr-defined]
    answer = asyncio.ensure_future(disp._route(disp.core.admit(1.0, time.monotonic())))
    for _ in range(3):
        await asyncio.sleep(0)  # the task is routed and forwarded, and waits for its node
    assert not answer.done() and disp.core.in_flight == 1
    token = {"kind": "idle_token", "node": 1, "dispatcher": 0, "data": [1], "sent": time.monotonic()}
    now = time.monotonic()
    stamps = {"arrived": 0.0, "completed": 0.0, "t0": now, "fired": now, "replied": now}
    reply.set_result((200, orjson.dumps({"node": 0, "waited": False, **stamps, "messages": [token]})))
    seen: list[tuple[bool, int]] = []
    loop.call_soon(lambda: seen.append((1 in disp.policy.held, disp.core.in_flight)))  # type: ignore[attr-defined]
    await answer
    assert seen == [(True, 0)]
    assert disp.core.received["idle_token"] == 1


async def test_the_dispatcher_decides_in_the_step_that_stamps_the_task_accepted() -> None:
    """The twin decides each task at the instant the cluster's dispatcher stamped it accepted, before
    any reply that reached the dispatcher after it. The dispatcher must decide in that same step: on
    Python 3.11 the coroutine that answers a task starts a loop turn later, and a decision made there saw
    Prequal probe replies the twin's had not seen yet. Here the probes of the task's query are out (its
    policy has numbered them) when ``task`` returns, before the loop turns, and none of the nodes' replies
    (the same reply, node 3 idle, for every probe) reaches the decision."""
    import asyncio
    import time

    import orjson

    from lbtestbed.dispatcher.host import DispatcherHost

    exp = experiment(QUEUES, {"name": "prequal"})
    disp = DispatcherHost(exp, 0, 1, ["http://127.0.0.1:9"] * exp.n, "token")
    disp.core.health.ready = True
    loop = asyncio.get_running_loop()
    never: asyncio.Future[tuple[int, bytes]] = loop.create_future()
    reply = {"messages": [{"kind": "prequal_reply", "node": 3, "dispatcher": 0, "data": [0, 0, 0.1]}]}

    class Node:
        async def post(self, path: str, body: bytes, timeout: float | None = None) -> tuple[int, bytes]:
            if path.endswith("/messages"):
                return 200, orjson.dumps(reply)  # a probe, answered at once
            return await never  # the task: never served

    disp.node_peer = [(Node(), f"/v1/nodes/{k}") for k in range(exp.n)]  # type: ignore[misc]
    answer = disp.task({"work": 1.0}, time.monotonic())
    assert not isinstance(answer, wire.Reply)
    policy = disp.policy
    assert isinstance(policy, PrequalDispatcher)
    assert policy.sent == 3 and disp.core.present.value == 1 and not policy.pool  # decided: a random node
    running = asyncio.ensure_future(answer)
    for _ in range(5):
        await asyncio.sleep(0)  # the probes go out and their replies come back
    assert 3 in policy.pool and not running.done()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    await disp.background.close()


async def test_a_node_message_is_stamped_at_the_event_that_made_it() -> None:
    """The twin sends a node's message at the model instant of its departure and delays it by a measured
    age, so the age must run from that instant: the ``sent`` stamp of an idle token sent on its own
    request (here behind an emulated delay of 20 ms wall) is the departure's model time placed on the
    clock, not the later instant its request left."""
    import asyncio
    import time

    import orjson

    from lbtestbed.model.nodes import make_node
    from lbtestbed.model.workload import Task
    from lbtestbed.server_node.host import NodeHost

    exp = parse_spec(
        {
            **QUEUES,
            "policy": {"name": "jiq"},
            "network": {"delay": {"dist": "deterministic", "mean": 2.0}},
            "run": {**QUEUES["run"], "time_scale": 0.01},
        }
    )
    host = NodeHost(exp, [0], ["http://127.0.0.1:9"], "token")
    host.loop, host.t0 = asyncio.get_running_loop(), time.monotonic()
    host.models[0] = make_node("fcfs", 1.0, None, 0.0)
    posted: list[tuple[float, dict]] = []

    class Dispatcher:
        async def post(self, path: str, body: bytes, timeout: float | None = None) -> tuple[int, bytes]:
            posted.append((time.monotonic(), orjson.loads(body)))
            return 200, b'{"ok": true, "applied": 1}'

    host.peers.pool = lambda url: Dispatcher()  # type: ignore[method-assign, assignment, return-value]
    host.models[0].arrive(Task(1, 0.5, 0.0), 0.0)
    due = host.models[0].next_completion()
    await asyncio.sleep(max(0.0, host.t0 + due * exp.run.time_scale - time.monotonic()))
    host.core.complete(0, due)
    host.act()
    await asyncio.gather(*host.background)
    [(left, body)] = posted
    [message] = body["messages"]
    assert message["kind"] == "idle_token"
    assert message["sent"] == host.t0 + due * exp.run.time_scale
    # the emulated 20 ms are part of its way, and of its age (stamped when the request left, as it was,
    # this is about 0; uvloop's timers may fire up to a millisecond early)
    assert left - message["sent"] >= 0.015
