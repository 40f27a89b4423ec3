"""The dispatcher's core (lbtestbed.dispatcher.core) driven by events alone: no socket, no clock, no loop.

Every event carries its monotonic instant, chosen here, so every time the core computes (a sojourn, a
latency handed to the policy, the time integral of the tasks present, a leg of a task's way) is checked
against its value worked out by hand from those instants. The health bookkeeping is driven the same way:
a node process's answers, its failures (a stall of our own loop among them) and its restarts.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from lbtestbed.dispatcher.core import FULL, LOCAL_FAILURE, DispatcherCore, Ticket
from lbtestbed.dispatcher.health import FIRST_CONTACT, LoopWatch, Transition, processes_of
from lbtestbed.model.clock import ModelClock
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import Message, make_node_sides
from lbtestbed.spec import parse_spec
from lbtestbed.transport.actions import Note, Send
from lbtestbed.transport.wire import Reply

SCALE = 0.01  # wall seconds per model second
START = 1000.0  # the dispatcher's start on the monotonic clock


class Seen:
    """One histogram as the core sees it: the values observed, in order."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, amount: float) -> None:
        self.values.append(amount)


class Ages:
    def __init__(self) -> None:
        self.seen: list[tuple[str, float | None, float, bool]] = []

    def observe(self, m: Message, sent: float | None, now: float, rider: bool = False) -> None:
        self.seen.append((m.kind, sent, now, rider))


class Recorded:
    """A recorder that keeps every observation (the process's is Prometheus histograms)."""

    def __init__(self) -> None:
        self.sojourn, self.latency = Seen(), Seen()
        self.leg: dict[str, Seen] = defaultdict(Seen)
        self.ages = Ages()


def experiment(policy: dict[str, Any], n: int = 4, **extra: Any) -> Experiment:
    return parse_spec(
        {
            "name": "core",
            "seed": 3,
            "classes": [{"name": "s", "count": n, "discipline": "fcfs"}],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": policy,
            "run": {"warmup": 1.0, "duration": 10.0, "time_scale": SCALE},
            **extra,
        }
    )


#: two node processes of two nodes each
URLS = [f"http://127.0.0.1:{9000 + k // 2}/v1/nodes/{k}" for k in range(4)]


def make_core(exp: Experiment) -> tuple[DispatcherCore, Recorded]:
    recorded = Recorded()
    core = DispatcherCore(exp, 0, 1, processes_of(URLS[: exp.n]), ModelClock(SCALE, START), recorded)
    return core, recorded


def reports(exp: Experiment, nodes: list[int], x: int = 0) -> dict[int, tuple[int, ...]]:
    """What the nodes' own policy sides report with ``x`` tasks each."""
    sides = make_node_sides(exp, random.Random(1), nodes, 1)
    return {k: side.report(x) for k, side in zip(nodes, sides, strict=True)}


def contact(core: DispatcherCore, at: float, incarnation: int = 7) -> None:
    """Every node process answers its first health check at ``at``."""
    for p in core.health.processes:
        core.check_answered(p.index, incarnation, reports(core.exp, p.nodes), at)


def node_reply(
    node: int, t0: float, arrived: float, completed: float, fired: float, replied: float
) -> dict[str, Any]:
    """Node ``node``'s answer to a task: model times on its clock (t0), its timer's and its reply's
    instants."""
    stamps = {"t0": t0, "fired": fired, "replied": replied}
    return {"node": node, "arrived": arrived, "completed": completed, "waited": False, **stamps}


def routed_to(core: DispatcherCore, node: int, at: float) -> Ticket:
    """A task the policy (random) routes to ``node``: tasks are admitted until one goes there, the others
    answered at once as lost."""
    while True:
        ticket = core.admit(1.0, at)
        assert ticket.route is not None
        if ticket.route.node == node:
            return ticket
        core.leave(ticket, at)


def test_a_task_before_first_contact_is_refused_as_starting_then_routed_once_every_process_answered() -> None:
    core, _ = make_core(experiment({"name": "least_request", "d": 2}))
    reply = core.accept({"work": 1.0}, START + 0.1)
    assert isinstance(reply, Reply) and reply.status == 503 and "first answers" in reply.body["error"]
    assert (core.own_refusals["starting"], core.outcomes["refused"]) == (1, 1)
    assert core.present.value == 0  # a refused task is never present
    core.check_answered(0, 7, reports(core.exp, [0, 1]), START + 0.2)
    assert not core.health.ready  # process 1 has not answered yet
    core.check_answered(1, 7, reports(core.exp, [2, 3]), START + 0.3)
    assert core.health.ready
    ticket = core.accept({"work": 1.0}, START + 0.4)
    assert isinstance(ticket, Ticket) and ticket.route is not None and ticket.probe is None
    assert core.present.value == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "work"), ({"work": -1}, "work"), ({"work": True}, "work"), ({"work": 1e9}, "work")],
)
def test_a_malformed_task_is_a_400_naming_its_field_and_counts_nothing(
    body: dict[str, Any], field: str
) -> None:
    core, _ = make_core(experiment({"name": "random"}))
    contact(core, START)
    reply = core.accept(body, START + 1.0)
    assert isinstance(reply, Reply) and reply.status == 400 and reply.body["field"] == field
    assert sum(core.outcomes.values()) == 0 and core.present.value == 0


def test_a_completed_task_times_every_leg_from_the_event_instants() -> None:
    """Accepted at 1001.000, decided at .002, forwarded at .003; its node (t0 = 1000.000) takes it at
    .004 (model 100.4) and completes it at model 102.4 (.024), its timer fires at .0245, it replies at
    .025; the reply is read at .027 and answered at .028."""
    core, rec = make_core(experiment({"name": "least_request", "d": 2}))
    contact(core, START)
    ticket = core.accept({"work": 2.0}, 1001.000)
    assert isinstance(ticket, Ticket) and ticket.route is not None
    node = ticket.route.node
    assert core.policy.in_flight[node] == 1  # type: ignore[attr-defined]
    core.route(ticket, 1001.002)
    assert (core.in_flight, core.decisions["sampled"]) == (1, 1)
    assert rec.latency.values == [pytest.approx(0.002)]
    reply = node_reply(node, 1000.0, 100.4, 102.4, 1001.0245, 1001.025)
    core.settle(ticket, 200, reply, 1001.003, 1001.027)
    assert core.in_flight == 0 and core.policy.in_flight[node] == 0  # type: ignore[attr-defined]
    answer = core.answer(ticket, 1001.028)
    assert answer.status == 200 and answer.compact
    body = answer.body
    assert body["node"] == node and body["sojourn"] == pytest.approx(2.8)
    assert (body["arrived"], body["completed"], body["waited"]) == (100.4, 102.4, False)
    assert "t0" not in body and "fired" not in body and "replied" not in body
    legs = body["legs"]
    assert (legs["accepted"], legs["decided"], legs["forwarded"]) == (1001.0, 1001.002, 1001.003)
    assert (legs["answered"], legs["released"]) == (1001.027, 1001.028)
    assert legs["node_arrived"] == pytest.approx(1001.004) and legs["node_due"] == pytest.approx(1001.024)
    assert (legs["node_fired"], legs["node_replied"]) == (1001.0245, 1001.025)
    want = {"decide": 0.002, "to_node": 0.001, "node_reply": 0.001, "from_node": 0.002}
    assert {k: v.values for k, v in rec.leg.items()} == {k: [pytest.approx(v)] for k, v in want.items()}
    assert rec.sojourn.values == [pytest.approx(2.8)]
    assert core.outcomes["completed"] == 1
    # one task present from 1001.000 to 1001.028: 0.028 wall seconds = 2.8 model seconds
    assert core.present.area(1002.0) == pytest.approx(2.8) and core.present.value == 0


def test_the_policy_hears_a_tasks_latency_from_its_forward_to_its_answer_in_model_seconds() -> None:
    core, _ = make_core(experiment({"name": "least_request", "d": 2}))
    done: list[tuple[int, float]] = []
    core.policy.on_task_done = lambda node, latency: done.append((node, latency))  # type: ignore[method-assign]
    contact(core, START)
    ticket = core.accept({"work": 1.0}, 1001.0)
    assert isinstance(ticket, Ticket)
    core.route(ticket, 1001.25)
    core.settle(ticket, 200, {"arrived": 0.0, "completed": 1.0}, 1001.25, 1001.75)
    assert done == [(ticket.route.node, pytest.approx(50.0))]  # type: ignore[union-attr]


def test_a_forward_that_finds_nobody_loses_the_task_and_marks_its_process_down() -> None:
    core, _ = make_core(experiment({"name": "random"}))
    contact(core, START)
    ticket = core.accept({"work": 1.0}, 1001.0)
    assert isinstance(ticket, Ticket) and ticket.route is not None
    node = ticket.route.node
    process = core.health.processes[core.health.process_of[node]]
    core.route(ticket, 1001.0)
    core.settle(ticket, 0, {"error": "connection refused"}, 1001.0, 1001.1)
    reply = core.answer(ticket, 1001.1)
    assert reply.status == 502 and reply.body["node"] == node
    assert (core.outcomes["lost"], core.lost_by_node[node]) == (1, 1)
    assert not process.up and core.health.up_count == 2
    assert not any(core.health.node_up[k] for k in process.nodes)
    [transition] = core.take()
    assert isinstance(transition, Transition) and transition.to == "down"
    assert transition.reason == "forward failed: connection refused" and transition.nodes == process.nodes


def test_a_task_that_could_not_leave_is_the_dispatchers_own_refusal() -> None:
    core, _ = make_core(experiment({"name": "random"}))
    contact(core, START)
    ticket = core.accept({"work": 1.0}, 1001.0)
    assert isinstance(ticket, Ticket)
    core.route(ticket, 1001.0)
    core.settle(ticket, LOCAL_FAILURE, {"error": "too many open files"}, 1001.0, 1001.0)
    reply = core.answer(ticket, 1001.0)
    assert reply.status == 503 and "could not forward" in reply.body["error"]
    assert (core.own_refusals["local"], core.outcomes["refused"], core.health.up_count) == (1, 1, 4)


def test_the_end_of_a_task_routed_to_an_earlier_life_of_its_node_is_not_the_policys() -> None:
    """least_request counts a task from its forward to its end; when the node's process restarts
    meanwhile (a new incarnation), the policy takes the node's count afresh (0) and must not hear of the
    earlier task's end (which would make it -1)."""
    core, _ = make_core(experiment({"name": "least_request", "d": 2}))
    contact(core, START, incarnation=7)
    ticket = core.accept({"work": 1.0}, 1001.0)
    assert isinstance(ticket, Ticket) and ticket.route is not None
    node = ticket.route.node
    core.route(ticket, 1001.0)
    p = core.health.process_of[node]
    core.check_answered(p, 8, reports(core.exp, core.health.processes[p].nodes), 1001.5)  # restarted
    assert core.policy.in_flight[node] == 0  # type: ignore[attr-defined]
    assert [a.to for a in core.take() if isinstance(a, Transition)] == ["down", "up"]
    core.settle(ticket, 200, {"arrived": 0.0, "completed": 1.0}, 1001.0, 1002.0)
    assert core.policy.in_flight[node] == 0 and core.in_flight == 0  # type: ignore[attr-defined]


def test_a_probing_policy_asks_resolves_and_counts_its_probes() -> None:
    core, _ = make_core(experiment({"name": "power_of_d", "d": 2}))
    contact(core, START)
    ticket = core.accept({"work": 1.0}, 1001.0)
    assert isinstance(ticket, Ticket) and ticket.probe is not None and ticket.route is None
    a, b = ticket.probe.nodes
    for k in (a, b):
        core.probe_sent(k)
    replies = [core.probe_answered(a, 3), core.probe_failed(b, "bad reply", None, 1001.0, 1001.1)]
    assert replies == [3, FULL] and core.health.up_count == 4  # a malformed answer blames nobody
    core.resolve(ticket, replies, 1001.1)
    assert ticket.route is not None and ticket.route.node == a  # b looks full
    assert (core.sent["probe"], core.received["probe_reply"], core.failures["probe"]) == (2, 1, 1)


def test_a_probe_that_times_out_marks_its_process_down_unless_our_own_loop_stood_still() -> None:
    core, _ = make_core(experiment({"name": "power_of_d", "d": 2}, health={"timeout": 1.0}))
    contact(core, START)
    watch = core.health.watch
    # the loop ticked on time up to 1001.0, then stood still until 1001.9: the probe begun at 1001.0 and
    # failed at 1001.9 had 0 of its 1 s, less than half: our stall, not the node's
    t = START
    while t < 1001.0:
        t += LoopWatch.TICK
        core.tick(t)
    core.probe_failed(0, "TimeoutError", "timeout", 1001.0, 1001.9)
    assert core.health.up_count == 4 and core.take() == []
    core.tick(1001.9)  # the stall is recorded as such
    assert watch.stalls and watch.stalls[-1][1] == pytest.approx(1001.9 - t - LoopWatch.TICK)
    # the same timeout with the loop running all along: judged, and its process goes down
    while t < 1004.0:
        t += LoopWatch.TICK
        core.tick(t)
    core.probe_failed(0, "TimeoutError", "timeout", t - 1.0, t)
    assert core.health.up_count == 2 and core.health.processes[0].judged


def test_a_stalled_health_check_is_asked_again_and_judges_nobody() -> None:
    core, _ = make_core(experiment({"name": "random"}, health={"timeout": 1.0}))
    contact(core, START)
    # no tick since START: at START + 5, the loop has stood still for 5 s
    assert core.check_failed(0, "timeout", "TimeoutError", START + 4.0, START + 5.0)
    assert core.health.heartbeats["stalled"] == 1 and core.health.up_count == 4
    core.tick(START + 5.0)
    assert not core.check_failed(0, "gone", "connection refused", START + 5.0, START + 5.01)
    assert core.health.heartbeats["failed"] == 1 and not core.health.processes[0].up


def test_a_report_the_policy_cannot_read_takes_its_nodes_down_once_however_often_it_comes() -> None:
    """JSQ reads (x, A, D, events); a process answering three values is down after its first answer,
    and its later answers count as unreadable without another transition."""
    core, _ = make_core(experiment({"name": "jsq"}))
    for at in (START + 0.1, START + 0.6, START + 1.1):
        core.check_answered(0, 7, {0: (0, 0, 0), 1: (0, 0, 0)}, at)
    assert core.health.heartbeats["unreadable"] == 3 and core.health.heartbeats["ok"] == 0
    assert core.health.transitions["down"] == 1 and not core.health.node_up[0] and not core.health.node_up[1]
    actions = core.take()
    assert [type(a) for a in actions] == [Note, Transition]
    assert isinstance(actions[1], Transition) and actions[1].to == "down"


def test_a_process_silent_at_first_contact_starts_down() -> None:
    core, _ = make_core(experiment({"name": "random"}))
    core.check_answered(0, 7, reports(core.exp, [0, 1]), START + 1.0)
    assert not core.check_failed(1, "gone", "connection refused", START + 1.0, START + 2.0)
    assert not core.health.ready and core.health.up_count == 4  # never contacted: not judged yet
    core.check_failed(1, "gone", "connection refused", START + FIRST_CONTACT, START + FIRST_CONTACT + 0.1)
    assert core.health.ready and core.health.up_count == 2
    reply = core.accept({"work": 1.0}, START + FIRST_CONTACT + 1.0)
    assert isinstance(reply, Ticket) and reply.route is not None and reply.route.node in (0, 1)


def test_state_messages_reach_the_policy_and_a_nodes_answer_rides_back_to_it() -> None:
    """JIQ: an idle token posted by node 2 is held, a task goes to node 2 with it, and the token that
    rides on its reply is held again at the instant the reply is read (its age observed as a rider)."""
    core, rec = make_core(experiment({"name": "jiq"}))
    contact(core, START)
    while core.policy.held:  # type: ignore[attr-defined]
        t = core.accept({"work": 1.0}, START + 1.0)
        assert isinstance(t, Ticket)
    token = {"kind": "idle_token", "node": 2, "dispatcher": 0, "data": [1], "sent": START + 1.5}
    reply = core.messages({"messages": [token]}, START + 1.75)
    assert reply == Reply(200, {"ok": True, "applied": 1})
    assert 2 in core.policy.held  # type: ignore[attr-defined]
    assert rec.ages.seen == [("idle_token", START + 1.5, START + 1.75, False)]
    ticket = core.accept({"work": 1.0}, START + 2.0)
    assert isinstance(ticket, Ticket) and ticket.route is not None and ticket.route.node == 2
    core.route(ticket, START + 2.0)
    rider = {**token, "data": [2], "sent": START + 2.4}
    core.settle(
        ticket, 200, {"arrived": 0.0, "completed": 1.0, "messages": [rider]}, START + 2.0, START + 2.5
    )
    assert 2 in core.policy.held  # type: ignore[attr-defined]
    assert (core.received["idle_token"], core.piggybacked["idle_token"]) == (2, 1)
    assert rec.ages.seen[-1] == ("idle_token", START + 2.4, START + 2.5, True)


def test_a_message_from_a_node_marked_down_is_ignored_and_one_the_policy_refuses_is_a_400() -> None:
    core, _ = make_core(experiment({"name": "jiq"}))
    contact(core, START)
    core.health.down(core.health.processes[1], "test")
    token = {"kind": "idle_token", "node": 3, "dispatcher": 0, "data": [1]}
    assert core.messages({"messages": [token]}, START + 1.0).status == 200
    assert (core.health.ignored["idle_token"], core.received["idle_token"]) == (1, 0)
    assert (
        core.messages({"messages": [{**token, "node": 9}]}, START + 1.0).body["field"] == "messages[0].node"
    )
    wrong = core.messages({"messages": [{**token, "kind": "departure"}]}, START + 1.0)
    assert wrong.status == 400 and wrong.body["field"] == "messages[0].kind"


def test_message_faults_act_on_what_the_core_sends() -> None:
    """SLTA's dispatcher sends epochs. While a drop fault is on, an epoch is counted as sent and never
    posted; while a duplicate fault is on, it is posted twice; with none, once, and counted as sent when
    its copy leaves (``message_left``)."""
    window = {"at": 1.0, "until": 5.0, "fraction": 1.0, "messages": ["epoch"]}
    faults = [{"kind": "drop", **window}, {"kind": "duplicate", **window}]
    exp = parse_spec(
        {
            "name": "pools",
            "seed": 3,
            "classes": [{"name": "p", "count": 2, "discipline": "pool", "utility": {"kind": "xlog", "r": 3}}],
            "workload": {"load": 1.0, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "slta", "beta": 1.0},
            "run": {"warmup": 1.0, "duration": 10.0, "time_scale": SCALE},
            "faults": faults,
        }
    )
    core = DispatcherCore(exp, 0, 1, processes_of(URLS[:2]), ModelClock(SCALE, START), Recorded())
    msg = Message("epoch", 1, (1, 1, 0), 0)
    core.faults.set(0, True)
    core.send([msg], START + 1.0)
    assert core.take() == [] and core.sent["epoch"] == 1
    assert core.health.last_sent[1] == START + 1.0
    core.faults.set(0, False)
    core.faults.set(1, True)
    core.send([msg], START + 2.0)
    assert core.take() == [Send(msg, START + 2.0, 0.0)] * 2 and core.sent["epoch"] == 1
    core.faults.set(1, False)
    core.send([msg], START + 3.0)
    assert core.take() == [Send(msg, START + 3.0, 0.0)] and core.sent["epoch"] == 1
    core.message_left(msg)
    assert core.sent["epoch"] == 2


def test_an_outlier_that_fails_tasks_in_a_row_is_ejected_and_taken_back_when_its_time_is_up() -> None:
    core, _ = make_core(
        experiment({"name": "random"}, health={"consecutive_failures": 2, "ejection_time": 3.0})
    )
    contact(core, START)
    for i in range(2):
        ticket = routed_to(core, 1, START + i)
        core.route(ticket, START + i)
        core.settle(ticket, 500, {"error": "boom"}, START + i, START + i + 0.1)
        core.answer(ticket, START + i + 0.1)
    assert not core.health.node_up[1] and core.health.ejections == 1 and core.health.up_count == 3
    assert core.outcomes["lost"] == 2  # a 500 loses the task
    core.outlier_interval(START + 3.0)  # 1.1 + 3 = 4.1 not reached
    assert not core.health.node_up[1]
    core.outlier_interval(START + 4.2)
    assert core.health.node_up[1] and core.health.up_count == 4
    assert [(a.to, a.nodes) for a in core.take() if isinstance(a, Transition)] == [
        ("down", [1, 1]),
        ("up", [1, 1]),
    ]


def test_a_policy_that_keeps_time_reads_model_seconds_since_the_start() -> None:
    core, _ = make_core(experiment({"name": "peak_ewma"}))
    assert core.policy.uses_clock
    assert core.side(START + 2.5).now == pytest.approx(2.5 / SCALE)
