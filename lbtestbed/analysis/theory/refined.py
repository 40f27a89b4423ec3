"""The refined mean field of JSQ(d): the 1/n term of the stationary mean (Gast and Van Houdt 2017;
docs/theory.md, "Refined mean field: the 1/n term").

A density-dependent population process with drift f(x) = sum_l l beta_l(x) and an exponentially stable fixed
point x* has E[X^(n)] = x* + V / n + O(1/n^2), where, with A = Df(x*), B = D^2 f(x*) and
Q = sum_l l l^T beta_l(x*):

    A W + W A^T + Q = 0                    (W: the covariance of sqrt(n) (X - x*) in the limit)
    V = -A^(-1) (B : W / 2 + f1(x*))       (f1: the drift's own 1/n term, zero when the rates do not
                                            depend on n)

and a smooth function h of the state has E[h(X)] = h(x*) + (grad h . V + (1/2) D^2 h : W) / n + O(1/n^2).

For JSQ(d) (supermarket model) x_k is the fraction of servers holding at least k tasks, k = 1..K:
f_k = lam (x_{k-1}^d - x_k^d) - mu (x_k - x_{k+1}), x_0 = 1, with lam the arrival rate per server. Sampling d
distinct servers makes the probability that all hold >= k equal C(n x_k, d) / C(n, d) = g(x_k) + g1(x_k) / n
+ O(1/n^2), g(y) = y^d, g1(y) = d (d - 1) / 2 (y^d - y^(d-1)): the drift's f1 (derived in docs/theory.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lbtestbed.analysis.theory import supermarket


@dataclass(frozen=True)
class Expansion:
    """x*, V and W of the supermarket model (levels 1..K) and its parameters."""

    rho: float
    d: int
    mu: float
    replace: bool
    x: np.ndarray
    V: np.ndarray
    W: np.ndarray

    # ---------------------------------------------------------------------------------- sampling law

    def _g(self, y: np.ndarray) -> np.ndarray:
        return y**self.d

    def _g1(self, y: np.ndarray) -> np.ndarray:
        """The 1/n term of C(n y, d) / C(n, d) (0 with replacement)."""
        if self.replace:
            return np.zeros_like(y)
        d = self.d
        return d * (d - 1) / 2 * (y**d - y ** (d - 1))

    def none_below(self, n: int) -> np.ndarray:
        """E[P(all d samples hold >= k)], k = 0..K+1, to order 1/n."""
        d, x, V, W = self.d, self.x, self.V, self.W
        first = d * x ** (d - 1)
        second = d * (d - 1) * x ** (d - 2) if d > 1 else np.zeros_like(x)
        levels = self._g(x) + (first * V + 0.5 * second * np.diag(W) + self._g1(x)) / n
        return np.concatenate([[1.0], levels, [0.0]])

    # -------------------------------------------------------------------------------------- metrics

    def tail(self, n: int) -> list[float]:
        """P(a server holds >= k), k = 0..K, to order 1/n (clipped to [0, 1])."""
        return [1.0, *np.clip(self.x + self.V / n, 0.0, 1.0).tolist()]

    def mean_tasks(self, n: int) -> float:
        return float(self.x.sum() + self.V.sum() / n)

    def wait(self, n: int) -> float:
        """P(an arrival joins a busy server) = P(all d samples busy)."""
        return float(self.none_below(n)[1])

    def join(self, n: int) -> list[float]:
        """P(an arrival joins a server holding k), k = 0..K, to order 1/n."""
        p = self.none_below(n)
        return np.clip(p[:-1] - p[1:], 0.0, 1.0).tolist()

    def correction(self) -> float:
        """V summed: the 1/n coefficient of the mean tasks per server."""
        return float(self.V.sum())


def supermarket_expansion(rho: float, d: int, mu: float = 1.0, replace: bool = False) -> Expansion:
    """The refined mean field of JSQ(d) at load rho < 1 per server, d >= 2."""
    from scipy.linalg import solve_continuous_lyapunov  # imported here: only finite-n JSQ(d) needs it

    lam = rho * mu
    x = np.array(supermarket.tails(rho, d, cutoff=1e-14)[1:])
    x = np.concatenate([x, [0.0, 0.0]])  # two empty levels: the Jacobian's band reaches one beyond
    K = len(x)
    full = np.concatenate([[1.0], x, [0.0]])  # x_0 .. x_{K+1}
    A = np.zeros((K, K))
    B = np.zeros((K, K, K))
    Q = np.zeros((K, K))
    f1 = np.zeros(K)
    probe = Expansion(rho, d, mu, replace, x, np.zeros(K), np.zeros((K, K)))
    g1 = probe._g1(full)
    for i in range(K):
        k = i + 1
        if k >= 2:  # d f_k / d x_{k-1}
            A[i, i - 1] = lam * d * full[k - 1] ** (d - 1)
            B[i, i - 1, i - 1] = lam * d * (d - 1) * full[k - 1] ** (d - 2)
        A[i, i] = -lam * d * full[k] ** (d - 1) - mu
        B[i, i, i] = -lam * d * (d - 1) * full[k] ** (d - 2)
        if k < K:
            A[i, i + 1] = mu
        # each transition moves one coordinate by +-1: Q is diagonal, arrivals plus departures at level k
        Q[i, i] = lam * (full[k - 1] ** d - full[k] ** d) + mu * (full[k] - full[k + 1])
        f1[i] = lam * (g1[k - 1] - g1[k])
    W = solve_continuous_lyapunov(A, -Q)
    V = -np.linalg.solve(A, 0.5 * np.einsum("ijk,jk->i", B, W) + f1)
    return Expansion(rho, d, mu, replace, x, V, W)
