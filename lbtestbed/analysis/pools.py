"""The optimal fractional assignment of tasks to pools and its utility bound (``jlmu_slta.md`` §3).

Slots are filled greedily in ranking order: every slot ranked above sigma* is full, sigma* is partly filled,
the rest are empty. u(q*) bounds the mean utility of every policy for every n (Theorem 1); SLTA's learned
index converges to r*, the rank of sigma*. Capacities and the load are exact fractions, because the integral
case is an exact equality.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from lbtestbed.policies.jlmu import ranking_of
from lbtestbed.policies.ranking import Ranking
from lbtestbed.spec import Experiment


@dataclass(frozen=True)
class PoolOptimum:
    r_star: int  # rank of sigma*
    sigma: tuple[int, int]  # (class index, j) of the partly filled slot
    fill: Fraction  # q*(sigma*): the fraction of all pools holding sigma*'s task
    thresholds: tuple[int, ...]  # l_i(r*): tasks every class-i pool holds below sigma*
    bound: float  # u(q*) = U*(rho)

    @property
    def integral(self) -> bool:
        return self.fill == 0


def bound_at(ranking: Ranking, alpha: Sequence[Fraction], x: Fraction) -> tuple[float, int, Fraction]:
    """U*(x), the optimum of problem (2) at load x, with the rank of its partly filled slot and its fill."""
    value = sum(float(a) * u.value(0) for a, u in zip(alpha, ranking.utilities, strict=True))
    filled = Fraction(0)
    k = 1
    while True:
        i, _ = ranking.slot(k)
        if filled + alpha[i] > x:
            return value + float(x - filled) * ranking.marginal(k), k, x - filled
        value += float(alpha[i]) * ranking.marginal(k)
        filled += alpha[i]
        k += 1


def pool_optimum(exp: Experiment) -> PoolOptimum:
    """q*, sigma*, r*, the thresholds at r* and the bound u(q*) for a spec of pools with utilities."""
    ranking = ranking_of(exp)
    alpha = [Fraction(c.count, exp.n) for c in exp.classes]
    rho = Fraction(str(exp.workload.load))
    bound, r_star, fill = bound_at(ranking, alpha, rho)
    return PoolOptimum(r_star, ranking.slot(r_star), fill, ranking.thresholds(r_star), bound)
