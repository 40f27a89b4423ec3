"""The policies' fault hooks (base.DispatcherSide: on_node_down, on_node_up, reconcile, awaiting, resend;
NodeSide.report), driven sans-I/O: both halves of a policy, the nodes' true occupancies, and the state
messages in flight, which a test delivers, drops, duplicates or reorders by hand.

What must hold (the brief of issue 8 and the contracts in base.py): a node that is down is never routed to
or probed, and one that comes back is used again; a lost state message is made good by ``reconcile`` with
the node's own report, a duplicated or overtaken one changes nothing; a fresh up (node or dispatcher
restarted) gives the dispatcher the node's true state; a fresh up from a node's initial report changes
nothing at all (runs without faults stay as they were); while every node is up the random draws are those
of a dispatcher that never saw a fault.

Expected values are the nodes' true occupancies kept by the test, or hand-derived; seeds are fixed.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import (
    DispatcherSide,
    Message,
    NodeSide,
    Probe,
    Route,
    make_dispatcher,
    make_node_sides,
)
from lbtestbed.policies.base import Liveness
from lbtestbed.policies.jiq import JIQDispatcher
from lbtestbed.policies.jlmu import JLMUDispatcher
from lbtestbed.policies.jsq import CountingDispatcher, JSQDispatcher
from lbtestbed.policies.slta import SLTADispatcher
from lbtestbed.policies.structures import LevelIndex
from lbtestbed.spec import parse_spec

# upper 1e-6 quantiles of chi-square with df degrees of freedom (as in test_policies.py)
CHI2_1E6 = {1: 23.93, 2: 27.63, 3: 30.66, 4: 33.38, 5: 35.89}


def assert_uniform(counts: Counter[int], support: Iterable[int]) -> None:
    """Pearson chi-square at level 1e-6, and no outcome off the support."""
    support = list(support)
    trials = sum(counts.values())
    assert set(counts) <= set(support), f"outcomes outside the support: {set(counts) - set(support)}"
    e = trials / len(support)
    stat = sum((counts[k] - e) ** 2 / e for k in support)
    assert stat < CHI2_1E6[len(support) - 1], f"chi-square {stat:.1f} for {dict(counts)}"


# ------------------------------------------------------------------------------------ experiments


def queue_class(name: str, count: int, speed: Any) -> dict[str, Any]:
    return {"name": name, "count": count, "discipline": "ps", "speed": speed}


def pool_class(name: str, count: int, r: int) -> dict[str, Any]:
    return {"name": name, "count": count, "discipline": "pool", "utility": {"kind": "xlog", "r": r}}


# nodes 0-1 speed 1, 2-3 speed 2, 4-5 speed 1/2
MIXED = [queue_class("mid", 2, 1), queue_class("fast", 2, 2), queue_class("slow", 2, "1/2")]
# pools 0-2 of class r20, 3-5 of class r30
POOLS = [pool_class("r20", 3, 20), pool_class("r30", 3, 30)]


def experiment(policy: dict[str, Any], pools: bool = False, load: float = 0.5) -> Experiment:
    return parse_spec(
        {
            "name": "faults",
            "seed": 1,
            "classes": POOLS if pools else MIXED,
            "workload": {"load": load},
            "policy": policy,
            "run": {"duration": 10.0},
        },
        "faults.toml",
    )


#: every policy, and the variants whose structures differ (tie-breaks, sampling with replacement)
POLICIES: dict[str, tuple[dict[str, Any], bool]] = {
    "random": ({"name": "random"}, False),
    "round_robin": ({"name": "round_robin"}, False),
    "jsq": ({"name": "jsq"}, False),
    "jsq_fastest": ({"name": "jsq", "tie_break": "fastest"}, False),
    "jsq_slowest": ({"name": "jsq", "tie_break": "slowest"}, False),
    "jsq_longest_idle": ({"name": "jsq", "tie_break": "longest_idle"}, False),
    "jsq_fastest_idle": ({"name": "jsq", "tie_break": "fastest_idle"}, False),
    "power_of_d": ({"name": "power_of_d", "d": 2}, False),
    "power_of_d_3_replace": ({"name": "power_of_d", "d": 3, "replace": True}, False),
    "power_of_d_fastest": ({"name": "power_of_d", "d": 2, "tie_break": "fastest"}, False),
    "least_request": ({"name": "least_request", "d": 2}, False),
    "least_request_weighted": ({"name": "least_request", "weights": "speed"}, False),
    "peak_ewma": ({"name": "peak_ewma"}, False),
    "prequal": ({"name": "prequal"}, False),
    "jiq": ({"name": "jiq"}, False),
    "jiq_longest_idle": ({"name": "jiq", "tie_break": "longest_idle"}, False),
    "jiq_fastest": ({"name": "jiq", "tie_break": "fastest"}, False),
    "scheme1": ({"name": "scheme1", "d": [2, 2, 1]}, False),
    "scheme2": ({"name": "scheme2", "d": [2, 2, 1]}, False),
    "jlmu": ({"name": "jlmu"}, True),
    "slta": ({"name": "slta", "beta": 0.5}, True),
}


def policy_exp(name: str) -> Experiment:
    policy, pools = POLICIES[name]
    return experiment(dict(policy), pools, load=2.0 if pools else 0.25)


def with_dispatchers(exp: Experiment, k: int) -> Experiment:
    return dataclasses.replace(exp, policy=dataclasses.replace(exp.policy, dispatchers=k))


# ---------------------------------------------------------------------------------------- the net


class Net:
    """One dispatcher side, the node sides, true occupancies, and the messages in flight both ways.

    ``to_disp`` and ``to_nodes`` are the messages on their way; the test delivers any of them (in any
    order), once or twice, or drops them. A node that is down gets nothing (a message to it is lost) and
    nothing of it reaches the dispatcher (its messages wait). Tasks reach their node at once.
    """

    def __init__(self, exp: Experiment, seed: int = 1, index: int = 0, dispatchers: int = 1) -> None:
        self.exp = exp
        self.n = exp.n
        self.index, self.dispatchers = index, dispatchers
        self.disp = make_dispatcher(exp, random.Random(seed), index, dispatchers)
        self.sides = make_node_sides(exp, random.Random(seed + 1000), dispatchers=dispatchers)
        self.x = [0] * exp.n
        self.to_disp: list[Message] = []
        self.to_nodes: list[Message] = []
        self.down: set[int] = set()
        self.chosen: list[int] = []  # every node routed to or probed

    # tasks
    def decide(self) -> Route:
        d = self.disp.dispatch()
        if isinstance(d, Probe):
            assert not set(d.nodes) & self.down, f"probed a node that is down: {d.nodes}, down {self.down}"
            self.chosen.extend(d.nodes)
            d = self.disp.resolve(d, [self.sides[k].probe_reply(self.x[k]) for k in d.nodes])
        assert d.node not in self.down, f"routed to node {d.node}, which is down"
        self.chosen.append(d.node)
        return d

    def land(self, route: Route) -> None:
        """The task reaches its node, then the route's messages leave for their nodes."""
        k = route.node
        self.x[k] += 1
        self.to_disp += self.sides[k].on_arrival(self.x[k], self.index, route.piggyback)
        self.to_nodes += route.messages

    def arrive(self) -> int:
        route = self.decide()
        self.land(route)
        return route.node

    def fail(self, ran: bool, late: bool = False) -> int:
        """A task the host counts as failed (refused, or lost on the way); with ``ran`` it reached the node
        all the same (its reply was lost), and with ``late`` it also left and its departure's message came
        before the host gave up on it."""
        route = self.decide()
        if ran:
            self.land(route)
            if late:
                self.depart(route.node, done=False)
                if self.to_disp:  # JIQ sends a token only when the node is idle
                    self.deliver(len(self.to_disp) - 1)
        else:
            self.to_nodes += route.messages
        self.disp.on_task_done(route.node, 0.0)
        self.disp.on_task_failed(route.node)
        return route.node

    def depart(self, k: int, done: bool = True) -> None:
        assert self.x[k] > 0
        self.x[k] -= 1
        self.to_disp += self.sides[k].on_departure(self.x[k], self.index)
        if done:
            self.disp.on_task_done(k, 0.0)

    # messages
    def deliver(self, i: int = 0, keep: bool = False) -> bool:
        """Deliver ``to_disp[i]`` (``keep``: and leave a copy in flight, a duplicate); False if its node is
        down (it waits)."""
        m = self.to_disp[i]
        if m.node in self.down:
            return False
        if not keep:
            del self.to_disp[i]
        self.to_nodes += self.disp.on_message(m)
        return True

    def deliver_to_node(self, i: int = 0, keep: bool = False) -> None:
        m = self.to_nodes[i] if keep else self.to_nodes.pop(i)
        if m.node not in self.down:  # else the post fails: lost
            self.to_disp += self.sides[m.node].on_message(m, self.x[m.node])

    def flush(self) -> None:
        """Deliver everything in flight, in order, until nothing is left (nodes that are down excepted)."""
        while True:
            i = next((i for i, m in enumerate(self.to_disp) if m.node not in self.down), None)
            if i is not None:
                self.deliver(i)
            elif self.to_nodes:
                self.deliver_to_node(0)
            else:
                return

    def report(self, k: int) -> tuple[int, ...]:
        return self.sides[k].report(self.x[k])

    # faults
    def node_down(self, k: int) -> None:
        self.down.add(k)
        self.disp.on_node_down(k)

    def node_up(self, k: int, fresh: bool = False) -> None:
        self.down.discard(k)
        self.to_nodes += self.disp.on_node_up(k, self.report(k), fresh)

    def restart_node(self, k: int) -> None:
        """The node's process starts anew: its tasks are lost, its side is new, messages of the old one in
        flight are lost with it."""
        self.node_down(k)
        self.x[k] = 0
        self.sides[k] = make_node_sides(self.exp, random.Random(7), [k], self.dispatchers)[0]
        self.to_disp = [m for m in self.to_disp if m.node != k]
        self.to_nodes = [m for m in self.to_nodes if m.node != k]
        self.node_up(k, fresh=True)

    def settle(self) -> None:
        """Every node up (the test's), everything delivered, overdue answers asked for again, and a
        reconcile with every node's report, as the host does on its next heartbeats."""
        for k in sorted(self.down):
            self.node_up(k)
        self.flush()
        for k in sorted(self.disp.awaiting()):
            self.to_nodes += self.disp.resend(k)
        self.flush()
        for k in range(self.n):
            self.to_nodes += self.disp.reconcile(k, self.report(k))
        self.flush()


# ------------------------------------------------------------------------ the dispatcher's picture


def check_index(lv: LevelIndex, out: Iterable[int] = ()) -> None:
    """LevelIndex's invariants: every node that is in is in the bucket (and speed bucket) of its level and
    nowhere else; min_level is the lowest occupied level; the longest-idle queue's live entries are exactly
    the nodes at level 0, once each."""
    for k, lvl in lv.level.items():
        where = [i for i, b in enumerate(lv.buckets) if k in b]
        if k in set(out):
            assert lvl == -1 and where == [], (k, lvl, where)
            assert k not in lv
        else:
            assert lvl >= 0 and where == [lvl], (k, lvl, where)
            assert k in lv
            if lv._by_speed:
                assert lv.speeds is not None
                speed = lv.speeds[k]
                assert [i for i, s in enumerate(lv._speed) if k in s._groups.get(speed, ())] == [lvl]
    assert set(out) <= set(lv.level)
    occupied = [i for i, b in enumerate(lv.buckets) if b]
    assert lv.min_level == (occupied[0] if occupied else 0)
    if lv._fifo0 is not None:
        live = [k for k, s in lv._fifo0 if lv._stamp[k] == s and lv.level[k] == 0]
        assert sorted(live) == sorted(lv.buckets[0]) and len(set(live)) == len(live)


def picture(disp: DispatcherSide, k: int) -> int:
    """How many tasks JSQ's or JLMU's dispatcher sees at node k."""
    if isinstance(disp, JSQDispatcher):
        return disp.levels.level[k]
    assert isinstance(disp, JLMUDispatcher)
    return disp.classes[disp.node_class[k]].level[k]


def check_structures(net: Net) -> None:
    """The dispatcher's structures are consistent, and hold nothing of a node that is down."""
    d = net.disp
    out = set(d.live.down) if hasattr(d, "live") and hasattr(d.live, "down") else set()
    if isinstance(d, CountingDispatcher):  # the picture is sent - acked, never below 0
        for k in set(range(d.n)) - out:
            assert picture(d, k) == max(0, d.sent[k] - d.acked[k])
    if isinstance(d, JSQDispatcher):
        check_index(d.levels, out)
    elif isinstance(d, JLMUDispatcher):
        for lv in d.classes:
            check_index(lv, out & set(lv.level))
    elif isinstance(d, JIQDispatcher):
        held = set(d.held)
        assert set(d.tokens) == held and not held & out
        if d.tie_break == "longest_idle":
            assert sorted(d._fifo) == sorted(held)
        elif d.tie_break != "random":
            assert {k for g in d._by_speed._groups.values() for k in g} == held
        assert all(s > d.used[k] for k, s in d.held.items())
    elif isinstance(d, SLTADispatcher):
        for k in range(d.n):
            i = d.node_class[k]
            up = k not in out
            assert d.bits[k] == d.th.true_bits(i, d.xhat[k], d.r)
            assert (k in d.green[i]) == (up and d.bits[k][0])
            assert (k in d.yellow) == (up and d.bits[k][1])
        assert not set(d.unsettled) & out


def check_truth(net: Net) -> None:
    """After ``settle``: the dispatcher's picture is the nodes' true state."""
    check_structures(net)
    d = net.disp
    if isinstance(d, CountingDispatcher):
        assert [picture(d, k) for k in range(net.n)] == net.x
    elif isinstance(d, SLTADispatcher):
        assert d.xhat == net.x
        assert not d.awaiting()
    elif isinstance(d, JIQDispatcher):
        idle = {k for k in range(net.n) if net.x[k] == 0}
        assert idle <= set(d.held), f"idle nodes without a token: {idle - set(d.held)}"
        for k, s in d.held.items():  # a token is never newer than its node
            assert s <= net.sides[k].arrivals  # type: ignore[attr-defined]


# ================================================================ 1. down nodes are never chosen


def drive(net: Net, steps: int, rng: random.Random) -> None:
    """Arrivals and departures in random order, every message delivered at once."""
    for _ in range(steps):
        busy = [k for k in range(net.n) if net.x[k]]
        if busy and rng.random() < 0.5:
            net.depart(rng.choice(busy))
        else:
            net.arrive()
        net.flush()
        check_structures(net)


@pytest.mark.parametrize("which", ["scattered", "whole-class"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_down_nodes_are_never_chosen_and_come_back(name: str, which: str) -> None:
    """Nodes down from the start are never routed to nor probed over 600 events (the nets assert it); once
    up again each of them is chosen within the next 600. ``whole-class``: every node of a class is down
    (the fast class of MIXED, the r30 class of POOLS)."""
    pools = POLICIES[name][1]
    down = (1, 2, 5) if which == "scattered" else (3, 4, 5) if pools else (2, 3)
    net = Net(policy_exp(name), seed=3)
    rng = random.Random(4)
    for k in down:
        net.node_down(k)
    drive(net, 600, rng)
    assert not set(net.chosen) & set(down)
    assert set(net.chosen) == set(range(net.n)) - set(down)  # the others all are
    for k in down:
        net.node_up(k)
    net.chosen.clear()
    drive(net, 600, rng)
    assert set(down) <= set(net.chosen)


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_node_that_goes_down_busy_is_never_chosen_and_its_tasks_end(name: str) -> None:
    """Down while it holds tasks: never chosen, its tasks' ends still reach the dispatcher (done, failed),
    its messages wait; after it comes back the dispatcher's picture is the truth again."""
    net = Net(policy_exp(name), seed=5)
    rng = random.Random(6)
    drive(net, 40, rng)
    for _ in range(12):
        net.arrive()
    net.flush()
    k = max(range(net.n), key=lambda j: net.x[j])
    net.node_down(k)
    net.chosen.clear()
    for _ in range(300):
        busy = [j for j in range(net.n) if net.x[j]]
        if busy and rng.random() < 0.5:
            net.depart(rng.choice(busy))
        else:
            net.arrive()
        net.flush()
        check_structures(net)
    assert k not in net.chosen
    net.settle()
    check_truth(net)


def test_schemes_probe_only_pools_that_are_up_and_skip_a_class_with_none() -> None:
    """Scheme 1 with d = (2, 2, 1): with node 2 of the fast class down, that class is probed once (its only
    node up); with both slow nodes down, the slow class is not probed at all."""
    net = Net(policy_exp("scheme1"), seed=8)
    net.node_down(2)
    net.node_down(4)
    net.node_down(5)
    for _ in range(200):
        probe = net.disp.dispatch()
        assert isinstance(probe, Probe)
        assert probe.nodes[2:] == (3,) and set(probe.nodes[:2]) == {0, 1}
        route = net.disp.resolve(probe, [0, 1, 0])
        assert route.node in (0, 1, 3)


def test_a_probed_node_that_goes_down_before_the_replies_is_not_chosen() -> None:
    for name in ("power_of_d", "scheme1", "scheme2"):
        net = Net(policy_exp(name), seed=9)
        for _ in range(50):
            probe = net.disp.dispatch()
            assert isinstance(probe, Probe)
            gone = probe.nodes[0]
            net.disp.on_node_down(gone)
            route = net.disp.resolve(probe, [0] + [5] * (len(probe.nodes) - 1))  # the gone one looks best
            assert route.node != gone and route.node in probe.nodes
            net.disp.on_node_up(gone, net.report(gone), False)


@pytest.mark.parametrize("name", ["random", "jiq"])
def test_the_random_choice_is_uniform_over_the_nodes_that_are_up(name: str) -> None:
    """Random routing, and JIQ's fallback when no token is held: uniform over the nodes that are up (1500
    tasks that never leave; every token is used up first)."""
    net = Net(policy_exp(name), seed=10)
    down = (1, 2, 5)
    for k in down:
        net.node_down(k)
    counts: Counter[int] = Counter()
    for _ in range(1500 + net.n):
        route = net.decide()
        if route.outcome == "random":
            counts[route.node] += 1
        net.x[route.node] += 1  # the task stays: no departure brings a token back
    assert sum(counts.values()) >= 1400
    assert_uniform(counts, sorted(set(range(net.n)) - set(down)))


def test_round_robin_skips_nodes_that_are_down() -> None:
    net = Net(policy_exp("round_robin"), seed=11)
    first = net.arrive()
    net.node_down((first + 2) % 6)
    net.node_down((first + 3) % 6)
    assert [net.arrive() for _ in range(8)] == [(first + i) % 6 for i in (1, 4, 5, 0, 1, 4, 5, 0)]


# =========================================== 2. while every node is up, draws are those of no faults


@pytest.mark.parametrize(
    "name",
    ["random", "round_robin", "power_of_d", "power_of_d_3_replace", "least_request", "scheme1", "scheme2"],
)
def test_after_a_down_and_up_the_draws_are_those_of_a_dispatcher_without_faults(name: str) -> None:
    exp = policy_exp(name)
    twin, net = Net(exp, seed=12), Net(exp, seed=12)
    for k in (4, 1):
        net.node_down(k)
    for k in (1, 4):
        net.node_up(k)
    rng_a, rng_b = random.Random(13), random.Random(13)
    drive(twin, 300, rng_a)
    drive(net, 300, rng_b)
    assert net.chosen == twin.chosen


# =================================== 3. a fresh up from the initial report leaves the constructor's state


SKIP = {"exp", "th", "ranking"}  # the spec, and derived tables that extend lazily


def state(obj: Any, depth: int = 0) -> Any:
    """Everything a dispatcher side holds, as comparable values (random generators by their state)."""
    assert depth < 12
    if isinstance(obj, random.Random):
        return ("rng", obj.getstate())
    if obj is None or isinstance(obj, bool | int | float | str | Fraction):
        return obj
    if isinstance(obj, list | tuple | deque):
        return (type(obj).__name__, [state(v, depth + 1) for v in obj])
    if isinstance(obj, set | frozenset):
        return ("set", sorted(obj))
    if isinstance(obj, dict):
        return ("dict", [(k, state(v, depth + 1)) for k, v in obj.items()])
    if callable(obj):  # a function the dispatcher side chose (how it samples)
        return ("callable", getattr(obj, "__qualname__", type(obj).__name__))
    fields: dict[str, Any] = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if hasattr(obj, slot):
                fields[slot] = getattr(obj, slot)
    return (
        type(obj).__name__,
        sorted((k, state(v, depth + 1)) for k, v in fields.items() if k not in SKIP),
    )


@pytest.mark.parametrize(("index", "dispatchers"), [(0, 1), (1, 2)])
@pytest.mark.parametrize("name", list(POLICIES))
def test_a_fresh_up_from_initial_reports_leaves_the_constructors_state(
    name: str, index: int, dispatchers: int
) -> None:
    """At cluster start the host calls on_node_up(k, initial report, fresh=True) for every node: the state,
    random generator included, must be the constructor's, and so must every later decision."""
    exp = with_dispatchers(policy_exp(name), dispatchers)
    twin = Net(exp, seed=14, index=index, dispatchers=dispatchers)
    net = Net(exp, seed=14, index=index, dispatchers=dispatchers)
    before = state(net.disp)
    assert before == state(twin.disp)
    for k in range(net.n):
        assert net.disp.on_node_up(k, net.report(k), True) == ()
    assert state(net.disp) == before
    drive(twin, 200, random.Random(15))
    drive(net, 200, random.Random(15))
    assert net.chosen == twin.chosen


def test_initial_reports() -> None:
    """What a node side reports before any task (read from the brief, not the code)."""
    # x, then (arrived, departed) per dispatcher, then the node's events
    assert make_node_sides(policy_exp("jsq"), random.Random(1), dispatchers=2)[3].report(0) == (0,) * 6
    sides = make_node_sides(policy_exp("jiq"), random.Random(1), dispatchers=2)
    assert [s.report(0) for s in sides[:3]] == [(0, 0, 0), (0, 0, 1), (0, 0, 0)]
    assert make_node_sides(policy_exp("jiq"), random.Random(1))[5].report(0) == (0, 0, 0)
    # (x, seq, epoch, r, arrived) per dispatcher
    assert make_node_sides(policy_exp("slta"), random.Random(1))[2].report(0) == (0, 0, 0, 1, 0)
    two = make_node_sides(with_dispatchers(policy_exp("slta"), 2), random.Random(1), dispatchers=2)
    assert two[2].report(0) == (0, 0, 0, 1, 0) * 2
    assert make_node_sides(policy_exp("random"), random.Random(1))[2].report(0) == (0,)


# ========================================================================== 4. JSQ and JLMU counts


@pytest.mark.parametrize("name", ["jsq", "jsq_longest_idle", "jlmu"])
def test_a_dropped_departure_is_made_good_by_reconcile(name: str) -> None:
    net = Net(policy_exp(name), seed=16)
    nodes = [net.arrive() for _ in range(5)]
    k = nodes[0]
    held = net.x[k]
    net.depart(k)
    assert net.to_disp[0] == Message("departure", k, (held, 1), 0)
    net.to_disp.clear()  # lost
    assert picture(net.disp, k) == held  # one too many
    net.disp.reconcile(k, net.report(k))
    assert picture(net.disp, k) == held - 1 == net.x[k]
    check_structures(net)
    assert [picture(net.disp, j) for j in range(net.n)] == net.x


@pytest.mark.parametrize("name", ["jsq", "jsq_fastest", "jlmu"])
def test_duplicated_and_reordered_departures_change_nothing(name: str) -> None:
    net = Net(policy_exp(name), seed=17)
    while max(net.x) < 3:
        net.arrive()
    k = net.x.index(max(net.x))
    for _ in range(3):
        net.depart(k)
    assert [m.data[1] for m in net.to_disp] == [1, 2, 3]  # departed so far
    net.deliver(1, keep=True)  # the second, twice
    net.deliver(1)
    assert picture(net.disp, k) == net.x[k] + 1  # the first is still on its way; the second counts it
    net.deliver(1)  # the third
    net.deliver(0)  # the first, overtaken
    net.to_disp.append(Message("departure", k, (net.sides[k].arrived[0], 2), 0))  # type: ignore[attr-defined]
    net.deliver(0)  # an old duplicate
    assert picture(net.disp, k) == net.x[k]
    check_structures(net)


@pytest.mark.parametrize("name", ["jsq", "jlmu"])
def test_a_task_counted_as_failed_that_ran_is_counted_again(name: str) -> None:
    net = Net(policy_exp(name), seed=18)
    k = net.fail(ran=True)  # the node has it, the dispatcher counted it out
    assert picture(net.disp, k) == 0 and net.x[k] == 1
    net.arrive()
    net.depart(k)  # a departure notice carries the arrivals: the task shows up before it leaves
    net.flush()
    assert [picture(net.disp, j) for j in range(net.n)] == net.x
    k2 = net.fail(ran=False)
    assert [picture(net.disp, j) for j in range(net.n)] == net.x
    assert net.x[k2] == picture(net.disp, k2)


@pytest.mark.parametrize("name", ["jsq", "jlmu"])
def test_a_departure_raises_the_count_of_tasks_sent_to_what_arrived(name: str) -> None:
    """Two tasks the host counted as failed both ran at the node (every other node is down, so both go
    there): the first departure notice, (2 arrived, 1 departed), shows the one still there."""
    net = Net(policy_exp(name), seed=39)
    for k in range(1, net.n):
        net.node_down(k)
    assert net.fail(ran=True) == 0 and net.fail(ran=True) == 0
    assert picture(net.disp, 0) == 0 and net.x[0] == 2
    net.depart(0)
    assert net.to_disp == [Message("departure", 0, (2, 1), 0)]
    net.deliver()
    assert picture(net.disp, 0) == net.x[0] == 1


@pytest.mark.parametrize("name", ["jsq", "jlmu", "jiq", "slta"])
def test_a_message_of_a_node_that_is_down_does_not_bring_it_back(name: str) -> None:
    """The host drops such messages; if one reached the policy all the same, the node stays out."""
    net = Net(policy_exp(name), seed=40)
    for _ in range(12):
        net.arrive()
    k = max(range(net.n), key=lambda j: net.x[j])
    while net.x[k]:  # JIQ: ends with an idle token
        net.depart(k)
    net.node_down(k)
    assert net.to_disp
    for m in net.to_disp:
        net.disp.on_message(m)  # past the host
    check_structures(net)
    net.to_disp.clear()
    net.chosen.clear()
    drive(net, 100, random.Random(41))
    assert k not in net.chosen


def test_departures_count_per_dispatcher() -> None:
    """A node counts each dispatcher's tasks apart, and reports them all: (x, A0, D0, A1, D1, events)."""
    side = make_node_sides(policy_exp("jsq"), random.Random(1), dispatchers=2)[2]
    side.on_arrival(1, 1, ())
    side.on_arrival(2, 0, ())
    side.on_arrival(3, 1, ())
    assert side.on_departure(2, 1) == (Message("departure", 2, (2, 1), 1),)
    assert side.report(2) == (2, 1, 0, 2, 1, 4)


def test_bad_departures_and_reports_are_refused() -> None:
    net = Net(policy_exp("jsq"), seed=19)
    for data in [(), (1,), (1, 2), (-1, 0), (1.0, 0), (True, 0), (1, 0, 0)]:
        with pytest.raises(ValueError):
            net.disp.on_message(Message("departure", 0, data, 0))
    with pytest.raises(ValueError):
        net.disp.reconcile(0, (0,))
    second = Net(policy_exp("jsq"), seed=19, index=1, dispatchers=2)
    with pytest.raises(ValueError):
        second.disp.reconcile(0, (0, 0, 0, 0))  # no counts for dispatcher 1


# ====================================================================================== 5. JIQ


def test_jiq_lost_token_is_restored_by_reconcile() -> None:
    net = Net(policy_exp("jiq"), seed=20)
    nodes = [net.arrive() for _ in range(6)]  # every token used
    assert sorted(nodes) == list(range(6))
    net.depart(3)
    assert net.to_disp == [Message("idle_token", 3, (1,), 0)]
    net.to_disp.clear()  # lost
    assert net.disp.gauges()["idle_tokens"] == 0
    net.disp.reconcile(3, net.report(3))
    assert net.disp.gauges()["idle_tokens"] == 1
    assert net.arrive() == 3
    net.disp.reconcile(3, (0, 1, 0))  # an old report once more: that token is spent
    assert net.disp.gauges()["idle_tokens"] == 0


def test_jiq_reconcile_adds_no_token_for_a_busy_node_or_one_sent_elsewhere() -> None:
    net = Net(policy_exp("jiq"), seed=21)
    for _ in range(6):
        net.arrive()
    net.disp.reconcile(2, net.report(2))  # busy
    assert net.disp.gauges()["idle_tokens"] == 0
    net.depart(2)
    net.to_disp.clear()
    net.disp.reconcile(2, (0, 1, 1))  # idle, but its token went to dispatcher 1
    assert net.disp.gauges()["idle_tokens"] == 0
    net.disp.reconcile(2, (0, 1, 0))
    assert net.disp.gauges()["idle_tokens"] == 1


def test_jiq_stale_and_duplicate_tokens_are_dropped_and_counted() -> None:
    net = Net(policy_exp("jiq"), seed=22)
    for _ in range(6):
        net.arrive()
    net.depart(4)
    net.deliver(0, keep=True)
    net.deliver(0)  # a duplicate
    assert net.disp.gauges() == {"idle_tokens": 1.0, "jiq_stale_tokens_total": 1.0}
    assert net.arrive() == 4
    net.to_disp.append(Message("idle_token", 4, (1,), 0))  # that token again, after it was used
    net.deliver(0)
    assert net.disp.gauges() == {"idle_tokens": 0.0, "jiq_stale_tokens_total": 2.0}


def test_jiq_an_overtaken_token_does_not_come_back() -> None:
    """Node 0's token 1 is overtaken by its token 2, which is used: token 1 arriving then is dropped (a
    dispatcher taking it would send a task to a busy node as if it were idle)."""
    net = Net(policy_exp("jiq"), seed=23)
    for _ in range(6):
        net.arrive()
    net.depart(0)  # token (1)
    net.land(Route(0, "test"))  # another task for node 0, routed by someone else
    net.depart(0)  # token (2)
    assert [m.data for m in net.to_disp] == [(1,), (2,)]
    net.deliver(1)
    assert net.arrive() == 0
    net.deliver(0)
    assert net.disp.gauges() == {"idle_tokens": 0.0, "jiq_stale_tokens_total": 1.0}


def test_jiq_token_used_by_a_task_that_never_ran_comes_back() -> None:
    net = Net(policy_exp("jiq"), seed=24)
    k = net.fail(ran=False)  # used node k's token, but the task never got there: k is idle, sends nothing
    assert net.x[k] == 0 and not net.to_disp
    net.disp.reconcile(k, net.report(k))
    assert k in net.disp.held  # type: ignore[attr-defined]


def test_jiq_down_node_loses_its_token_and_gets_it_back_when_up() -> None:
    net = Net(policy_exp("jiq_longest_idle"), seed=25)
    net.node_down(2)
    assert 2 not in net.disp.held  # type: ignore[attr-defined]
    seen = [net.arrive() for _ in range(5)]
    assert sorted(seen) == [0, 1, 3, 4, 5]
    net.node_up(2)  # paused, still idle: its token is back
    assert net.arrive() == 2
    check_structures(net)


def test_jiq_several_dispatchers_take_only_their_tokens() -> None:
    """Dispatcher 1 of 2 starts with the tokens of nodes 1, 3, 5; a report of a node whose token went to
    dispatcher 0 gives dispatcher 1 nothing."""
    net = Net(policy_exp("jiq"), seed=26, index=1, dispatchers=2)
    assert sorted(net.disp.held) == [1, 3, 5]  # type: ignore[attr-defined]
    for k in range(6):
        net.disp.reconcile(k, (0, 0, k % 2))
    assert sorted(net.disp.held) == [1, 3, 5]  # type: ignore[attr-defined]


# ===================================================================================== 6. SLTA


def slta_net(seed: int = 27) -> Net:
    return Net(policy_exp("slta"), seed=seed)


def raise_r(net: Net) -> list[Message]:
    """Arrivals (messages held back) until the dispatcher changes r; the epoch messages it sent."""
    while not net.to_nodes:
        net.land(net.decide())
    return list(net.to_nodes)


def test_slta_lost_epoch_answer_is_awaited_and_resent() -> None:
    net = slta_net()
    epochs = raise_r(net)
    told = {m.node for m in epochs}
    assert set(net.disp.awaiting()) == told
    k = epochs[0].node
    net.to_nodes.pop(0)  # the epoch message to k is lost
    net.flush()
    assert set(net.disp.awaiting()) == {k}
    (again,) = net.disp.resend(k)
    assert again == epochs[0]  # nothing changed at k since: the very same message
    net.to_nodes.append(again)
    net.deliver_to_node(0)  # this time the answer is lost
    assert net.to_disp[0].kind == "token_epoch"
    net.to_disp.clear()
    assert set(net.disp.awaiting()) == {k}
    net.to_nodes += net.disp.resend(k)
    net.flush()
    assert not net.disp.awaiting()
    check_structures(net)


def test_slta_lost_departure_token_is_made_good_by_reconcile() -> None:
    net = slta_net(28)
    for _ in range(8):
        net.arrive()
        net.flush()
    k = net.x.index(max(net.x))
    net.depart(k)
    net.depart(k)
    assert [m.kind for m in net.to_disp] == ["token_departure"] * 2
    net.to_disp.clear()
    assert net.disp.xhat[k] == net.x[k] + 2  # type: ignore[attr-defined]
    net.disp.reconcile(k, net.report(k))
    assert net.disp.xhat == net.x  # type: ignore[attr-defined]
    check_structures(net)
    net.disp.reconcile(k, net.report(k))  # again: nothing newer
    assert net.disp.xhat == net.x  # type: ignore[attr-defined]


def test_slta_pool_down_gets_no_epoch_and_is_told_when_up() -> None:
    net = slta_net(29)
    disp = net.disp
    assert isinstance(disp, SLTADispatcher)
    net.node_down(0)  # class r20
    net.node_down(3)  # class r30
    assert disp.green_needed == 4 * 0.5  # n_up beta
    epochs = raise_r(net)
    assert not {0, 3} & {m.node for m in epochs}
    assert not {0, 3} & set(disp.awaiting())
    net.flush()
    assert not disp.awaiting()
    net.node_up(0)
    net.node_up(3)
    assert disp.green_needed == 6 * 0.5
    # a pool whose epoch is behind is told the current one, and awaited
    told = {m.node for m in net.to_nodes}
    behind = {k for k in (0, 3) if net.sides[k].epoch[0] != disp.epoch}  # type: ignore[attr-defined]
    assert behind and told == behind == set(disp.awaiting())
    net.flush()
    assert not disp.awaiting()
    assert all(net.sides[k].epoch[0] == disp.epoch for k in behind)  # type: ignore[attr-defined]
    check_structures(net)


def test_slta_bad_reports_are_refused() -> None:
    net = slta_net()
    for report in [(0, 0, 0, 1), (0, -1, 0, 1, 0), (0, 0, 0, 1.0, 0), (0, 0, 0, 1, -1), (0, 0, 0, 1, 0, 0)]:
        with pytest.raises(ValueError):
            net.disp.reconcile(0, report)  # type: ignore[arg-type]


# ================================================================ 7. restarts: node and dispatcher


@pytest.mark.parametrize("name", ["jsq", "jlmu", "slta", "jiq", "jiq_fastest", "least_request"])
def test_a_restarted_node_is_seen_as_it_is(name: str) -> None:
    """The node's process restarts (its tasks lost, a new node side): after the fresh up the dispatcher's
    picture is the new node's, and stays right as traffic goes on."""
    net = Net(policy_exp(name), seed=30)
    rng = random.Random(31)
    drive(net, 60, rng)
    for _ in range(10):
        net.arrive()
    net.flush()
    k = max(range(net.n), key=lambda j: net.x[j])
    assert net.x[k] > 0
    net.restart_node(k)
    check_structures(net)
    if isinstance(net.disp, CountingDispatcher):
        assert picture(net.disp, k) == 0
    elif isinstance(net.disp, SLTADispatcher):
        assert net.disp.xhat[k] == 0
    elif isinstance(net.disp, JIQDispatcher):
        assert k in net.disp.held
    else:
        assert net.disp.in_flight[k] == 0  # type: ignore[attr-defined]
    drive(net, 200, rng)
    while any(net.x):
        net.depart(next(j for j in range(net.n) if net.x[j]))
        net.flush()
    net.settle()
    check_truth(net)
    if hasattr(net.disp, "in_flight"):
        assert net.disp.in_flight == [0] * net.n


@pytest.mark.parametrize("name", ["jsq", "jsq_longest_idle", "jlmu", "slta", "jiq", "jiq_longest_idle"])
def test_a_restarted_dispatcher_learns_the_nodes_state(name: str) -> None:
    """A new dispatcher side (same index) meets the old node sides, which hold tasks and counters: after a
    fresh up of every node its picture is their true state; the old tasks' departures then keep it right."""
    exp = policy_exp(name)
    net = Net(exp, seed=32)
    drive(net, 150, random.Random(33))
    for _ in range(8):
        net.arrive()
    net.flush()
    old_epochs = [getattr(s, "epoch", [0])[0] for s in net.sides]
    net.disp = make_dispatcher(exp, random.Random(34))  # the restart
    for k in range(net.n):
        net.node_up(k, fresh=True)
    net.settle()
    check_truth(net)
    if isinstance(net.disp, SLTADispatcher):
        assert max(old_epochs) > 0  # the old dispatcher had changed r: the restart matters
        assert net.disp.epoch > max(old_epochs)
        assert [s.r[0] for s in net.sides] == [net.disp.r] * net.n  # type: ignore[attr-defined]
    if isinstance(net.disp, JIQDispatcher):  # no token of a busy node
        assert set(net.disp.held) == {k for k in range(net.n) if net.x[k] == 0}
    while any(net.x):
        net.depart(next(j for j in range(net.n) if net.x[j]))
        net.flush()
    check_truth(net)


# ============================================== 8. property: any loss, duplicate, reorder is made good

#: the events of the property test: kind (weighted by repetition), then a number that picks what it acts on
KINDS = ["arrive"] * 3 + ["depart"] * 2 + ["deliver"] * 3 + ["duplicate", "drop", "to_node", "drop_to_node"]
KINDS += ["fail_ran", "fail_late", "fail_lost", "down", "up"]
OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 63)), min_size=20, max_size=200)
Op = tuple[str, int]


def run_ops(net: Net, ops: Sequence[Op]) -> None:
    for op, a in ops:
        busy = [k for k in range(net.n) if net.x[k]]
        if op == "arrive":
            net.arrive()
        elif op == "depart" and busy:
            net.depart(busy[a % len(busy)])
        elif op in ("deliver", "duplicate") and net.to_disp:
            net.deliver(a % len(net.to_disp), keep=op == "duplicate")
        elif op == "drop" and net.to_disp:
            del net.to_disp[a % len(net.to_disp)]
        elif op == "to_node" and net.to_nodes:
            net.deliver_to_node(a % len(net.to_nodes))
        elif op == "drop_to_node" and net.to_nodes:
            del net.to_nodes[a % len(net.to_nodes)]
        elif op in ("fail_ran", "fail_late", "fail_lost"):
            net.fail(ran=op != "fail_lost", late=op == "fail_late")
        elif op == "down" and len(net.down) < net.n - 2:
            k = a % net.n
            if k not in net.down:
                net.node_down(k)
        elif op == "up" and net.down:
            net.node_up(sorted(net.down)[a % len(net.down)])
        check_structures(net)
    net.settle()
    check_truth(net)


PROPERTY_POLICIES = ["jsq", "jsq_longest_idle", "jsq_fastest_idle", "jlmu", "slta", "jiq", "jiq_longest_idle"]


@pytest.mark.parametrize("name", PROPERTY_POLICIES)
def test_any_interleaving_of_losses_duplicates_and_reorders_is_made_good(name: str) -> None:
    exp = policy_exp(name)

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(ops=OPS, seed=st.integers(0, 3))
    def check(ops: list[Op], seed: int) -> None:
        run_ops(Net(exp, seed=seed), ops)

    check()


def test_without_faults_reconcile_changes_nothing() -> None:
    """Exact delivery: every message arrives before the next event, so a report shows nothing new, and a
    reconcile after every event leaves the picture and the decisions as they are without it."""
    for name in ("jsq", "jlmu", "slta", "jiq"):
        exp = policy_exp(name)
        twin, net = Net(exp, seed=35), Net(exp, seed=35)
        rng_a, rng_b = random.Random(36), random.Random(36)
        for _ in range(300):
            drive(twin, 1, rng_a)
            drive(net, 1, rng_b)
            for k in range(net.n):
                assert net.disp.reconcile(k, net.report(k)) == ()
            if isinstance(net.disp, CountingDispatcher):
                assert [picture(net.disp, k) for k in range(net.n)] == net.x
        assert net.chosen == twin.chosen


# ============================================================================ 9. LevelIndex moves


def test_level_index_moves_remove_and_restore() -> None:
    rng = random.Random(37)
    lv = LevelIndex(range(4), rng, [1.0, 2.0, 2.0, 0.5], by_speed=1, idle_order=True)
    lv.move(0, 3)
    lv.move(1, 2)
    check_index(lv)
    assert lv.min_level == 0 and lv.pick_longest_idle() == 2
    lv.remove(2)
    lv.remove(3)
    check_index(lv, {2, 3})
    assert lv.min_level == 2 and lv.pick_by_speed(2) == 1
    lv.move(1, 5)
    check_index(lv, {2, 3})
    assert lv.min_level == 3
    lv.restore(3, 0)
    lv.restore(2, 0)
    check_index(lv)
    assert lv.min_level == 0 and lv.pick_longest_idle() == 3  # back in the order it came back
    lv.move(0, 0)
    assert lv.pick_longest_idle() == 3
    lv.move(3, 1)
    assert lv.pick_longest_idle() == 2
    assert lv.pick_by_speed(0) == 2  # 0 (speed 1) and 2 (speed 2) are idle
    lv.remove(1)
    with pytest.raises(ValueError):
        lv.move(1, 2)  # a removed node comes back with restore
    for k in (0, 2, 3):
        lv.remove(k)
    check_index(lv, {0, 1, 2, 3})
    lv.restore(2, 4)  # into an empty index
    check_index(lv, {0, 1, 3})
    assert lv.min_level == 4 and lv.pick_uniform(4) == 2


def test_liveness_keeps_the_nodes_that_are_up_in_member_order() -> None:
    live = Liveness([3, 5, 7, 9])
    assert live.set_down(7) and live.set_down(3) and not live.set_down(3)
    assert live.up == [5, 9]
    assert live.set_up(7) and not live.set_up(7)
    assert live.up == [5, 7, 9] and live.down == {3}
    rng = random.Random(38)
    counts = Counter(live.pick(rng) for _ in range(1500))
    assert_uniform(counts, [5, 7, 9])
    assert all(set(live.sample(rng, 5)) == {5, 7, 9} for _ in range(20))  # at most as many as are up


def test_a_node_side_without_policy_state_reports_its_occupancy() -> None:
    side = NodeSide(policy_exp("random"), 1, random.Random(1))
    assert side.report(4) == (4,)
