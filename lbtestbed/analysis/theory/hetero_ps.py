"""Mean-field fixed point of Scheme 1 and Scheme 2 on heterogeneous ps clusters (Mukhopadhyay et al. 2015,
arXiv 1502.05786, §4; docs/theory.md, "The mean field and its fixed point").

u[j][k] is the fraction of type-j servers with at least k tasks, types sorted by capacity C_1 < ... < C_M.
The fixed point solves l(u) = 0 for the mean-field ODE (4.5) / (4.9); it is reached by integrating the ODE
from the empty state (the equilibrium is globally attractive, Thm 4.3) and then polished by a Newton-type
root finder. Capacities are exact fractions because Scheme 2's indices take floors and ceilings of C_i/C_j k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


@dataclass(frozen=True)
class SchemeFixedPoint:
    tails: list[list[float]]  # per type (input order): P(N >= k), k = 0, 1, ...
    mean_tasks: list[float]  # E[Q_j] per type
    mean_sojourn: list[float]  # E[T_j] per type
    share: list[float]  # fraction of tasks sent to each type
    overall_tasks: float  # E[Q] per server
    overall_sojourn: float  # E[T]
    residual: float


def _indices(caps: Sequence[Fraction], K: int, scheme: int) -> tuple[np.ndarray, np.ndarray]:
    """less[j, i, k], more[j, i, k]: the level a type-i server must hold for type j (at k - 1) to win."""
    M = len(caps)
    less = np.zeros((M, M, K + 1), dtype=int)
    more = np.zeros((M, M, K + 1), dtype=int)
    for j in range(M):
        for i in range(M):
            for k in range(1, K + 1):
                m = k - 1
                if scheme == 1:
                    less[j, i, k], more[j, i, k] = m, m + 1
                else:
                    ratio = caps[i] / caps[j]
                    less[j, i, k] = math.ceil(ratio * m)
                    more[j, i, k] = math.floor(ratio * m) + 1
    return np.minimum(less, K + 1), np.minimum(more, K + 1)


def _mean_field(
    caps: Sequence[Fraction], gam: np.ndarray, dd: np.ndarray, lam: float, mu: float, K: int, scheme: int
) -> Callable[[np.ndarray], np.ndarray]:
    """l(u) of (4.5) / (4.9) on the levels 1..K of every type (types sorted by capacity)."""
    M = len(caps)
    cf = np.array([float(c) for c in caps])
    less, more = _indices(caps, K, scheme)
    ks = np.arange(1, K + 1)

    def rhs(flat: np.ndarray) -> np.ndarray:
        u = np.ones((M, K + 2))
        u[:, 1 : K + 1] = np.clip(flat.reshape(M, K), 0.0, 1.0)
        u[:, K + 1] = 0.0
        ud = u ** dd[:, None]
        out = np.empty((M, K))
        for j in range(M):
            join = (lam / gam[j]) * (ud[j, ks - 1] - ud[j, ks])
            for i in range(M):
                if i < j:
                    join = join * ud[i, less[j, i, ks]]
                elif i > j:
                    join = join * ud[i, more[j, i, ks]]
            out[j] = join - mu * cf[j] * (u[j, ks] - u[j, ks + 1])
        return out.ravel()

    return rhs


def fixed_point(
    capacities: Sequence[Fraction],
    gammas: Sequence[float],
    d: Sequence[int],
    lam: float,
    mu: float,
    scheme: int,
) -> SchemeFixedPoint:
    """The stationary mean field for arrival rate ``lam`` per server and work rate ``mu`` (1 / mean work)."""
    from scipy import integrate, optimize  # imported here: only the schemes need them

    order = sorted(range(len(capacities)), key=lambda j: capacities[j])
    caps = [capacities[j] for j in order]
    gam = np.array([gammas[j] for j in order])
    dd = np.array([d[j] for j in order], dtype=float)
    cf = np.array([float(c) for c in caps])
    M = len(caps)
    if lam >= mu * float(np.dot(gam, cf)):
        raise ValueError("unstable: the arrival rate reaches the total capacity (Mukhopadhyay et al. (3.1))")
    K = 32
    while True:
        rhs = _mean_field(caps, gam, dd, lam, mu, K, scheme)
        x0 = np.zeros(M * K)
        horizon = 200.0 / (mu * float(cf.min()) * (1 - lam / (mu * float(np.dot(gam, cf)))))
        sol = integrate.solve_ivp(
            lambda _t, x, f=rhs: f(x), (0.0, horizon), x0, method="LSODA", rtol=1e-9, atol=1e-12
        )
        root = optimize.root(rhs, sol.y[:, -1], method="hybr", options={"xtol": 1e-14})
        # hybr can report failure ("xtol too small") at a residual of 1e-17: keep the better of its answer
        # and the integration's end point, judged by the residual, not by the solver's flag
        candidates = [np.clip(root.x, 0.0, 1.0), np.clip(sol.y[:, -1], 0.0, 1.0)]
        residuals = [float(np.abs(rhs(c)).max()) for c in candidates]
        x = candidates[int(np.argmin(residuals))]
        u = x.reshape(M, K)
        if u[:, -1].max() < 1e-13 or K >= 512:
            break
        K *= 2
    residual = float(np.abs(rhs(x)).max())
    tails_sorted = [[1.0, *[float(v) for v in u[j] if v > 1e-15]] for j in range(M)]
    eq = [float(u[j].sum()) for j in range(M)]
    p1 = [float(u[j, 0]) for j in range(M)]
    et = [eq[j] / (mu * cf[j] * p1[j]) if p1[j] > 0 else 1 / (mu * cf[j]) for j in range(M)]
    share = [float(gam[j] * mu * cf[j] * p1[j] / lam) for j in range(M)]
    overall = float(np.dot(gam, eq))
    back = [0] * M
    for pos, j in enumerate(order):
        back[j] = pos
    return SchemeFixedPoint(
        tails=[tails_sorted[back[j]] for j in range(M)],
        mean_tasks=[eq[back[j]] for j in range(M)],
        mean_sojourn=[et[back[j]] for j in range(M)],
        share=[share[back[j]] for j in range(M)],
        overall_tasks=overall,
        overall_sojourn=overall / lam,
        residual=residual,
    )
