"""Single-node queueing formulas: what one node sees under static routing.

A node of speed s serves work at rate s, so a task of work w needs w / s seconds. With arrival rate a at the
node and work of mean m and squared coefficient of variation c2, the service time S has E[S] = m / s and
E[S^2] = (m / s)^2 (1 + c2), and the node's load is rho = a E[S].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from lbtestbed.analysis.theory.numeric import bisect, poisson_sf
from lbtestbed.model.distributions import SizeDistribution


@dataclass(frozen=True)
class NodeQueue:
    """Stationary values of one node; None where no exact formula applies."""

    mean_sojourn: float
    mean_tasks: float
    wait_probability: float | None
    tail: list[float] | None  # P(N >= j), j = 0, 1, ... (time average)
    exact: bool = True


def service_quantile(work: SizeDistribution, speed: float, q: float) -> float:
    """The q-quantile of a service time work / speed."""
    m = work.mean / speed
    if work.dist == "deterministic":
        return m
    if work.dist == "exponential":
        return -math.log1p(-q) * m
    if work.dist == "lognormal":
        s2 = math.log1p(work.scv)
        return math.exp(math.log(m) - s2 / 2 + math.sqrt(s2) * NormalDist().inv_cdf(q))
    # balanced-means hyperexponential: invert its distribution function numerically
    c2 = work.scv
    p1 = 0.5 * (1 + math.sqrt((c2 - 1) / (c2 + 1)))
    r1, r2 = 2 * p1 / m, 2 * (1 - p1) / m

    def excess(t: float) -> float:
        return 1 - p1 * math.exp(-r1 * t) - (1 - p1) * math.exp(-r2 * t) - q

    return bisect(excess, 0.0, 100 * m * (1 + c2))


def geometric_tail(first: float, ratio: float, cutoff: float = 1e-12) -> list[float]:
    """[1, first, first*ratio, first*ratio^2, ...] until below ``cutoff``."""
    tail, p = [1.0], first
    while p > cutoff and len(tail) < 10_000:
        tail.append(p)
        p *= ratio
    return tail


def poisson_tail(mean: float, cutoff: float = 1e-12) -> list[float]:
    """P(N >= j) for N ~ Poisson(mean)."""
    tail, j = [1.0], 1
    while True:
        p = poisson_sf(j - 1, mean)
        if p < cutoff:
            return tail
        tail.append(p)
        j += 1


def mg1_fcfs(a: float, work: SizeDistribution, speed: float) -> NodeQueue:
    """M/G/1 FCFS (Pollaczek-Khinchine); the queue-length law is geometric only for exponential work."""
    es = work.mean / speed
    es2 = es * es * (1 + work.scv)
    rho = a * es
    w = es + a * es2 / (2 * (1 - rho))
    tail = geometric_tail(rho, rho) if work.dist == "exponential" else None
    return NodeQueue(w, a * w, rho, tail)


def mg1_ps(a: float, work: SizeDistribution, speed: float) -> NodeQueue:
    """M/G/1 processor sharing: insensitive, geometric occupancy."""
    rho = a * work.mean / speed
    return NodeQueue(work.mean / speed / (1 - rho), rho / (1 - rho), None, geometric_tail(rho, rho))


def mg_infinity(a: float, work: SizeDistribution, speed: float) -> NodeQueue:
    """M/G/infinity (a pool): Poisson occupancy with mean a E[S], no waiting."""
    rho = a * work.mean / speed
    return NodeQueue(work.mean / speed, rho, None, poisson_tail(rho))


def erlang_arrivals_m1(total_rate: float, n: int, work: SizeDistribution, speed: float) -> NodeQueue:
    """Round robin over n nodes: a node sees Erlang(n, total_rate) gaps, a GI/M/1 queue.

    sigma solves sigma = (lambda / (lambda + mu (1 - sigma)))^n; an arriving task waits with probability
    sigma, its sojourn is exponential with rate mu (1 - sigma), and P(N >= j) = rho sigma^(j-1). Exact for
    exponential work under fcfs, and for ps too (same occupancy process, Little gives the same mean).
    """
    mu = speed / work.mean
    lam = total_rate

    def fixed(sig: float) -> float:
        return (lam / (lam + mu * (1 - sig))) ** n - sig

    sigma = bisect(fixed, 0.0, 1.0 - 1e-9)
    rho = lam / n / mu
    w = 1 / (mu * (1 - sigma))
    return NodeQueue(w, lam / n * w, sigma, geometric_tail(rho, sigma))


def kingman_fcfs(a: float, ca2: float, work: SizeDistribution, speed: float) -> NodeQueue:
    """GI/G/1 FCFS, Kingman's heavy-traffic approximation: Wq ~ E[S] rho/(1-rho) (ca2 + cs2)/2."""
    es = work.mean / speed
    rho = a * es
    w = es + es * rho / (1 - rho) * (ca2 + work.scv) / 2
    return NodeQueue(w, a * w, None, None, exact=False)
