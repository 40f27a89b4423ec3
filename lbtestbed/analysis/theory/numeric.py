"""Small numerical tools the closed forms need, in plain Python: predictions stay instant to start
(importing scipy.stats and scipy.optimize alone takes about a second)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def bisect(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-13) -> float:
    """A root of f in [lo, hi], where f(lo) and f(hi) have opposite signs (or one is zero)."""
    f_lo = f(lo)
    if f_lo == 0:
        return lo
    if f(hi) == 0:
        return hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        f_mid = f(mid)
        if f_mid == 0 or hi - lo <= tol * max(1.0, abs(mid)):
            return mid
        if (f_mid < 0) == (f_lo < 0):
            lo, f_lo = mid, f_mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def falsi(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-12) -> float:
    """A root of f in [lo, hi], where f(lo) and f(hi) have opposite signs: regula falsi with the Illinois
    rule (the end kept twice has its value halved), for an f that is costly to evaluate and smooth."""
    f_lo, f_hi = f(lo), f(hi)
    if f_lo == 0:
        return lo
    if f_hi == 0:
        return hi
    side = 0
    for _ in range(200):
        mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        f_mid = f(mid)
        if f_mid == 0 or hi - lo <= tol * max(1.0, abs(mid)):
            return mid
        if (f_mid < 0) == (f_lo < 0):
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo /= 2
            side = 1
        if abs(f_mid) <= tol:
            return mid
    return 0.5 * (lo + hi)


def poisson_pmf(k: int, mean: float) -> float:
    """P(N = k) for N ~ Poisson(mean), in log space so that large means do not underflow."""
    if mean == 0:
        return 1.0 if k == 0 else 0.0
    return math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))


def poisson_sf(k: int, mean: float) -> float:
    """P(N > k): the tail is summed directly where it is small, as 1 - cdf otherwise."""
    if k + 1 > mean:
        total, j = 0.0, k + 1
        term = poisson_pmf(j, mean)
        while term > 1e-300 and (total == 0 or term > total * 1e-17):
            total += term
            j += 1
            term *= mean / j
        return total
    return max(0.0, 1.0 - sum(poisson_pmf(j, mean) for j in range(k + 1)))


def erlang_cdf(x: float, shape: int) -> float:
    """P(Gamma(shape, 1) <= x) for an integer shape: 1 - e^(-x) sum_{i < shape} x^i / i!."""
    if x <= 0:
        return 0.0
    term, total = 1.0, 1.0
    for i in range(1, shape):
        term *= x / i
        total += term
    return max(0.0, 1.0 - math.exp(-x) * total)


def erlang_mixture_quantile(weights: Sequence[float], mu: float, q: float) -> float:
    """The q-quantile of a mixture of Gamma(k + 1, mu) with weights[k]: the fcfs sojourn of a task that
    finds k tasks ahead at its node, with exponential work of rate mu."""
    terms = [(k, w) for k, w in enumerate(weights) if w > 1e-16]
    total = sum(w for _, w in terms)

    def excess(t: float) -> float:
        return sum(w * erlang_cdf(t * mu, k + 1) for k, w in terms) / total - q

    hi = 1.0 / mu
    while excess(hi) < 0:
        hi *= 2
    return bisect(excess, 0.0, hi)
