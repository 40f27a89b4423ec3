"""The JLMU fluid model (Goldsztajn et al. 2021, arXiv 2112.08958, §4.1, (12)) and the warm-up it implies.

From an empty system the fluid trajectory is the optimal assignment for the current mass,
q(t) = q*(s(t)) with s(t) = rho (1 - e^(-mu t)); hence u(q(t)) = U*(s(t)) and ||q(t) - q*||_1 = rho e^(-mu t)
(derived in docs/theory.md, "`--transient`: the JLMU fluid trajectory from empty", with the warm-up rule).
``integrate`` solves equation (12) from any state with the operator-splitting Euler scheme described there,
which checks the closed form and serves other starting points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lbtestbed.analysis.theory.pools import BoundCurve, alphas, pool_load, service_rate
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies.jlmu import ranking_of
from lbtestbed.policies.ranking import Ranking


@dataclass(frozen=True)
class TransientPoint:
    t: float
    mass: float  # s(t), tasks per pool
    utility: float  # u(q(t))
    distance: float  # ||q(t) - q*||_1


def from_empty(exp: Experiment, times: Sequence[float]) -> list[TransientPoint]:
    """The fluid trajectory of JLMU from an empty system (exponential work; mu = speed / mean work)."""
    mu = service_rate(exp)
    rho = float(pool_load(exp))
    curve = BoundCurve(ranking_of(exp), alphas(exp))
    out = []
    for t in times:
        s = rho * (1.0 - math.exp(-mu * t))
        out.append(TransientPoint(t, s, float(curve(s)[0]), rho - s))
    return out


def describes(exp: Experiment) -> bool:
    """Whether the fluid model describes the spec: pools under JLMU or SLTA (the policies it is of)."""
    return {c.discipline for c in exp.classes} == {"pool"} and exp.policy.name in ("jlmu", "slta")


def warmup_needed(exp: Experiment) -> float:
    """Model time until the fluid's distance to q* falls below a tenth of the stationary standard deviation
    of the mass, sqrt(rho / n): t = ln(10 sqrt(n rho)) / mu, mu = speed / mean work."""
    mu = service_rate(exp)
    rho = float(pool_load(exp))
    return math.log(10.0 * math.sqrt(exp.n * rho)) / mu


def integrate(
    ranking: Ranking,
    alpha: Sequence[float],
    lam: float,
    mu: float,
    q0: np.ndarray,
    t_end: float,
    dt: float = 1e-3,
) -> np.ndarray:
    """Euler operator splitting for (12): q[i, j] = fraction of all pools of class i holding >= j tasks.

    Each step removes the departures mu j (q(i,j) - q(i,j+1)) dt, then hands out lam dt greedily over the
    slots in ranking order, raising q(i, j) at most to min(alpha_i, q(i, j-1)).
    """
    q = np.array(q0, dtype=float)
    m, width = q.shape
    order: list[tuple[int, int]] = []
    k = 1
    while len(order) < m * (width - 2):
        i, j = ranking.slot(k)
        if j < width - 1:
            order.append((i, j))
        k += 1
        if k > 10 * m * width:
            break
    js = np.arange(width)
    for _ in range(round(t_end / dt)):
        exact = q[:, :-1] - q[:, 1:]  # fraction holding exactly j
        q[:, 1:-1] -= mu * js[1:-1] * exact[:, 1:] * dt
        budget = lam * dt
        for i, j in order:
            if budget <= 0:
                break
            room = min(alpha[i], q[i, j - 1]) - q[i, j]
            if room > 0:
                add = min(room, budget)
                q[i, j] += add
                budget -= add
    return q
