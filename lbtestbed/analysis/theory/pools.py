"""Server pools with utilities (Goldsztajn et al. 2021, arXiv 2112.08958, §2-§3; docs/theory.md, "Pools").

The optimal fractional assignment q* fills slots greedily in ranking order: every slot ranked above sigma*
is full, sigma* is partly filled, the rest are empty. Its utility u(q*) = U*(rho) bounds the mean utility of
every policy for every n (Theorem 1); the sharper Poisson-Jensen bound E[U*(N/n)], N ~ Poisson(n rho),
holds too (derived in docs/theory.md, "The `bounds` block"). JLMU and SLTA converge to q* (Theorem 2,
exponential work), SLTA's index to r*. Capacities and the load are exact fractions, because the integral
case is an exact equality.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from lbtestbed.analysis.theory.numeric import poisson_pmf
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies.jlmu import ranking_of
from lbtestbed.policies.ranking import Ranking


@dataclass(frozen=True)
class PoolOptimum:
    r_star: int  # rank of sigma*
    sigma: tuple[int, int]  # (class index, j) of the partly filled slot
    fill: Fraction  # q*(sigma*): the fraction of all pools holding sigma*'s task
    thresholds: tuple[int, ...]  # l_i(r*): tasks every class-i pool holds below sigma*
    bound: float  # u(q*) = U*(rho)
    alpha: tuple[Fraction, ...]  # class fractions

    @property
    def integral(self) -> bool:
        return self.fill == 0

    def class_tail(self, i: int) -> list[float]:
        """P(a class-i pool holds >= j tasks) under q*: l_i tasks each, plus sigma*'s task in a fraction."""
        ell = self.thresholds[i]
        tail = [1.0] * (ell + 1)
        if i == self.sigma[0] and self.fill > 0:
            tail.append(float(self.fill / self.alpha[i]))
        return tail

    def class_mean(self, i: int) -> float:
        return sum(self.class_tail(i)[1:])


class BoundCurve:
    """U*(x) for all loads x: concave and piecewise linear with breakpoints at the cumulative capacities."""

    def __init__(self, ranking: Ranking, alpha: Sequence[Fraction]) -> None:
        self.ranking, self.alpha = ranking, tuple(alpha)
        self.base = sum(float(a) * u.value(0) for a, u in zip(alpha, ranking.utilities, strict=True))
        self._x = [0.0]  # breakpoints C_k
        self._y = [self.base]  # U* at the breakpoints
        self._exact = [Fraction(0)]

    def _extend(self, x: float) -> None:
        while self._x[-1] <= x:
            k = len(self._x)
            i, _ = self.ranking.slot(k)
            self._exact.append(self._exact[-1] + self.alpha[i])
            self._x.append(float(self._exact[-1]))
            self._y.append(self._y[-1] + float(self.alpha[i]) * self.ranking.marginal(k))

    def __call__(self, x: float | np.ndarray) -> np.ndarray:
        xs = np.atleast_1d(np.asarray(x, dtype=float))
        self._extend(float(xs.max()))
        return np.interp(xs, self._x, self._y)

    def at(self, x: Fraction) -> tuple[float, int, Fraction]:
        """U*(x) exactly at a fraction, with the rank of the partly filled slot and its fill."""
        self._extend(float(x))
        k = 1
        while self._exact[k] <= x:
            k += 1
        filled = self._exact[k - 1]
        return self._y[k - 1] + float(x - filled) * self.ranking.marginal(k), k, x - filled


def alphas(exp: Experiment) -> tuple[Fraction, ...]:
    return tuple(Fraction(c.count, exp.n) for c in exp.classes)


def pool_speed(exp: Experiment) -> Fraction | None:
    """The speed every pool serves at, exactly, or None when pools differ (or speeds are drawn)."""
    speeds = {c.speed.value for c in exp.classes}
    speed = speeds.pop() if len(speeds) == 1 else None
    return speed if speed else None


def pool_load(exp: Experiment) -> Fraction:
    """rho, tasks per pool, exactly: the spec's load (work per pool) over the pools' common speed."""
    speed = pool_speed(exp)
    if speed is None:
        raise ValueError("pools of different speeds have no common load in tasks per pool")
    return Fraction(str(exp.workload.load)) / speed


def service_rate(exp: Experiment) -> float:
    """mu, tasks per model second one pool completes per task: speed / mean work."""
    speed = pool_speed(exp)
    assert speed is not None
    return float(speed) / exp.workload.service.mean


def pool_optimum(exp: Experiment) -> PoolOptimum:
    """q*, sigma*, r*, the thresholds at r* and the bound u(q*) for a spec of pools with utilities."""
    ranking = ranking_of(exp)
    alpha = alphas(exp)
    bound, r_star, fill = BoundCurve(ranking, alpha).at(pool_load(exp))
    return PoolOptimum(r_star, ranking.slot(r_star), fill, ranking.thresholds(r_star), bound, alpha)


def poisson_jensen_bound(exp: Experiment) -> float:
    """PJ_n = E[U*(N / n)], N ~ Poisson(n rho): a bound for every policy at this n (docs/theory.md)."""
    n = exp.n
    mean = n * float(pool_load(exp))
    lo = max(0, int(mean - 12 * math.sqrt(mean) - 10))
    hi = int(mean + 12 * math.sqrt(mean) + 10)
    counts = np.arange(lo, hi + 1)
    weights = np.array([poisson_pmf(int(c), mean) for c in counts])
    curve = BoundCurve(ranking_of(exp), alphas(exp))
    return float(np.dot(weights, curve(counts / n)) / weights.sum())


def random_utility(exp: Experiment) -> float:
    """Mean utility per pool under uniform random routing: every pool holds Poisson(rho) tasks."""
    rho = float(pool_load(exp))
    total = 0.0
    for c in exp.classes:
        assert c.utility is not None
        hi = int(rho + 12 * math.sqrt(rho) + 20)
        xs = np.arange(hi + 1)
        pmf = [poisson_pmf(int(x), rho) for x in xs]
        total += (
            c.count / exp.n * float(sum(p * c.utility.value(int(x)) for x, p in zip(xs, pmf, strict=True)))
        )
    return total
