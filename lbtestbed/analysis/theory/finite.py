"""Values at the spec's n for identical exponential servers (docs/theory.md, "Values at the spec's n").

``supermarket`` (JSQ(d)) and ``join_idle`` (JSQ, JIQ) run after the limit values are set and replace them
where they can: with the exact chain (``ctmc``) when its state space is small enough, else, for JSQ(d), with
the refined mean field (``refined``), whose O(1/n^2) error is estimated from the exact chain at n0 = 3 (or 4)
(the 1/n^2 coefficient c2 = n0^2 |exact - refined|; the error stated is twice c2 / n^2). What stays a
limit gets its finite-n gap where one is known, and a warning when that gap is large.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lbtestbed.analysis.results.regime import EXACT, FINITE_N
from lbtestbed.analysis.theory import ctmc, jiq_stale, refined
from lbtestbed.analysis.theory.numeric import erlang_mixture_quantile
from lbtestbed.analysis.theory.prediction import THEORY, Prediction
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies.jiq import JIQParams
from lbtestbed.policies.jsq import JSQParams
from lbtestbed.policies.sampling import LeastRequestParams, PowerOfDParams

EXACT_SOURCE = f'{THEORY}, "Exact values at small n: the Markov chain"'
REFINED_SOURCE = (
    "Gast and Van Houdt 2017 (Proc. ACM Meas. Anal. Comput. Syst. 1(2), DOI 10.1145/3154491); "
    f'{THEORY}, "Refined mean field: the 1/n term"'
)
GAP_SOURCE = f'{THEORY}, "The finite-n gap of a limit"'
#: a limit whose gap at this n is larger than this (relative) is worth a warning
LARGE_GAP = 0.02
PROBES = "every task sees the true occupancy (probes answered at once)"
#: the refined value's stated error is this many times c2 / n^2 (c2 itself carries the O(1/n0^3) rest)
SAFETY = 2.0
#: tail points below this are not listed
TAIL_CUT = 1e-12


def _model(exp: Experiment, policy: str, speed: float) -> ctmc.Model:
    pol = exp.policy
    d, replace = 2, False
    if isinstance(pol, PowerOfDParams | LeastRequestParams):
        d, replace = pol.d, pol.replace
    return ctmc.Model(policy, exp.n, exp.workload.arrival_rate, speed / exp.workload.service.mean, d, replace)


def tie_break(exp: Experiment) -> str:
    """The tie-break of a policy that has one (JSQ, JIQ, power-of-d), else "random"."""
    pol = exp.policy
    return pol.tie_break if isinstance(pol, JSQParams | JIQParams | PowerOfDParams) else "random"


def _cut(tail: Sequence[float], errors: Sequence[float]) -> tuple[list[float], list[float]]:
    keep = [j for j, t in enumerate(tail) if j == 0 or t >= TAIL_CUT]
    return [tail[j] for j in keep], [errors[j] if j < len(errors) else 0.0 for j in keep]


def _truncation(x: ctmc.Exact) -> str:
    return (
        f"exact chain of {x.states} states (at most {x.K} tasks per node, which drops {x.dropped:.2g} of "
        "the arrivals; the error is estimated from K - 1 -> K)"
    )


def _apply_exact(exp: Experiment, p: Prediction, x: ctmc.Exact, fcfs: bool, tokens: bool) -> None:
    n = exp.n
    how = _truncation(x)
    sees = (
        PROBES
        if exp.policy.name in ("power_of_d", "least_request")
        else "one dispatcher with the exact state"
    )
    assumes = ["exponential work", sees]
    e = x.errors
    p.finite(
        "mean_sojourn",
        x.mean_sojourn,
        f"Little: n L / lambda; {how}",
        EXACT_SOURCE,
        EXACT,
        x.sojourn_error(),
        assumes,
    )
    p.finite(
        "mean_tasks_per_node",
        x.mean_tasks,
        f"L = sum_j P(N >= j); {how}",
        EXACT_SOURCE,
        EXACT,
        e["mean_tasks"],
        assumes,
    )
    p.finite(
        "tasks_in_system", n * x.mean_tasks, f"n L; {how}", EXACT_SOURCE, EXACT, n * e["mean_tasks"], assumes
    )
    if fcfs:
        p.finite(
            "wait_probability",
            x.wait,
            f"P(the node an arrival joins is busy); {how}",
            EXACT_SOURCE,
            EXACT,
            e["wait"],
            assumes,
        )
        for metric, q in ctmc.QUANTILES.items():
            p.finite(
                metric,
                x.fcfs_sojourn_quantile(q),
                f"Gamma(k + 1, mu) mixed over the level joined; {how}",
                EXACT_SOURCE,
                EXACT,
                e[metric],
                assumes,
            )
    if tokens:
        p.finite(
            "messages_per_task",
            x.idle_arrival,
            f"tokens per task = P(an arrival finds an idle node); {how}",
            EXACT_SOURCE,
            EXACT,
            e["idle_arrival"],
            assumes,
        )
    tail, errors = _cut(x.tail, x.tail_errors)
    for c in exp.classes:
        p.finite_tail(
            c.name, tail, errors, f"E[#nodes holding >= j] / n; {how}", EXACT_SOURCE, EXACT, assumes
        )


def _small_exact(model: ctmc.Model, d: int) -> ctmc.Exact | None:
    """The exact chain at n0 = 3 (4 when d = 3), where it is quick (same load per server), for the refined
    error estimate."""
    per_server = model.lam / model.n
    for n0 in (3, 4):
        if n0 <= d:
            continue
        x = ctmc.exact(
            ctmc.Model(model.policy, n0, per_server * n0, model.mu, model.d, model.replace),
            max_states=20_000,
            tolerance=1e-3,  # c2 needs |exact - refined| to a few percent, and that is 10 % of L at n0 = 3
        )
        if x is not None:
            return x
    return None


def supermarket(exp: Experiment, p: Prediction, speed: float, fcfs: bool) -> None:
    """JSQ(d) at the spec's n: the exact chain, else the refined mean field (exponential work); for other
    work on ps nodes the limit stays, with the exponential refined correction as its estimated gap."""
    pol, work = exp.policy, exp.workload.service
    assert isinstance(pol, PowerOfDParams | LeastRequestParams)
    if pol.d < 2:
        return  # d = 1 is random routing: M/M/1 or M/G/1-PS per node, the value at every n
    model = _model(exp, "power_of_d", speed)
    if work.dist == "exponential":
        x = ctmc.exact(model)
        if x is not None:
            _apply_exact(exp, p, x, fcfs, tokens=False)
            return
    e = refined.supermarket_expansion(model.lam / (exp.n * model.mu), pol.d, model.mu, pol.replace)
    if work.dist == "exponential":
        _apply_refined(exp, p, model, e, fcfs)
    else:
        _insensitive_gap(exp, p, e)


def _apply_refined(
    exp: Experiment, p: Prediction, model: ctmc.Model, e: refined.Expansion, fcfs: bool
) -> None:
    n = exp.n
    small = _small_exact(model, model.d)
    n0 = small.model.n if small else None
    known = (
        f"c2 from the exact chain at n0 = {n0})" if n0 else "no exact chain to estimate c2: error unknown)"
    )
    how = f"the refined mean field at n = {n} (mean field + V / n; error O(1/n^2), stated as 2 c2 / n^2 with "
    how += known
    assumes = ["exponential work", PROBES]
    values = _refined_values(e, n, fcfs)
    errors: dict[str, float] = {}
    tail = e.tail(n)
    tail_errors: list[float] | None = None
    if small is not None and n0 is not None:  # c2 = n0^2 |exact - refined| at n0, then 2 c2 / n^2
        scale = SAFETY * n0 * n0 / (n * n)
        at_n0, refined_n0 = _exact_values(small, fcfs), _refined_values(e, n0, fcfs)
        errors = {k: scale * abs(at_n0[k] - refined_n0[k]) for k in values}
        ref0 = e.tail(n0)
        tail_errors = [
            scale * abs((small.tail[j] if j < len(small.tail) else 0.0) - ref0[j]) for j in range(len(tail))
        ]
    for metric, value in values.items():
        p.finite(metric, value, how, REFINED_SOURCE, FINITE_N, errors.get(metric), assumes)
    L, error = values["mean_tasks_per_node"], errors.get("mean_tasks_per_node")
    p.finite(
        "tasks_in_system", n * L, how, REFINED_SOURCE, FINITE_N, None if error is None else n * error, assumes
    )
    tail, cut_errors = _cut(tail, tail_errors or [])
    for c in exp.classes:
        p.finite_tail(
            c.name, tail, cut_errors if tail_errors else None, how, REFINED_SOURCE, FINITE_N, assumes
        )
    shift = abs(e.correction() / n) / e.mean_tasks(n)
    if shift > 0.1:
        p.warn(
            f"the refined mean field moves the mean tasks by {100 * shift:.0f} % from the limit at n = {n}: "
            "its O(1/n^2) error may be large"
        )


def _insensitive_gap(exp: Experiment, p: Prediction, e: refined.Expansion) -> None:
    """Non-exponential work on ps nodes: the limit stays; the exponential 1/n term estimates its gap."""
    n, limit = exp.n, p.metrics["mean_sojourn"]["value"]
    gap = e.correction() / n / (e.rho * e.mu)  # V / n in tasks per node, over the arrival rate per node
    p.gap(
        "mean_sojourn",
        gap,
        "estimate",
        "the refined 1/n term for exponential work; on ps nodes the mean field is insensitive to the work "
        "law, its 1/n term is not known to be",
    )
    if abs(gap) > LARGE_GAP * limit:
        p.warn(
            f"mean_sojourn: the limit {limit:.4g} is about {100 * gap / limit:.0f} % below the value at "
            f"n = {n} for exponential work; no finite-n value for {exp.workload.service.dist} work"
        )


def _refined_values(e: refined.Expansion, n: int, fcfs: bool) -> dict[str, float]:
    """The refined mean field's per-node values at n (tasks in the system are n times the tasks per node)."""
    a = e.rho * e.mu  # arrivals per node per unit time
    out = {"mean_tasks_per_node": e.mean_tasks(n), "mean_sojourn": e.mean_tasks(n) / a}
    if fcfs:
        out["wait_probability"] = e.wait(n)
        for metric, q in ctmc.QUANTILES.items():
            out[metric] = erlang_mixture_quantile(e.join(n), e.mu, q)
    return out


def _exact_values(x: ctmc.Exact, fcfs: bool) -> dict[str, float]:
    """The same values from the exact chain."""
    out = {"mean_tasks_per_node": x.mean_tasks, "mean_sojourn": x.mean_sojourn}
    if fcfs:
        out["wait_probability"] = x.wait
        for metric, q in ctmc.QUANTILES.items():
            out[metric] = x.fcfs_sojourn_quantile(q)
    return out


def erlang_c(n: int, offered: float) -> float:
    """P(wait) in M/M/n with offered load ``offered`` = lambda / mu < n (Erlang C), in log space."""
    log_terms = [k * math.log(offered) - math.lgamma(k + 1) for k in range(n)]
    top = n * math.log(offered) - math.lgamma(n + 1) + math.log(n / (n - offered))
    peak = max([*log_terms, top])
    below = sum(math.exp(t - peak) for t in log_terms)
    return math.exp(top - peak) / (below + math.exp(top - peak))


def join_idle(exp: Experiment, p: Prediction, speed: float, fcfs: bool) -> None:
    """JSQ and JIQ (one dispatcher, or a full view of JSQ) at the spec's n: the exact chain where it is
    small enough; otherwise the limit, whose mean-sojourn gap is at least the pooled M/M/n queue's."""
    pol, work = exp.policy, exp.workload.service
    one = pol.dispatchers == 1 or (pol.name == "jsq" and pol.view == "full")
    if not one or work.dist != "exponential":
        return
    model = _model(exp, pol.name, speed)
    x = ctmc.exact(model)
    if x is not None:
        _apply_exact(exp, p, x, fcfs, tokens=pol.name == "jiq")
        return
    n, mu = exp.n, model.mu
    offered = model.lam / mu
    wait = erlang_c(n, offered)
    gap = wait / (n * mu - model.lam)  # M/M/n's mean wait: no dispatching to n separate queues beats it
    how = (
        f"M/M/n's mean wait (Erlang C): the n queues pooled, a lower bound for any dispatching ({GAP_SOURCE})"
    )
    p.gap("mean_sojourn", gap, "at least", how)
    p.gap("mean_tasks_per_node", gap * model.lam / n, "at least", how + ", with Little's law")
    p.gap("tasks_in_system", gap * model.lam, "at least", how + ", with Little's law")
    limit = p.metrics["mean_sojourn"]["value"]
    if limit and gap > LARGE_GAP * limit:
        p.warn(
            f"mean_sojourn: the limit {limit:.4g} (queueing vanishes) is at least {100 * gap / limit:.0f} % "
            f"low at n = {n} (the M/M/n bound); the exact chain needs more than {ctmc.MAX_STATES} states here"
        )


#: the tie-breaks that send a task to an idle node by rate order: which rate goes first
RATE_ORDER = {"fastest": -1.0, "fastest_idle": -1.0, "slowest": 1.0}


def halfin_whitt_gap(exp: Experiment, p: Prediction, limit: float) -> None:
    """The finite-n gap of the Halfin-Whitt idle count for a rate-ordered tie-break on a few speed classes
    (docs/theory.md, "Idle nodes at finite n"; derived here, a heuristic).

    The classes served first (the fastest for JFSQ and JFIQ) keep only O(1) idle nodes: while the first j
    classes cannot carry the arrivals alone (their capacity C_j < lambda), their idle count is about a birth-
    death chain, born at C_j - mu_j i (their busy nodes finishing, servers with two or more tasks ignored)
    and dying at lambda (every arrival takes one while any is idle). The last class holds the rest, set by
    flow balance: sum over idle nodes of mu = sum mu - lambda exactly."""
    order = RATE_ORDER.get(tie_break(exp))
    work = exp.workload.service
    if order is None or any(c.speed.value is None for c in exp.classes):
        return
    rates: dict[float, int] = {}
    for c in exp.classes:
        mu = float(c.speed.value or 1) / work.mean
        rates[mu] = rates.get(mu, 0) + c.count
    classes = sorted(rates.items(), key=lambda kv: order * kv[0])  # served first, first
    if len(classes) < 2:
        return
    lam = exp.workload.arrival_rate
    spare = sum(mu * k for mu, k in classes) - lam
    idle_first, capacity, before = [], 0.0, 0.0
    for mu, k in classes[:-1]:
        capacity += mu * k
        if capacity >= lam:
            return  # the classes served first could carry everything: the heuristic's picture fails
        weights, w = [1.0], 1.0
        for i in range(1, int(capacity / mu) + 1):
            w *= max(capacity - mu * (i - 1), 0.0) / lam
            weights.append(w)
            if w < 1e-15 * sum(weights):
                break
        mean = sum(i * x for i, x in enumerate(weights)) / sum(weights)
        idle_first.append((mu, mean - before))
        before = mean
    mu_last = classes[-1][0]
    rest = (spare - sum(mu * i for mu, i in idle_first)) / mu_last
    estimate = rest + sum(i for _, i in idle_first)
    how = (
        "the classes served first keep O(1) idle nodes (a birth-death estimate, docs/theory.md, "
        '"Idle nodes at finite n"); flow balance gives the last class the rest'
    )
    p.gap("idle_nodes", estimate - limit, "estimate", how)
    if abs(estimate - limit) > LARGE_GAP * limit:
        p.warn(
            f"idle_nodes: the Halfin-Whitt limit {limit:.4g} converges slowly for tie_break = "
            f"{tie_break(exp)}: at n = {exp.n} the classes served first hold about "
            f"{sum(i for _, i in idle_first):.2g} idle nodes, which puts the count near {estimate:.4g}"
        )


#: ``jiq_stale.finite`` is solved up to this many nodes (4 s at 200, 15 s at 500, minutes at 1,000); above
#: it Lu et al.'s limit stays, its error there a few tenths of a percent on the mean sojourn
JIQ_STALE_MAX_NODES = 200
JIQ_STALE_SOURCE = f'derived here; {THEORY}, "JIQ with K dispatchers: stale tokens"'


def jiq_dispatchers(exp: Experiment, p: Prediction, speed: float, fcfs: bool) -> None:
    """JIQ-Random or JIQ-SQ(d) with K dispatchers at the spec's n: the stale-token chain
    (``jiq_stale.finite``) in place of Lu et al.'s limit, which stays beside it, where its assumptions hold.
    An approximation without a proved error bound (within 2 % of long simulations at 50 nodes, load 0.9),
    so its regime is ``limit``: shown, not counted in verdicts."""
    pol, work = exp.policy, exp.workload.service
    assert isinstance(pol, JIQParams)
    k, d, n = pol.dispatchers, pol.d, exp.n
    skip = (
        "exponential work" if work.dist != "exponential" else None,
        'arrivals split at random (split = "random")' if pol.split != "random" else None,
        f"at most {JIQ_STALE_MAX_NODES} nodes (its chain grows fast with n)"
        if n > JIQ_STALE_MAX_NODES
        else None,
        f"JIQ-SQ(d) with at most {jiq_stale.SQ_SPLIT_MAX} dispatchers"
        if d > 1 and k > jiq_stale.SQ_SPLIT_MAX
        else None,
    )
    missing = [s for s in skip if s is not None]
    if missing:
        p.warn(
            f"JIQ with {k} dispatchers: the stale-token model at the spec's n needs {', '.join(missing)}; "
            "the values are Lu et al.'s limit, which leaves stale tokens out (docs/theory.md)"
        )
        return
    load = exp.work_rate / (n * speed)
    v = jiq_stale.finite(n, k, load, d)
    unit = work.mean / speed
    rule = "JIQ-Random" if d == 1 else f"JIQ-SQ({d})"
    how = f"{rule} with {k} dispatchers at n = {n}: chain of (idle nodes, waiting tasks)"
    assumes = [
        "finite-n approximation, no proved error bound (within 2 % of long simulations: 50 nodes, load 0.9)",
        "exponential work",
        "Poisson arrivals split at random over the dispatchers",
        "messages delivered at once",
        "tokens used oldest first (random order: up to 3 % lower mean sojourn at 50 nodes, load 0.9)",
    ]
    values = {
        "mean_sojourn": (v.mean_sojourn * unit, f"W = L / lambda; {how}"),
        "mean_tasks_per_node": (v.mean_tasks, f"L = E[busy + waiting] / n; {how}"),
        "tasks_in_system": (n * v.mean_tasks, f"n L; {how}"),
        "messages_per_task": (
            v.messages_per_task,
            f"tokens per task (superseded ones included){' x (1 + 2d)' if d > 1 else ''}; {how}",
        ),
    }
    if fcfs:
        values["wait_probability"] = (
            v.wait,
            f"P(a task's node is busy: a random task, or a stale token); {how}",
        )
    for metric, (value, formula) in values.items():
        p.approximate(metric, value, formula, JIQ_STALE_SOURCE, assumes)
