"""Several dispatchers (``policy.dispatchers = K``): the split, the simulator's K dispatcher sides, and JIQ
with two dispatchers against an exact Markov chain written here from the rule in docs/spec.md.

JIQ-Random (Lu et al. 2011) on n FCFS nodes of speed 1, exponential work of mean 1, Poisson arrivals split
uniformly over K dispatchers. The state is every node's number of tasks q_k and, for each node and
dispatcher, whether that dispatcher holds a token of the node. An arrival at dispatcher d uses one of
d's tokens chosen uniformly (its node gets the task, idle or not: a token stays valid until used) or, with
none, goes to a uniformly random node. A node whose last task leaves sends one token to a uniformly random
dispatcher; a dispatcher holds at most one token per node (a newer one of the same node replaces it). The
chain is truncated at Q tasks per node (arrivals beyond are not taken); the test checks that the
truncation does not matter: the values at Q and at Q - 4 agree to 1e-5, and the mass on the boundary is
below 1e-6. Two nodes keep the chain small enough for a direct sparse solve (4,000 states at K = 2).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy import stats

from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.theory import jiq_stale
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.workload import DispatcherSplit
from lbtestbed.policies import DispatcherSide, Message, make_dispatcher, make_node_sides
from lbtestbed.policies.jiq import IdleTokenSender, JIQDispatcher
from lbtestbed.policies.jsq import CountingDispatcher
from lbtestbed.policies.slta import SLTADispatcher
from lbtestbed.spec import parse_spec

N, LOAD, Q = 2, 0.5, 20  # nodes, load per node, truncation (tasks per node)


def jiq(dispatchers: int, **extra: object) -> Experiment:
    return parse_spec(
        {
            "name": "jiq-k",
            "seed": 21,
            "classes": [{"name": "s", "count": N, "discipline": "fcfs"}],
            "workload": {"load": LOAD, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "jiq", "dispatchers": dispatchers, **extra},
            "run": {"warmup": 200.0, "duration": 40_000.0, "batches": 20},
        }
    )


def exact_jiq(dispatchers: int, Q: int = Q, sq: bool = False) -> tuple[float, float, float]:
    """(mean tasks per node, P(an arrival finds its node busy), stationary mass with some node at Q).
    ``sq``: JIQ-SQ(K), the idle node's token to the dispatcher holding the fewest tokens (ties uniform)."""
    K, lam = dispatchers, LOAD * N
    queues = list(itertools.product(range(Q + 1), repeat=N))
    tokens = list(itertools.product((0, 1), repeat=N * K))  # t[k * K + d]: d holds a token of node k
    states = [(q, t) for q in queues for t in tokens]
    index = {s: i for i, s in enumerate(states)}
    rows: list[int] = []
    cols: list[int] = []
    rates: list[float] = []
    wait = np.zeros(len(states))  # per state: the probability that an arrival waits

    def go(i: int, q: tuple[int, ...], t: tuple[int, ...], rate: float) -> None:
        rows.append(i)
        cols.append(index[(q, t)])
        rates.append(rate)

    for i, (q, t) in enumerate(states):
        for d in range(K):  # an arrival at dispatcher d, rate lam / K
            held = [k for k in range(N) if t[k * K + d]]
            choices = [(k, 1.0 / len(held)) for k in held] if held else [(k, 1.0 / N) for k in range(N)]
            for k, p in choices:
                wait[i] += p * (q[k] > 0) / K
                if q[k] == Q:
                    continue  # truncated: not taken
                nt = list(t)
                if held:
                    nt[k * K + d] = 0
                go(i, tuple(x + (j == k) for j, x in enumerate(q)), tuple(nt), lam / K * p)
        for k in range(N):  # a departure at node k, rate 1
            if q[k] == 0:
                continue
            nq = tuple(x - (j == k) for j, x in enumerate(q))
            if nq[k] == 0:
                held = [sum(t[j * K + d] for j in range(N)) for d in range(K)]
                # its token to a uniformly random dispatcher, or to one of those holding the fewest
                to = [d for d in range(K) if not sq or held[d] == min(held)]
                for d in to:
                    nt = list(t)
                    nt[k * K + d] = 1
                    go(i, nq, tuple(nt), 1.0 / len(to))
            else:
                go(i, nq, t, 1.0)
    m = len(states)
    out = sp.csr_matrix((rates, (rows, cols)), shape=(m, m))
    generator = (out - sp.diags(np.asarray(out.sum(axis=1)).ravel())).T.tolil()
    generator[0, :] = 1.0  # replace one balance equation by the normalisation
    rhs = np.zeros(m)
    rhs[0] = 1.0
    pi = spla.spsolve(generator.tocsc(), rhs)
    assert pi.min() > -1e-12
    total = np.array([sum(q) for q, _ in states], float)
    edge = np.array([max(q) == Q for q, _ in states], float)
    return float(pi @ total) / N, float(pi @ wait), float(pi @ edge)


def test_the_split_is_seeded_and_fair() -> None:
    """Random: the same sequence from the same seed, about 1/K of the arrivals each (a binomial bound);
    round robin: 0, 1, ..., K-1 in turn; one dispatcher: always 0, drawing nothing."""
    exp = jiq(4)
    a, b = DispatcherSplit(exp).take(40_000), DispatcherSplit(exp).take(40_000)
    assert a == b and DispatcherSplit(exp, replication=1).take(50) != a[:50]
    bound = 4 * math.sqrt(40_000 * 0.25 * 0.75)  # 4 standard deviations of a binomial count
    assert all(abs(a.count(d) - 10_000) < bound for d in range(4))
    assert DispatcherSplit(jiq(3, split="round_robin")).take(7) == [0, 1, 2, 0, 1, 2, 0]
    assert DispatcherSplit(jiq(1)).take(5) == [0] * 5


def test_every_dispatcher_side_gets_its_own_arrivals_and_messages() -> None:
    """In the simulator dispatcher d routes exactly the arrivals the split gives it, every idle token
    reaches the dispatcher it names, and tokens reach every dispatcher."""
    exp = jiq(3)
    sim = Simulator(exp)
    routed = [0, 0, 0]
    tokens = [0, 0, 0]
    for i, side in enumerate(sim.dispatchers):
        assert side.index == i
        dispatch, on_message = side.dispatch, side.on_message

        def count_dispatch(i=i, dispatch=dispatch):  # type: ignore[no-untyped-def]
            routed[i] += 1
            return dispatch()

        def count_message(msg, i=i, on_message=on_message):  # type: ignore[no-untyped-def]
            assert msg.dispatcher == i  # a message reaches only the dispatcher it was sent to
            tokens[i] += 1
            return on_message(msg)

        side.dispatch = count_dispatch  # type: ignore[method-assign]
        side.on_message = count_message  # type: ignore[method-assign]
    raw = sim.run()
    split = DispatcherSplit(exp).take(sum(routed))  # the arrivals so far, in order
    assert routed == [split.count(d) for d in range(3)]
    assert sum(routed) == sim.count  # every task that arrived was routed once
    assert all(n > 0 for n in tokens)
    assert raw.decisions["idle_token"] > 0 and raw.decisions["random"] > 0


@pytest.mark.parametrize("dispatchers", [1, 2])
def test_jiq_with_k_dispatchers_matches_its_exact_markov_chain(dispatchers: int) -> None:
    """The simulator's mean tasks per node and wait probability agree with the exact chain within a
    99.9 % t interval of the batch means (two metrics, two settings: a family of four at about 0.4 %)."""
    mean_exact, wait_exact, edge = exact_jiq(dispatchers)
    coarser = exact_jiq(dispatchers, Q - 4)
    assert edge < 1e-6 and max(abs(mean_exact - coarser[0]), abs(wait_exact - coarser[1])) < 1e-5
    result = summarize(jiq(dispatchers), [simulate_once(jiq(dispatchers))])
    widen = stats.t.ppf(0.9995, 19) / stats.t.ppf(0.975, 19)  # the 95 % intervals have 19 df
    for metric, exact in (("mean_tasks_per_node", mean_exact), ("wait_probability", wait_exact)):
        est = result.metrics[metric]
        assert abs(est["value"] - exact) <= widen * est["ci95"], (metric, est, exact)


def test_jiq_sq_with_two_dispatchers_matches_its_exact_markov_chain() -> None:
    """JIQ-SQ(2) with two dispatchers: the idle node probes both and joins the one holding fewer tokens.
    The simulator against the chain (as above), and the chain tells it apart from JIQ-Random by far more
    than the simulation's interval."""
    exp = jiq(2, d=2)
    mean_exact, wait_exact, edge = exact_jiq(2, sq=True)
    coarser = exact_jiq(2, Q - 4, sq=True)
    assert edge < 1e-6 and max(abs(mean_exact - coarser[0]), abs(wait_exact - coarser[1])) < 1e-5
    raw = simulate_once(exp)
    result = summarize(exp, [raw])
    widen = stats.t.ppf(0.9995, 19) / stats.t.ppf(0.975, 19)
    for metric, exact in (("mean_tasks_per_node", mean_exact), ("wait_probability", wait_exact)):
        est = result.metrics[metric]
        assert abs(est["value"] - exact) <= widen * est["ci95"], (metric, est, exact)
    # the same tasks under JIQ-Random, batch by batch: the difference is the chain's, and not zero
    rnd = simulate_once(jiq(2))
    gap = [
        rw / ra - sw / sa
        for rw, ra, sw, sa in zip(
            *rnd.ratios["wait_probability"], *raw.ratios["wait_probability"], strict=True
        )
    ]
    half = stats.t.ppf(0.9995, len(gap) - 1) * stats.sem(gap)
    assert abs(np.mean(gap) - (exact_jiq(2)[1] - wait_exact)) <= half and np.mean(gap) > half
    # every idle period costs 2 probes, 2 answers and 1 token
    by_kind = result.metrics["messages_per_task"]["by_kind"]
    for kind in ("token_probe", "token_count"):
        assert by_kind[kind] == pytest.approx(2 * by_kind["idle_token"], rel=1e-3)


def test_two_dispatchers_make_jiq_wait_more_than_one_and_the_chain_tells_them_apart() -> None:
    """The multi-dispatcher effect the test above must see: with K = 2 arrivals wait noticeably more
    often (a token may sit at the other dispatcher) than with K = 1, by many times the simulation's
    interval, so a simulator that ran one dispatcher side for K = 2 would fail it."""
    one, two = exact_jiq(1), exact_jiq(2)
    sim_two = summarize(jiq(2), [simulate_once(jiq(2))]).metrics["wait_probability"]
    assert two[1] - one[1] > 5 * sim_two["ci95"]


@pytest.mark.parametrize("policy", ["random", "power_of_d"])
def test_theory_that_k_does_not_change_stays(policy: str) -> None:
    """random and power_of_d predict the same with any K."""
    from lbtestbed.analysis.theory.predict import predict

    one, four = predict(jiq(1, name=policy)), predict(jiq(4, name=policy))
    for metric in ("mean_sojourn", "mean_tasks_per_node", "wait_probability"):
        assert four.metrics[metric]["value"] == one.metrics[metric]["value"] is not None


def herd(dispatchers: int, **extra: object) -> Experiment:
    return parse_spec(
        {
            "name": "herd",
            "seed": 2,
            "classes": [{"name": "s", "count": 24, "discipline": "fcfs"}],
            "workload": {"load": 0.85, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": "jiq", "dispatchers": dispatchers, **extra},
            "run": {"warmup": 10.0, "duration": 100.0},
        }
    )


@pytest.mark.parametrize(("k", "d"), [(2, 1), (4, 1), (4, 2), (8, 3)])
def test_jiq_with_k_dispatchers_predicts_lu_et_al_limit(k: int, d: int) -> None:
    """JIQ-Random and JIQ-SQ(d) with n / K nodes per dispatcher (Lu et al. 2011, section 4), computed here
    on their own: the fraction rho of dispatchers holding a token solves rho / (1 - rho) = r (1 - lambda)
    (random), or sum_i rho^((d^i - 1)/(d - 1)) = r (1 - lambda) (SQ(d), solved by brentq); each node is
    then an M/M/1 queue's busy periods at lambda' = lambda (1 - rho)."""
    from scipy.optimize import brentq

    from lbtestbed.analysis.theory.predict import predict

    lam, m = 0.85, 24 / k * 0.15
    if d == 1:
        rho = m / (1 + m)
    else:
        rho = brentq(lambda x: sum(x ** ((d**i - 1) / (d - 1)) for i in range(1, 60)) - m, 0, 1 - 1e-12)
    low = lam * (1 - rho)
    result = predict(herd(k, d=d))
    metrics = result.metrics
    # where the stale-token model applies (24 nodes, exponential work) its value replaces Lu et al.'s,
    # which stays beside it (tested below); JIQ-SQ(3) with 8 dispatchers is beyond its split's reach
    stale = d == 1 or k <= jiq_stale.SQ_SPLIT_MAX

    def lu(metric: str) -> float:
        m = metrics[metric]
        return float(m["limit"] if stale else m["value"])

    assert lu("mean_sojourn") == pytest.approx(1 / (1 - low), rel=1e-9)
    assert lu("mean_tasks_per_node") == pytest.approx(lam / (1 - low), rel=1e-9)
    assert lu("wait_probability") == pytest.approx((1 - rho) * lam, rel=1e-9)
    tail = [e["value"] for e in metrics["occupancy_tail"]["s"]]
    assert tail[:4] == pytest.approx([1, lam, lam * low, lam * low**2], rel=1e-9)
    assert lu("messages_per_task") == pytest.approx((1 - low) * (1 + (2 * d if d > 1 else 0)))
    note = next(n for n in result.extras["notes"] if n["metric"] == "mean_sojourn")
    lu_note = note["limit"] if stale else note
    assert "Lu et al. 2011" in lu_note["source"] and "n / K = " in str(lu_note["assumes"])
    assert stale or any("stale-token model" in w for w in result.extras.get("warnings", []))
    # more dispatchers, fewer tokens each: the wait grows with K (one dispatcher: the old limit, 0)
    fewer = predict(herd(k // 2, d=min(d, k // 2))).metrics["wait_probability"]["value"]
    assert metrics["wait_probability"]["value"] > fewer


@pytest.mark.parametrize(("k", "d"), [(2, 1), (4, 2)])
def test_jiq_with_k_dispatchers_predicts_the_stale_token_chain_at_the_spec_n(k: int, d: int) -> None:
    """At the spec's n (24 nodes, exponential work, a random split) ``lbt predict`` gives the stale-token
    chain's values (jiq_stale.finite, tested against long simulations in tests/test_jiq_stale.py), as an
    approximation: regime limit, never counted in a verdict."""
    from lbtestbed.analysis.theory.predict import predict

    model = jiq_stale.finite(24, k, 0.85, d)
    result = predict(herd(k, d=d))
    metrics = result.metrics
    for metric, value in (
        ("mean_sojourn", model.mean_sojourn),
        ("mean_tasks_per_node", model.mean_tasks),
        ("wait_probability", model.wait),
        ("messages_per_task", model.messages_per_task),
    ):
        assert metrics[metric]["value"] == pytest.approx(value, rel=1e-12), metric
        assert metrics[metric]["regime"] == "limit"
    note = next(n for n in result.extras["notes"] if n["metric"] == "wait_probability")
    assert "stale tokens" in note["source"] and "approximation" in " ".join(note["assumes"])


def test_jiq_with_k_dispatchers_keeps_lu_et_al_where_the_chain_does_not_apply() -> None:
    """Deterministic work, or a round-robin split: the chain's assumptions fail, Lu et al.'s limit stays
    and a warning says why."""
    from lbtestbed.analysis.theory.predict import predict

    for extra, why in (({"split": "round_robin"}, "split"),):
        result = predict(herd(2, **extra))
        assert "limit" not in result.metrics["mean_sojourn"]
        note = next(n for n in result.extras["notes"] if n["metric"] == "mean_sojourn")
        assert "Lu et al. 2011" in note["source"]
        assert any(why in w for w in result.extras["warnings"]), result.extras["warnings"]
    slow = parse_spec(
        {
            "name": "herd",
            "seed": 2,
            "classes": [{"name": "s", "count": 24, "discipline": "fcfs"}],
            "workload": {"load": 0.85, "service": {"dist": "deterministic", "mean": 1.0}},
            "policy": {"name": "jiq", "dispatchers": 2},
            "run": {"warmup": 10.0, "duration": 100.0},
        }
    )
    assert any("exponential work" in w for w in predict(slow).extras["warnings"])


def test_a_full_view_has_the_theory_of_one_dispatcher() -> None:
    """jsq and slta with a full view of K dispatchers predict what one dispatcher does, saying so; with
    local views they have none."""
    from lbtestbed.analysis.theory.predict import predict

    for exp, metric in ((queues("jsq", 3, "full"), "mean_sojourn"), (pools("slta", 3, "full"), "utility")):
        one = predict(dataclasses.replace(exp, policy=dataclasses.replace(exp.policy, dispatchers=1)))
        full = predict(exp)
        assert full.metrics[metric]["value"] == one.metrics[metric]["value"] is not None
        note = next(n for n in full.extras["notes"] if n["metric"] == metric)
        assert "full view" in str(note["assumes"])
    local = predict(pools("slta", 3))
    assert local.metrics["utility"]["value"] is None and local.metrics["slta_r"]["value"] is None
    assert predict(queues("jsq", 3, "full")).metrics["messages_per_task"]["value"] == 5


@pytest.mark.parametrize("policy", ["round_robin", "least_request", "jsq"])
def test_a_policy_on_local_views_has_no_theory_with_several_dispatchers(policy: str) -> None:
    from lbtestbed.analysis.theory.predict import predict

    assert predict(jiq(1, name=policy)).metrics["mean_sojourn"]["value"] is not None
    result = predict(jiq(2, name=policy))
    assert result.metrics["mean_sojourn"]["value"] is None
    reasons = [n for n in result.extras["notes"] if n["metric"] == "mean_sojourn"]
    assert reasons and "2 dispatchers, each deciding on its own view" in str(reasons)


# ============================================================ every policy's K-dispatcher rule (docs/spec.md)


def pools(name: str, dispatchers: int, view: str = "local", **extra: object) -> Experiment:
    """Twelve pools of two classes (the demo's utilities) at 3 tasks per pool."""
    policy: dict[str, object] = {"name": name, "dispatchers": dispatchers, "view": view, **extra}
    if name == "slta":
        policy["beta_scale"] = 1.0
    return parse_spec(
        {
            "name": "pools-k",
            "seed": 5,
            "classes": [
                {"name": "small", "count": 6, "discipline": "pool", "utility": {"kind": "xlog", "r": 6}},
                {"name": "large", "count": 6, "discipline": "pool", "utility": {"kind": "xlog", "r": 9}},
            ],
            "workload": {"load": 3.0, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": policy,
            "run": {"warmup": 20.0, "duration": 200.0, "batches": 10},
        }
    )


def queues(name: str, dispatchers: int, view: str | None = None) -> Experiment:
    return parse_spec(
        {
            "name": "queues-k",
            "seed": 6,
            "classes": [{"name": "s", "count": 8, "discipline": "fcfs"}],
            "workload": {"load": 0.8, "service": {"dist": "exponential", "mean": 1.0}},
            "policy": {"name": name, "dispatchers": dispatchers, **({"view": view} if view else {})},
            "run": {"warmup": 20.0, "duration": 400.0, "batches": 10},
        }
    )


def picture(side: DispatcherSide, k: int) -> int:
    """The tasks a dispatcher side sees at node k."""
    if isinstance(side, SLTADispatcher):
        return side.xhat[k]
    assert isinstance(side, CountingDispatcher)
    return side._levels(k).level[k]


def watch(sim: Simulator, check: Callable[[int], None]) -> list[int]:
    """Call ``check(d)`` just before every decision of dispatcher d; the number of checks per dispatcher."""
    calls = [0] * len(sim.dispatchers)
    for d, side in enumerate(sim.dispatchers):

        def checked(d: int = d, dispatch: Callable[[], object] = side.dispatch) -> object:
            check(d)
            calls[d] += 1
            return dispatch()

        side.dispatch = checked  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize(
    "exp", [queues("jsq", 3, "full"), pools("jlmu", 3, "full"), pools("slta", 3, "full")]
)
def test_a_full_view_shows_every_dispatcher_the_true_state_at_every_decision(exp: Experiment) -> None:
    """With exact delivery every dispatcher of a full view sees every node's true task count when it
    decides, and SLTA's dispatchers hold one r: K dispatchers decide as one would."""
    sim = Simulator(exp)

    def check(d: int) -> None:
        side = sim.dispatchers[d]
        assert [picture(side, k) for k in range(exp.n)] == [node.x for node in sim.nodes]
        if isinstance(side, SLTADispatcher):
            assert {s.r for s in sim.dispatchers} == {side.r}  # type: ignore[attr-defined]

    calls = watch(sim, check)
    raw = sim.run()
    assert min(calls) > 100
    if exp.policy.name == "slta":  # r moved: sharing it was put to the test
        assert len(raw.r_series) > 2 and len({r for _, r in raw.r_series}) > 1


@pytest.mark.parametrize("exp", [queues("jsq", 3), pools("jlmu", 3), pools("slta", 3)])
def test_a_local_view_shows_each_dispatcher_exactly_its_own_tasks(exp: Experiment) -> None:
    """With a local view dispatcher d sees, at every node, the tasks it routed there that are still
    there (the node side's count of d's arrivals less its departures), and nothing of the others'."""
    sim = Simulator(exp)

    def check(d: int) -> None:
        side = sim.dispatchers[d]
        own = [s.arrived[d] - s.departed[d] for s in sim.sides]  # type: ignore[attr-defined]
        assert [picture(side, k) for k in range(exp.n)] == own

    calls = watch(sim, check)
    sim.run()
    assert min(calls) > 100
    assert any(sum(s.arrived) != s.arrived[0] for s in sim.sides)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("view", "per_task"), [("local", 1), ("full", 5)])
def test_what_a_view_costs_in_messages(view: str, per_task: int) -> None:
    """JSQ with K = 3: one departure notice per task with a local view; 2K - 1 = 5 with a full one
    (every arrival to the 2 others, every departure to all 3). Counted per task arrived in a batch, so a
    batch's departures may differ from its arrivals by the tasks in the system at its ends."""
    exp = queues("jsq", 3, view)
    result = summarize(exp, [simulate_once(exp)])
    by_kind = result.metrics["messages_per_task"]["by_kind"]
    assert set(by_kind) == ({"departure", "arrival"} if view == "full" else {"departure"})
    assert result.metrics["messages_per_task"]["value"] == pytest.approx(per_task, rel=0.01)
    if view == "full":
        assert by_kind["arrival"] == pytest.approx(2.0, abs=1e-12)  # exactly K - 1 per arrival


def test_full_view_notices_and_their_order() -> None:
    """The node side of a full view: an arrival of dispatcher 1's task tells 0 and 2 (A, D, X, s), a
    departure tells all three; a dispatcher keeps the others' count of the newest notice by s."""
    exp = queues("jsq", 3, "full")
    side = make_node_sides(exp, random.Random(1), dispatchers=3)[4]
    assert side.on_arrival(1, 1, ()) == (
        Message("arrival", 4, (0, 0, 1, 1), 0),
        Message("arrival", 4, (0, 0, 1, 1), 2),
    )
    side.on_arrival(2, 0, ())
    out = side.on_departure(1, 1)
    assert out == tuple(
        Message("departure", 4, (a, d, 1, 3), e) for e, (a, d) in enumerate([(1, 0), (1, 1), (0, 0)])
    )
    disp = make_dispatcher(exp, random.Random(2), 2, 3)
    assert isinstance(disp, CountingDispatcher)
    disp.on_message(Message("arrival", 4, (0, 0, 2, 2), 2))  # two tasks of the others after event 2
    disp.on_message(Message("arrival", 4, (0, 0, 1, 1), 2))  # an older notice, overtaken: ignored
    assert picture(disp, 4) == 2
    disp.on_message(Message("departure", 4, (0, 0, 1, 3), 2))
    assert picture(disp, 4) == 1
    for bad in [(0, 0, 1), (1, 0, 0, 3), (0, 0, -1, 3), (0, 0, 1, -1)]:
        with pytest.raises(ValueError):
            disp.on_message(Message("departure", 4, bad, 2))


def test_jiq_sq_node_probes_d_dispatchers_and_joins_the_fewest() -> None:
    """JIQ-SQ(2) with 4 dispatchers: an idle node asks 2 distinct dispatchers chosen uniformly, sends its
    token to the one holding fewer tokens, breaks ties uniformly, and drops a round a task overtook."""
    exp = queues("jiq", 4)
    exp = dataclasses.replace(exp, policy=dataclasses.replace(exp.policy, d=2))
    asked: list[tuple[int, ...]] = []
    chose: list[int] = []
    for seed in range(400):
        side = IdleTokenSender(exp, 3, random.Random(seed), 4)
        side.on_arrival(1, 0, ())
        probes = side.on_departure(0, 0)
        assert [m.kind for m in probes] == ["token_probe"] * 2 and all(m.data == (1,) for m in probes)
        pair = tuple(m.dispatcher for m in probes)
        assert len(set(pair)) == 2
        asked.append(tuple(sorted(pair)))
        assert side.on_message(Message("token_count", 3, (1, 5), pair[0]), 0) == ()
        if seed % 2:  # the second holds fewer: it gets the token
            (token,) = side.on_message(Message("token_count", 3, (1, 2), pair[1]), 0)
            assert token == Message("idle_token", 3, (1,), pair[1]) and side.report(0) == (0, 1, pair[1])
        else:  # a tie: either, uniformly
            (token,) = side.on_message(Message("token_count", 3, (1, 5), pair[1]), 0)
            chose.append(token.dispatcher == min(pair))
    pairs = {p: asked.count(p) for p in set(asked)}
    assert len(pairs) == 6 and all(abs(c - 400 / 6) < 4 * math.sqrt(400 / 6) for c in pairs.values())
    assert abs(sum(chose) - 100) < 4 * math.sqrt(200 * 0.25)
    # a task arrives before the last answer: the round is void, no token goes out
    side = IdleTokenSender(exp, 3, random.Random(1), 4)
    first, second = side.on_departure(0, 0)
    side.on_message(Message("token_count", 3, (0, 0), first.dispatcher), 0)
    side.on_arrival(1, 2, ())
    assert side.on_message(Message("token_count", 3, (0, 0), second.dispatcher), 1) == ()
    assert side.report(1) == (1, 1, -1)
    # a dispatcher answers a probe with the number of tokens it holds
    disp = make_dispatcher(exp, random.Random(1), 1, 4)
    assert isinstance(disp, JIQDispatcher)
    held = len(disp.tokens)
    assert disp.on_message(Message("token_probe", 6, (9,), 1)) == (Message("token_count", 6, (9, held), 1),)


def test_slta_full_view_epochs_are_ordered_across_dispatchers_and_adopted() -> None:
    """Dispatcher i numbers its epochs i modulo K, each above every epoch it has seen; a token of a
    later epoch makes a dispatcher take that epoch and r; a pool answers an epoch to every dispatcher."""
    exp = pools("slta", 3, "full")
    one, two = (make_dispatcher(exp, random.Random(s), i, 3) for s, i in ((1, 1), (2, 2)))
    assert isinstance(one, SLTADispatcher) and isinstance(two, SLTADispatcher)
    assert [one._next_epoch(e) for e in (0, 1, 2, 3)] == [1, 4, 4, 4]
    assert [two._next_epoch(e) for e in (0, 1, 2, 3)] == [2, 2, 5, 5]
    moved = one._move(4)
    assert moved and one.epoch == 1 and all(m.data[:2] == (1, 4) for m in moved)
    side = make_node_sides(exp, random.Random(3), [moved[0].node], dispatchers=3)[0]
    answers = side.on_message(moved[0], 0)
    assert [m.dispatcher for m in answers] == [0, 1, 2] and all(m.kind == "token_epoch" for m in answers)
    assert two.r == 1
    two.on_message(answers[2])
    assert (two.epoch, two.r) == (1, 4) and not two.unsettled
    assert two._next_epoch(two.epoch) == 2  # its next change comes after the adopted epoch
    one.on_message(answers[1])
    assert not one.unsettled - {m.node for m in moved[1:]}


def test_results_of_systems_with_other_dispatchers_are_never_compared() -> None:
    """A comparison of a run with one dispatcher and a run with two (or another view) is refused with one
    line naming the setting; the same system compares."""
    from lbtestbed.analysis.comparison.compare import Side, compare

    one, two = queues("jiq", 1), queues("jiq", 2)
    a = summarize(one, [simulate_once(one)])
    b = summarize(two, [simulate_once(two)], source="twin")
    with pytest.raises(ValueError, match=r"policy\.dispatchers is 1 in one and 2 in the other"):
        compare(Side(a), Side(b))
    full, local = queues("jsq", 2, "full"), queues("jsq", 2)
    c = summarize(full, [simulate_once(full)])
    d = summarize(local, [simulate_once(local)], source="twin")
    with pytest.raises(ValueError, match=r"policy\.view"):
        compare(Side(c), Side(d))
    assert compare(Side(a), Side(summarize(one, [simulate_once(one)], source="twin")))
