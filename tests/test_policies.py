"""Every policy rule pinned on small hand-made states, driving the sans-I/O policy objects directly.

The expected values come from the policies' rules and reference tables in ``docs/theory.md`` ("Pools",
"Tie-breaking rules", "What each policy sends", "The two assignment rules") and ``docs/notes/pools.md``, or
from hand computation, never from the code under test.

Statistical checks use fixed seeds. A uniformity check is Pearson's chi-square test: under the rule, the
statistic sum((observed - expected)^2 / expected) is approximately chi-square with (outcomes - 1) degrees of
freedom (every expected count here is >= 250, far above the usual >= 5), so a correct implementation
exceeds the upper 1e-6 quantile with probability 1e-6. The alternatives the tests guard against (a fixed
tie-break, picking a class first and then a token, a wrong support, etc.) shift some probability by at
least 1/12, which over the N >= 800 trials used moves the statistic by well over a hundred, far above the
bound. Counts of single events use a binomial mean +- 5 sd bound (two-sided tail 5.7e-7), stated in place.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import pytest

from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import FCFSNode, PoolNode, PSNode, make_node
from lbtestbed.model.utility import TableUtility
from lbtestbed.model.workload import Task
from lbtestbed.policies import Message, Probe, Route, make_dispatcher, make_node_sides
from lbtestbed.policies.jlmu import ranking_of
from lbtestbed.policies.ranking import Ranking
from lbtestbed.policies.slta import SLTADispatcher, Thresholds
from lbtestbed.spec import parse_spec

# upper 1e-6 quantiles of chi-square with df degrees of freedom (scipy.stats.chi2.isf(1e-6, df))
CHI2_1E6 = {1: 23.93, 2: 27.63, 3: 30.66, 4: 33.38, 5: 35.89, 6: 38.26, 7: 40.52}


def assert_distribution(counts: Counter[int], probs: dict[int, float]) -> None:
    """Pearson chi-square goodness of fit at level 1e-6 (see the module docstring); no outcome off support."""
    trials = sum(counts.values())
    assert set(counts) <= set(probs), f"outcomes outside the support: {set(counts) - set(probs)}"
    assert abs(sum(probs.values()) - 1.0) < 1e-12
    stat = sum((counts[k] - trials * p) ** 2 / (trials * p) for k, p in probs.items())
    assert stat < CHI2_1E6[len(probs) - 1], f"chi-square {stat:.1f} for {dict(counts)} vs {probs}"


def assert_uniform(counts: Counter[int], support: Iterable[int]) -> None:
    support = list(support)
    assert_distribution(counts, {k: 1.0 / len(support) for k in support})


# ------------------------------------------------------------------------------------ experiments


def values_of(slopes: Sequence[float]) -> list[float]:
    """u(0..m) of a piecewise-linear utility with these marginal utilities (the last one continues)."""
    return [0.0, *itertools.accumulate(slopes)]


def pool_class(name: str, count: int, utility: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "count": count, "discipline": "pool", "utility": utility}


def table(slopes: Sequence[float]) -> dict[str, Any]:
    return {"kind": "table", "values": values_of(slopes)}


def queue_class(name: str, count: int, speed: Any, discipline: str = "ps") -> dict[str, Any]:
    return {"name": name, "count": count, "discipline": discipline, "speed": speed}


def experiment(classes: list[dict[str, Any]], policy: dict[str, Any], load: float = 0.1) -> Experiment:
    return parse_spec(
        {
            "name": "unit",
            "seed": 1,
            "classes": classes,
            "workload": {"load": load},
            "policy": policy,
            "run": {"duration": 10.0},
        },
        "unit.toml",
    )


class World:
    """A tiny event loop: both policy halves, true occupancies, every message delivered at once.

    This mirrors what the simulator does without a network delay: after a dispatch the task reaches its
    node (whose side may answer), then the route's messages go to their nodes (whose sides may answer).
    """

    def __init__(self, exp: Experiment, seed: int = 1) -> None:
        self.exp = exp
        self.disp = make_dispatcher(exp, random.Random(seed))
        self.sides = make_node_sides(exp, random.Random(seed + 1000))
        self.x = [0] * exp.n
        self.to_dispatcher: list[Message] = []

    def _deliver_to_dispatcher(self, msgs: Iterable[Message]) -> None:
        for m in msgs:
            self.to_dispatcher.append(m)
            self._deliver_to_nodes(self.disp.on_message(m))

    def _deliver_to_nodes(self, msgs: Iterable[Message]) -> None:
        for m in msgs:
            self._deliver_to_dispatcher(self.sides[m.node].on_message(m, self.x[m.node]))

    def arrive(self) -> Route:
        d = self.disp.dispatch()
        if isinstance(d, Probe):
            replies = []
            for k in d.nodes:
                (reply,) = self.sides[k].on_message(Message("probe", k), self.x[k])
                assert reply.kind == "probe_reply" and reply.node == k
                replies.append(reply.data[0])
            d = self.disp.resolve(d, replies)
        k = d.node
        self.x[k] += 1
        self._deliver_to_dispatcher(self.sides[k].on_arrival(self.x[k], 0, d.piggyback))
        self._deliver_to_nodes(d.messages)
        return d

    def depart(self, k: int) -> None:
        assert self.x[k] > 0
        self.x[k] -= 1
        self._deliver_to_dispatcher(self.sides[k].on_departure(self.x[k], 0))
        self.disp.on_task_done(k, 0.0)

    def frequencies(self, trials: int) -> Counter[int]:
        """Where a task goes from the current state, which is restored by that task's departure."""
        counts: Counter[int] = Counter()
        for _ in range(trials):
            k = self.arrive().node
            counts[k] += 1
            self.depart(k)
        return counts


# ======================================================================================= ranking


# Table 1 of the JLMU/SLTA paper (Goldsztajn et al. 2021, §3.4.1): u_i(x) = x ln(r_i / x), r = (20, 30),
# equal classes.
TABLE1 = [pool_class("r20", 2, {"kind": "xlog", "r": 20}), pool_class("r30", 2, {"kind": "xlog", "r": 30})]

# The first 15 slots of docs/notes/pools.md, "The ranking around the optimum", classes shifted to 0-based:
# (2,1),(1,1),(2,2),(1,2),(2,3),(2,4),(1,3),...
TABLE1_FIRST_15 = [
    (1, 1), (0, 1), (1, 2), (0, 2), (1, 3), (1, 4), (0, 3), (1, 5),
    (0, 4), (1, 6), (1, 7), (0, 5), (1, 8), (0, 6), (1, 9),
]  # fmt: skip

# k, (i_k, j_k) 0-based, delta(i_k, j_k - 1), C_k, l(k)
TABLE1_ROWS = [
    (16, (1, 10), +0.150368, 8.0, (6, 9)),
    (17, (0, 7), +0.124918, 8.5, (6, 10)),
    (18, (1, 11), +0.050200, 9.0, (7, 10)),
    (19, (0, 8), -0.018429, 9.5, (7, 11)),
    (20, (1, 12), -0.040834, 10.0, (8, 11)),
    (21, (1, 13), -0.124264, 10.5, (8, 12)),
    (22, (0, 9), -0.143757, 11.0, (8, 13)),
]


@pytest.mark.parametrize("order", ["ij", "ji"])
def test_table1_enumeration_matches_the_reference_table(order: str) -> None:
    exp = experiment(TABLE1, {"name": "jlmu", "rank_order": order}, load=9.75)
    ranking = ranking_of(exp)
    assert [ranking.slot(k) for k in range(1, 16)] == TABLE1_FIRST_15
    alpha = [Fraction(1, 2), Fraction(1, 2)]
    for k, slot, delta, capacity, ell in TABLE1_ROWS:
        assert ranking.slot(k) == slot
        assert ranking.marginal(k) == pytest.approx(delta, abs=6e-7)  # the table prints 6 decimals
        assert sum(alpha[ranking.slot(q)[0]] for q in range(1, k + 1)) == Fraction(capacity)
        assert ranking.thresholds(k) == ell
    # sigma* for rho = 9.75 is the first slot whose cumulative capacity exceeds rho: k = 20, slot (2,12)
    assert ranking.slot(20) == (1, 12) and ranking.thresholds(20) == (8, 11)


def _exactly_one_step(ranking: Ranking, upto: int) -> None:
    for r in range(1, upto):
        before, after = ranking.thresholds(r), ranking.thresholds(r + 1)
        i_r, j_r = ranking.slot(r)
        steps = [b - a for a, b in zip(before, after, strict=True)]
        # r -> r + 1 raises l_{i_r} by one and nothing else (docs/theory.md, "SLTA: thresholds, tokens and
        # dispatching")
        assert steps == [1 if i == i_r else 0 for i in range(len(before))], (r, before, after)
        assert before[i_r] == j_r - 1  # l_{i_r}(r) = j_r - 1
    assert ranking.thresholds(1) == (0,) * len(ranking.utilities)


# Three classes, marginal utilities 10,7,4,1,-2,-5 / 9,6,3,0,-3,-6 / 8,5,2,-1,-4,-7: the ranking visits the
# classes in turn (all marginal utilities distinct) down to -4; then class 0's slot 6 (-5) beats -6 and -7,
# and its last slope -5 continues forever, so every later slot is class 0's.
SLOPES3 = ([10, 7, 4, 1, -2, -5], [9, 6, 3, 0, -3, -6], [8, 5, 2, -1, -4, -7])
SLOTS3 = [(i, j) for j in range(1, 6) for i in range(3)] + [(0, 6), (0, 7), (0, 8), (0, 9), (0, 10)]
THRESHOLDS3 = {1: (0, 0, 0), 2: (1, 0, 0), 3: (1, 1, 0), 4: (1, 1, 1), 5: (2, 1, 1), 6: (2, 2, 1),
               7: (2, 2, 2), 8: (3, 2, 2), 16: (5, 5, 5), 17: (6, 5, 5), 20: (9, 5, 5)}  # fmt: skip


def three_classes(counts: Sequence[int] = (2, 3, 3)) -> list[dict[str, Any]]:
    return [pool_class(f"c{i}", c, table(s)) for i, (c, s) in enumerate(zip(counts, SLOPES3, strict=True))]


def test_three_class_ranking_and_thresholds() -> None:
    exp = experiment(three_classes(), {"name": "slta", "beta": 0.5}, load=1.0)
    ranking = ranking_of(exp)
    assert [ranking.slot(k) for k in range(1, 21)] == SLOTS3
    for r, ell in THRESHOLDS3.items():
        assert ranking.thresholds(r) == ell


@pytest.mark.parametrize("which", ["table1", "three"])
def test_each_change_of_r_moves_exactly_one_threshold_by_one(which: str) -> None:
    classes = TABLE1 if which == "table1" else three_classes()
    exp = experiment(classes, {"name": "slta", "beta": 1.0}, load=1.0)
    _exactly_one_step(ranking_of(exp), 60)


# The constructed example of docs/notes/pools.md ("A constructed three-class example"):
# alpha = (1/4, 1/4, 1/2); u1(x) = x; u2 slope 6 for 5 tasks, 2 for the next 5, then flat; u3 slope 3 for
# 10 tasks, then flat.
SEC63 = [
    pool_class("u1", 1, table([1])),
    pool_class("u2", 1, table([6] * 5 + [2] * 5 + [0])),
    pool_class("u3", 2, table([3] * 10 + [0])),
]
SEC63_SLOTS = (
    [(1, j) for j in range(1, 6)] + [(2, j) for j in range(1, 11)] + [(1, j) for j in range(6, 11)]
    + [(0, j) for j in range(1, 11)]
)  # fmt: skip


@pytest.mark.parametrize("order", ["ij", "ji"])
def test_section_6_3_example(order: str) -> None:
    exp = experiment(SEC63, {"name": "jlmu", "rank_order": order}, load=1.0)
    ranking = ranking_of(exp)
    # the example ties only inside a class (slopes 6, 3, 2, 1 are distinct), where both readings put
    # smaller j first: the enumeration is the same for ij and ji
    assert [ranking.slot(k) for k in range(1, len(SEC63_SLOTS) + 1)] == SEC63_SLOTS
    alpha = [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)]

    def optimum(rho: Fraction) -> tuple[list[Fraction], Fraction]:
        """Greedy fill of the slots in rank order: mean tasks per pool of each class, and U*."""
        tasks = [Fraction(0)] * 3
        bound, left, k = Fraction(0), rho, 1
        while left > 0:
            i, _ = ranking.slot(k)
            take = min(alpha[i], left)
            tasks[i] += take / alpha[i]
            bound += take * Fraction(ranking.marginal(k)).limit_denominator(1000)
            left -= take
            k += 1
        return tasks, bound

    # "ρ = 1.25 → (0,5,0); 6.25 → (0,5,10); 7.5 → (0,10,10); 9 → (6,10,10). U* = 7.5, 22.5, 25, 26.5."
    for rho, tasks, bound in [
        (Fraction(5, 4), (0, 5, 0), Fraction(15, 2)),
        (Fraction(25, 4), (0, 5, 10), Fraction(45, 2)),
        (Fraction(15, 2), (0, 10, 10), Fraction(25)),
        (Fraction(9), (6, 10, 10), Fraction(53, 2)),
    ]:
        assert optimum(rho) == (list(map(Fraction, tasks)), bound)


# An exact tie across classes: class 0 has slope 2 for 7 tasks, class 1 slope 6 for 5 then 2 for 5 tasks.
CROSS_TIE = [pool_class("a", 1, table([2] * 7 + [1])), pool_class("b", 1, table([6] * 5 + [2] * 5 + [0]))]
# "ij": ties by class first; "ji": ties by j first, then class (docs/theory.md, "Slots and their ranking")
CROSS_TIE_IJ = (
    [(1, j) for j in range(1, 6)] + [(0, j) for j in range(1, 8)] + [(1, j) for j in range(6, 11)]
    + [(0, 8), (0, 9), (0, 10)]
)  # fmt: skip
CROSS_TIE_JI = (
    [(1, j) for j in range(1, 6)] + [(0, j) for j in range(1, 7)]
    + [(1, 6), (0, 7), (1, 7), (1, 8), (1, 9), (1, 10), (0, 8), (0, 9), (0, 10)]
)  # fmt: skip


@pytest.mark.parametrize(("order", "expected"), [("ij", CROSS_TIE_IJ), ("ji", CROSS_TIE_JI)])
def test_exact_cross_class_ties_follow_the_rank_order(order: str, expected: list[tuple[int, int]]) -> None:
    ranking = ranking_of(experiment(CROSS_TIE, {"name": "jlmu", "rank_order": order}, load=1.0))
    assert [ranking.slot(k) for k in range(1, len(expected) + 1)] == expected
    assert CROSS_TIE_IJ != CROSS_TIE_JI


@pytest.mark.parametrize(("order", "expected"), [("ij", CROSS_TIE_IJ), ("ji", CROSS_TIE_JI)])
def test_jlmu_dispatch_order_on_exact_ties(order: str, expected: list[tuple[int, int]]) -> None:
    # one pool per class: JLMU fills the slots exactly in rank order
    world = World(experiment(CROSS_TIE, {"name": "jlmu", "rank_order": order}, load=1.0))
    nodes = [world.arrive().node for _ in expected]
    assert nodes == [i for i, _ in expected]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("ij", [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (0, 8)]),
        ("ji", [(0, 1), (0, 2), (1, 1), (1, 2), (0, 3), (1, 3), (0, 4), (1, 4)]),
    ],
)
def test_ties_survive_floating_point_rounding(order: str, expected: list[tuple[int, int]]) -> None:
    # class 0: u = 0, 0.3, 0.6, 0.7, 0.8: in floats the steps are 0.3, 0.3, 0.09999999999999998,
    # 0.10000000000000009, ...; class 1 has slope 0.1. Every 0.1-ish step is an exact tie (the sort key of
    # docs/theory.md: round the marginal utilities), so only the rank order decides.
    classes = [
        pool_class("a", 1, {"kind": "table", "values": [0, 0.3, 0.6, 0.7, 0.8]}),
        pool_class("b", 1, {"kind": "table", "values": [0, 0.1]}),
    ]
    ranking = ranking_of(experiment(classes, {"name": "jlmu", "rank_order": order}, load=1.0))
    assert [ranking.slot(k) for k in range(1, 9)] == expected


# ========================================================================================== JLMU


def test_jlmu_fills_pools_in_rank_order() -> None:
    # 3 pools of class 0 (nodes 0-2), 4 of class 1 (nodes 3-6). From empty, JLMU fills the slots of the
    # Table 1 enumeration one after the other; a slot of class i takes one task in each class-i pool.
    classes = [
        pool_class("r20", 3, {"kind": "xlog", "r": 20}),
        pool_class("r30", 4, {"kind": "xlog", "r": 30}),
    ]
    world = World(experiment(classes, {"name": "jlmu"}, load=5.0))
    members = {0: [0, 1, 2], 1: [3, 4, 5, 6]}
    for i, j in TABLE1_FIRST_15:
        block = [world.arrive() for _ in members[i]]
        assert sorted(r.node for r in block) == members[i]  # every pool of the class once
        assert all(r.outcome == "jlmu" and not r.messages for r in block)
        assert all(world.x[k] == j for k in members[i])


def test_jlmu_picks_a_least_loaded_pool_of_the_best_class_uniformly() -> None:
    classes = [
        pool_class("r20", 3, {"kind": "xlog", "r": 20}),
        pool_class("r30", 4, {"kind": "xlog", "r": 30}),
    ]
    world = World(experiment(classes, {"name": "jlmu"}, load=5.0), seed=5)
    for _ in range(3 + 4 + 4):  # slots (2,1), (1,1), (2,2): class-1 pools hold 2, class-0 pools 1
        world.arrive()
    assert world.x == [1, 1, 1, 2, 2, 2, 2]
    for k in (3, 4, 5):
        world.depart(k)
    # candidates: class 0 at 1 task, slot (1,2), delta = 2 ln 10 - ln 20 = 1.609; class 1 at 1 task,
    # slot (2,2), delta = 2 ln 15 - ln 30 = 2.015: class 1 wins; its least loaded pools are 3, 4, 5
    assert 2 * math.log(15) - math.log(30) > 2 * math.log(10) - math.log(20)
    counts = world.frequencies(3000)
    assert_uniform(counts, [3, 4, 5])


def test_jlmu_prefers_the_better_marginal_utility_over_the_emptier_pool() -> None:
    classes = [
        pool_class("r20", 1, {"kind": "xlog", "r": 20}),
        pool_class("r30", 1, {"kind": "xlog", "r": 30}),
    ]
    world = World(experiment(classes, {"name": "jlmu"}, load=5.0))
    # slots (2,1),(1,1),(2,2),(1,2),(2,3),(2,4): after 6 tasks x = (2, 4); the next slot is (1,3) of the
    # pool with fewer tasks, then (2,5) although pool 0 holds fewer tasks:
    # delta(2,4) = 5 ln 6 - 4 ln 7.5 = 0.899 > delta(1,3) = 4 ln 5 - 3 ln(20/3) = 0.747
    assert [world.arrive().node for _ in range(6)] == [1, 0, 1, 0, 1, 1]
    assert world.arrive().node == 0
    assert world.arrive().node == 1
    assert world.x == [3, 5]


def test_jlmu_and_jsq_pools_report_every_departure() -> None:
    """One notice per departure, carrying (tasks of the dispatcher that arrived, that left) at the pool."""
    world = World(experiment(TABLE1, {"name": "jlmu"}, load=1.0))
    k = world.arrive().node
    other = world.arrive().node
    world.depart(k)
    arrived = 2 if other == k else 1
    assert world.to_dispatcher == [Message("departure", k, (arrived, 1), 0)]
    world.depart(other)
    assert world.to_dispatcher[1] == Message("departure", other, (arrived, 2 if other == k else 1), 0)
    jsq = jsq_world("random")
    jsq.arrive()
    jsq.depart(jsq.arrive().node)
    assert [m.kind for m in jsq.to_dispatcher] == ["departure"]


# ========================================================================================== SLTA


def slta_world(beta: float = 0.5, counts: Sequence[int] = (2, 3, 3), seed: int = 1) -> World:
    return World(experiment(three_classes(counts), {"name": "slta", "beta": beta}, load=2.0), seed)


def expected_bits(ranking: Ranking, i: int, x: int, r: int) -> tuple[bool, bool]:
    """docs/theory.md, "SLTA: thresholds, tokens and dispatching": green iff x < l_i(r); yellow iff i = i_r
    and x < j_r."""
    i_r, j_r = ranking.slot(r)
    return x < ranking.thresholds(r)[i], i == i_r and x < j_r


def test_true_bits_at_r5_by_hand() -> None:
    # r = 5: slot (1, 2), l(5) = (2, 1, 1). Class 0 green below 2; class 1 green below 1 and yellow below
    # 2; class 2 green below 1; nothing else.
    th = Thresholds(ranking_of(experiment(three_classes(), {"name": "slta", "beta": 0.5}, load=1.0)))
    expected = {
        0: [(True, False), (True, False), (False, False), (False, False)],
        1: [(True, True), (False, True), (False, False), (False, False)],
        2: [(True, False), (False, False), (False, False), (False, False)],
    }
    for i, row in expected.items():
        assert [th.true_bits(i, x, 5) for x in range(4)] == row
    assert [th.true_bits(0, x, 1) for x in range(3)] == [(False, True), (False, False), (False, False)]


def prime(disp: SLTADispatcher, r: int, green: Iterable[int], yellow: Iterable[int]) -> None:
    """Give the dispatcher a hand-made, settled belief: index r and the green and yellow tokens listed."""
    green, yellow = set(green), set(yellow)
    disp.r = r
    disp.unsettled.clear()  # every pool has answered the last epoch
    for k in range(disp.n):
        disp._set(k, (k in green, k in yellow))


# Three classes with 2, 3, 3 pools: nodes 0-1 class 0, 2-4 class 1, 5-7 class 2. At r = 5 the slot is
# (1, 2) and i_{r-1} = 0. n beta = 8 * 0.5 = 4.
R5_PRIORITY = [
    # green tokens of classes other than i_{r-1} = 0: uniform over those 4 tokens, not class by class
    ("green_other", {0, 2, 5, 6, 7}, {2, 3, 4}, [2, 5, 6, 7]),
    # only class-0 green tokens left
    ("green_prev", {0, 1}, {3, 4}, [0, 1]),
    # no green tokens: yellow
    ("yellow", set(), {2, 3, 4}, [2, 3, 4]),
    # no token at all: uniform over all pools
    ("random", set(), set(), list(range(8))),
]


@pytest.mark.parametrize(
    ("outcome", "green", "yellow", "support"), R5_PRIORITY, ids=[c[0] for c in R5_PRIORITY]
)
def test_slta_dispatch_priorities(
    outcome: str, green: set[int], yellow: set[int], support: list[int]
) -> None:
    world = slta_world(seed=7)
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    counts: Counter[int] = Counter()
    for _ in range(400 * len(support)):
        prime(disp, 5, green, yellow)
        route = disp.dispatch()
        assert route.outcome == outcome
        counts[route.node] += 1
    assert_uniform(counts, support)


# (id, green, yellow, r after, outcome): learning at r = 5 with n beta = 4 and i_{r-1} = class 0
R5_LEARNING = [
    # decrement: 4 green tokens >= n beta, one of class 0. The dispatch uses one, leaving 3 < n beta:
    # r still falls, because the condition is read before the arrival.
    ("decrement", {0, 5, 6, 7}, {3, 4}, 4, "green_other"),
    ("decrement-two-prev", {0, 1, 5, 6}, {3, 4}, 4, "green_other"),
    ("too-few-green", {0, 5, 6}, {3, 4}, 5, "green_other"),
    ("no-prev-green", {2, 5, 6, 7}, {2, 3, 4}, 5, "green_other"),
    # increment: no green and at most one yellow token
    ("increment-last-yellow", set(), {3}, 6, "yellow"),
    ("increment-no-token", set(), set(), 6, "random"),
    # two yellow tokens before the arrival (one after it): no increment, read before the arrival
    ("two-yellow", set(), {3, 4}, 5, "yellow"),
    ("green-blocks-increment", {5}, {3}, 5, "green_other"),
    ("prev-green-blocks-increment", {0}, {3}, 5, "green_prev"),
]


@pytest.mark.parametrize(
    ("green", "yellow", "r_after", "outcome"), [c[1:] for c in R5_LEARNING], ids=[c[0] for c in R5_LEARNING]
)
def test_slta_learning_step(green: set[int], yellow: set[int], r_after: int, outcome: str) -> None:
    world = slta_world()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    for _ in range(20):
        prime(disp, 5, green, yellow)
        route = disp.dispatch()
        assert route.outcome == outcome
        if outcome == "yellow" and len(yellow) == 1:
            assert route.node in yellow  # the dispatch used the old r's tokens
        assert disp.r == r_after
        if r_after == 5:
            assert route.messages == ()
            continue
        # r -> r - 1 lowers l_{i_{r-1}} = l_0; r -> r + 1 raises l_{i_r} = l_1 (docs/theory.md)
        assert disp.ranking.thresholds(disp.r) == ((1, 1, 1) if r_after == 4 else (2, 2, 1))
        # the pools whose thresholds or yellow set changed hear of the new epoch (docs/theory.md, "SLTA's
        # messages"): 5 -> 4 moves the yellow set from class 1 to class 0 and lowers class 0; 5 -> 6 moves it
        # to class 2, raises class 1
        told = {m.node for m in route.messages}
        assert all(m.kind == "epoch" for m in route.messages)
        assert told >= ({0, 1, 2, 3, 4} if r_after == 4 else {2, 3, 4, 5, 6, 7})


def test_slta_from_empty_fills_one_task_per_pool_in_rank_order() -> None:
    # r = 1: yellow = class-0 pools with 0 tasks; the arrival that takes the last yellow token raises r.
    world = slta_world()
    routes = [world.arrive() for _ in range(8 + 2)]
    assert [world.exp.node_class[r.node] for r in routes] == [0, 0, 1, 1, 1, 2, 2, 2, 0, 0]
    assert all(r.outcome == "yellow" for r in routes)
    assert world.x == [2, 2, 1, 1, 1, 1, 1, 1]
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    assert disp.r == 5
    assert disp.gauges()["slta_r"] == 5.0


def test_slta_r_after_each_of_the_first_arrivals() -> None:
    world = slta_world()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    r_after = []
    for _ in range(10):
        world.arrive()
        r_after.append(disp.r)
    assert r_after == [1, 2, 2, 2, 3, 3, 3, 4, 4, 5]


def test_slta_departure_token_makes_a_green_dispatch() -> None:
    world = slta_world()
    for _ in range(10):
        world.arrive()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher) and disp.r == 5
    world.to_dispatcher.clear()
    world.depart(3)  # a class-1 pool at 0 tasks: green (0 < l_1 = 1) and yellow (0 < j_5 = 2)
    assert [m.kind for m in world.to_dispatcher] == ["token_departure"]
    assert disp.bits[3] == (True, True)
    route = world.arrive()
    assert (route.node, route.outcome) == (3, "green_other")
    assert disp.r == 5  # 1 green token < n beta = 4; green > 0, so no increment either


def test_slta_increment_guesses_the_new_yellow_tokens() -> None:
    # r = 5 after 10 arrivals: x = (2, 2 | 1, 1, 1 | 1, 1, 1), yellow = the three class-1 pools.
    # Three more arrivals fill them; the last takes the last yellow token, so r -> 6, slot (2, 2).
    world = slta_world()
    for _ in range(10):
        world.arrive()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    world.to_dispatcher.clear()
    routes = [world.arrive() for _ in range(3)]
    assert sorted(r.node for r in routes) == [2, 3, 4] and disp.r == 6
    # the EPOCH goes to class 1 (its threshold rose to 2) and class 2 (the new yellow class)
    assert {m.node for m in routes[2].messages} >= {2, 3, 4, 5, 6, 7}
    # class 2's pools were believed (no green, no yellow) at r = 5: they hold l_2(5) = 1 task or more.
    # The dispatcher assumes the new yellow token (x < j_6 = 2) is there; all three hold exactly 1, so the
    # guess is right: every told pool answers with the bits the dispatcher already holds, no correction
    # (the messaging design of docs/theory.md, "SLTA's messages", withholds the token and makes all three
    # report it)
    told = {m.node for m in routes[2].messages}
    answers = world.to_dispatcher
    assert sorted(m.node for m in answers) == sorted(told) and {m.kind for m in answers} == {"token_epoch"}
    for m in answers:
        assert tuple(m.data[3:5]) == disp.bits[m.node]  # (..., green, yellow, tasks)
    for k in range(8):
        assert disp.bits[k] == expected_bits(disp.ranking, world.exp.node_class[k], world.x[k], 6)


def test_slta_decrement_driven_by_departures() -> None:
    world = slta_world()
    for _ in range(10):
        world.arrive()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher) and disp.r == 5
    for k in (0, 5, 6, 7):  # class 0: 2 -> 1 < l_0 = 2; class 2: 1 -> 0 < l_2 = 1: four green tokens
        world.depart(k)
    assert sum(g for g, _ in disp.bits) == 4
    world.to_dispatcher.clear()
    route = world.arrive()
    assert route.node in (5, 6, 7) and route.outcome == "green_other"
    assert disp.r == 4
    # decrement: green class-0 pools gain y for sure and are assumed to lose g (l_0 falls from 2 to 1);
    # node 0 holds 1 task, so it did lose it: the belief is exact and the told pools answer without a
    # correction (the messaging design of docs/theory.md, "SLTA's messages", keeps g and makes node 0 correct
    # it)
    told = {m.node for m in route.messages}
    answers = world.to_dispatcher
    assert sorted(m.node for m in answers) == sorted(told) and {m.kind for m in answers} == {"token_epoch"}
    for m in answers:
        assert tuple(m.data[3:5]) == disp.bits[m.node]  # (..., green, yellow, tasks)
    ranking = disp.ranking
    for k in range(8):
        assert disp.bits[k] == expected_bits(ranking, world.exp.node_class[k], world.x[k], 4)


def _branch(ranking: Ranking, exp: Experiment, x: Sequence[int], r: int) -> tuple[dict[str, set[int]], int]:
    """Token sets of the true state and the r the learning rule gives after one arrival (Goldsztajn et al.
    2021, §3.2)."""
    cls = exp.node_class
    bits = [expected_bits(ranking, cls[k], x[k], r) for k in range(exp.n)]
    prev = ranking.slot(r - 1)[0] if r > 1 else -1
    green = {k for k in range(exp.n) if bits[k][0]}
    sets = {
        "green_other": {k for k in green if cls[k] != prev},
        "green_prev": {k for k in green if cls[k] == prev},
        "yellow": {k for k in range(exp.n) if bits[k][1]},
    }
    assert exp.policy.beta is not None
    if r > 1 and len(green) >= exp.n * exp.policy.beta and sets["green_prev"]:
        return sets, r - 1
    if len(sets["yellow"]) <= 1 and not green:
        return sets, r + 1
    return sets, r


SLTA_RUNS = [
    ("table1-n8-nbeta2", TABLE1, (4, 4), 0.25, 3.0),
    ("three-classes-nbeta4", None, (2, 3, 3), 0.5, 2.5),
    ("three-classes-nbeta2", None, (3, 2, 3), 0.25, 2.0),
]


@pytest.mark.parametrize(
    ("classes", "counts", "beta", "load"), [c[1:] for c in SLTA_RUNS], ids=[c[0] for c in SLTA_RUNS]
)
def test_slta_long_run_invariants(
    classes: list[dict[str, Any]] | None, counts: tuple[int, ...], beta: float, load: float
) -> None:
    """SLTA's invariants (docs/theory.md, "SLTA: thresholds, tokens and dispatching"; the paper's Remark 1)
    on a long random sequence of arrivals and departures, exact delivery.

    Arrivals at rate n load and departures at rate (tasks present) (M/M/inf, mean service 1). After every
    event the dispatcher's belief equals the true bits; before every arrival at least one yellow token
    exists; every dispatch takes the branch the priorities give on the true state, lands at a slot
    ranked at or above (i_r, j_r), and r moves as the learning rule on the true state says.
    """
    if classes is None:
        classes = three_classes(counts)
    else:
        classes = [dict(c, count=k) for c, k in zip(classes, counts, strict=True)]
    exp = experiment(classes, {"name": "slta", "beta": beta}, load=load)
    world = World(exp, seed=3)
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    ranking, th, cls = disp.ranking, disp.th, exp.node_class
    rank_of = {}  # slot -> its k in the enumeration
    for k in range(1, 200):
        rank_of[ranking.slot(k)] = k
    rng = random.Random(11)
    lam = exp.workload.arrival_rate
    rs, outcomes, moves = Counter[int](), Counter[str](), Counter[int]()
    for _ in range(10000):
        r, total = disp.r, sum(world.x)
        if rng.random() < lam / (lam + total):
            sets, r_expected = _branch(ranking, exp, world.x, r)
            assert len(sets["yellow"]) >= 1  # invariant: always a yellow token
            k_before = world.x.copy()
            route = world.arrive()
            k = route.node
            outcomes[route.outcome] += 1
            assert route.outcome != "random"
            expected_branch = next(b for b in ("green_other", "green_prev", "yellow") if sets[b])
            assert route.outcome == expected_branch
            assert k in sets[expected_branch]
            assert rank_of[(cls[k], k_before[k] + 1)] <= r  # at or above (i_r, j_r)
            assert disp.r == r_expected and abs(disp.r - r) <= 1
            moves[disp.r - r] += 1
            if disp.r != r:
                steps = [
                    b - a for a, b in zip(ranking.thresholds(r), ranking.thresholds(disp.r), strict=True)
                ]
                assert sorted(map(abs, steps)) == [0] * (len(steps) - 1) + [1]
        else:
            u = rng.random() * total
            k = next(k for k in range(exp.n) if (u := u - world.x[k]) < 0)
            world.depart(k)
            assert disp.r == r  # r changes only at arrivals
        rs[disp.r] += 1
        for k in range(exp.n):
            truth = expected_bits(ranking, cls[k], world.x[k], disp.r)
            assert th.true_bits(cls[k], world.x[k], disp.r) == truth
            assert disp.bits[k] == truth, (k, world.x[k], disp.r)
        assert len(disp.yellow) >= 1
    # the run exercised the learning rule in both directions and every dispatch branch but random
    assert len(rs) >= 5 and moves[-1] >= 20 and moves[+1] >= 20
    assert {"green_other", "green_prev", "yellow"} <= set(outcomes)


# ------------------------------------------------------------------------- SLTA under message delay


class HeldWorld(World):
    """A World whose network can hold things back: while ``holding``, messages to the dispatcher wait in
    ``to_dispatcher_held``, messages to pools in ``to_pools_held``, and (with ``hold_tasks``) forwarded tasks
    in ``tasks_held``, until the test delivers them, one at a time and in the order it chooses."""

    def __init__(self, exp: Experiment, seed: int = 1) -> None:
        super().__init__(exp, seed)
        self.holding = False
        self.hold_tasks = False
        self.to_dispatcher_held: list[Message] = []
        self.to_pools_held: list[Message] = []
        self.tasks_held: list[tuple[int, tuple[Any, ...]]] = []  # (pool, piggyback)

    def _deliver_to_dispatcher(self, msgs: Iterable[Message]) -> None:
        if self.holding:
            self.to_dispatcher_held.extend(msgs)
        else:
            super()._deliver_to_dispatcher(msgs)

    def _deliver_to_nodes(self, msgs: Iterable[Message]) -> None:
        if self.holding:
            self.to_pools_held.extend(msgs)
        else:
            super()._deliver_to_nodes(msgs)

    def arrive(self) -> Route:
        if not (self.holding and self.hold_tasks):
            return super().arrive()
        route = self.disp.dispatch()
        assert isinstance(route, Route)
        self.tasks_held.append((route.node, route.piggyback))
        self._deliver_to_nodes(route.messages)  # held: they follow the task, as in the simulator
        return route

    def in_flight(self, k: int) -> int:
        """Tasks forwarded to pool k that have not reached it."""
        return sum(1 for node, _ in self.tasks_held if node == k)

    def held(self) -> int:
        return len(self.to_dispatcher_held) + len(self.to_pools_held) + len(self.tasks_held)

    def deliver(self, which: int) -> None:
        """Deliver held item ``which`` (tasks first, then messages to pools, then to the dispatcher)."""
        if which < len(self.tasks_held):
            k, piggyback = self.tasks_held.pop(which)
            self.x[k] += 1
            self._deliver_to_dispatcher(self.sides[k].on_arrival(self.x[k], 0, piggyback))
            return
        which -= len(self.tasks_held)
        if which < len(self.to_pools_held):
            m = self.to_pools_held.pop(which)
            self._deliver_to_dispatcher(self.sides[m.node].on_message(m, self.x[m.node]))
            return
        m = self.to_dispatcher_held.pop(which - len(self.to_pools_held))
        self.to_dispatcher.append(m)
        self._deliver_to_nodes(self.disp.on_message(m))


def r5_world_with_room() -> HeldWorld:
    """slta_world after 10 arrivals (r = 5, x = (2, 2 | 1, 1, 1 | 1, 1, 1), see the tests above), then
    departures at pools 0, 0 and 5, delivered at once: at r = 5, l = (2, 1, 1) and i_{r-1} = class 0, so
    pool 0 (class 0) holds a green token with room for two tasks and pool 5 (class 2) one with room for
    one; 2 green tokens < n beta = 4, so no decrement is due; yellow: the class-1 pools 2, 3, 4."""
    world = HeldWorld(experiment(three_classes((2, 3, 3)), {"name": "slta", "beta": 0.5}, load=2.0))
    for _ in range(10):
        world.arrive()
    for k in (0, 0, 5):
        world.depart(k)
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    assert disp.r == 5 and world.x == [0, 2, 1, 1, 1, 0, 1, 1]
    assert disp.ranking.slot(4)[0] == 0 and disp.ranking.thresholds(5) == (2, 1, 1)
    return world


def assert_picture_is_the_truth(world: World) -> None:
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    for k in range(world.exp.n):
        truth = expected_bits(disp.ranking, world.exp.node_class[k], world.x[k], disp.r)
        assert disp.bits[k] == truth, (k, world.x[k], disp.r)


def test_slta_held_answers_make_no_shortfall() -> None:
    """Issue 4's transient shortfall, by hand. Every message is held back while six tasks arrive and no task
    leaves, so the dispatcher learns nothing from the pools; but nothing happens that it does not know (it
    sent the tasks itself), so it must route and learn exactly as the paper's rules on the true state say
    (Goldsztajn et al. 2021, §3.2).

    By hand: task 1 takes pool 5's green token (class 2, other than i_{r-1}); task 2 takes pool 0's (class
    i_{r-1}; 0 -> 1 tasks < l_0 = 2, so the token stays); task 3 takes it again (1 -> 2, gone); tasks 4-6 take
    the three yellow tokens, and the last of them, with no green token left, raises r to 6. A dispatcher
    that assumes a used green token gone until the pool says otherwise sends task 3 to a yellow token instead
    and raises r one task early, while pool 0 still holds a green token.
    """
    world = r5_world_with_room()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    world.holding = True
    routes, r_after = [], []
    for _ in range(6):
        assert_picture_is_the_truth(world)
        sets, r_expected = _branch(disp.ranking, world.exp, world.x, disp.r)
        route = world.arrive()
        branch = next(b for b in ("green_other", "green_prev", "yellow") if sets[b])
        assert (route.outcome, route.node in sets[branch]) == (branch, True)
        assert disp.r == r_expected
        routes.append((route.node, route.outcome))
        r_after.append(disp.r)
    assert routes[:3] == [(5, "green_other"), (0, "green_prev"), (0, "green_prev")]
    assert [o for _, o in routes[3:]] == ["yellow"] * 3
    assert r_after == [5, 5, 5, 5, 5, 6]
    assert world.x == [2, 2, 2, 2, 2, 1, 1, 1]
    # the pools had nothing to correct: only the epochs of r = 6 are held, on their way to the pools
    assert world.to_dispatcher_held == [] and {m.kind for m in world.to_pools_held} == {"epoch"}
    assert_picture_is_the_truth(world)
    # late answers, in reverse order, leave the picture true and settle the epoch
    while world.held():
        world.deliver(world.held() - 1)
        assert_picture_is_the_truth(world)
    assert not disp.unsettled


@pytest.mark.parametrize("elsewhere", [False, True])
def test_slta_late_report_counts_the_tasks_sent_since(elsewhere: bool) -> None:
    """A departure report that reaches the dispatcher after it has sent the pool another task. The report's
    task count misses that task; its seq (the pool's arrivals plus departures) tells the dispatcher how many
    of its tasks the pool had received, so the picture counts the missing one on top. Read naively, the
    report would show room for one task too many, and a task would go to a slot ranked below (i_r, j_r).

    ``elsewhere``: first a task that did not come through this dispatcher (the cluster benchmark sends
    such tasks to the same pools) arrives at the pool and leaves; the pool has then received more tasks
    than the dispatcher sent it, and the count must not stay off by that one."""
    world = r5_world_with_room()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    rank_of = {disp.ranking.slot(k): k for k in range(1, 40)}
    if elsewhere:
        world.x[0] += 1
        assert world.sides[0].on_arrival(world.x[0], 0, ()) == ()
        world.depart(0)  # reported at once
        assert_picture_is_the_truth(world)
    world.holding = True
    world.tasks_held.clear()
    assert world.arrive().node == 5  # pool 5's green token first (class 2, other than i_{r-1} = 0)
    assert world.arrive().node == 0  # then pool 0's: 0 -> 1
    world.depart(0)  # 1 -> 0: its report waits
    report = world.to_dispatcher_held[-1]
    assert report.kind == "token_departure" and report.data[5] == 0
    assert world.arrive().node == 0  # the picture still has pool 0 at 1 < l_0: 0 -> 1
    assert disp.bits[0] == (False, False)  # in the picture pool 0 is full (2), the report is on its way
    world.deliver(world.held() - 1)  # the report arrives: x = 0 then, plus the task sent since
    assert world.x[0] == 1
    assert_picture_is_the_truth(world)  # green again: one task of room, not two
    for _ in range(3):
        before, r = world.x.copy(), disp.r
        route = world.arrive()
        k = route.node
        assert rank_of[(world.exp.node_class[k], before[k] + 1)] <= r, (k, before, r)  # Remark 1
        assert_picture_is_the_truth(world)
    assert world.x[0] == 2  # pool 0 took exactly the one task its token had room for


@pytest.mark.parametrize("hold_tasks", [False, True])
def test_slta_picture_under_random_delays(hold_tasks: bool) -> None:
    """Arrivals, departures and deliveries in a random order: every message (and, with ``hold_tasks``, every
    forwarded task) takes a random number of events to arrive, in any order, often dozens. The tasks sent
    to a pool and not yet arrived count as its tasks.

    At every dispatch the task goes to a slot ranked at or above (i_r, j_r) (Goldsztajn et al. 2021, Remark 1;
    the pool truly holds no more than the dispatcher counts), never at random (Remark 1: the dispatcher's
    picture always holds a yellow token); the picture never shows a token the pool lacks; r moves by at
    most one per arrival and only at arrivals. Whenever everything in flight has been delivered, the picture
    is the true state.
    """
    exp = experiment(three_classes((3, 2, 3)), {"name": "slta", "beta": 0.25}, load=2.0)
    world = HeldWorld(exp, seed=5)
    world.holding, world.hold_tasks = True, hold_tasks
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    ranking, cls, pools = disp.ranking, exp.node_class, range(exp.n)
    rank_of = {ranking.slot(k): k for k in range(1, 200)}
    rng = random.Random(17)
    lam = exp.workload.arrival_rate
    outcomes, moves, most_held, behind = Counter[str](), Counter[int](), 0, 0
    for step in range(30000):
        r = disp.r
        committed = [world.x[k] + world.in_flight(k) for k in range(exp.n)]
        total = sum(world.x)
        u = rng.random()
        if world.held() and u < 0.6:
            world.deliver(int(rng.random() * world.held()))
            assert disp.r == r  # r changes only at arrivals
        elif rng.random() < lam / (lam + total):
            route = world.arrive()
            k = route.node
            outcomes[route.outcome] += 1
            assert route.outcome != "random"
            assert rank_of[(cls[k], committed[k] + 1)] <= r, (k, committed, r)
            assert abs(disp.r - r) <= 1
            moves[disp.r - r] += 1
        else:
            v = rng.random() * total
            k = next(k for k in range(exp.n) if (v := v - world.x[k]) < 0)
            world.depart(k)
            assert disp.r == r
        most_held = max(most_held, world.held())
        truths = [expected_bits(ranking, cls[k], world.x[k] + world.in_flight(k), disp.r) for k in pools]
        for k, (truth, picture) in enumerate(zip(truths, disp.bits, strict=True)):
            assert (picture[0] <= truth[0], picture[1] <= truth[1]) == (True, True), (k, picture, truth)
        behind += truths != disp.bits
        if step % 1000 == 999:
            while world.held():
                world.deliver(int(rng.random() * world.held()))
            assert_picture_is_the_truth(world)
    # the run held dozens of things back at times, the picture lagged the truth often, and both
    # directions of learning were exercised
    print(f"most held {most_held}, picture behind the truth after {behind} of 30000 steps, moves {moves}")
    assert most_held >= 30 and behind >= 3000
    assert moves[-1] >= 20 and moves[+1] >= 20
    assert {"green_other", "green_prev", "yellow"} <= set(outcomes)


# =========================================================================================== JSQ

# nodes 0-1 speed 1, nodes 2-3 speed 2, nodes 4-5 speed 1/2: the fastest are neither the lowest nor the
# highest ids
MIXED_SPEEDS = [queue_class("mid", 2, 1), queue_class("fast", 2, 2), queue_class("slow", 2, "1/2")]


def jsq_world(tie_break: str, seed: int = 1, policy: str = "jsq") -> World:
    return World(experiment(MIXED_SPEEDS, {"name": policy, "tie_break": tie_break}), seed)


def test_jsq_fastest_among_shortest() -> None:
    world = jsq_world("fastest")
    routes = [world.arrive() for _ in range(7)]
    nodes = [r.node for r in routes]
    assert set(nodes[0:2]) == {2, 3} and set(nodes[2:4]) == {0, 1} and set(nodes[4:6]) == {4, 5}
    assert nodes[6] in (2, 3)
    assert [r.outcome for r in routes] == ["idle"] * 6 + ["busy"]
    world.depart(4)
    assert world.arrive().node == 4  # the only shortest queue, however slow


def test_jsq_slowest_among_shortest() -> None:
    world = jsq_world("slowest")
    nodes = [world.arrive().node for _ in range(7)]
    assert set(nodes[0:2]) == {4, 5} and set(nodes[2:4]) == {0, 1} and set(nodes[4:6]) == {2, 3}
    assert nodes[6] in (4, 5)


@pytest.mark.parametrize(("tie_break", "tied"), [("fastest", [2, 3]), ("slowest", [4, 5])])
def test_jsq_equal_speeds_tie_uniformly(tie_break: str, tied: list[int]) -> None:
    # from the empty state every task goes to one of the two fastest (slowest) nodes and leaves again:
    # each decision is a fresh tie between two nodes of the same speed and must be 1/2 each
    counts = jsq_world(tie_break, seed=2).frequencies(2000)
    assert_uniform(counts, tied)


def test_jsq_equal_speeds_tie_uniformly_in_a_fresh_state() -> None:
    # the first decision of fresh dispatchers (no history) is a fair coin between the two fastest nodes;
    # 1000 dispatchers: count of node 2 ~ Binomial(1000, 1/2), sd 15.8, 5 sd = 79
    exp = experiment(MIXED_SPEEDS, {"name": "jsq", "tie_break": "fastest"})
    firsts: Counter[int] = Counter()
    for seed in range(1000):
        route = make_dispatcher(exp, random.Random(seed)).dispatch()
        assert isinstance(route, Route)
        firsts[route.node] += 1
    assert set(firsts) == {2, 3}
    assert abs(firsts[2] - 500) < 79


def test_jsq_random_tie_break_is_uniform_among_shortest() -> None:
    world = jsq_world("random", seed=3)
    assert_uniform(world.frequencies(2400), range(6))
    for _ in range(6):
        world.arrive()
    assert world.x == [1] * 6
    for k in (0, 3, 5):
        world.depart(k)
    assert_uniform(world.frequencies(1500), [0, 3, 5])


def test_jsq_longest_idle() -> None:
    world = jsq_world("longest_idle", seed=4)
    for _ in range(6):
        world.arrive()
    assert world.x == [1] * 6
    for k in (3, 0, 5):  # idle order 3, 0, 5
        world.depart(k)
    assert world.arrive().node == 3
    assert world.arrive().node == 0
    world.depart(3)  # 3 is idle again, behind 5
    assert world.arrive().node == 5
    assert world.arrive().node == 3
    # nobody idle: uniform among the shortest (two random nodes hold 2 tasks, four hold 1)
    assert world.x == [1] * 6
    world.arrive()
    world.arrive()
    low = min(world.x)
    shortest = [k for k in range(6) if world.x[k] == low]
    assert low >= 1 and len(shortest) >= 2
    assert_uniform(world.frequencies(400 * len(shortest)), shortest)


def test_jsq_fastest_idle() -> None:
    world = jsq_world("fastest_idle", seed=5)
    nodes = [world.arrive().node for _ in range(6)]
    assert set(nodes[0:2]) == {2, 3} and set(nodes[2:4]) == {0, 1} and set(nodes[4:6]) == {4, 5}
    # all busy with one task: uniform over all six, not the fastest (JFIQ's busy-level rule)
    assert_uniform(world.frequencies(2400), range(6))
    # shortest = {0, 4} (mid and slow) with everybody else at 2: uniform between them
    for _ in range(6):
        world.arrive()
    assert world.x == [2] * 6
    for k in (0, 4):
        world.depart(k)
    assert_uniform(world.frequencies(1600), [0, 4])
    # idle nodes 4 (slow) and 0 (mid): the fastest idle one
    world.depart(0)
    world.depart(4)
    assert world.x == [0, 2, 2, 2, 0, 2]
    assert world.arrive().node == 0
    assert world.arrive().node == 4


# ===================================================================================== power of d


def test_power_of_d_probes_distinct_nodes_uniformly() -> None:
    world = World(experiment([queue_class("q", 5, 1)], {"name": "power_of_d", "d": 3}), seed=6)
    disp = world.disp
    seen: Counter[int] = Counter()
    trials = 3000
    for _ in range(trials):
        probe = disp.dispatch()
        assert isinstance(probe, Probe)
        assert len(probe.nodes) == 3 and len(set(probe.nodes)) == 3
        seen.update(probe.nodes)
    # each node is in a sample with probability 3/5: sd = sqrt(3000 * 0.6 * 0.4) = 26.8; 5 sd = 134
    # (two-sided 5-sd tails 5.7e-7 per node)
    assert all(abs(seen[k] - trials * 0.6) < 134 for k in range(5))
    full = World(experiment([queue_class("q", 5, 1)], {"name": "power_of_d", "d": 5}), seed=6).disp
    for _ in range(50):
        probe = full.dispatch()
        assert isinstance(probe, Probe) and sorted(probe.nodes) == [0, 1, 2, 3, 4]


def test_power_of_d_with_replacement() -> None:
    disp = World(experiment([queue_class("q", 3, 1)], {"name": "power_of_d", "d": 3, "replace": True})).disp
    trials, distinct = 2700, 0
    for _ in range(trials):
        probe = disp.dispatch()
        assert isinstance(probe, Probe) and len(probe.nodes) == 3
        distinct += len(set(probe.nodes)) == 3
    # P(3 draws with replacement are distinct) = 3!/27 = 2/9: mean 600, sd = sqrt(2700*2/9*7/9) = 21.6
    assert abs(distinct - 600) < 5 * 21.6
    wide = World(experiment([queue_class("q", 3, 1)], {"name": "power_of_d", "d": 6, "replace": True})).disp
    probe = wide.dispatch()
    assert isinstance(probe, Probe) and len(probe.nodes) == 6


def test_power_of_d_joins_the_least_occupied_probed_node() -> None:
    world = World(experiment([queue_class("q", 5, 1)], {"name": "power_of_d", "d": 3}))
    assert world.disp.resolve(Probe((3, 1, 4)), [2, 0, 5]) == Route(1, "probed")
    assert world.disp.resolve(Probe((3, 1, 4)), [2, 7, 1]).node == 4
    # the node side answers a probe with its occupancy
    (reply,) = world.sides[2].on_message(Message("probe", 2, (), 0), 7)
    assert reply == Message("probe_reply", 2, (7,), 0)


def test_power_of_d_random_ties_are_uniform() -> None:
    # n = 4, d = 2, occupancies (0, 0, 1, 1). Of the 6 equally likely pairs, node 0 wins {0,2}, {0,3}
    # and half of {0,1}: 2.5/6 = 5/12; node 2 wins half of {2,3}: 1/12.
    world = World(experiment([queue_class("q", 4, 1)], {"name": "power_of_d", "d": 2}), seed=8)
    world.x = [0, 0, 1, 1]
    counts = world.frequencies(3000)
    assert_distribution(counts, {0: 5 / 12, 1: 5 / 12, 2: 1 / 12, 3: 1 / 12})


TWO_SPEEDS = [queue_class("slow", 2, 1), queue_class("fast", 2, 3)]  # nodes 0-1 slow, 2-3 fast


@pytest.mark.parametrize(("tie_break", "winner"), [("fastest", 2), ("slowest", 0)])
def test_power_of_d_speed_ties(tie_break: str, winner: int) -> None:
    disp = World(experiment(TWO_SPEEDS, {"name": "power_of_d", "d": 2, "tie_break": tie_break})).disp
    assert disp.resolve(Probe((0, 2)), [1, 1]).node == winner
    assert disp.resolve(Probe((2, 0)), [1, 1]).node == winner
    # the least occupied wins whatever its speed
    assert disp.resolve(Probe((0, 2)), [1, 0]).node == 2
    assert disp.resolve(Probe((2, 0)), [1, 0]).node == 0


def test_power_of_d_fastest_ties_between_equal_speeds_are_uniform() -> None:
    # all idle, d = 2 of 4: node 2 is chosen on {0,2}, {1,2} and half of {2,3}: 5/12; node 0 on half of
    # {0,1}: 1/12.
    world = World(experiment(TWO_SPEEDS, {"name": "power_of_d", "d": 2, "tie_break": "fastest"}), seed=9)
    assert_distribution(world.frequencies(3000), {0: 1 / 12, 1: 1 / 12, 2: 5 / 12, 3: 5 / 12})


# ================================================================================== least request


def test_least_request_counts_tasks_in_flight() -> None:
    world = World(experiment([queue_class("q", 3, 1)], {"name": "least_request", "d": 3}), seed=10)
    disp = world.disp
    first = [world.arrive() for _ in range(3)]
    assert sorted(r.node for r in first) == [0, 1, 2]
    assert all(r.outcome == "sampled" and not r.messages for r in first)
    assert disp.gauges() == {"pending_tasks": 3.0}
    disp.on_task_done(1, 0.0)
    assert disp.gauges() == {"pending_tasks": 2.0}
    assert world.arrive().node == 1
    disp.on_task_done(2, 0.0)
    assert world.arrive().node == 2
    assert world.to_dispatcher == []  # no messages at all


def test_least_request_never_picks_the_busiest_of_two() -> None:
    # counts (1, 0, 0), d = 2 of 3: node 0 always meets an emptier node; nodes 1 and 2 split evenly
    world = World(experiment([queue_class("q", 3, 1)], {"name": "least_request", "d": 2}), seed=12)
    disp = world.disp
    while (k := world.arrive().node) != 0:
        world.depart(k)  # the completion passes back through the dispatcher
    assert disp.gauges() == {"pending_tasks": 1.0}
    counts = world.frequencies(1500)
    assert counts[0] == 0
    assert_uniform(counts, [1, 2])


# ============================================================================================ JIQ


def jiq_world(tie_break: str, seed: int = 1) -> World:
    return World(experiment(MIXED_SPEEDS, {"name": "jiq", "tie_break": tie_break}), seed)


def drain(world: World) -> None:
    """Use up the idle tokens every node holds at the start."""
    nodes = [world.arrive() for _ in range(6)]
    assert sorted(r.node for r in nodes) == list(range(6))  # one token per node, no duplicates
    assert all(r.outcome == "idle_token" for r in nodes)


def test_jiq_node_sends_a_token_only_when_it_becomes_idle() -> None:
    exp = experiment(MIXED_SPEEDS, {"name": "jiq"})
    side = make_node_sides(exp, random.Random(1))[4]
    assert side.on_arrival(1, 0, ()) == ()
    assert side.on_departure(2, 0) == ()
    assert side.on_departure(1, 0) == ()
    assert side.on_departure(0, 0) == (Message("idle_token", 4, (1,), 0),)  # numbered by its 1 arrival


def test_jiq_uses_tokens_then_random() -> None:
    world = jiq_world("random", seed=13)
    drain(world)
    route = world.arrive()
    assert route.outcome == "random"
    world.depart(route.node)  # that node had 2 tasks: no token
    assert world.to_dispatcher == []
    world.depart(2)  # 1 -> 0: an idle token, numbered by node 2's arrivals (its first token's task, and
    # the random one if that went to node 2)
    assert world.to_dispatcher == [Message("idle_token", 2, (1 + (route.node == 2),), 0)]
    assert world.arrive() == Route(2, "idle_token")
    assert world.arrive().outcome == "random"


@pytest.mark.parametrize("tie_break", ["random", "longest_idle", "fastest"])
def test_jiq_tokens_are_not_duplicated(tie_break: str) -> None:
    world = jiq_world(tie_break, seed=14)
    drain(world)
    for k in (5, 5, 5, 1):  # node 5 (slow) announces itself three times, then node 1 (mid)
        world.disp.on_message(Message("idle_token", k, (1,), 0))
    # two duplicates dropped
    assert world.disp.gauges() == {"idle_tokens": 2.0, "jiq_stale_tokens_total": 2.0}
    assert sorted(world.arrive().node for _ in range(2)) == [1, 5]
    assert world.arrive().outcome == "random"
    assert world.disp.gauges() == {"idle_tokens": 0.0, "jiq_stale_tokens_total": 2.0}


def test_jiq_longest_idle_is_fifo() -> None:
    world = jiq_world("longest_idle", seed=15)
    drain(world)
    for k in (4, 1, 3):
        world.depart(k)
    assert [world.arrive().node for _ in range(3)] == [4, 1, 3]
    assert world.arrive().outcome == "random"


def test_jiq_fastest_token_first() -> None:
    world = jiq_world("fastest", seed=16)
    drain(world)
    for k in (4, 2, 0):  # slow, fast, mid
        world.depart(k)
    assert [world.arrive().node for _ in range(3)] == [2, 0, 4]


def test_jiq_random_token_is_uniform_and_fallback_is_uniform() -> None:
    world = jiq_world("random", seed=17)
    drain(world)
    for k in (1, 3, 5):
        world.depart(k)
    assert_uniform(world.frequencies(1500), [1, 3, 5])  # the departure returns the token
    for _ in range(3):
        world.arrive()
    assert world.x == [1] * 6
    counts: Counter[int] = Counter()
    for _ in range(2400):
        route = world.arrive()
        assert route.outcome == "random"
        counts[route.node] += 1
        world.depart(route.node)  # 2 -> 1 tasks: no token
    assert_uniform(counts, range(6))


# ====================================================================================== Schemes


def scheme_disp(policy: str, classes: list[dict[str, Any]], d: Any = None, seed: int = 1) -> Any:
    p: dict[str, Any] = {"name": policy}
    if d is not None:
        p["d"] = d
    return World(experiment(classes, p, load=0.05), seed)


# nodes 0-2 speed 2/3, nodes 3-5 speed 4/3 (Mukhopadhyay et al. 2015, the capacities of Fig. 3)
HETERO = [queue_class("slow", 3, "2/3"), queue_class("fast", 3, "4/3")]
# the same with the fast class listed first: nodes 0-2 fast, 3-5 slow
HETERO_FAST_FIRST = [queue_class("fast", 3, "4/3"), queue_class("slow", 3, "2/3")]


def test_scheme_probes_d_j_distinct_nodes_of_each_class() -> None:
    disp = scheme_disp("scheme1", HETERO, d=[2, 1], seed=18).disp
    seen: Counter[int] = Counter()
    for _ in range(1500):
        probe = disp.dispatch()
        assert isinstance(probe, Probe) and len(probe.nodes) == 3
        assert set(probe.nodes[:2]) <= {0, 1, 2} and probe.nodes[0] != probe.nodes[1]
        assert probe.nodes[2] in (3, 4, 5)
        seen.update(probe.nodes)
    # slow nodes are in a sample w.p. 2/3 (sd = sqrt(1500*2/9) = 18.3), fast ones w.p. 1/3 (same sd)
    assert all(abs(seen[k] - 1000) < 5 * 18.3 for k in (0, 1, 2))
    assert all(abs(seen[k] - 500) < 5 * 18.3 for k in (3, 4, 5))


# (replies for probe (0, 1, 3, 4): slow 0, slow 1, fast 3, fast 4), scheme1 winner, scheme2 winner
SCHEME_CASES = [
    # kept: slow q=1 (2/3 per task), fast q=2 (2/3 per task): exact tie for scheme 2 -> the faster
    ("rate-tie", [1, 3, 2, 5], 0, 3),
    # slow q=2 (1/3) vs fast q=3 (4/9): scheme 1 the lower q, scheme 2 the higher rate
    ("rate-vs-occupancy", [4, 2, 3, 3], 1, 3),
    # slow q=1 (2/3) vs fast q=3 (4/9)
    ("slow-better", [1, 2, 3, 4], 0, 0),
    # an idle node beats any busy node, also a faster one
    ("idle-slow", [0, 5, 1, 1], 0, 0),
    # both idle: the faster class
    ("both-idle", [2, 0, 0, 4], 3, 3),
    # equal occupancy: scheme 1 to the faster class
    ("equal-q", [1, 1, 4, 1], 4, 4),
]


@pytest.mark.parametrize("fast_first", [False, True])
@pytest.mark.parametrize(
    ("replies", "winner1", "winner2"), [c[1:] for c in SCHEME_CASES], ids=[c[0] for c in SCHEME_CASES]
)
def test_scheme_selection(replies: list[int], winner1: int, winner2: int, fast_first: bool) -> None:
    nodes, classes = (0, 1, 3, 4), HETERO
    if fast_first:
        # the same case with the fast class first in the spec: nodes 0-2 fast, 3-5 slow. A probe lists
        # the classes in spec order, so the fast replies come first.
        classes = HETERO_FAST_FIRST
        replies = [replies[2], replies[3], replies[0], replies[1]]
        renumber = {0: 3, 1: 4, 3: 0, 4: 1}
        winner1, winner2 = renumber[winner1], renumber[winner2]
    for policy, winner in (("scheme1", winner1), ("scheme2", winner2)):
        disp = scheme_disp(policy, classes, d=2).disp
        route = disp.resolve(Probe(nodes), replies)
        assert route.node == winner, (policy, replies)
        assert route.outcome == ("idle" if replies[nodes.index(winner)] == 0 else "busy")


def test_scheme2_compares_rates_exactly() -> None:
    # speeds 0.1 and 0.3 are exactly 1/10 and 3/10: slow q=1 and fast q=3 give 1/10 per task each, a
    # tie that goes to the faster class. In floats 0.1 * 3 > 0.3 * 1 would hand it to the slow node.
    classes = [queue_class("slow", 2, 0.1), queue_class("fast", 2, 0.3)]
    disp = scheme_disp("scheme2", classes, d=[1, 1]).disp
    assert disp.resolve(Probe((0, 2)), [1, 3]).node == 2
    assert disp.resolve(Probe((1, 3)), [1, 4]).node == 1  # 1/10 > 3/40


def test_scheme_ties_inside_a_class_are_uniform() -> None:
    # slow occupancies (1, 1, 5), fast (9, 9, 9); d = (2, 1). Of the slow pairs, {0,1} ties (half each),
    # {0,2} keeps 0, {1,2} keeps 1: node 0 and node 1 each with probability 1/2; the slow node always
    # wins (q = 1 against 9, 2/3 against 4/27).
    for policy in ("scheme1", "scheme2"):
        world = scheme_disp(policy, HETERO, d=[2, 1], seed=19)
        world.x = [1, 1, 5, 9, 9, 9]
        assert_uniform(world.frequencies(2000), [0, 1])


# ==================================================================================== node models


def test_ps_two_tasks_at_once() -> None:
    # speed 1, work 1 and 2 at t = 0: each served at 1/2; the first leaves at 2, the other at 3
    node = PSNode(1.0, TableUtility([0, 1, 1.5]))
    a, b = Task(1, 1.0, 0.0), Task(2, 2.0, 0.0)
    assert node.arrive(a, 0.0) is False
    assert node.arrive(b, 0.0) is False
    assert node.next_completion() == pytest.approx(2.0, abs=1e-12)
    assert node.complete(2.0) is a
    assert node.next_completion() == pytest.approx(3.0, abs=1e-12)
    assert node.complete(3.0) is b
    assert node.next_completion() == math.inf
    node.advance(4.0)
    assert node.time_at == pytest.approx([1.0, 1.0, 2.0], abs=1e-12)
    assert node.task_seconds == pytest.approx(2 * 2 + 1 * 1, abs=1e-12)
    assert node.utility_seconds == pytest.approx(2 * 1.5 + 1 * 1, abs=1e-12)
    assert (node.arrivals, node.completions, node.x) == (2, 2, 0)


def test_ps_three_tasks_at_once() -> None:
    # speed 1, work 1, 2, 3 at t = 0: all at 1/3 until 3 (the first leaves), then 1/2 each until 5 (the
    # second leaves with its last unit), then the third alone finishes its last unit at 6
    node = PSNode(1.0)
    tasks = [Task(k, float(k), 0.0) for k in (1, 2, 3)]
    for t in tasks:
        node.arrive(t, 0.0)
    done = []
    for expected in (3.0, 5.0, 6.0):
        assert node.next_completion() == pytest.approx(expected, abs=1e-12)
        done.append(node.complete(expected))
    assert done == tasks
    assert node.time_at == pytest.approx([0.0, 1.0, 2.0, 3.0], abs=1e-12)
    assert node.task_seconds == pytest.approx(3 + 5 + 6, abs=1e-12)  # the sum of the sojourn times


def test_ps_staggered_arrivals_at_speed_two() -> None:
    # speed 2. A (work 4) alone would leave at 2. B (work 1) arrives at 0.5, when A has 3 left; both are
    # served at 1: B leaves at 1.5 with A at 2 left, then A alone at 2 leaves at 2.5.
    node = make_node("ps", 2.0)
    assert isinstance(node, PSNode)
    a, b = Task(1, 4.0, 0.0), Task(2, 1.0, 0.5)
    node.arrive(a, 0.0)
    assert node.next_completion() == pytest.approx(2.0, abs=1e-12)
    node.arrive(b, 0.5)
    assert node.next_completion() == pytest.approx(1.5, abs=1e-12)
    assert node.complete(1.5) is b
    assert node.next_completion() == pytest.approx(2.5, abs=1e-12)
    assert node.complete(2.5) is a
    assert node.time_at == pytest.approx([0.0, 1.5, 1.0], abs=1e-12)
    assert node.task_seconds == pytest.approx(0.5 + 2 * 1.0 + 1.0, abs=1e-12)


def test_fcfs_order_waits_and_integrals() -> None:
    # speed 2: T1 (work 2) at 0 runs 0-1; T2 (work 1) and T3 (work 4) arrive at 0.5 and wait;
    # T2 runs 1-1.5, T3 1.5-3.5
    node = FCFSNode(2.0)
    t1, t2, t3 = Task(1, 2.0, 0.0), Task(2, 1.0, 0.5), Task(3, 4.0, 0.5)
    assert node.arrive(t1, 0.0) is False
    assert node.next_completion() == 1.0
    assert node.arrive(t2, 0.5) is True
    assert node.arrive(t3, 0.5) is True
    assert node.next_completion() == 1.0
    assert node.complete(1.0) is t1
    assert node.next_completion() == 1.5
    assert node.complete(1.5) is t2
    assert node.next_completion() == 3.5
    assert node.complete(3.5) is t3
    assert node.next_completion() == math.inf
    # x = 1 on [0, 0.5], 3 on [0.5, 1], 2 on [1, 1.5], 1 on [1.5, 3.5], 0 on [3.5, 5]
    t4 = Task(4, 1.0, 5.0)
    assert node.arrive(t4, 5.0) is False
    assert node.next_completion() == 5.5
    assert node.time_at == pytest.approx([1.5, 2.5, 0.5, 0.5], abs=1e-12)
    assert node.task_seconds == pytest.approx(0.5 + 1.5 + 1.0 + 2.0, abs=1e-12)


def test_pool_serves_every_task_at_once() -> None:
    # speed 1/2: T1 (work 1) at 0 leaves at 2; T2 (work 0.25) at 1 leaves at 1.5, first
    node = PoolNode(0.5, TableUtility([0, 2, 3]))
    t1, t2 = Task(1, 1.0, 0.0), Task(2, 0.25, 1.0)
    assert node.arrive(t1, 0.0) is False
    assert node.next_completion() == 2.0
    assert node.arrive(t2, 1.0) is False
    assert node.next_completion() == 1.5
    assert node.complete(1.5) is t2
    assert node.complete(2.0) is t1
    assert node.next_completion() == math.inf
    assert node.time_at == pytest.approx([0.0, 1.5, 0.5], abs=1e-12)
    assert node.task_seconds == pytest.approx(1.0 + 2 * 0.5 + 0.5, abs=1e-12)
    assert node.utility_seconds == pytest.approx(1.0 * 2 + 0.5 * 3 + 0.5 * 2, abs=1e-12)


def test_slta_learns_again_only_once_every_told_pool_has_answered() -> None:
    # r = 5 -> 4 by the decrement of R5_LEARNING; until the pools told of epoch 4 answer, a state that
    # calls for another decrement leaves r alone; after the last answer it moves again
    world = slta_world()
    disp = world.disp
    assert isinstance(disp, SLTADispatcher)
    prime(disp, 5, {0, 5, 6, 7}, {3, 4})
    route = disp.dispatch()
    assert disp.r == 4
    told = sorted({m.node for m in route.messages})
    assert told and sorted(disp.unsettled) == told
    # at r = 4, i_{r-1} is class 1: green tokens of class 1 and plenty in all call for r -> 3
    green = {0, 1, 2, 3, 4, 5, 6, 7}
    for k in told[:-1]:
        prime_keep = set(disp.unsettled)
        prime(disp, 4, green, set())
        disp.unsettled.update(prime_keep)
        data = (disp.epoch, 4, disp.seen_seq[k], True, False, world.x[k], disp.sent[k])  # all sent arrived
        answer = Message("token_epoch", k, data, 0)
        disp.on_message(answer)
        disp.dispatch()
        assert disp.r == 4, f"r moved while pools {sorted(disp.unsettled)} had not answered"
    last = told[-1]
    disp.on_message(
        Message(
            "token_epoch",
            last,
            (disp.epoch, 4, disp.seen_seq[last], True, False, world.x[last], disp.sent[last]),
            0,
        )
    )
    assert not disp.unsettled
    prime(disp, 4, green, set())
    disp.dispatch()
    assert disp.r == 3
