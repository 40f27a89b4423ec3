"""``lbt predict``: the stationary values the papers predict for a spec, with formulas and assumptions.

Where no formula applies the metric stays null and a note says why; no number is invented. Notes name the
formula, where it comes from (a paper, textbook queueing, or a heading of ``docs/theory.md``, which states
every formula with its source) and what it assumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

from lbtestbed.analysis.results.result import METRICS, Result
from lbtestbed.analysis.theory import dispatchers, finite, hetero_ps, queues, sparse_feedback, supermarket
from lbtestbed.analysis.theory.fluid import warmup_needed
from lbtestbed.analysis.theory.numeric import bisect
from lbtestbed.analysis.theory.pools import (
    PoolOptimum,
    poisson_jensen_bound,
    pool_load,
    pool_optimum,
    pool_speed,
    random_utility,
)
from lbtestbed.analysis.theory.prediction import THEORY, Prediction
from lbtestbed.model.conditions import speed_varies
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import policy_of
from lbtestbed.policies.hetero_ps import SchemeParams
from lbtestbed.policies.jiq import JIQParams
from lbtestbed.policies.jiq_sparse import SparseJIQParams, tokens_per_task
from lbtestbed.policies.sampling import LeastRequestParams, PowerOfDParams, node_weights
from lbtestbed.policies.slta import SLTAParams
from lbtestbed.policies.sparse_jsq import SparseJSQParams

#: metrics a queueing formula predicts together, and which fall together when it does not apply
#: beyond this beta the load is too light for the Halfin-Whitt idle-count formula to mean anything
HW_BETA_MAX = 3.0

QUEUE_METRICS = (
    "mean_sojourn",
    "sojourn_p50",
    "sojourn_p99",
    "mean_tasks_per_node",
    "tasks_in_system",
    "wait_probability",
    "occupancy_tail",
)

#: short citations for each note's ``source``; docs/theory.md, "Sources", gives the full references
POOL_PAPER = "Goldsztajn et al. 2021 (arXiv 2112.08958)"
PS_PAPER = "Mukhopadhyay et al. 2015 (arXiv 1502.05786)"
POD_PAPER = "Fittipaldi et al. 2018 (arXiv 1809.05373)"
HJSQ_PAPER = 'the heterogeneous-JSQ paper ("Load Balancing with Individually Heterogeneous Servers")'
SPARSE_PAPER = "van der Boor, Borst and van Leeuwaarden 2019 (arXiv 1903.02337)"


#: policies whose dispatchers, when there are several, each decide on their own partial view of the nodes
#: (jsq, jlmu and slta unless their ``view`` is full)
LOCAL_VIEW = ("round_robin", "least_request", "peak_ewma", "jsq", "jlmu", "slta")
LU_PAPER = "Lu et al. 2011 (Performance Evaluation 68(11)), §4"
FULL_VIEW = (
    "a full view (policy.view = full): with exact delivery every dispatcher sees the true state and SLTA's "
    "share one r, so K dispatchers decide as one"
)


WEIGHTED_LEAST_REQUEST = (
    "least_request with unequal weights follows Envoy's deterministic weighted schedule, whose effective "
    f"weights move with the dispatcher's own counts: no result in the papers covers it ({THEORY}, "
    '"The proxies\' policies: no theory")'
)
PEAK_EWMA = (
    "peak_ewma decides on latency estimates that decay with time and jump to peaks: no result in the papers "
    f'covers it ({THEORY}, "The proxies\' policies: no theory")'
)


def _local_view(exp: Experiment) -> bool:
    """Whether the spec's several dispatchers each decide on a partial view of the nodes."""
    pol = exp.policy
    if pol.dispatchers == 1 or pol.name not in LOCAL_VIEW:
        return False
    return pol.name in ("round_robin", "least_request", "peak_ewma") or pol.view == "local"


def _why_local(exp: Experiment) -> str:
    """Why a policy on local views has no theory with several dispatchers."""
    return (
        f"{exp.policy.dispatchers} dispatchers, each deciding on its own view (its own tasks, its own "
        f"turn or counts: docs/spec.md, dispatchers and split): no result in the papers covers "
        f"{exp.policy.name} so split"
    )


def _doc(heading: str) -> str:
    """A citation of a section of docs/theory.md."""
    return f'{THEORY}, "{heading}"'


FLOW = _doc("Flow balance")
BOUNDS = "The `bounds` block"


def _disciplines(exp: Experiment) -> set[str]:
    return {c.discipline for c in exp.classes}


def _equal_speeds(exp: Experiment) -> float | None:
    speeds = set(exp.node_speeds)
    return speeds.pop() if len(speeds) == 1 else None


def _mixture_quantile(cdfs: Sequence[Callable[[float], float]], q: float, scale: float) -> float:
    """q-quantile of an equal-weight mixture of distributions given by their distribution functions."""

    def excess(t: float) -> float:
        return sum(f(t) for f in cdfs) / len(cdfs) - q

    hi = scale
    while excess(hi) < 0:
        hi *= 2
    return bisect(excess, 0.0, hi)


def predict(exp: Experiment) -> Result:
    """The theory result object for a spec."""
    p = Prediction(exp)
    work = exp.workload.service
    discs = _disciplines(exp)
    msgs = _messages(exp)
    varies = speed_varies(exp)
    if varies is not None:
        # every formula here assumes each node keeps one speed; a count of messages fixed by the policy's
        # definition (no assumption about the state) still holds
        why = f"{varies}: every formula in {THEORY} assumes constant node speeds"
        if msgs[0] is not None and not msgs[3]:
            p.set("messages_per_task", msgs[0], msgs[1], msgs[2])
        p.null_many(METRICS, why)
        return p.result()
    if msgs[0] is None:
        p.null("messages_per_task", msgs[1])
    else:
        p.set("messages_per_task", msgs[0], msgs[1], msgs[2], msgs[3])
    if discs == {"pool"}:
        _pools(exp, p)
    elif "pool" not in discs:
        _queued_common(exp, p)
        policy = exp.policy.name
        if len(discs) > 1:
            p.null_many(QUEUE_METRICS, "mixed fcfs and ps nodes: every formula here assumes one discipline")
        elif _local_view(exp):
            p.null_many(QUEUE_METRICS, _why_local(exp))
        elif policy == "random":
            _static(exp, p, per_node=lambda s: _node_formula(exp, exp.workload.arrival_rate / exp.n, s))
        elif policy == "round_robin":
            _round_robin(exp, p)
        elif policy == "least_request" and len(set(node_weights(exp))) > 1:
            p.null_many(QUEUE_METRICS, WEIGHTED_LEAST_REQUEST)
        elif policy in ("power_of_d", "least_request"):
            _supermarket(exp, p)
        elif policy == "peak_ewma":
            p.null_many(QUEUE_METRICS, PEAK_EWMA)
        elif policy in ("jsq", "jiq"):
            _join_idle(exp, p)
        elif policy in ("scheme1", "scheme2"):
            _schemes(exp, p)
        elif policy in ("sparse_jsq", "jiq_sparse"):
            _sparse_feedback(exp, p)
        elif policy == "prequal":
            p.null_many(QUEUE_METRICS, f"Prequal has no queueing theory ({_doc('Prequal: no theory')})")
    else:
        p.null_many(QUEUE_METRICS, "mixed pools and queues: no formula covers them together")
    if (
        exp.policy.dispatchers > 1
        and exp.policy.view == "full"
        and exp.policy.name in ("jsq", "jlmu", "slta")
    ):
        for note in p.notes:
            if "assumes" in note:
                note["assumes"].append(FULL_VIEW)
    if work.dist != "exponential":
        p.notes.append(
            {
                "metric": "*",
                "formula": f"work is {work.describe()}",
                "source": "spec",
                "assumes": ["formulas marked 'exponential work' do not apply"],
            }
        )
    return p.result()


# ----------------------------------------------------------------------------------------- messages


def _messages(exp: Experiment) -> tuple[float | None, str, str, list[str]]:
    """The policy's own count of its messages per task (``unit.Policy.messages``)."""
    cost = policy_of(exp).messages(exp)
    return cost.per_task, cost.formula, cost.source, list(cost.assumes)


# -------------------------------------------------------------------------------------------- pools


def _pools(exp: Experiment, p: Prediction) -> None:
    work = exp.workload.service
    speed = _equal_speeds(exp)
    if speed is None or pool_speed(exp) is None:
        why = (
            "pools of different speeds: the total is not Poisson independently of routing, and the bounds "
            f"and the JLMU/SLTA limits assume one service rate ({POOL_PAPER} §2.1)"
        )
        for metric in (
            "mean_sojourn",
            "sojourn_p50",
            "sojourn_p99",
            "mean_tasks_per_node",
            "tasks_in_system",
            "utility",
            "slta_r",
        ):
            p.null(metric, why)
        return
    es = work.mean / speed
    rho = exp.workload.arrival_rate * es / exp.n
    n = exp.n
    src = f"{POOL_PAPER} §2.1, §3.3; {_doc('Any policy, equal speeds')}"
    p.set("tasks_in_system", n * rho, "n rho: the total is M/G/inf, Poisson(n rho), under any policy", src)
    p.metrics["tasks_in_system"]["variance"] = {"value": n * rho, "ci95": None}
    p.set("mean_tasks_per_node", rho, "rho = lambda E[S] / n", src)
    p.set("mean_sojourn", es, "E[S]: a pool serves every task at once", src)
    p.set("sojourn_p50", queues.service_quantile(work, speed, 0.5), "median of the service time", src)
    p.set(
        "sojourn_p99", queues.service_quantile(work, speed, 0.99), "99th percentile of the service time", src
    )
    p.null("wait_probability", "pools never queue a task")
    p.null("idle_capacity", "pools have no finite capacity")
    if any(c.utility is None for c in exp.classes):
        p.null("utility", "some class has no utility")
        if exp.policy.name == "random":
            for c in exp.classes:
                p.tail(c.name, queues.poisson_tail(rho), "Poisson(rho) per pool", src)
        return
    opt = pool_optimum(exp)
    pj = poisson_jensen_bound(exp)
    names = [c.name for c in exp.classes]
    p.bounds.update(
        {
            "utility_upper": opt.bound,
            "utility_poisson_jensen": pj,
            "r_star": opt.r_star,
            "sigma_star": {"class": names[opt.sigma[0]], "j": opt.sigma[1]},
            "q_star_fill": float(opt.fill),
            "integral_optimum": opt.integral,
            "thresholds_at_r_star": dict(zip(names, opt.thresholds, strict=True)),
            "valid_for": f"every policy and every n ({POOL_PAPER} Thm 1; Poisson-Jensen: {_doc(BOUNDS)})",
        }
    )
    policy = exp.policy.name
    if policy == "random":
        p.set(
            "utility",
            random_utility(exp),
            "sum_i alpha_i E[u_i(Poisson(rho))]",
            _doc("`random` on pools"),
            ["uniform random routing: each pool is M/G/inf"],
        )
        for c in exp.classes:
            p.tail(c.name, queues.poisson_tail(rho), "Poisson(rho) per pool", _doc("`random` on pools"))
    elif _local_view(exp):
        p.null_many(("utility", "slta_r"), f"{_why_local(exp)}; the bounds above still hold")
    elif policy in ("jlmu", "slta"):
        limit = ["n -> infinity (Theorem 2)", "exponential work"]
        if policy == "slta":
            limit.append("beta_n -> 0 with n^gamma beta_n bounded below")
            if opt.integral:
                limit.append(f"the optimum is integral here, outside the SLTA theory ({POOL_PAPER} §4.2.1)")
        p.set("utility", opt.bound, "u(q*): the limit of the mean utility", f"{POOL_PAPER} Thm 2(c)", limit)
        for i, c in enumerate(exp.classes):
            p.tail(
                c.name,
                opt.class_tail(i),
                "q*: l_i tasks per pool, sigma*'s slot in a fraction of class i*",
                f"{POOL_PAPER} (4), Thm 2",
                limit,
            )
        if policy == "slta":
            p.set("slta_r", opt.r_star, "r*: the rank of sigma*", f"{POOL_PAPER} Thm 2(b)", limit)
            _slta_range(exp, p, opt)
        p.gap(
            "utility",
            pj - opt.bound,
            "at most",
            f"the Poisson-Jensen bound at this n: no policy's mean utility exceeds it ({_doc(BOUNDS)})",
        )
    else:
        p.null("utility", f"{policy} on pools has no theory in the papers; the bounds above still hold")
    p.bounds["warmup_needed"] = warmup_needed(exp)


def _slta_range(exp: Experiment, p: Prediction, opt: PoolOptimum) -> None:
    """Warn when beta_n is above the green tokens SLTA sees one slot past sigma*, n (alpha_i* - q*(sigma*)):
    the decrement that brings r back to r* cannot fire there (docs/theory.md, "Why gamma_0 < 1/2")."""
    assert isinstance(exp.policy, SLTAParams)
    beta = exp.policy.beta
    i_star = opt.sigma[0]
    room = float(opt.alpha[i_star] - opt.fill)
    p.bounds["slta_beta_range"] = {"beta_n": beta, "green_past_sigma_star": room}
    if beta < room:
        return
    n = exp.n
    lowest = 2.0 / n  # n beta_n >= 2 (the parser's bound)
    fix = (
        f"beta_scale below {room * n**0.25:.3g} (beta below {room:.3g}) brings it back"
        if room > lowest
        else f"no beta_n at n = {n} is both below {room:.3g} and at least 2 / n"
    )
    p.warn(
        f"slta: beta_n = {beta:.3g} is not below alpha_i* - q*(sigma*) = {room:.3g}, the fraction of pools "
        f"holding a green token one slot past sigma* (class {exp.classes[i_star].name}): the decrement "
        f"cannot bring r back from r* + 1 and r may sit above r* = {opt.r_star}, with utility below "
        f'JLMU\'s; {fix} (docs/theory.md, "Why gamma_0 < 1/2")'
    )


# ------------------------------------------------------------------------------------------- queues


def _queued_common(exp: Experiment, p: Prediction) -> None:
    capacity = sum(exp.node_speeds)
    p.bounds["stability"] = {
        "work_rate": exp.work_rate,
        "capacity": capacity,
        "stable": exp.work_rate < capacity,
    }
    p.set(
        "idle_capacity",
        capacity - exp.work_rate,
        "sum of speeds - work arrival rate: every node is busy a fraction (its work rate / its speed)",
        FLOW,
        ["any stable policy", "fcfs or ps nodes (work conserving)"],
    )
    speed = _equal_speeds(exp)
    if speed is not None:
        p.set(
            "idle_nodes",
            exp.n - exp.work_rate / speed,
            "n - work rate / speed",
            FLOW,
            ["any stable policy", "equal speeds"],
        )


def _node_formula(exp: Experiment, a: float, speed: float) -> queues.NodeQueue | None:
    work = exp.workload.service
    disc = exp.classes[0].discipline if len(_disciplines(exp)) == 1 else None
    if disc == "fcfs":
        return queues.mg1_fcfs(a, work, speed)
    if disc == "ps":
        return queues.mg1_ps(a, work, speed)
    return None


def _static(
    exp: Experiment,
    p: Prediction,
    per_node: Callable[[float], queues.NodeQueue | None],
    formula: str = "M/G/1 per node (Pollaczek-Khinchine for fcfs, M/G/1-PS for ps)",
    source: str = "textbook queueing (M/G/1, M/G/1-PS)",
    assumes: Sequence[str] = (),
    wait_formula: str = "P(node busy) by PASTA",
) -> None:
    """Average per-node formulas over the nodes (each node gets 1/n of the tasks)."""
    work = exp.workload.service
    speeds = exp.node_speeds
    by_speed = {s: per_node(s) for s in set(speeds)}
    if any(q is None for q in by_speed.values()):
        p.null("mean_sojourn", "mixed fcfs and ps nodes")
        return
    nodes = [by_speed[s] for s in speeds]
    n = exp.n
    a = exp.workload.arrival_rate / n
    p.set(
        "idle_nodes",
        sum(1 - a * work.mean / s for s in speeds),
        "sum_k (1 - rho_k): each node is busy rho_k",
        "textbook queueing",
        ["static routing: every node gets 1/n of the tasks"],
    )
    exact = all(q is not None and q.exact for q in nodes)
    tag = list(assumes) + ([] if exact else ["approximation"])
    p.set("mean_sojourn", sum(q.mean_sojourn for q in nodes if q) / n, formula, source, tag)
    p.set("mean_tasks_per_node", sum(q.mean_tasks for q in nodes if q) / n, formula + ", Little", source, tag)
    p.set("tasks_in_system", sum(q.mean_tasks for q in nodes if q), formula + ", Little", source, tag)
    waits = [q.wait_probability for q in nodes if q]
    if exp.classes[0].discipline == "fcfs" and all(w is not None for w in waits):
        p.set(
            "wait_probability",
            sum(w for w in waits if w is not None) / n,
            wait_formula,
            source,
            tag,
        )
    for i, c in enumerate(exp.classes):
        members = [nodes[k] for k in range(n) if exp.node_class[k] == i]
        if all(q is not None and q.tail is not None for q in members):
            width = max(len(q.tail) for q in members if q and q.tail)
            tail = [
                sum((q.tail[j] if q and q.tail and j < len(q.tail) else 0.0) for q in members) / len(members)
                for j in range(width)
            ]
            p.tail(c.name, tail, "per-node occupancy law, averaged over the class", source, tag)
    if exp.classes[0].discipline == "fcfs" and work.dist == "exponential" and exact:
        # sojourn of an fcfs node with exponential work and P(wait) = w: Exp(mu (1 - w)) for M/M/1 and GI/M/1
        rates = [(speeds[k] / work.mean) * (1 - (nodes[k].wait_probability or 0.0)) for k in range(n)]  # type: ignore[union-attr]
        cdfs = [lambda t, r=r: 1 - math.exp(-r * t) for r in rates]
        scale = 1 / min(rates)
        p.set(
            "sojourn_p50",
            _mixture_quantile(cdfs, 0.5, scale),
            "exponential sojourn per node, mixed",
            source,
            tag,
        )
        p.set(
            "sojourn_p99",
            _mixture_quantile(cdfs, 0.99, scale),
            "exponential sojourn per node, mixed",
            source,
            tag,
        )


def _round_robin(exp: Experiment, p: Prediction) -> None:
    work = exp.workload.service
    lam, n = exp.workload.arrival_rate, exp.n
    disc = exp.classes[0].discipline if len(_disciplines(exp)) == 1 else None
    if work.dist == "exponential":
        _static(
            exp,
            p,
            lambda s: queues.erlang_arrivals_m1(lam, n, work, s),
            formula="GI/M/1 per node with Erlang(n) gaps: sigma = (lambda/(lambda + mu(1 - sigma)))^n",
            source="textbook queueing (GI/M/1)",
            assumes=["exponential work"],
            wait_formula="sigma: the probability that an arrival finds its node busy (GI/M/1)",
        )
    elif disc == "fcfs":
        _static(
            exp,
            p,
            lambda s: queues.kingman_fcfs(lam / n, 1.0 / n, work, s),
            formula="Kingman: Wq ~ E[S] rho/(1-rho) (1/n + scv)/2 (Erlang(n) gaps have scv 1/n)",
            source="textbook queueing (Kingman)",
            wait_formula="not predicted",
        )
    else:
        p.null_many(QUEUE_METRICS, "round robin on ps nodes with non-exponential work: no formula")


def _supermarket(exp: Experiment, p: Prediction) -> None:
    speed = _equal_speeds(exp)
    work = exp.workload.service
    disc = exp.classes[0].discipline if len(_disciplines(exp)) == 1 else None
    if speed is None:
        p.null_many(
            QUEUE_METRICS,
            "power-of-d with unequal speeds: not implemented (the pool SQ(d) baseline of "
            f"{_doc('Baselines for the schemes')}, is not a prediction lbt makes)",
        )
        return
    if disc == "fcfs" and work.dist != "exponential":
        p.null_many(
            QUEUE_METRICS,
            "JSQ(d) on fcfs nodes is insensitive only for exponential work "
            f"({_doc('Reference numbers for JSQ(d)')})",
        )
        return
    assert isinstance(exp.policy, PowerOfDParams | LeastRequestParams)
    d = exp.policy.d
    a = exp.workload.arrival_rate / exp.n
    rho = a * work.mean / speed
    field = "n -> infinity (mean field)" if d > 1 else "d = 1 is random routing: M/M/1 or M/G/1-PS per node"
    assumes = [field, "exponential work" if disc == "fcfs" else "ps: any work law"]
    if exp.policy.name == "least_request":
        assumes.append(
            "one dispatcher: its in-flight counts are the queue lengths, so least_request is JSQ(d)"
        )
    src = f"{POD_PAPER} eq. (1.1); Mitzenmacher 2001"
    tails = supermarket.tails(rho, d)
    L = sum(tails[1:])
    p.set("mean_tasks_per_node", L, f"L = sum_k P_k, P_k = rho^((d^k - 1)/(d - 1)), d = {d}", src, assumes)
    p.set("tasks_in_system", exp.n * L, "n L", src, assumes)
    p.set("mean_sojourn", L / a, "W = L / lambda (Little)", src, assumes)
    for c in exp.classes:
        p.tail(c.name, tails, "P_k = rho^((d^k - 1)/(d - 1))", src, assumes)
    if disc == "fcfs":
        p.set("wait_probability", supermarket.wait_probability(rho, d), "P_1^d = rho^d", src, assumes)
        mu = speed / work.mean
        for metric, q in (("sojourn_p50", 0.5), ("sojourn_p99", 0.99)):
            p.set(
                metric,
                supermarket.fcfs_sojourn_quantile(rho, d, mu, q),
                "mixture of Gamma(k+1, mu) with weights P_k^d - P_{k+1}^d",
                src,
                assumes,
            )
    finite.supermarket(exp, p, speed, disc == "fcfs")


def _join_idle(exp: Experiment, p: Prediction) -> None:
    """JSQ and JIQ at fixed load < 1: queueing vanishes as n grows; Halfin-Whitt idle counts for JSQ."""
    work = exp.workload.service
    speed = _equal_speeds(exp)
    name = exp.policy.name
    src = f"Lu et al. 2011; Stolyar 2015; Foss & Stolyar 2017; {_doc('Classical results for JSQ and JIQ')}"
    if speed is not None and name == "jiq" and exp.policy.dispatchers > 1:
        _jiq_dispatchers(exp, p, speed)
        return
    if speed is not None:
        rho = exp.work_rate / (exp.n * speed)
        limit = ["n -> infinity at fixed load < 1 (queueing vanishes)"]
        if name == "jiq":
            limit += ["exponential work, or load < 1/2 for general work (Foss-Stolyar)"]
        p.set("mean_sojourn", work.mean / speed, "E[S]: every task finds an idle node", src, limit)
        p.set("mean_tasks_per_node", rho, "rho: one task per busy node", src, limit)
        p.set("tasks_in_system", exp.n * rho, "n rho", src, limit)
        if exp.classes[0].discipline == "fcfs":
            p.set("wait_probability", 0.0, "P(wait) -> 0", src, limit)
        for c in exp.classes:
            p.tail(c.name, [1.0, rho], "P(>= 1) = rho, P(>= 2) -> 0", src, limit)
        p.set("sojourn_p50", queues.service_quantile(work, speed, 0.5), "service-time median", src, limit)
        p.set(
            "sojourn_p99",
            queues.service_quantile(work, speed, 0.99),
            "service-time 99th percentile",
            src,
            limit,
        )
        finite.join_idle(exp, p, speed, exp.classes[0].discipline == "fcfs")
        return
    unequal = (
        f"unequal speeds: only finite-n simulation tables exist ({_doc('Finite-n reference: exact CTMC')}), "
        "no formula for this metric"
    )
    p.null_many(QUEUE_METRICS, unequal)
    if name != "jsq":
        return
    # heterogeneous JSQ, Halfin-Whitt regime: E[#idle] ~ sqrt(n) beta / c, beta = (sum mu - lambda) / sqrt(n)
    mus = [s / work.mean for s in exp.node_speeds]
    n = exp.n
    beta = (sum(mus) - exp.workload.arrival_rate) / math.sqrt(n)
    lo, hi = _rate_support(exp)
    mean_mu = sum(mus) / n
    fairness = {"fastest": lo, "fastest_idle": lo, "slowest": hi}.get(
        finite.tie_break(exp), sum(m * m for m in mus) / n / mean_mu
    )
    p.bounds["halfin_whitt"] = {"beta": beta, "fairness_coefficient": fairness}
    if not 0 < beta <= HW_BETA_MAX:
        p.null(
            "idle_nodes",
            f"beta = (sum mu - lambda) / sqrt(n) = {beta:.3g} is outside the Halfin-Whitt "
            f"regime (0, {HW_BETA_MAX}] where E[#idle] ~ sqrt(n) beta / c applies",
        )
        return
    idle = math.sqrt(n) * beta / fairness
    if idle > n / 2:
        p.null(
            "idle_nodes",
            f"sqrt(n) beta / c = {idle:.3g} idle nodes is more than half of n = {n}: far from the "
            "Halfin-Whitt regime, where the idle count is small next to n",
        )
        return
    p.set(
        "idle_nodes",
        idle,
        "sqrt(n) beta / c, c = <iota, eta> of the tie-break",
        f"{HJSQ_PAPER} Thm 4.1; {_doc('Idle nodes in the diffusion limit')}",
        ["Halfin-Whitt diffusion limit", "exponential work", "approximation"],
    )
    finite.halfin_whitt_gap(exp, p, idle)


def _jiq_dispatchers(exp: Experiment, p: Prediction, speed: float) -> None:
    """JIQ-Random or JIQ-SQ(d) with K dispatchers, equal speeds: Lu et al.'s limit with n / K fixed, in
    which a node's busy periods are an M/G/1 queue's at the reduced load lambda (1 - rho) (dispatchers.py)."""
    work, pol = exp.workload.service, exp.policy
    assert isinstance(pol, JIQParams)
    k, d = pol.dispatchers, pol.d
    load = exp.work_rate / (exp.n * speed)
    ratio = exp.n / k
    rho = dispatchers.occupied_iqueues(ratio, load, d)
    reduced = load * (1.0 - rho)
    rule = "JIQ-Random" if d == 1 else f"JIQ-SQ({d})"
    fixed = (
        f"n -> infinity with n / K = {ratio:.4g} nodes per dispatcher fixed ({rule}: rho = {rho:.4g} of the "
        f"dispatchers hold a token, lambda' = lambda (1 - rho) = {reduced:.4g})"
    )
    limit = [fixed, "a token is never stale: an idle node sits in one idle queue (Lu et al.'s model)"]
    if pol.split != "random":
        limit.append("Poisson arrivals at each dispatcher (round_robin splits them evenly, not Poisson)")
    src = f"{LU_PAPER}; {_doc('Several dispatchers')}"
    node = _node_formula(exp, reduced * speed / work.mean, speed)
    assert node is not None  # one discipline, fcfs or ps (checked by the caller)
    p.set("mean_sojourn", node.mean_sojourn, "the mean sojourn of M/G/1 at load lambda'", src, limit)
    p.set(
        "mean_tasks_per_node",
        load * node.mean_sojourn / (work.mean / speed),
        "Little: lambda E[T]",
        src,
        limit,
    )
    p.set(
        "tasks_in_system", exp.n * load * node.mean_sojourn / (work.mean / speed), "n lambda E[T]", src, limit
    )
    if exp.classes[0].discipline == "fcfs":
        p.set(
            "wait_probability",
            (1.0 - rho) * load,
            "(1 - rho) lambda: routed at random to a busy node",
            src,
            limit,
        )
    if node.tail is not None:
        tail = [1.0] + [load * q for q in node.tail]  # node.tail: P(N' >= j) = lambda'^j of M/G/1
        for c in exp.classes:
            p.tail(c.name, tail, "P(N >= j) = lambda lambda'^(j-1), j >= 1", src, limit)
    tokens = 1.0 - reduced
    probes = 2 * d if d > 1 else 0
    p.set(
        "messages_per_task",
        tokens * (1 + probes),
        f"(1 - lambda') tokens per task{f', each after {d} probes and {d} answers' if probes else ''}",
        src,
        limit,
    )
    why = f"{rule} with {k} dispatchers: the limit gives the mean, not the sojourn's distribution"
    p.null_many(("sojourn_p50", "sojourn_p99"), why)
    finite.jiq_dispatchers(exp, p, speed, exp.classes[0].discipline == "fcfs")


def _sparse_regime(exp: Experiment) -> str | None:
    """Why the fluid limits of sparse feedback do not cover ``exp`` (None: they do)."""
    if exp.policy.dispatchers > 1:
        return (
            f"{exp.policy.dispatchers} dispatchers, each on its own estimates or tokens: the fluid limits of "
            f"{_doc('Sparse feedback: JSQ on occasional updates')} are for one dispatcher"
        )
    if _equal_speeds(exp) is None:
        return "unequal speeds: the fluid limits of sparse feedback are for identical servers"
    if exp.workload.service.dist != "exponential":
        work = exp.workload.service.describe()
        return f"work is {work}: the fluid limits of sparse feedback need exponential work"
    if exp.work_rate >= sum(exp.node_speeds):
        return "load >= 1: no stationary regime"
    return None


def _sparse_feedback(exp: Experiment, p: Prediction) -> None:
    """JSQ on sparse feedback (asynchronous or synchronous updates) and sparsified JIQ: the fixed points of
    their fluid limits (``sparse_feedback``; docs/theory.md, "Sparse feedback: JSQ on occasional updates"),
    in units of the mean service time, scaled to the spec's."""
    why = _sparse_regime(exp)
    if why is not None:
        p.null_many(QUEUE_METRICS, why)
        return
    pol, speed = exp.policy, exp.node_speeds[0]
    load = exp.work_rate / (exp.n * speed)
    if isinstance(pol, SparseJSQParams):
        fluid = sparse_feedback.asynchronous if pol.updates == "asynchronous" else sparse_feedback.synchronous
        values = fluid(load, pol.rate)
        model = f"JSQ on {pol.updates} updates at {pol.rate:g} messages per task"
    else:
        assert isinstance(pol, SparseJIQParams)
        values = sparse_feedback.sparse_jiq(load, tokens_per_task(pol.p, load))
        model = f"sparsified JIQ, p = {pol.p:g}"
    fcfs = exp.classes[0].discipline == "fcfs"
    limit = [
        "n -> infinity (the fixed point of the fluid limit)",
        "one dispatcher",
        "exponential work",
        "equal speeds",
        "messages delivered at once",
        "fcfs" if fcfs else "ps: with exponential work its queue lengths move as fcfs's",
    ]
    src = f"{SPARSE_PAPER}; {_doc('Sparse feedback: JSQ on occasional updates')}"
    scale = exp.workload.service.mean / speed
    p.set("mean_sojourn", values.mean_sojourn * scale, f"{model}: E[Q] / load (Little)", src, limit)
    p.set("mean_tasks_per_node", values.mean_queue, f"{model}: E[Q]", src, limit)
    p.set("tasks_in_system", exp.n * values.mean_queue, "n E[Q]", src, limit)
    if fcfs:
        p.set("wait_probability", values.wait, f"{model}: P(a task finds its node busy)", src, limit)
    if values.tail:
        for c in exp.classes:
            p.tail(c.name, values.tail, f"{model}: P(Q >= k) at the fixed point", src, limit)
    why = f"{model}: the fluid limit gives the mean sojourn and the queue law, not the sojourn's distribution"
    p.null_many(("sojourn_p50", "sojourn_p99"), why)


def _rate_support(exp: Experiment) -> tuple[float, float]:
    """The support [mu_min, mu_max] of the rate distribution: the spec's bounds, or its class speeds."""
    lows, highs = [], []
    for c in exp.classes:
        if c.speed.value is not None:
            lows.append(float(c.speed.value))
            highs.append(float(c.speed.value))
        else:
            assert c.speed.low is not None and c.speed.high is not None
            lows.append(c.speed.low)
            highs.append(c.speed.high)
    m = exp.workload.service.mean
    return min(lows) / m, max(highs) / m


def _schemes(exp: Experiment, p: Prediction) -> None:
    if _disciplines(exp) != {"ps"}:
        p.null("mean_sojourn", "scheme 1 and 2 are analysed for ps nodes only")
        return
    if any(c.speed.value is None for c in exp.classes):
        p.null("mean_sojourn", "the fixed point needs one speed per class")
        return
    assert isinstance(exp.policy, SchemeParams)
    caps = [Fraction(c.speed.value or 1) for c in exp.classes]
    gam = [c.count / exp.n for c in exp.classes]
    lam = exp.workload.arrival_rate / exp.n
    mu = 1.0 / exp.workload.service.mean
    scheme = 1 if exp.policy.name == "scheme1" else 2
    fp = hetero_ps.fixed_point(caps, gam, exp.policy.d, lam, mu, scheme)
    eq = "(4.11)" if scheme == 1 else "(4.12)"
    src = f"{PS_PAPER} {eq}, Thm 4.4; {_doc('The mean field and its fixed point')}"
    assumes = ["n -> infinity (mean field)", "ps: any work law (asymptotic insensitivity)"]
    p.set(
        "mean_sojourn",
        fp.overall_sojourn,
        f"fixed point of {eq}: E[T] = sum_j gamma_j E[Q_j] / lambda",
        src,
        assumes,
    )
    p.set("mean_tasks_per_node", fp.overall_tasks, "sum_j gamma_j sum_n P_n^(j)", src, assumes)
    p.set("tasks_in_system", exp.n * fp.overall_tasks, "n E[Q]", src, assumes)
    p.metrics["mean_sojourn"]["by_class"] = {
        c.name: {"value": fp.mean_sojourn[i], "ci95": None} for i, c in enumerate(exp.classes)
    }
    for i, c in enumerate(exp.classes):
        p.tail(c.name, fp.tails[i], f"fixed point of {eq}", src, assumes)
    p.set(
        "idle_nodes",
        sum(
            c.count * (1 - (fp.tails[i][1] if len(fp.tails[i]) > 1 else 0.0))
            for i, c in enumerate(exp.classes)
        ),
        "sum_j n gamma_j (1 - P_1^(j))",
        src,
        assumes,
    )
    p.bounds["stability"]["condition"] = "lambda < mu sum_j gamma_j C_j (Theorem 3.1)"
    p.bounds["job_share"] = {c.name: fp.share[i] for i, c in enumerate(exp.classes)}
    p.bounds["fixed_point_residual"] = fp.residual


def transient_table(exp: Experiment, times: Sequence[float]) -> list[dict[str, float]]:
    """The JLMU fluid trajectory from empty (pools only)."""
    from lbtestbed.analysis.theory.fluid import from_empty

    return [
        {"t": pt.t, "mass": pt.mass, "utility": pt.utility, "distance": pt.distance}
        for pt in from_empty(exp, times)
    ]


__all__ = ["pool_load", "predict", "transient_table"]
