"""JSQ(d), the supermarket model (Fittipaldi et al. 2018, arXiv 1809.05373, eq. (1.1); Mitzenmacher 2001).

Mean-field fixed point P_k = rho^((d^k - 1)/(d - 1)), the fraction of nodes with at least k tasks, for n
identical nodes at load rho each. It holds for ps nodes under any work law (asymptotic insensitivity) and for
fcfs nodes under exponential work; d = 1 is random routing (P_k = rho^k). The sojourn mixture below is
derived in docs/theory.md, "`power_of_d` and `least_request`: the supermarket model".
"""

from __future__ import annotations

import math

from lbtestbed.analysis.theory.numeric import erlang_mixture_quantile


def tails(rho: float, d: int, cutoff: float = 1e-15) -> list[float]:
    """[P_0, P_1, ...] down to ``cutoff``."""
    out, k = [1.0], 1
    while True:
        exponent = k if d == 1 else (d**k - 1) / (d - 1)
        p = math.exp(exponent * math.log(rho)) if rho > 0 else 0.0
        if p < cutoff or k > 100_000:
            return out
        out.append(p)
        k += 1


def mean_tasks(rho: float, d: int) -> float:
    """L = sum_{k >= 1} P_k, tasks per node."""
    return sum(tails(rho, d)[1:])


def wait_probability(rho: float, d: int) -> float:
    """An arrival joins a busy node iff all d sampled nodes are busy: P_1^d = rho^d."""
    return rho**d


def fcfs_sojourn_quantile(rho: float, d: int, mu: float, q: float) -> float:
    """q-quantile of the sojourn under fcfs and exponential work of rate mu.

    An arrival finds k tasks with probability P_k^d - P_{k+1}^d and then stays Gamma(k + 1, mu). For d = 1
    that mixture is exactly Exp(mu (1 - rho)), the M/M/1 sojourn.
    """
    if d == 1:
        return -math.log1p(-q) / (mu * (1 - rho))
    p = [*tails(rho, d), 0.0]
    return erlang_mixture_quantile([p[k] ** d - p[k + 1] ** d for k in range(len(p) - 1)], mu, q)
