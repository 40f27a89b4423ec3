"""Statistical validation of the discrete-event simulator against what is known exactly.

Every expected value below is computed by hand in this file (M/M/1, M/G/1-PS, E_k/M/1, Poisson occupancies,
the greedy bound of docs/theory.md, "The `bounds` block", rate balance), never by the code under test. Runs
use fixed seeds.

Tolerances. A metric's ``ci95`` is the half-width of a 95% batch-means interval, t_{19} * s.e. ~ 2.09 s.e.
with the default 20 batches. It is itself an estimate from 19 degrees of freedom (it can come out 25% low
by chance), batch means under-cover when batches are not much longer than the correlation time of the
process, and the per-batch ratio estimator has an O(1/T) bias: in a 20-seed trial of the idle-capacity check
(JSQ, T = 200 and 1000) the error exceeded ci95 in 10-15% of the seeds instead of 5%, once by 1.84 ci95, and
a seed sweep of this file saw one check at 2.07 ci95 (a 1% shortfall of arrivals that moves every metric of
that run together). So a value must lie within ``K = 2.5`` ci95 (5.2 estimated s.e., about 4 true s.e. with
the under-coverage seen) of the exact value: a correct simulator then fails a check with probability of order
1e-3 or less (six seed sweeps of the fast tests passed), while the errors we want to catch (a wrong speed or
rate, a mis-weighted integral, a wrong discipline or service law) are tens of s.e. away; mutating the
simulator that way fails these tests.
Each check also bounds ci95 itself, so that no check can pass because its interval is uselessly wide.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result, summarize
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.theory.pools import pool_optimum
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]

#: multiplier on the reported ci95 (see the module docstring)
K = 2.5

EXP1 = {"dist": "exponential", "mean": 1.0}
UNIFORM_SPEED = {"dist": "uniform", "low": 0.7, "high": 1.3}
R_SMALL, R_LARGE = 20, 30  # u_i(x) = x ln(r_i / x), Table 1 of Goldsztajn et al. 2021 (§3.4.1)


# ------------------------------------------------------------------------------------------ helpers


def check(
    est: dict[str, Any], exact: float, label: str, *, max_ci: float | None = None, rel: float = 0.05
) -> None:
    """|value - exact| <= K * ci95, with ci95 at most ``max_ci`` (default ``rel * |exact|``)."""
    value, ci = est["value"], est["ci95"]
    assert value is not None and ci is not None, f"{label}: no estimate ({est})"
    bound = rel * abs(exact) if max_ci is None else max_ci
    print(f"{label}: {value:.6g} ± {ci:.3g} vs exact {exact:.6g} ({(value - exact) / ci:+.2f} ci95)")
    assert math.isfinite(ci) and 0 < ci <= bound, f"{label}: ci95 {ci:.3g} is not in (0, {bound:.3g}]"
    assert abs(value - exact) <= K * ci, (
        f"{label}: {value:.6g} ± {ci:.3g} is {abs(value - exact) / ci:.2f} ci95 from the exact {exact:.6g}"
    )


def simulate(spec: dict[str, Any], replications: int = 1) -> tuple[Experiment, list[RawRun], Result]:
    exp = parse_spec(spec)
    raws = [simulate_once(exp, r) for r in range(replications)]
    return exp, raws, summarize(exp, raws)


def pool_spec(
    policy: str,
    *,
    per_class: int = 20,
    load: float = 5.0,
    warmup: float = 10.0,
    duration: float = 1000.0,
    seed: int = 1,
    **policy_keys: Any,
) -> dict[str, Any]:
    """Two equal classes of pools with u = x ln(r/x), r = 20 and 30."""
    return {
        "name": f"pools-{policy}",
        "seed": seed,
        "classes": [
            {
                "name": "small",
                "count": per_class,
                "discipline": "pool",
                "utility": {"kind": "xlog", "r": R_SMALL},
            },
            {
                "name": "large",
                "count": per_class,
                "discipline": "pool",
                "utility": {"kind": "xlog", "r": R_LARGE},
            },
        ],
        "workload": {"load": load, "service": EXP1},
        "policy": {"name": policy, **policy_keys},
        "run": {"warmup": warmup, "duration": duration, "batches": 20},
    }


def queue_spec(
    policy: str,
    classes: list[tuple[str, int, str, Any]],
    *,
    load: float,
    service: dict[str, Any] | None = None,
    warmup: float = 100.0,
    duration: float = 1000.0,
    seed: int = 1,
    network: dict[str, Any] | None = None,
    **policy_keys: Any,
) -> dict[str, Any]:
    """Nodes given as (class name, count, discipline, speed)."""
    spec: dict[str, Any] = {
        "name": f"queues-{policy}",
        "seed": seed,
        "classes": [
            {"name": name, "count": count, "discipline": disc, "speed": speed}
            for name, count, disc, speed in classes
        ],
        "workload": {"load": load, "service": service or EXP1},
        "policy": {"name": policy, **policy_keys},
        "run": {"warmup": warmup, "duration": duration, "batches": 20},
    }
    if network is not None:
        spec["network"] = network
    return spec


def xlog(r: float, x: int) -> float:
    return 0.0 if x == 0 else x * math.log(r / x)


def poisson_pmf(mean: float, x: int) -> float:
    return math.exp(-mean + x * math.log(mean) - math.lgamma(x + 1))


def random_pool_utility(rho: float) -> float:
    """docs/theory.md, "`random` on pools": under uniform random routing every pool holds Poisson(rho)
    tasks."""
    return sum(0.5 * poisson_pmf(rho, x) * (xlog(R_SMALL, x) + xlog(R_LARGE, x)) for x in range(200))


def greedy_bound(x: float) -> tuple[float, int]:
    """U*(x) and r* for the two equal classes (docs/theory.md, "The `bounds` block", steps 2-4), written from
    scratch.

    Slots (i, j) are ranked by marginal utility u_i(j) - u_i(j - 1), ties by (i, j); each class-i slot holds
    alpha_i = 1/2 task per pool; fill them in rank order until the load x is used up.
    """
    slots = sorted(
        (-round(xlog(r, j) - xlog(r, j - 1), 12), i, j)
        for i, r in enumerate((R_SMALL, R_LARGE))
        for j in range(1, 200)
    )
    value = filled = 0.0
    for rank, (neg_delta, _, _) in enumerate(slots, start=1):
        if filled + 0.5 > x:
            return value + (x - filled) * -neg_delta, rank
        value += 0.5 * -neg_delta
        filled += 0.5
    raise AssertionError("load beyond the enumerated slots")


def arrivals_in_window(raw: RawRun) -> float:
    return float(raw.ratios["messages_per_task"][1].sum())


def completions_in_window(raw: RawRun) -> float:
    """Tasks that arrived in the window and completed (the sojourn sample size)."""
    return float(raw.ratios["mean_sojourn"][1].sum())


def test_hand_formulas_reproduce_the_reference_numbers() -> None:
    """The test's own formulas give the numbers printed in docs/notes/pools.md ("The upper bound at selected
    loads", "Uniform random routing")."""
    assert greedy_bound(9.75) == (pytest.approx(9.173116, abs=1e-6), 20)
    assert greedy_bound(10.0) == (pytest.approx(9.162907, abs=1e-6), 21)
    assert greedy_bound(5.0)[0] == pytest.approx(8.0472, abs=1e-4)
    assert random_pool_utility(9.75) == pytest.approx(8.471980, abs=1e-6)
    assert random_pool_utility(10.0) == pytest.approx(8.449383, abs=1e-6)


# ------------------------------------------------- 1. pools: the total is Poisson(n rho) under any policy

POOL_POLICIES = {"random": {}, "jlmu": {}, "slta": {"beta_scale": 1.0}}


@cache
def pool_run(policy: str) -> tuple[Experiment, RawRun, Result]:
    """n = 40 pools (20 + 20), rho = 5, 20 batches of 50 mean service times."""
    exp, raws, res = simulate(pool_spec(policy, **POOL_POLICIES[policy]))
    return exp, raws[0], res


@pytest.mark.parametrize("policy", list(POOL_POLICIES))
def test_pool_total_tasks_is_poisson(policy: str) -> None:
    exp, _, res = pool_run(policy)
    m = res.metrics
    # With equal pool speeds a task's sojourn is its work wherever it goes, so N(t) is the same path under
    # every policy (same seed, same arrivals and works): the three cases print the same totals. What differs
    # per policy is the bookkeeping checked below (node integrals, per-class sojourns).
    n, rho, w, T = 40, 5.0, exp.run.warmup, exp.run.duration
    # Started empty, E N(t) = n rho (1 - e^-t) (M/M/inf): the time average over [w, w + T] has this mean.
    # The correction is n rho e^-10 / T ~ 1e-5 here, far inside the CI; no other allowance is needed.
    mean = n * rho * (1 - math.exp(-w) * (1 - math.exp(-T)) / T)
    check(m["tasks_in_system"], mean, f"{policy}: tasks in system", rel=0.02)
    # time average of (N - mean)^2 about the sample mean: biased low by Var(sample mean) ~ 2 n rho / T
    check(m["tasks_in_system"]["variance"], n * rho - 2 * n * rho / T, f"{policy}: variance of N", rel=0.15)
    # the nodes' own integrals agree with the simulator's count of tasks in the system
    assert m["mean_tasks_per_node"]["value"] * n == pytest.approx(m["tasks_in_system"]["value"], rel=1e-9)
    # pools serve every task at once: the sojourn is the work, mean 1, whatever the pool or the policy
    check(m["mean_sojourn"], 1.0, f"{policy}: mean sojourn", rel=0.02)
    for name, est in m["mean_sojourn"]["by_class"].items():
        check(est, 1.0, f"{policy}: mean sojourn [{name}]", rel=0.03)
    assert m["wait_probability"]["value"] is None  # pools never queue


def test_random_pools_are_independent_poisson() -> None:
    """Random routing: every pool is M/M/inf with load rho (docs/theory.md, "`random` on pools")."""
    _, _, res = pool_run("random")
    m = res.metrics
    rho = 5.0
    check(m["utility"], random_pool_utility(rho), "random: utility", rel=0.01)
    for name in ("small", "large"):
        tail = m["occupancy_tail"][name]
        assert len(tail) >= 13
        for j in range(1, 13):
            exact = 1.0 - sum(poisson_pmf(rho, x) for x in range(j))
            check(tail[j], exact, f"random: P(X >= {j}) [{name}]", max_ci=0.02)


# ------------------------------------------------------------ 2. random routing: M/M/1 and M/G/1-PS


def test_random_fcfs_is_mm1() -> None:
    """100 unit-speed fcfs nodes at rho = 0.5; 20 batches of 200 (the M/M/1 correlation time is ~6)."""
    rho = 0.5
    _, _, res = simulate(
        queue_spec("random", [("a", 100, "fcfs", 1)], load=rho, warmup=100, duration=4000, seed=11)
    )
    m = res.metrics
    check(m["mean_sojourn"], 1 / (1 - rho), "M/M/1 mean sojourn", rel=0.03)
    check(m["wait_probability"], rho, "M/M/1 P(wait)", rel=0.03)
    check(m["mean_tasks_per_node"], rho / (1 - rho), "M/M/1 mean tasks", rel=0.03)
    check(m["idle_capacity"], 100 * (1 - rho), "M/M/1 idle capacity", rel=0.03)
    # the sojourn time is Exp(mu - lambda)
    check(m["sojourn_p50"], math.log(2) / (1 - rho), "M/M/1 sojourn median", rel=0.03)
    check(m["sojourn_p99"], math.log(100) / (1 - rho), "M/M/1 sojourn p99", rel=0.05)
    tail = m["occupancy_tail"]["a"]
    for j in range(1, 7):
        check(tail[j], rho**j, f"M/M/1 P(X >= {j})", max_ci=0.01)


PS_CASES = {
    "deterministic": ({"dist": "deterministic", "mean": 1.0}, [("a", 100, "ps", 1)], 0.5),
    "hyperexp-scv4": ({"dist": "hyperexponential", "mean": 1.0, "scv": 4.0}, [("a", 100, "ps", 1)], 0.5),
    "hyperexp-scv4-speeds-2/3-4/3": (
        {"dist": "hyperexponential", "mean": 1.0, "scv": 4.0},
        [("slow", 50, "ps", "2/3"), ("fast", 50, "ps", "4/3")],
        0.4,
    ),
}


@pytest.mark.parametrize("case", list(PS_CASES))
def test_random_ps_is_mg1_ps(case: str) -> None:
    """M/G/1-PS is insensitive: mean sojourn w/(C - lambda) per unit of work, P(X >= j) = rho^j.

    (docs/theory.md, "Baselines for the schemes", for the two speeds: a type-i node is M/G/1-PS with arrival
    rate lambda.)
    """
    service, classes, lam = PS_CASES[case]
    exp, _, res = simulate(queue_spec("random", classes, load=lam, service=service, duration=4000, seed=12))
    m = res.metrics
    speeds = {name: float(Fraction(str(speed))) for name, _, _, speed in classes}
    sojourns = {name: 1 / (c - lam) for name, c in speeds.items()}
    for name, exact in sojourns.items():
        check(m["mean_sojourn"]["by_class"][name], exact, f"{case}: mean sojourn [{name}]", rel=0.06)
        tail = m["occupancy_tail"][name]
        for j in range(1, 6):
            check(tail[j], (lam / speeds[name]) ** j, f"{case}: P(X >= {j}) [{name}]", max_ci=0.015)
    # every class has the same count, so tasks split evenly between classes
    check(m["mean_sojourn"], float(np.mean(list(sojourns.values()))), f"{case}: mean sojourn", rel=0.04)
    total_speed = sum(count * speeds[name] for name, count, _, _ in classes)
    check(m["idle_capacity"], total_speed - lam * exp.n, f"{case}: idle capacity", rel=0.03)
    assert m["wait_probability"]["value"] is None  # no fcfs node


def test_random_heterogeneous_fcfs_per_class_mm1() -> None:
    """Speeds 1 and 2, lambda = 0.6 per node: per class M/M/1 with sojourn 1/(speed - lambda)."""
    lam = 0.6
    _, _, res = simulate(
        queue_spec("random", [("s1", 50, "fcfs", 1), ("s2", 50, "fcfs", 2)], load=lam, duration=4000, seed=13)
    )
    m = res.metrics
    by_class = m["mean_sojourn"]["by_class"]
    check(by_class["s1"], 1 / (1 - lam), "speed 1: mean sojourn", rel=0.05)
    check(by_class["s2"], 1 / (2 - lam), "speed 2: mean sojourn", rel=0.04)
    check(m["wait_probability"], (lam / 1 + lam / 2) / 2, "P(wait), both classes", rel=0.03)
    for name, speed in (("s1", 1), ("s2", 2)):
        tail = m["occupancy_tail"][name]
        for j in range(1, 6):
            check(tail[j], (lam / speed) ** j, f"P(X >= {j}) [{name}]", max_ci=0.015)
    mean_tasks = (lam / (1 - lam) + (lam / 2) / (1 - lam / 2)) / 2
    check(m["mean_tasks_per_node"], mean_tasks, "mean tasks per node", rel=0.04)
    check(m["idle_capacity"], 50 * 1 + 50 * 2 - 100 * lam, "idle capacity", rel=0.03)


def test_round_robin_fcfs_is_erlang_m1() -> None:
    """Round robin over k fcfs nodes: each node sees every k-th arrival, an E_k/M/1 queue.

    GI/M/1: sigma = A*(mu (1 - sigma)) with A*(s) = (k lambda / (k lambda + s))^k; an arrival waits with
    probability sigma, the sojourn is Exp(mu (1 - sigma)), and P(X >= j) = rho sigma^(j - 1) in time.
    """
    k, lam = 10, 0.7
    sigma = 0.5
    for _ in range(1000):
        sigma = (k * lam / (k * lam + 1 - sigma)) ** k
    _, _, res = simulate(queue_spec("round_robin", [("a", k, "fcfs", 1)], load=lam, duration=20000, seed=14))
    m = res.metrics
    check(m["mean_sojourn"], 1 / (1 - sigma), "E_k/M/1 mean sojourn", rel=0.04)
    check(m["wait_probability"], sigma, "E_k/M/1 P(wait)", rel=0.04)
    tail = m["occupancy_tail"]["a"]
    for j in range(1, 5):
        check(tail[j], lam * sigma ** (j - 1), f"E_k/M/1 P(X >= {j})", max_ci=0.015)


# ------------------------------------------------ 3. work conservation: idle capacity = sum mu - work rate

JSQ_TIE_BREAKS = ("random", "fastest", "slowest", "longest_idle", "fastest_idle")
N_HET, LOAD_HET = 50, 0.85


@cache
def het_run(policy: str, discipline: str, **policy_keys: Any) -> tuple[Experiment, RawRun, Result]:
    """50 nodes with speeds uniform in [0.7, 1.3], work 0.85 per node and unit time, 20 batches of 50."""
    spec = queue_spec(
        policy,
        [("a", N_HET, discipline, UNIFORM_SPEED)],
        load=LOAD_HET,
        warmup=20,
        duration=1000,
        seed=3,
        **policy_keys,
    )
    exp, raws, res = simulate(spec)
    return exp, raws[0], res


def check_idle_capacity(exp: Experiment, res: Result, label: str) -> None:
    """docs/theory.md, "Flow balance", any stable policy: sum_k mu_k P(k idle) = sum_k mu_k - lambda_work."""
    speeds = exp.node_speeds  # the experiment's realised speeds: an input, not a prediction
    work_rate = exp.workload.load * exp.n  # spec: load is work per node and unit time
    check(res.metrics["idle_capacity"], sum(speeds) - work_rate, f"{label}: idle capacity", rel=0.15)


@pytest.mark.parametrize("tie_break", JSQ_TIE_BREAKS)
def test_idle_capacity_jsq(tie_break: str) -> None:
    exp, _, res = het_run("jsq", "fcfs", tie_break=tie_break)
    speeds = exp.node_speeds
    assert len(speeds) == N_HET and all(0.7 <= s <= 1.3 for s in speeds) and len(set(speeds)) == N_HET
    check_idle_capacity(exp, res, f"jsq/{tie_break}")


def test_idle_capacity_power_of_d_ps() -> None:
    exp, _, res = het_run("power_of_d", "ps", d=2)
    check_idle_capacity(exp, res, "power_of_d on ps")


def test_idle_capacity_scheme1_ps() -> None:
    """Scheme 1 on the Fig. 3 cluster of Mukhopadhyay et al. 2015 (speeds 2/3 and 4/3, half each),
    d = (2, 2)."""
    spec = queue_spec(
        "scheme1",
        [("slow", 25, "ps", "2/3"), ("fast", 25, "ps", "4/3")],
        load=LOAD_HET,
        warmup=20,
        duration=1000,
        seed=4,
        d=[2, 2],
    )
    exp, _, res = simulate(spec)
    assert sum(exp.node_speeds) == pytest.approx(50.0)
    check(res.metrics["idle_capacity"], 50.0 - LOAD_HET * 50, "scheme1: idle capacity", rel=0.15)


# ------------------------------------------------------------ 4-5. JLMU and SLTA at n = 400 (Table 1)

TABLE1_BOUND = 9.173116  # u(q*) at rho = 9.75, docs/notes/pools.md


def check_pathwise_bound(exp: Experiment, raw: RawRun, label: str) -> None:
    """docs/theory.md, "The `bounds` block": u(q(t)) <= U*(s(t)) at every instant, so for every batch average,
    U* being
    concave: avg u <= avg U*(s) <= U*(avg s). A hard inequality, no statistics."""
    util, den_u = raw.ratios["utility"]
    tot, den_s = raw.ratios["tasks_in_system"]
    for b, (u, s) in enumerate(zip(util / den_u, tot / den_s / exp.n, strict=True)):
        assert u <= greedy_bound(s)[0] + 1e-9, f"{label}: batch {b}: u = {u:.6f} > U*({s:.4f})"


def test_jlmu_bound_and_near_optimality_n400() -> None:
    """JLMU at n = 400 (200 + 200 pools), rho = 9.75: within 0.5% of u(q*) and never above it.

    The exact-CTMC reference (docs/theory.md, "Reference runs: an exact CTMC of the pool policies") has
    9.17158 +- 0.00151 at n = 400, 0.0015 below the bound.
    """
    spec = pool_spec("jlmu", per_class=200, load=9.75, warmup=10, duration=30, seed=5)
    exp, raws, res = simulate(spec)
    opt = pool_optimum(exp)
    assert opt.bound == pytest.approx(TABLE1_BOUND, abs=1e-6)
    assert opt.bound == pytest.approx(greedy_bound(9.75)[0], abs=1e-9)
    assert opt.r_star == 20 and opt.thresholds == (8, 11)  # docs/notes/pools.md: r* = 20, l = (8, 11)
    u = res.metrics["utility"]
    print(f"jlmu n=400: utility {u['value']:.6f} ± {u['ci95']:.2g}, bound {TABLE1_BOUND}")
    assert 0 < u["ci95"] < 0.01
    assert u["value"] <= TABLE1_BOUND + u["ci95"]  # Theorem 1
    assert u["value"] >= 0.995 * TABLE1_BOUND  # random routing would give 8.47 (docs/notes/pools.md)
    check_pathwise_bound(exp, raws[0], "jlmu")
    assert res.extras["decisions"] == {"jlmu": arrivals_in_window(raws[0])}


# Threshold for SLTA's time at r*. The exact-CTMC reference (docs/notes/pools.md) has P(r = r*) = 0.787 at
# n = 400 (one run, T = 100). With this
# test's design (two replications of T = 60, pooled) eight seeds gave 0.63-0.85, mean 0.77, sd 0.07; single
# runs of T = 60 spread over 0.59-0.93. The fraction follows the slow fluctuations of the total load: runs
# whose time-average s is high (9.80 for both replications of seed 6, the lowest at 0.63) spend more time at
# r* + 1. So 0.5 sits about 4 sd below the mean and below every run seen; a learning rule that failed to
# settle at r* (drifting, or parked at r* +- 1) falls below it.
SLTA_R_STAR_MIN_FRACTION = 0.5


@pytest.mark.slow
def test_slta_learns_r_star_n400() -> None:
    spec = pool_spec("slta", per_class=200, load=9.75, warmup=10, duration=60, seed=6, beta_scale=1.0)
    exp, raws, res = simulate(spec, replications=2)
    r_star = pool_optimum(exp).r_star
    assert r_star == 20
    # by value of r, as a mapping (results.json lists them: its keys must not depend on the values seen)
    fractions = {str(e["value"]): e["fraction"] for e in res.metrics["slta_r"]["time_fraction"]}
    print(f"slta n=400: time fraction at r {fractions}, utility {res.metrics['utility']['value']:.6f}")
    assert sum(fractions.values()) == pytest.approx(1.0)
    assert fractions.get(str(r_star), 0.0) > SLTA_R_STAR_MIN_FRACTION
    assert all(abs(int(r) - r_star) <= 3 for r in fractions)
    # SLTA's invariants with exact dispatcher state (docs/theory.md, "SLTA: thresholds, tokens and
    # dispatching")
    decisions = res.extras["decisions"]
    assert "random" not in decisions
    assert set(decisions) <= {"green_other", "green_prev", "yellow"}
    assert sum(decisions.values()) == sum(arrivals_in_window(raw) for raw in raws)
    for raw in raws:
        r = np.array([v for _, v in raw.r_series])
        assert r.size > 0 and np.all(np.abs(np.diff(r)) <= 1)  # r moves by one at a time
        check_pathwise_bound(exp, raw, "slta")
    assert res.metrics["utility"]["value"] >= 0.995 * TABLE1_BOUND


# -------------------------------------------------------------------------- 6. messages per task


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("d", [2, 3])
def test_power_of_d_sends_2d_messages(d: int, replace: bool) -> None:
    """d probes and d replies per task, counted in the same instant as the arrival: exactly 2d."""
    spec = queue_spec(
        "power_of_d", [("a", 20, "fcfs", 1)], load=0.7, warmup=20, duration=200, seed=7, d=d, replace=replace
    )
    _, _, res = simulate(spec)
    msgs = res.metrics["messages_per_task"]
    assert msgs["value"] == 2 * d and msgs["ci95"] == 0.0
    assert msgs["by_kind"] == {"probe": d, "probe_reply": d}


@pytest.mark.parametrize("policy", ["random", "round_robin", "least_request"])
def test_stateless_policies_send_nothing(policy: str) -> None:
    spec = queue_spec(policy, [("a", 20, "fcfs", 1)], load=0.7, warmup=20, duration=200, seed=8)
    _, _, res = simulate(spec)
    assert res.metrics["messages_per_task"]["value"] == 0.0
    assert res.metrics["messages_per_task"]["by_kind"] == {}


def check_one_departure_per_task(res: Result, raw: RawRun, var_n: float, label: str) -> None:
    """Departure messages in the window = completions in it = arrivals A + N(t0) - N(t1).

    N(t0) and N(t1) lie T (>> the relaxation time) apart, so they are nearly independent and the edge term
    has sd sqrt(2 Var N); allow 4.5 sd (two-sided Gaussian tail ~ 7e-6) plus one task.
    """
    a = arrivals_in_window(raw)
    tol = (4.5 * math.sqrt(2 * var_n) + 1) / a
    value = res.metrics["messages_per_task"]["value"]
    print(f"{label}: departures per task {value:.6f}, tolerance ±{tol:.2g} (A = {a:.0f})")
    assert set(res.metrics["messages_per_task"]["by_kind"]) == {"departure"}
    assert abs(value - 1.0) <= tol


def test_jlmu_sends_one_departure_per_task() -> None:
    _, raw, res = pool_run("jlmu")
    check_one_departure_per_task(res, raw, 40 * 5.0, "jlmu")  # N ~ Poisson(n rho) exactly


def test_jsq_sends_one_departure_per_task() -> None:
    _, raw, res = het_run("jsq", "fcfs", tie_break="random")
    var = res.metrics["tasks_in_system"]["variance"]
    check_one_departure_per_task(res, raw, var["value"] + var["ci95"], "jsq")  # upper end of measured Var N


# ------------------------------------------------------------------------------ 7. reproducibility


def test_same_seed_same_metrics_other_seed_differs() -> None:
    def metrics(seed: int, replication: int = 0) -> str:
        exp = parse_spec(pool_spec("slta", duration=50, seed=seed, beta_scale=1.0))
        res = summarize(exp, [simulate_once(exp, replication)])
        return json.dumps({"metrics": res.metrics, "decisions": res.extras["decisions"]}, sort_keys=True)

    first = metrics(21)
    assert metrics(21) == first
    assert metrics(22) != first
    assert metrics(21, replication=1) != first


# ------------------------------------------------------------------- 8. network delay (delayed paths)

DELAY = 0.05


def delayed_spec(policy: str, forward_tasks: bool = False, **policy_keys: Any) -> dict[str, Any]:
    return queue_spec(
        policy,
        [("a", N_HET, "fcfs", UNIFORM_SPEED)],
        load=LOAD_HET,
        warmup=20,
        duration=500,
        seed=9,
        network={"delay": {"dist": "deterministic", "mean": DELAY}, "forward_tasks": forward_tasks},
        **policy_keys,
    )


def check_every_task_completes(res: Result, raw: RawRun, label: str) -> None:
    a = arrivals_in_window(raw)
    assert a > 0
    assert raw.censored == 0 and res.extras["censored_tasks"] == 0, f"{label}: censored tasks"
    assert completions_in_window(raw) == a, f"{label}: completions != arrivals"
    assert sum(res.extras["decisions"].values()) == a, f"{label}: decisions != arrivals"


@pytest.mark.parametrize("d", [2, 3])
def test_delayed_power_of_d(d: int) -> None:
    """Probes leave with the arrival; a reply is counted when its probe reaches the node, DELAY later.

    So the window counts the replies of the arrivals in [t0 - DELAY, t1 - DELAY): the edge term is d times the
    difference of two independent Poisson(lambda DELAY) counts, sd d sqrt(2 lambda DELAY); allow 5 sd + d.
    """
    exp, raws, res = simulate(delayed_spec("power_of_d", d=d))
    raw = raws[0]
    a = arrivals_in_window(raw)
    msgs = res.metrics["messages_per_task"]
    lam = exp.workload.arrival_rate
    tol = d * (5 * math.sqrt(2 * lam * DELAY) + 1) / a
    print(f"delayed power_of_d d={d}: {msgs['value']:.6f} messages per task, tolerance ±{tol:.2g}")
    assert msgs["by_kind"]["probe"] == d  # counted at the arrival itself
    assert abs(msgs["by_kind"]["probe_reply"] - d) <= tol
    assert abs(msgs["value"] - 2 * d) <= tol
    check_every_task_completes(res, raw, f"power_of_d d={d}")
    check_idle_capacity(exp, res, f"delayed power_of_d d={d}")


@pytest.mark.parametrize("forward_tasks", [False, True])
def test_delayed_jiq(forward_tasks: bool) -> None:
    """JIQ with delayed idle tokens (with forward_tasks, delayed tasks and completions too) still balances."""
    exp, raws, res = simulate(delayed_spec("jiq", forward_tasks=forward_tasks))
    raw = raws[0]
    check_every_task_completes(res, raw, "jiq")
    assert set(res.extras["decisions"]) <= {"idle_token", "random"}
    # at most one idle token per completion, and completions = arrivals + O(sqrt(N)) edge effect
    assert res.metrics["messages_per_task"]["value"] <= 1.0 + 0.01
    check_idle_capacity(exp, res, f"delayed jiq forward_tasks={forward_tasks}")


def test_delayed_jsq_and_least_request() -> None:
    """Delayed departures (_AT_DISPATCHER) and delayed completions passing the dispatcher (least_request)."""
    exp, raws, res = simulate(delayed_spec("jsq"))
    check_every_task_completes(res, raws[0], "delayed jsq")
    check_idle_capacity(exp, res, "delayed jsq")
    exp, raws, res = simulate(delayed_spec("least_request", forward_tasks=True))
    check_every_task_completes(res, raws[0], "delayed least_request")
    check_idle_capacity(exp, res, "delayed least_request")


@cache
def delayed_slta_run() -> tuple[Experiment, RawRun, Result]:
    """SLTA on the 40 pools of test 1 (r* = 11) with every message delayed by DELAY = 1/20 mean service."""
    spec = pool_spec("slta", warmup=5, duration=10, seed=10, beta_scale=1.0)
    spec["network"] = {"delay": {"dist": "deterministic", "mean": DELAY}}
    exp, raws, res = simulate(spec)
    return exp, raws[0], res


def test_delayed_slta_completes_every_task() -> None:
    """Delayed tokens (_AT_DISPATCHER) and epochs (_AT_NODE): the run ends, every measured task completes."""
    _, raw, res = delayed_slta_run()
    check_every_task_completes(res, raw, "delayed slta")


def test_delayed_slta_keeps_r_near_r_star() -> None:
    """What a working SLTA should still do with a delay of 1/20 of the mean service time: route by tokens and
    keep r near r* (= 11 here). These are design expectations, not exact theory: the paper's invariants
    (Remark 1; docs/theory.md) hold for exact dispatcher state."""
    exp, raw, res = delayed_slta_run()
    r_star = greedy_bound(5.0)[1]
    assert r_star == 11 == pool_optimum(exp).r_star
    decisions = res.extras["decisions"]
    random_share = decisions.get("random", 0) / sum(decisions.values())
    r = [v for _, v in raw.r_series]
    print(f"delayed slta: random dispatches {random_share:.3f}, r in [{min(r)}, {max(r)}], r* = {r_star}")
    assert random_share <= 0.05
    assert max(r) <= 2 * r_star


# SLTA under delay (issue 4). The dispatcher's picture of a pool is the tasks it sent there less the
# departures the pool has reported, so a task stays in the picture for one report delay after it leaves: the
# picture is the paper's SLTA on tasks that last one delay longer, and r settles near r* of the load
# rho (1 + delay / mean work) (docs/theory.md, "The `bounds` block", applied to that load, computed here by
# greedy_bound).
# JLMU's dispatcher counts the same way from its departure notices, so with the same delay it sees what
# SLTA's sees; at n = 400 the two agree within noise with exact delivery (the exact-CTMC reference of
# docs/theory.md, "Reference runs": 9.17238 +- 0.00182 and 9.17158 +- 0.00151), so with a delay they must
# agree too.


def delayed_slta_and_jlmu(delay: float, **keys: Any) -> dict[str, tuple[Experiment, RawRun, Result]]:
    """SLTA (beta_scale 1) and JLMU on the same spec and tasks, every message delayed by ``delay``."""
    out = {}
    for policy, extra in (("slta", {"beta_scale": 1.0}), ("jlmu", {})):
        spec = pool_spec(policy, **keys, **extra)
        spec["network"] = {"delay": {"dist": "deterministic", "mean": delay}}
        exp, raws, res = simulate(spec)
        out[policy] = (exp, raws[0], res)
    return out


def check_like_jlmu(runs: dict[str, tuple[Experiment, RawRun, Result]], label: str) -> None:
    """SLTA's utility within K ci95 (of the difference, the two estimates taken as independent) of JLMU's;
    no task routed at random (Remark 1 holds for the picture); never above the pathwise bound."""
    (exp, raw, res), (_, _, jlmu) = runs["slta"], runs["jlmu"]
    u, v = res.metrics["utility"], jlmu.metrics["utility"]
    ci = math.hypot(u["ci95"], v["ci95"])
    print(f"{label}: slta {u['value']:.5f} ± {u['ci95']:.2g}, jlmu {v['value']:.5f} ± {v['ci95']:.2g}")
    assert 0 < u["ci95"] < 0.1 and 0 < v["ci95"] < 0.1
    assert abs(u["value"] - v["value"]) <= K * ci, f"{label}: {(u['value'] - v['value']) / ci:+.2f} ci95"
    decisions = res.extras["decisions"]
    assert set(decisions) <= {"green_other", "green_prev", "yellow"}, decisions
    assert sum(decisions.values()) == arrivals_in_window(raw)
    check_pathwise_bound(exp, raw, label)


#: share of the window SLTA's r may spend more than 2 ranks from r* of the delayed load, n = 40 and a delay
#: of 1/4 of the mean work. A 16-seed sweep spent 0-1.8 % there (r over r*-1 .. r*+3 of that load, as the
#: exact-CTMC reference shows for small n with exact delivery, docs/notes/pools.md); the earlier rule (used
#: green tokens assumed gone until the pool answered) spent 55-98 %, with r climbing to r* + 19 and 1 % of the
#: tasks routed at random.
FAR_FROM_R_STAR_MAX = 0.1


def test_slta_with_a_long_delay_learns_like_jlmu() -> None:
    """40 pools, rho = 5 (about 50 arrivals per round trip of 2 x 0.25 mean works)."""
    delay = 0.25
    runs = delayed_slta_and_jlmu(delay, warmup=5, duration=100, seed=3)
    r_star = greedy_bound(5.0 * (1 + delay))[1]
    assert r_star == 13 and greedy_bound(5.0)[1] == 11
    # by value of r, as a mapping (results.json lists them: its keys must not depend on the values seen)
    fractions = {str(e["value"]): e["fraction"] for e in runs["slta"][2].metrics["slta_r"]["time_fraction"]}
    far = sum(share for r, share in fractions.items() if abs(int(r) - r_star) > 2)
    print(f"long delay: r {fractions}, {far:.3f} of the time more than 2 from {r_star}")
    assert far <= FAR_FROM_R_STAR_MAX
    check_like_jlmu(runs, "slta, n = 40, delay 0.25")


# Threshold for the share of time at r* of the delayed load, as SLTA_R_STAR_MIN_FRACTION above: an 8-seed
# sweep of this design gave 0.68-0.94 (mean 0.81) at r* = 22 and the rest at 21 or 23; the earlier rule gave
# 0.29 at 22 (0.71 at 23), 106 tasks routed at random and a utility 0.074 below JLMU's (25 ci95).
DELAYED_R_STAR_MIN_FRACTION = 0.5


@pytest.mark.slow
def test_delayed_slta_n400_learns_like_jlmu() -> None:
    """Table 1 setting at n = 400, rho = 9.75, every message delayed by 0.1 mean works (~390 arrivals per
    round trip): r settles at r* of the load 9.75 x 1.1 = 10.725, which is 22 (r* = 20 without delay), and
    the utility is JLMU's with the same delay."""
    delay = 0.1
    runs = delayed_slta_and_jlmu(delay, per_class=200, load=9.75, warmup=10, duration=30, seed=6)
    r_star = greedy_bound(9.75 * (1 + delay))[1]
    assert r_star == 22
    # by value of r, as a mapping (results.json lists them: its keys must not depend on the values seen)
    fractions = {str(e["value"]): e["fraction"] for e in runs["slta"][2].metrics["slta_r"]["time_fraction"]}
    print(f"delayed slta n=400: time fraction at r {fractions}")
    assert fractions.get(str(r_star), 0.0) > DELAYED_R_STAR_MIN_FRACTION
    assert all(abs(int(r) - r_star) <= 3 for r in fractions)
    check_like_jlmu(runs, "slta, n = 400, delay 0.1")


# ----------------------------------------------------------------------------- 9. replications via CLI

CLI_SPEC = """
name = "cli-replications"
seed = 3

[[classes]]
name = "a"
count = 20
discipline = "fcfs"

[workload]
load = 0.5
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "random"

[run]
warmup = 20.0
duration = 500.0
"""


def test_cli_replications(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(CLI_SPEC, encoding="utf-8")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtestbed.cli",
            "simulate",
            str(spec),
            "--replications",
            "2",
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    )
    result = json.loads(out.stdout)
    settings = result["settings"]
    assert settings["ci_method"] == "independent replications" and settings["replications"] == 2
    m = result["metrics"]
    for key in (
        "mean_sojourn",
        "mean_tasks_per_node",
        "tasks_in_system",
        "wait_probability",
        "idle_capacity",
    ):
        ci = m[key]["ci95"]
        assert ci is not None and math.isfinite(ci) and ci > 0, f"{key}: ci95 = {ci}"
    assert all(math.isfinite(e["ci95"]) for e in m["occupancy_tail"]["a"])
    assert math.isfinite(m["mean_sojourn"]["by_class"]["a"]["ci95"])
    # a 2-replication interval (t_1 = 12.7) still covers the M/M/1 values
    assert abs(m["mean_sojourn"]["value"] - 2.0) <= m["mean_sojourn"]["ci95"]
    assert abs(m["wait_probability"]["value"] - 0.5) <= m["wait_probability"]["ci95"]


# ------------------------------------------------------------ the dispatcher side's clock and latencies


def _clocked_run(monkeypatch: pytest.MonkeyPatch, network: dict[str, Any], dispatchers: int) -> list[Any]:
    """Run least_request, its sides reading the clock and recording what they are told; the sides and
    the measured sojourns."""
    from test_proxy_policies import ClockedLeastRequest

    from lbtestbed.analysis.simulator import engine

    sides: list[Any] = []

    def make(exp: Experiment, rng: Any, index: int = 0, k: int = 1) -> Any:
        sides.append(ClockedLeastRequest(exp, rng, index))
        return sides[-1]

    monkeypatch.setattr(engine, "make_dispatcher", make)
    spec = queue_spec(
        "least_request",
        [("q", 4, "fcfs", 1.0)],
        load=0.7,
        warmup=5.0,
        duration=200.0,
        network=network,
        d=2,
        dispatchers=dispatchers,
    )
    raw = engine.Simulator(parse_spec(spec)).run()
    sojourns = [s for batch in raw.sojourns for s in batch]
    assert len(sojourns) > 300
    return [sides, sojourns]


@pytest.mark.parametrize("dispatchers", [1, 2])
def test_the_simulator_tells_a_clocked_side_the_time_and_each_task_latency(
    monkeypatch: pytest.MonkeyPatch, dispatchers: int
) -> None:
    """Without network delay a task is forwarded the instant it arrives and its answer is back the instant
    it completes: its latency is its sojourn, and the side hears of it at forward time + latency."""
    sides, sojourns = _clocked_run(monkeypatch, {}, dispatchers)
    assert len(sides) == dispatchers
    latencies = sorted(lat for s in sides for _, lat in s.done)
    for s in sides:
        assert s.dispatched == sorted(s.dispatched) and s.dispatched[-1] > 200.0  # the clock runs
        starts = {round(t, 9) for t in s.dispatched}
        assert all(round(now - lat, 9) in starts for now, lat in s.done)
    # every measured sojourn is one of the latencies (the others arrived outside the window)
    pool = {round(x, 9) for x in latencies}
    assert all(round(x, 9) in pool for x in sojourns)


def test_with_a_network_delay_the_latency_holds_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """A constant delay of 0.05 each way with forwarded tasks: a task's sojourn (arrival at the dispatcher
    to completion at its node) is 0.05 + its stay, its latency 0.05 + stay + 0.05 = sojourn + 0.05. The
    run stops when the last measured task completes, with the answers of the last few still on their way
    back: those have no latency."""
    sides, sojourns = _clocked_run(monkeypatch, {"delay": 0.05, "forward_tasks": True}, 1)
    pool = {round(lat - 0.05, 9) for _, lat in sides[0].done}
    unmatched = [x for x in sojourns if round(x, 9) not in pool]
    assert len(unmatched) <= 3, unmatched[:5]
    assert min(lat for _, lat in sides[0].done) > 0.1
