"""Prequal's rules, driven event by event (Wydrowski et al. 2024, arXiv 2312.10172; docs/spec.md, prequal).

Every expectation is worked out by hand in the comments from the rules as the paper states them: probes
per query, the probe pool's reuse budget (Eq. 1), age limit, size and removals (worst and oldest in turn),
the hot-cold lexicographic choice with the RIF quantile, and the uniform fallback with an empty pool.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.theory import predict
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.policies import make_dispatcher, make_node_sides
from lbtestbed.policies.base import DispatcherSide, Message, Route
from lbtestbed.policies.prequal import PrequalDispatcher, PrequalNode, PrequalParams, reuse_budget
from lbtestbed.spec import parse_spec


def experiment(n: int = 10, **params: Any) -> Experiment:
    return parse_spec(
        {
            "name": "prequal-rules",
            "seed": 3,
            "classes": [{"name": "servers", "count": n, "discipline": "ps"}],
            "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "prequal", **params},
            "run": {"warmup": 1.0, "duration": 10.0},
        }
    )


def dispatcher(n: int = 10, seed: int = 1, **params: Any) -> PrequalDispatcher:
    d = make_dispatcher(experiment(n, **params), random.Random(seed))
    assert isinstance(d, PrequalDispatcher)
    return d


def reply(d: PrequalDispatcher, node: int, rif: int, latency: float, at: float, seq: int = 0) -> None:
    """Deliver a probe reply to ``d`` at model time ``at`` (``seq``: a number ``d`` has sent)."""
    d.now = at
    assert d.on_message(Message("prequal_reply", node, (seq, rif, latency), d.index)) == ()


def decide(d: PrequalDispatcher, at: float) -> Route:
    d.now = at
    route = d.dispatch()
    assert isinstance(route, Route)
    return route


def primed(n: int = 10, **params: Any) -> PrequalDispatcher:
    """A dispatcher that has sent its first query's probes (so replies numbered below r_probe are its own),
    and whose pool is still empty."""
    d = dispatcher(n, **params)
    assert decide(d, 0.0).outcome == "random"
    return d


def test_the_defaults_are_the_papers() -> None:
    # section 4: a pool of m = 16, a max age of 1 s, r_remove = 1, delta = 1; section 5: r_probe = 3 probes
    # per query and Q_RIF = 2^(-1/4) ~ 0.84
    p = experiment().policy
    assert p == PrequalParams()
    assert (p.r_probe, p.r_remove, p.pool_size, p.max_age, p.delta) == (3.0, 1.0, 16, 1.0, 1.0)
    assert p.q_rif == pytest.approx(0.8409, abs=1e-4)
    assert p.b_reuse is None


def test_reuse_budget_is_equation_1() -> None:
    # n = 100, m = 16, r_probe = 3, r_remove = 1, delta = 1: (1 - 16/100) * 3 - 1 = 2.52 - 1 = 1.52, and
    # b_reuse = max(1, (1 + 1) / 1.52) = 1.3157...
    assert reuse_budget(PrequalParams(), 100) == pytest.approx(2 / 1.52)
    # r_probe = 5, delta = 0: (0.84 * 5 - 1) = 3.2, 1 / 3.2 < 1, so the max gives 1
    assert reuse_budget(PrequalParams(r_probe=5.0, delta=0.0), 100) == 1.0
    # n = 10 < m = 16: (1 - 1.6) * 3 - 1 = -2.8, the quotient 2 / -2.8 is negative and the max is 1
    assert reuse_budget(PrequalParams(), 10) == 1.0
    # a zero denominator (m/n = 2/3, r_probe = 3, r_remove = 1: 1 - 1 = 0) is read from below: 1
    assert reuse_budget(PrequalParams(pool_size=8), 12) == 1.0
    # a spec's own budget is taken as it is
    assert reuse_budget(PrequalParams(b_reuse=2.0), 100) == 2.0
    assert dispatcher(100).b_reuse == pytest.approx(2 / 1.52)


def test_each_query_sends_r_probe_probes_to_distinct_nodes_numbered_in_turn() -> None:
    d = dispatcher(100, r_probe=3)
    first, second = decide(d, 0.0), decide(d, 0.5)
    for route, numbers in ((first, (0, 1, 2)), (second, (3, 4, 5))):
        assert [m.kind for m in route.messages] == ["prequal_probe"] * 3
        assert tuple(m.data[0] for m in route.messages) == numbers
        assert len({m.node for m in route.messages}) == 3  # without replacement
        assert {m.dispatcher for m in route.messages} == {0}
    # dispatcher 2 of several numbers its own probes and signs them with its index
    other = make_dispatcher(experiment(100), random.Random(1), index=2, dispatchers=3)
    assert {m.dispatcher for m in other.dispatch().messages} == {2}  # type: ignore[union-attr]


def test_the_probes_targets_do_not_depend_on_what_the_pool_holds() -> None:
    """Issue 26: the n-th query's probes go to the same nodes whatever the pool holds, so that a twin whose
    pool parts from the cluster's still probes where the cluster did. Two dispatchers of the same stream:
    one hears no reply (each query falls back to a random node: a draw each), the other hears every probe
    answered, by node k with RIF 1 and latency k + 1 (no two alike: no tie to break, no draw). They send
    the same probes, numbered alike (on one stream the fallback's draws shifted the first one's)."""
    lonely, heard = dispatcher(20, seed=7), dispatcher(20, seed=7)
    alone, answered = [], []
    for q in range(500):
        alone.append(decide(lonely, float(q)).messages)
        route = decide(heard, float(q))
        answered.append(route.messages)
        for m in route.messages:  # 0.5 old at the next query: in the pool (max_age = 1)
            reply(heard, m.node, 1, m.node + 1.0, at=q + 0.5, seq=m.data[0])
    assert {decide(lonely, 500.0).outcome, decide(heard, 500.0).outcome} == {"random", "hcl_cold"}
    assert alone == answered
    # still uniform: each node is one of a query's 3 distinct targets with probability 3/20, so its count
    # over 500 queries is binomial(500, 0.15), sd sqrt(500 * 0.15 * 0.85) = 8.0: 75 +- 5 sd = +- 40
    counts = Counter(m.node for msgs in alone for m in msgs)
    assert all(abs(counts[k] - 75) < 40 for k in range(20))


def test_a_fractional_probe_rate_is_its_mean() -> None:
    # r_probe = 2.5: each query sends 2 or 3 probes, 2.5 on average; over 2000 queries the total has
    # standard deviation 0.5 * sqrt(2000) = 22.4, so 5000 +- 4.5 sd = +- 100
    d = dispatcher(100, r_probe=2.5)
    counts = Counter(len(decide(d, 0.0).messages) for _ in range(2000))
    assert set(counts) == {2, 3}
    assert abs(2 * counts[2] + 3 * counts[3] - 5000) < 100


def test_an_empty_pool_falls_back_to_a_uniform_node() -> None:
    # no reply ever arrives: every query goes to a uniformly random node; 4 nodes, 4000 queries: each
    # count is binomial(4000, 1/4), sd sqrt(4000 * 3/16) = 27.4, so 1000 +- 5 sd = +- 137
    d = dispatcher(4, r_probe=1)
    routes = [decide(d, 0.0) for _ in range(4000)]
    assert {r.outcome for r in routes} == {"random"}
    counts = Counter(r.node for r in routes)
    assert all(abs(counts[k] - 1000) < 137 for k in range(4))


def test_hcl_takes_the_coldest_fastest_not_the_fastest() -> None:
    # ten replies with RIF 0..9; Q_RIF = 2^(-1/4) = 0.8409: ceil(0.8409 * 10) = ceil(8.41) = 9, so theta is
    # the 9th smallest RIF, 8, and only the probe with RIF 9 is hot. Its latency 0.1 is the lowest, but a
    # hot probe loses to every cold one: among the cold the lowest latency is 0.7, node 18's (RIF 8).
    d = primed(100, r_probe=10, r_remove=0)
    latencies = [5.0, 4.0, 3.0, 2.0, 1.5, 1.2, 0.9, 0.8, 0.7, 0.1]
    for i, lat in enumerate(latencies):
        reply(d, node=10 + i, rif=i, latency=lat, at=0.1, seq=i)
    route = decide(d, 0.2)
    assert (route.node, route.outcome) == (18, "hcl_cold")


def test_hcl_takes_the_lowest_rif_when_all_are_hot_and_used_probes_leave() -> None:
    # b_reuse = 1: a probe serves one query. Replies, oldest first: A=node 1 (RIF 5, latency 1.0),
    # B=node 2 (RIF 6, latency 0.5), C=node 3 (RIF 0, latency 0.2), D=node 4 (RIF 0, latency 0.3).
    # Q_RIF = 0.5 over the last four RIFs [0, 0, 5, 6]: ceil(0.5 * 4) = 2, theta = 0; A and B are hot.
    d = primed(10, r_probe=4, r_remove=0, b_reuse=1, q_rif=0.5)
    for seq, (node, rif, lat) in enumerate([(1, 5, 1.0), (2, 6, 0.5), (3, 0, 0.2), (4, 0, 0.3)]):
        reply(d, node, rif, lat, at=0.1, seq=seq)
    # cold C (0.2) beats cold D (0.3); C is used up and leaves; then D; then only A and B, both hot:
    # the lowest RIF, A (5), although B is faster; then B; then the pool is empty: uniform fallback
    got = [(r.node, r.outcome) for r in (decide(d, 0.2 + i / 10) for i in range(5))]
    assert got[:4] == [(3, "hcl_cold"), (4, "hcl_cold"), (1, "hcl_hot"), (2, "hcl_hot")]
    assert got[4][1] == "random"
    assert d.removed["used_up"] == 4


def test_a_probe_serves_b_reuse_queries() -> None:
    # b_reuse = 2: P = node 5 (latency 0.1) serves two queries and leaves, then Q = node 6 (latency 0.5)
    d = primed(10, r_probe=2, r_remove=0, b_reuse=2)
    reply(d, 5, 0, 0.1, at=0.1, seq=0)
    reply(d, 6, 0, 0.5, at=0.1, seq=1)
    assert [decide(d, 0.2 + i / 10).node for i in range(3)] == [5, 5, 6]


def test_probes_older_than_max_age_leave_the_pool() -> None:
    # max_age = 1: P = node 7 (latency 0.1) arrives at 0, Q = node 8 (latency 0.9) at 0.5. At 1.0 P is
    # exactly 1 old and stays (it is the fastest); at 1.2 P is 1.2 old and gone, Q (0.7 old) is taken; at
    # 1.6 Q is 1.1 old and gone: the pool is empty. (b_reuse = 100: no probe is used up; r_remove = 0.)
    d = primed(10, r_probe=2, r_remove=0, b_reuse=100)
    reply(d, 7, 0, 0.1, at=0.0, seq=0)
    reply(d, 8, 0, 0.9, at=0.5, seq=1)
    assert decide(d, 1.0).node == 7
    assert decide(d, 1.2).node == 8
    assert decide(d, 1.6).outcome == "random"
    assert d.removed["aged"] == 2


def test_each_query_removes_the_worst_and_the_oldest_in_turn() -> None:
    # r_remove = 1, b_reuse = 100 (no probe is used up). Replies: A=node 1 (RIF 0, latency 0.4) at 0.0,
    # B=node 2 (RIF 3, latency 0.2) at 0.1, C=node 3 (RIF 0, latency 0.9) at 0.2, D=node 4 (RIF 1,
    # latency 0.3) at 0.3. Q_RIF = 0.5 over [0, 0, 1, 3]: ceil(2) = 2, theta = 0: B and D are hot.
    d = primed(10, r_probe=4, r_remove=1, q_rif=0.5, b_reuse=100)
    for seq, (node, rif, lat, at) in enumerate(
        [(1, 0, 0.4, 0.0), (2, 3, 0.2, 0.1), (3, 0, 0.9, 0.2), (4, 1, 0.3, 0.3)]
    ):
        reply(d, node, rif, lat, at=at, seq=seq)
    # query 1: cold A (0.4) beats cold C (0.9); then the worst goes: the hot one with the highest RIF, B
    assert decide(d, 0.4).node == 1 and set(d.pool) == {1, 3, 4}
    # query 2: A again; then the oldest goes: A (received at 0.0)
    assert decide(d, 0.5).node == 1 and set(d.pool) == {3, 4}
    # query 3: C, the only cold one; then the worst: hot D
    assert decide(d, 0.6).node == 3 and set(d.pool) == {3}
    # query 4: C; then the oldest, C: the pool is empty and query 5 falls back
    assert decide(d, 0.7).node == 3 and not d.pool
    assert decide(d, 0.8).outcome == "random"
    assert (d.removed["worst"], d.removed["oldest"]) == (2, 2)


def test_with_no_hot_probe_the_worst_is_the_slowest() -> None:
    # Q_RIF = 1: theta is the largest RIF, nothing is hot; the worst is the highest latency, node 2 (0.9)
    d = primed(10, r_probe=3, r_remove=1, q_rif=1.0, b_reuse=100)
    for seq, (node, lat) in enumerate([(1, 0.5), (2, 0.9), (3, 0.1)]):
        reply(d, node, rif=seq, latency=lat, at=0.1, seq=seq)
    assert decide(d, 0.2).node == 3
    assert set(d.pool) == {1, 3}


def test_a_full_pool_drops_its_oldest_and_a_node_keeps_one_probe() -> None:
    d = primed(10, r_probe=4, pool_size=2, r_remove=0)
    reply(d, 1, 0, 0.1, at=0.0, seq=0)
    reply(d, 2, 0, 0.2, at=0.1, seq=1)
    reply(d, 3, 0, 0.3, at=0.2, seq=2)  # the pool holds 2: node 1's, the oldest, makes room
    assert list(d.pool) == [2, 3] and d.removed["full"] == 1
    reply(d, 2, 4, 0.9, at=0.3, seq=3)  # node 2's newer probe takes the place of its older one
    assert list(d.pool) == [3, 2] and (d.pool[2].rif, d.pool[2].latency) == (4, 0.9)
    reply(d, 2, 0, 0.0, at=0.4, seq=1)  # an overtaken reply (probe 1 < 3) is dropped
    assert (d.pool[2].rif, d.pool[2].received) == (4, 0.3)


def test_replies_to_probes_never_sent_are_refused() -> None:
    d = primed(10, r_probe=2)  # probes 0 and 1 went out
    with pytest.raises(ValueError, match="has sent 2"):
        reply(d, 1, 0, 0.1, at=0.1, seq=2)
    with pytest.raises(ValueError, match="RIF"):
        d.on_message(Message("prequal_reply", 1, (0, -1, 0.1)))


def test_a_node_down_leaves_the_pool_and_gets_no_probe() -> None:
    d = primed(3, r_probe=2, r_remove=0)
    reply(d, 0, 0, 0.1, at=0.1, seq=0)
    d.on_node_down(0)
    assert not d.pool
    route = decide(d, 0.2)
    assert route.node != 0 and {m.node for m in route.messages} == {1, 2}


def test_the_node_reports_its_rif_and_the_median_latency_at_that_rif() -> None:
    exp = experiment(4, latency_window=3)
    side = make_node_sides(exp, random.Random(0))[2]
    assert isinstance(side, PrequalNode)
    probe = Message("prequal_probe", 2, (7,), 1)
    # nothing served yet: latency 0; answered to dispatcher 1, the prober, with its probe's number
    assert side.on_message(probe, 3) == (Message("prequal_reply", 2, (7, 3, 0.0), 1),)
    for found, latency in [(0, 1.0), (0, 3.0), (1, 2.0), (3, 10.0), (0, 2.0)]:
        side.on_served(found, latency)
    assert side.estimate(0) == 2.0  # median of 1, 3, 2
    assert side.estimate(1) == 2.0  # the one task that found 1
    assert side.estimate(5) == 10.0  # none found 5: the nearest count is 3
    assert side.estimate(2) == 6.0  # none found 2: 1 and 3 are as near, median of 2 and 10
    side.on_served(0, 4.0)  # the window at 0 holds 3: the first (1.0) drops out, the others' stay
    assert side.estimate(0) == 3.0  # median of 3, 2, 4
    assert side.estimate(1) == 2.0
    side.on_served(1, 4.0)
    assert side.estimate(1) == 3.0  # median of 2, 4
    assert side.on_message(probe, 1)[0].data == (7, 1, 3.0)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"r_probe": 11}, "r_probe"),
        ({"q_rif": 1.5}, "q_rif"),
        ({"b_reuse": 0.5}, "b_reuse"),
        ({"pool_size": 0}, "pool_size"),
        ({"max_age": 0}, "max_age"),
        ({"d": 2}, "d"),
    ],
)
def test_bad_parameters_are_named(params: dict[str, Any], key: str) -> None:
    with pytest.raises(SpecError, match=f"policy.{key}"):
        experiment(10, **params)


def test_the_theory_gives_messages_and_says_why_nothing_else() -> None:
    """2 r_probe messages per task (r_probe = 2.5: 5); every queue metric null, with the reason."""
    result = predict(experiment(10, r_probe=2.5))
    assert result.metrics["messages_per_task"]["value"] == 5.0
    assert result.metrics["mean_sojourn"]["value"] is None
    nulls = {n["metric"]: n["null"] for n in result.to_json()["notes"] if "null" in n}
    assert nulls["mean_sojourn"].startswith("Prequal has no queueing theory")


def test_with_several_dispatchers_each_pool_holds_its_own_probes_answers() -> None:
    """K = 3 in the simulator (docs/spec.md, "dispatchers and split"): every reply reaches the dispatcher
    whose probe it answers, so each pool is fed by its own probes only; each dispatcher numbers its own
    probes, and every probe is answered: 2 r_probe = 6 messages per task in all."""
    exp = parse_spec(
        {
            "name": "prequal-k3",
            "seed": 4,
            "classes": [{"name": "servers", "count": 10, "discipline": "ps"}],
            "workload": {"load": 0.6, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "prequal", "dispatchers": 3},
            "run": {"warmup": 5.0, "duration": 60.0, "batches": 5},
        }
    )
    sim = Simulator(exp)
    probes: set[tuple[int, int, int]] = set()  # (prober, probe number, node) of every probe sent
    replies: list[tuple[int, int, int]] = []  # (receiver, probe number, node) of every reply
    for d in sim.dispatchers:

        def dispatch(d: DispatcherSide = d, on: Any = d.dispatch) -> Route:
            route = on()
            probes.update((m.dispatcher, m.data[0], m.node) for m in route.messages)
            assert {m.dispatcher for m in route.messages} <= {d.index}
            return route  # type: ignore[no-any-return]

        def record(msg: Message, d: DispatcherSide = d, on: Any = d.on_message) -> tuple[Message, ...]:
            replies.append((d.index, msg.data[0], msg.node))
            return on(msg)  # type: ignore[no-any-return]

        d.dispatch = dispatch  # type: ignore[method-assign]
        d.on_message = record  # type: ignore[method-assign]
    raw = sim.run()
    assert {r for r, _, _ in replies} == {0, 1, 2}
    assert set(replies) == probes and len(replies) == len(probes)  # each answered once, to its prober
    counts, arrivals = raw.ratios["messages_per_task"]
    assert sum(counts) == 6 * sum(arrivals)
