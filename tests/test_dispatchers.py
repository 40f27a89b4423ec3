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

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy import stats

from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.model.spec import Experiment, parse_spec
from lbtestbed.model.workload import DispatcherSplit

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


def exact_jiq(dispatchers: int, Q: int = Q) -> tuple[float, float, float]:
    """(mean tasks per node, P(an arrival finds its node busy), stationary mass with some node at Q)."""
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
                for d in range(K):  # its token to a uniformly random dispatcher
                    nt = list(t)
                    nt[k * K + d] = 1
                    go(i, nq, tuple(nt), 1.0 / K)
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
    assert sum(routed) in (sim.workload.count, sim.workload.count - 1)  # the last one drawn may not arrive
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


def test_two_dispatchers_make_jiq_wait_more_than_one_and_the_chain_tells_them_apart() -> None:
    """The multi-dispatcher effect the test above must see: with K = 2 arrivals wait noticeably more
    often (a token may sit at the other dispatcher) than with K = 1, by many times the simulation's
    interval, so a simulator that ran one dispatcher side for K = 2 would fail it."""
    one, two = exact_jiq(1), exact_jiq(2)
    sim_two = summarize(jiq(2), [simulate_once(jiq(2))]).metrics["wait_probability"]
    assert two[1] - one[1] > 5 * sim_two["ci95"]


@pytest.mark.parametrize("policy", ["random", "power_of_d", "jiq"])
def test_theory_that_k_does_not_change_stays_and_says_so(policy: str) -> None:
    """random and power_of_d predict the same with any K; JIQ's limit stands with equal dispatcher
    loads, and its notes add that assumption and cite van der Boor et al. 2017 (docs/theory.md)."""
    from lbtestbed.analysis.theory.predict import predict

    one = predict(jiq(1, **({"name": policy} if policy != "jiq" else {})))
    four = predict(jiq(4, **({"name": policy} if policy != "jiq" else {})))
    for metric in ("mean_sojourn", "mean_tasks_per_node", "wait_probability"):
        assert four.metrics[metric]["value"] == one.metrics[metric]["value"] is not None
    notes = [n for n in four.extras["notes"] if n["metric"] == "mean_sojourn"]
    cited = any("1706.01059" in n["source"] and "4 dispatchers" in str(n["assumes"]) for n in notes)
    assert cited == (policy == "jiq")


@pytest.mark.parametrize("policy", ["round_robin", "least_request", "jsq"])
def test_a_policy_on_local_views_has_no_theory_with_several_dispatchers(policy: str) -> None:
    from lbtestbed.analysis.theory.predict import predict

    assert predict(jiq(1, name=policy)).metrics["mean_sojourn"]["value"] is not None
    result = predict(jiq(2, name=policy))
    assert result.metrics["mean_sojourn"]["value"] is None
    reasons = [n for n in result.extras["notes"] if n["metric"] == "mean_sojourn"]
    assert reasons and "2 dispatchers, each deciding on its own view" in str(reasons)
