"""The node host's core (lbtestbed.server_node.core) driven by events alone: no socket, no clock, no loop.

Events carry model time; the core answers with replies and asks for timers (``Arm``), completions
(``Completed``) and messages (``Send``). Every completion instant, timer and stamp is checked against its
value worked out by hand from the tasks' works and the nodes' speeds.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from lbtestbed.model.clock import ModelClock
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import Message
from lbtestbed.server_node.core import Admitted, Arm, Completed, NodeCore
from lbtestbed.spec import parse_spec
from lbtestbed.transport.actions import Send
from lbtestbed.transport.wire import Reply

SCALE = 0.01
T0 = 500.0  # the host's start on the monotonic clock: model time 0


class Seen:
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
    def __init__(self) -> None:
        self.lateness = Seen()
        self.ages = Ages()


def experiment(
    policy: str | dict[str, Any] = "random", node: dict[str, Any] | None = None, **extra: Any
) -> Experiment:
    """Two FCFS nodes of speed 2 (``node``: more keys of their class)."""
    return parse_spec(
        {
            "name": "node-core",
            "seed": 5,
            "classes": [{"name": "s", "count": 2, "discipline": "fcfs", "speed": 2.0, **(node or {})}],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": policy} if isinstance(policy, str) else policy,
            "run": {"warmup": 1.0, "duration": 100.0, "time_scale": SCALE},
            **extra,
        }
    )


def started(exp: Experiment, max_tasks: int = 100) -> tuple[NodeCore, Recorded]:
    recorded = Recorded()
    core = NodeCore(exp, [0, 1], exp.policy.dispatchers, max_tasks, 42, recorded)
    core.start(ModelClock(SCALE, T0))
    return core, recorded


def admitted(reply: Reply | Admitted) -> Admitted:
    assert isinstance(reply, Admitted), reply
    return reply


def test_an_fcfs_node_serves_in_order_and_asks_for_a_timer_at_each_next_completion() -> None:
    """Speed 2: work 4 arriving at 1 completes at 3; work 2 arriving at 1.5 waits and completes at 4."""
    core, _ = started(experiment())
    first = admitted(core.arrive(0, {"work": 4.0}, 1.0))
    assert first == Admitted(1, 1.0, False)
    assert core.take() == [Arm(0, 3.0)]
    second = admitted(core.arrive(0, {"work": 2.0}, 1.5))
    assert second.waited and core.take() == []  # the next completion is still at 3
    core.fire(0, 3.0)
    assert core.take() == [Completed(1, 3.0, []), Arm(0, 4.0)]
    core.fire(0, 4.0)
    assert core.take() == [Completed(2, 4.0, []), Arm(0, math.inf)]
    assert core.models[0].completions == 2 and core.models[0].x == 0


def test_a_late_timer_does_not_let_a_later_arrival_overtake_the_completion_it_stands_for() -> None:
    """Work 2 arrives at 0 (due at 1); its timer has not fired when the next task arrives at 1.5: the
    completion at 1 is applied first, so the new task finds the node idle and does not wait."""
    core, _ = started(experiment())
    admitted(core.arrive(0, {"work": 2.0}, 0.0))
    core.take()
    late = admitted(core.arrive(0, {"work": 1.0}, 1.5))
    assert not late.waited
    # the completion's timer is dropped and one armed for the new task's completion
    assert core.take() == [Completed(1, 1.0, []), Arm(0, math.inf), Arm(0, 2.0)]
    assert core.models[0].time_at[0] == pytest.approx(0.5)  # idle from 1 to 1.5


def test_the_reply_places_model_times_on_the_monotonic_clock_and_the_timers_lateness_is_observed() -> None:
    core, rec = started(experiment())
    task = admitted(core.arrive(1, {"work": 4.0}, 10.0))  # completes at 12: T0 + 0.12
    core.take()
    core.fire(1, 12.0)
    [done, _] = core.take()
    assert done == Completed(task.task, 12.0, [])
    reply = core.served(1, task, 12.0, [], T0 + 0.1205, T0 + 0.1207)
    assert reply.status == 200 and reply.compact
    assert dict(reply.body) == {
        "node": 1,
        "arrived": 10.0,
        "completed": 12.0,
        "waited": False,
        "t0": T0,
        "fired": T0 + 0.1205,
        "replied": T0 + 0.1207,
    }
    assert rec.lateness.values == [pytest.approx(0.0005)]


def test_a_node_at_its_task_limit_refuses_and_a_bad_task_names_its_field() -> None:
    core, _ = started(experiment(), max_tasks=1)
    admitted(core.arrive(0, {"work": 1.0}, 0.0))
    full = core.arrive(0, {"work": 1.0}, 0.1)
    assert isinstance(full, Reply) and full.status == 503 and core.refused[0] == 1
    for body, field in (
        ({"work": 0}, "work"),
        ({"work": 1, "origin": 3}, "origin"),
        ({"work": 1, "piggyback": 1}, "piggyback"),
    ):
        bad = core.arrive(1, body, 0.2)
        assert isinstance(bad, Reply) and bad.status == 400 and bad.body["field"] == field
    assert core.models[1].arrivals == 0


def test_an_unknown_node_is_a_404_even_of_thousands_of_digits() -> None:
    core, _ = started(experiment())
    assert core.node_of("1") == 1
    for text in ("2", "1" * 5000):
        reply = core.node_of(text)
        assert isinstance(reply, Reply) and reply.status == 404 and "no node" in reply.body["error"]


def test_a_departure_message_rides_on_the_reply_of_its_dispatchers_task_without_an_emulated_network() -> None:
    """JIQ: the node that falls idle sends its token to the task's dispatcher: on the task's reply when
    the network is not emulated, on a request of its own, stamped at the departure's instant, when it is."""
    core, _ = started(experiment("jiq"))
    task = admitted(core.arrive(0, {"work": 2.0}, 0.0))
    core.take()
    core.fire(0, 1.0)
    [done, _] = core.take()
    assert isinstance(done, Completed) and done.task == task.task
    [token] = done.riders
    assert token.kind == "idle_token" and token.node == 0
    assert (core.sent["idle_token"], core.piggybacked["idle_token"]) == (1, 1)
    delayed, _ = started(experiment("jiq", network={"delay": {"dist": "deterministic", "mean": 0.5}}))
    admitted(delayed.arrive(0, {"work": 2.0}, 0.0))
    delayed.take()
    delayed.fire(0, 1.0)
    actions = delayed.take()
    assert Completed(task.task, 1.0, []) in actions
    assert [a for a in actions if isinstance(a, Send)] == [Send(token, T0 + 1.0 * SCALE, 0.0)]
    assert delayed.sent["idle_token"] == 0  # counted when its copy leaves


def test_a_request_that_went_away_gets_no_completion_and_its_riders_go_on_their_own() -> None:
    core, _ = started(experiment("jiq"))
    task = admitted(core.arrive(0, {"work": 2.0}, 0.0))
    core.forget(task.task)
    core.take()
    core.fire(0, 1.0)
    actions = core.take()
    assert not any(isinstance(a, Completed) for a in actions)
    assert [a.message.kind for a in actions if isinstance(a, Send)] == ["idle_token"]


def test_the_state_report_applies_the_departures_due_first() -> None:
    core, _ = started(experiment("jsq"))
    admitted(core.arrive(0, {"work": 2.0}, 0.0))  # due at 1
    reply = core.state(0.5)
    assert reply.body["reports"]["0"][0] == 1 and core.heartbeats == 1
    reply = core.state(1.5)  # the timer has not fired: the report must not show the task
    assert reply.body["reports"]["0"][0] == 0 and reply.body["incarnation"] == 42


def test_the_runs_timed_speed_changes_apply_from_the_origin_on() -> None:
    """Speed 2 halved at run time 20; the run's 0 is the host's model time 5: the change is armed at 25.
    A task of work 60 arriving at 10 has 30 done by 25 at speed 2 and the rest at speed 1: done at 55."""
    exp = experiment(node={"speed_schedule": [{"at": 20.0, "factor": 0.5}]})
    core, _ = started(exp)
    assert core.set_origin(5.0, 0.0) == 2  # one change per node
    assert core.take() == [Arm(0, 25.0), Arm(1, 25.0)]
    admitted(core.arrive(0, {"work": 60.0}, 10.0))
    assert core.take() == []  # the change comes first
    core.fire(0, 25.0)
    assert core.take() == [Arm(0, 55.0)] and core.models[0].speed == 1.0
    core.fire(0, 55.0)
    assert core.take()[0] == Completed(1, 55.0, [])


def test_a_probe_reads_the_node_after_its_departures_due() -> None:
    core, _ = started(experiment("power_of_d"))
    admitted(core.arrive(1, {"work": 2.0}, 0.0))  # due at 1
    assert core.probe(1, 0.5) == Reply(200, {"node": 1, "x": 1})
    assert core.probe(1, 1.5) == Reply(200, {"node": 1, "x": 0})
    assert (core.received["probe"], core.sent["probe_reply"]) == (2, 2)


def test_state_messages_are_applied_and_an_answer_to_their_sender_rides_on_the_reply() -> None:
    """JIQ-SQ(2) with two dispatchers: node 0 falls idle at 1 and asks both how many tokens they hold
    (the ask for dispatcher 0, whose task it was, rides on the task's reply); dispatcher 1 answers 5,
    dispatcher 0 answers 2: the token goes to dispatcher 0, on the reply to its answer."""
    core, rec = started(experiment({"name": "jiq", "d": 2, "dispatchers": 2}))
    admitted(core.arrive(0, {"work": 2.0, "origin": 0}, 0.0))
    core.take()
    core.fire(0, 1.0)
    actions = core.take()
    [done] = [a for a in actions if isinstance(a, Completed)]
    assert [(m.kind, m.dispatcher, m.data) for m in done.riders] == [("token_probe", 0, (1,))]
    [alone] = [a for a in actions if isinstance(a, Send)]
    assert (alone.message.kind, alone.message.dispatcher, alone.at) == ("token_probe", 1, T0 + 1.0 * SCALE)

    def count(dispatcher: int, tokens: int, sent: float) -> dict[str, Any]:
        return {"kind": "token_count", "node": 0, "dispatcher": dispatcher, "data": [1, tokens], "sent": sent}

    first = core.messages(0, {"messages": [count(1, 5, T0 + 0.02)]}, T0 + 0.03)
    assert first == Reply(200, {"ok": True, "applied": 1})
    second = core.messages(0, {"messages": [count(0, 2, T0 + 0.04)]}, T0 + 0.05)
    assert second.status == 200 and core.take() == []
    [token] = second.body["messages"]
    assert token == {"kind": "idle_token", "node": 0, "dispatcher": 0, "data": [1], "sent": T0 + 0.05}
    assert (core.received["token_count"], core.sent["idle_token"], core.piggybacked["idle_token"]) == (
        2,
        1,
        1,
    )
    assert rec.ages.seen == [
        ("token_count", T0 + 0.02, T0 + 0.03, False),
        ("token_count", T0 + 0.04, T0 + 0.05, False),
    ]


def test_a_message_of_the_wrong_kind_or_for_another_node_is_a_400_naming_its_field() -> None:
    core, rec = started(experiment("jiq"))
    token = {"kind": "token_count", "node": 0, "data": [1, 1]}
    elsewhere = core.messages(1, {"messages": [token]}, T0 + 1.0)
    assert elsewhere.status == 400 and elsewhere.body["field"] == "messages[0].node"
    wrong = core.messages(0, {"messages": [{**token, "kind": "idle_token"}]}, T0 + 1.0)
    assert wrong.status == 400 and wrong.body["field"] == "messages[0].kind"
    assert rec.ages.seen == [] and sum(core.received.values()) == 0


def test_a_node_sides_own_events_run_on_the_hosts_clock_then_on_the_runs_from_its_origin() -> None:
    """sparse_jsq, synchronous, rate 0.5: two nodes at load 0.5 of speed 2 make Lambda = 1, delta = 0.5 *
    1 / 2 = 1/4, T = 4. On the host's own clock (clock 0) the first updates are at 4; the run's model time 0
    at the host's 2 (clock 1) moves them to 2 + 4 = 6, numbered (1, 1). A task of work 20 at 1 (done at 11)
    makes node 0 report 1."""
    exp = experiment({"name": "sparse_jsq", "updates": "synchronous", "rate": 0.5})
    core, _ = started(exp)
    assert core.take() == [Arm(0, 4.0), Arm(1, 4.0)]
    admitted(core.arrive(0, {"work": 20.0}, 1.0))
    assert core.take() == []  # the update at 4 comes before the completion at 11
    core.set_origin(2.0, 1.5)
    assert core.take() == [Arm(0, 6.0), Arm(1, 6.0)]
    core.fire(0, 6.0)
    update = Message("queue_update", 0, (1, 1, 1), 0)
    assert core.take() == [Send(update, T0 + 6.0 * SCALE, 0.0), Arm(0, 10.0)]
    assert core.state(7.0).body["reports"]["0"] == [1, 1, 1, 1]


def test_a_late_own_event_reads_the_node_at_its_own_model_time() -> None:
    """Node 1's update is due at 6 (as above) but its timer has not fired when a task arrives at 7: the
    update goes first, stamped at 6 and reporting the node empty, then the task is admitted."""
    exp = experiment({"name": "sparse_jsq", "updates": "synchronous", "rate": 0.5})
    core, _ = started(exp)
    core.set_origin(2.0, 0.0)
    core.take()
    admitted(core.arrive(1, {"work": 2.0}, 7.0))
    actions = core.take()
    assert actions[0] == Send(Message("queue_update", 1, (1, 1, 0), 0), T0 + 6.0 * SCALE, 0.0)
    # the timer is for the next update at 10, then for the task's completion at 8, before it
    assert actions[1:] == [Arm(1, 10.0), Arm(1, 8.0)]
