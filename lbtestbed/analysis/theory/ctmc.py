"""Exact finite-n values: the stationary law of the Markov chain of n identical exponential servers
(docs/theory.md, "Exact values at small n: the Markov chain").

The nodes are exchangeable, so the state is the occupancy vector m = (m_0, ..., m_K), m_k the number of
servers holding exactly k tasks: C(n + K, K) states instead of (K + 1)^n. A busy server completes at rate mu
(fcfs and ps alike: with exponential work their queue-length processes are the same). An arrival joins a
server holding k tasks with the policy's probability p_k(m):

- ``jsq``: the least occupied level; ``jiq``: an idle server if any, else a uniformly random one;
- ``power_of_d``: P(min of d samples >= k) - P(min >= k + 1), d distinct servers or d draws with
  replacement; ``random``: m_k / n.

The truncation: every server holds at most K tasks, and an arrival whose chosen server holds K is dropped.
With the same arrivals and service clocks the truncated chain stays below the true one (sorted queue
lengths, coordinate by coordinate: derived in docs/theory.md), so every mean below grows with K towards its
exact value. Three small truncations give the ratio by which the increments fall from one K to the next;
K is then the smallest whose estimated remaining error meets ``TOLERANCE`` (relative), at most the largest
within ``MAX_STATES``, and a value whose error stays above ``MAX_ERROR`` is not given.

The solver: a transition changes the total by one, so ordered by the total the generator is block-
tridiagonal with diagonal blocks. Small levels are censored one by one from the top (linear level
reduction, the diagonal by the GTH rule); large ones go to GMRES, preconditioned by a symmetric Gauss-Seidel
sweep over the levels. Results are cached in the process and on disk (``$XDG_CACHE_HOME/lbtestbed/theory``,
keyed by the inputs and this file's source).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import numpy as np

from lbtestbed.analysis.theory import disk_cache
from lbtestbed.analysis.theory.numeric import erlang_mixture_quantile

#: the largest state space solved (about 0.6 s at a quiet moment on the 2-core reference machine)
MAX_STATES = 60_000
#: up to this band fill (sum over levels of size x (size + next size)) the levels are reduced directly
DIRECT_FILL = 15_000_000
#: the relative truncation error aimed at; a value whose estimate stays above MAX_ERROR is not used
TOLERANCE = 1e-4
MAX_ERROR = 1e-2
#: chains up to this many states are reduced from a dense copy of their generator
SMALL_DENSE = 2000
#: the policies the chain models
POLICIES = ("jsq", "jiq", "power_of_d", "random")


@dataclass(frozen=True)
class Model:
    """n identical servers of rate mu fed at total rate lam, dispatched by ``policy``."""

    policy: str
    n: int
    lam: float
    mu: float = 1.0
    d: int = 2
    replace: bool = False

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class Exact:
    """Stationary values of a truncated chain and the estimated truncation error of each."""

    model: Model
    K: int
    states: int
    mean_tasks: float  # per server
    wait: float  # P(an arrival joins a busy server), accepted arrivals
    idle_arrival: float  # P(an arrival finds an idle server): JIQ's tokens per task
    dropped: float  # P(an arrival is dropped by the truncation)
    tail: list[float]  # P(a server holds >= j), j = 0..K
    join: list[float]  # P(an accepted arrival joins a server holding k), k = 0..K-1
    errors: dict[str, float] = field(default_factory=dict)  # estimated |exact - value| per field
    tail_errors: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the solves

    @property
    def mean_sojourn(self) -> float:
        """Little's law for the accepted tasks."""
        return self.model.n * self.mean_tasks / (self.model.lam * (1.0 - self.dropped))

    def sojourn_error(self) -> float:
        return self.errors["mean_tasks"] * self.model.n / self.model.lam

    def fcfs_sojourn_quantile(self, q: float) -> float:
        """fcfs, exponential work: a task joining k tasks stays Gamma(k + 1, mu)."""
        return erlang_mixture_quantile(self.join, self.model.mu, q)


def state_count(n: int, K: int) -> int:
    return math.comb(n + K, K)


def _states(n: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Every occupancy vector (m_0..m_K) with sum n, by stars and bars, and the bars' positions
    b_1 < ... < b_K in 0..n+K-1 (b_j = m_0 + ... + m_(j-1) + j - 1)."""
    bars = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations(range(n + K), K)), dtype=np.int64
    ).reshape(-1, K)
    edges = np.concatenate([np.full((len(bars), 1), -1), bars, np.full((len(bars), 1), n + K)], axis=1)
    return np.diff(edges, axis=1) - 1, bars


def _join_probabilities(model: Model, m: np.ndarray) -> np.ndarray:
    """p[s, k]: the probability that an arrival in state s joins a server holding k tasks."""
    n = model.n
    S, width = m.shape
    rows = np.arange(S)
    if model.policy == "jsq":
        p = np.zeros((S, width))
        p[rows, np.argmax(m > 0, axis=1)] = 1.0
        return p
    if model.policy in ("random", "jiq"):
        p = m / n
        if model.policy == "jiq":
            idle = m[:, 0] > 0
            p[idle] = 0.0
            p[idle, 0] = 1.0
        return p
    at_least = np.cumsum(m[:, ::-1], axis=1)[:, ::-1]  # servers holding >= k
    at_least = np.concatenate([at_least, np.zeros((S, 1), dtype=np.int64)], axis=1)
    if model.replace:
        none_below = (at_least / n) ** model.d
    else:  # d distinct servers: C(G, d) / C(n, d)
        none_below = np.ones(at_least.shape)
        for i in range(model.d):
            none_below *= np.maximum(at_least - i, 0) / (n - i)
    return none_below[:, :-1] - none_below[:, 1:]


def _generator(model: Model, K: int) -> tuple[np.ndarray, Any, np.ndarray]:
    """The states, the sparse generator (rows: from) without its diagonal, and the join probabilities."""
    from scipy import sparse

    m, bars = _states(model.n, K)
    S = len(m)
    # the colex rank of the bars, sum_j C(b_j, j), numbers the states 0..S-1; moving one server up or
    # down a level moves one bar by one, so a target's rank is its source's plus one difference
    comb = np.array(  # C(x, j) where a bar can be (x <= n + j), so that every entry fits
        [[math.comb(x, j) if x <= model.n + j else 0 for j in range(K + 1)] for x in range(model.n + K + 1)],
        dtype=np.int64,
    )
    columns = np.arange(1, K + 1)
    rank = comb[bars, columns].sum(axis=1)
    index = np.empty(S, dtype=np.int64)
    index[rank] = np.arange(S)
    p = _join_probabilities(model, m)
    rows, cols, rates = [], [], []
    everyone = np.arange(S)
    for k in range(1, K + 1):  # a server holding k completes a task: bar k moves right
        r = model.mu * m[:, k]
        ok = r > 0
        b = bars[ok, k - 1]
        rows.append(everyone[ok])
        cols.append(index[rank[ok] - comb[b, k] + comb[b + 1, k]])
        rates.append(r[ok])
    for k in range(K):  # an arrival joins a server holding k (at K it is dropped): bar k + 1 moves left
        r = model.lam * p[:, k]
        ok = r > 0
        b = bars[ok, k]
        rows.append(everyone[ok])
        cols.append(index[rank[ok] - comb[b, k + 1] + comb[b - 1, k + 1]])
        rates.append(r[ok])
    q = sparse.csr_matrix((np.concatenate(rates), (np.concatenate(rows), np.concatenate(cols))), shape=(S, S))
    return m, q, p


def stationary(m: np.ndarray, q: Any) -> np.ndarray:
    """pi with pi Q = 0 for the off-diagonal generator ``q``, whose transitions change the total number of
    tasks by one, so that the levels of the total make Q block-tridiagonal with diagonal blocks."""
    return stationary_by_level(m @ np.arange(m.shape[1]), q)


def stationary_by_level(level: np.ndarray, q: Any) -> np.ndarray:
    """pi with pi Q = 0 for the off-diagonal generator ``q`` of any chain whose transitions move the integer
    ``level`` of a state (e.g. its total number of tasks) by exactly one up or down; the lowest level present
    is numbered 0 here, so any integer levels will do."""
    total = np.asarray(level, dtype=np.int64)
    total = total - total.min()
    order = np.argsort(total, kind="stable")
    q = q[order][:, order].tocsr()
    sizes = np.bincount(total)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if int((sizes[:-1] * (sizes[:-1] + sizes[1:])).sum()) <= DIRECT_FILL:
        pi = _level_reduction(q, starts)
    else:
        pi = _iterative(q, starts)
    back = np.empty(len(pi), dtype=np.int64)
    back[order] = np.arange(len(pi))
    return pi[back]


def _level_reduction(q: Any, starts: np.ndarray) -> np.ndarray:
    """Censor the chain level by level from the top (linear level reduction, with dense blocks). The
    censored level's generator gets its diagonal as minus the sum of its rates (GTH), so no pivot is a
    difference of nearly equal numbers; then pi rises from the empty state level by level."""
    L = len(starts) - 1
    small = q.toarray() if q.shape[0] <= SMALL_DENSE else None  # slicing a sparse matrix costs more there

    def block(i: int, j: int) -> np.ndarray:
        if small is not None:
            return small[starts[i] : starts[i + 1], starts[j] : starts[j + 1]]
        return q[starts[i] : starts[i + 1], starts[j] : starts[j + 1]].toarray()

    lift: list[np.ndarray] = [np.zeros((0, 0))] * L  # lift[i] = Q_{i,i+1} (-C_{i+1})^(-1)
    within = np.zeros((starts[L] - starts[L - 1],) * 2)  # censored rates inside the level being reduced
    for i in range(L - 1, 0, -1):
        down = block(i, i - 1)
        c = within.copy()
        np.fill_diagonal(c, 0.0)
        c -= np.diag(c.sum(axis=1) + down.sum(axis=1))
        up = block(i - 1, i)
        lift[i - 1] = np.linalg.solve(-c.T, up.T).T
        within = lift[i - 1] @ down
    pi = [
        gth_stationary(within)
    ]  # the lowest level, censored: one state for a chain of tasks (the empty one)
    for i in range(L - 1):
        pi.append(pi[-1] @ lift[i])
    x = np.clip(np.concatenate(pi), 0.0, None)
    return x / x.sum()


def gth_stationary(rates: np.ndarray) -> np.ndarray:
    """The stationary law of a small chain given its off-diagonal ``rates`` (irreducible), by the GTH rule:
    states are eliminated from the last, each pivot being the sum of the rates out of it."""
    a = np.array(rates, dtype=float)
    np.fill_diagonal(a, 0.0)
    size = len(a)
    if size == 1:
        return np.ones(1)
    for k in range(size - 1, 0, -1):
        out = a[k, :k].sum()
        a[:k, :k] += np.outer(a[:k, k], a[k, :k]) / out
        a[:k, k] /= out
    x = np.ones(size)
    for k in range(1, size):
        x[k] = x[:k] @ a[:k, k]
    return x / x.sum()


def _iterative(q: Any, starts: np.ndarray, tol: float = 1e-13) -> np.ndarray:
    """GMRES on the balance equations (one replaced by sum pi = 1), preconditioned by a symmetric
    Gauss-Seidel sweep over the levels (``starts``: where each level begins)."""
    from scipy.sparse import linalg

    S, L = q.shape[0], len(starts) - 1
    out = np.asarray(q.sum(axis=1)).ravel()
    incoming = q.T.tocsr()  # incoming[i, j]: the rate from j into i
    nxt = [incoming[starts[i] : starts[i + 1], starts[i - 1] : starts[i]] for i in range(1, L)]
    prev = [incoming[starts[i] : starts[i + 1], starts[i + 1] : starts[i + 2]] for i in range(L - 1)]

    def balance(x: np.ndarray) -> np.ndarray:
        y = out * x - incoming @ x
        y[0] = x.sum()
        return y

    def sweep(r: np.ndarray) -> np.ndarray:
        z = np.zeros(S)
        r = np.asarray(r, dtype=float)
        for i in range(L):  # forward: (D - lower) z = r
            s = slice(starts[i], starts[i + 1])
            z[s] = (r[s] + (nxt[i - 1] @ z[starts[i - 1] : starts[i]] if i else 0.0)) / out[s]
        y = out * z
        for i in range(L - 2, -1, -1):  # backward: (D - upper) z = D z
            s = slice(starts[i], starts[i + 1])
            z[s] = (y[s] + prev[i] @ z[starts[i + 1] : starts[i + 2]]) / out[s]
        return z

    rhs = np.zeros(S)
    rhs[0] = 1.0
    system = linalg.LinearOperator((S, S), matvec=balance, dtype=float)
    pre = linalg.LinearOperator((S, S), matvec=sweep, dtype=float)
    x, info = linalg.gmres(system, rhs, M=pre, rtol=tol, atol=0.0, restart=60, maxiter=100)
    pi = np.clip(x, 0.0, None)
    pi /= pi.sum()
    residual = np.abs(out * pi - incoming @ pi)[1:].max() / out.max()
    if info != 0 and residual > 1e-10:
        raise ArithmeticError(f"the stationary solve did not converge (residual {residual:.2g})")
    return pi


def solve(model: Model, K: int) -> Exact:
    """The chain truncated at K tasks per server."""
    start = time.perf_counter()
    m, q, p = _generator(model, K)
    pi = stationary(m, q)
    at_least = np.cumsum(m[:, ::-1], axis=1)[:, ::-1]
    tail = (pi @ at_least) / model.n
    join_all = pi @ p
    dropped = float(join_all[K])
    accepted = 1.0 - dropped
    return Exact(
        model=model,
        K=K,
        states=len(m),
        mean_tasks=float(tail[1:].sum()),
        wait=float(join_all[1:K].sum() / accepted),
        idle_arrival=float(join_all[0]),
        dropped=dropped,
        tail=[float(t) for t in tail],
        join=[float(j / accepted) for j in join_all[:K]],
        seconds=time.perf_counter() - start,
    )


SCALARS = ("mean_tasks", "wait", "idle_arrival")
QUANTILES = {"sojourn_p50": 0.5, "sojourn_p99": 0.99}


def _with_errors(last: Exact, previous: Exact, ratio: float) -> Exact:
    """Errors of the values at K from the increment K - 1 -> K: the increments fall by about ``ratio`` from
    one K to the next (geometrically; the truncated chain grows monotonically to the exact one), so what is
    still missing is about the last increment times r / (1 - r), and at least the increment itself."""
    factor = max(1.0, ratio / (1.0 - ratio))
    last.errors = {
        name: factor * abs(getattr(last, name) - getattr(previous, name)) + 1e-12 for name in SCALARS
    }
    for name, q in QUANTILES.items():
        last.errors[name] = factor * abs(last.fcfs_sojourn_quantile(q) - previous.fcfs_sojourn_quantile(q))
    padded = [*previous.tail, *[0.0] * (len(last.tail) - len(previous.tail))]
    last.tail_errors = [factor * abs(a - b) + 1e-12 for a, b in zip(last.tail, padded, strict=True)]
    return last


def _relative_error(x: Exact) -> float:
    return x.errors["mean_tasks"] / x.mean_tasks if x.mean_tasks > 0 else 0.0


def _largest_k(n: int, max_states: int) -> int:
    K = 0
    while state_count(n, K + 1) <= max_states:
        K += 1
    return K


def _compute(model: Model, max_states: int, tolerance: float) -> Exact | None:
    """Three small truncations show the ratio r by which the increments fall from one K to the next; the K
    whose remaining error meets the tolerance (at most the largest the state budget allows) is then solved
    with K - 1 beside it, unless the ratio says that even that K would miss MAX_ERROR by far."""
    top = _largest_k(model.n, max_states)
    if top < 3:
        return None
    solved: dict[int, Exact] = {}

    def at(K: int) -> Exact:
        if K not in solved:
            solved[K] = solve(model, K)
        return solved[K]

    probe = max(3, min(top, _largest_k(model.n, max_states // 50)))
    step = abs(at(probe).mean_tasks - at(probe - 1).mean_tasks)
    before = abs(at(probe - 1).mean_tasks - at(probe - 2).mean_tasks)
    r = min(0.95, step / before) if before > 0 else 0.95
    K = probe
    x = _with_errors(at(probe), at(probe - 1), r)
    if _relative_error(x) > tolerance and r > 0:
        K += math.ceil(math.log(tolerance / _relative_error(x)) / math.log(r))
    K = min(max(K, probe), top)
    if probe < K and 0 < r < 1 and _relative_error(x) * r ** (K - probe) > 2 * MAX_ERROR:
        return None  # even the largest K the budget allows would not bring the error under MAX_ERROR
    if K - 2 in solved:  # the ratio at the top itself, where the three are at hand
        step, before = (
            abs(at(K).mean_tasks - at(K - 1).mean_tasks),
            abs(at(K - 1).mean_tasks - at(K - 2).mean_tasks),
        )
        r = min(0.95, step / before) if before > 0 else r
    last = _with_errors(at(K), at(K - 1), r)
    last.seconds = sum(s.seconds for s in solved.values())
    return last if _relative_error(last) <= MAX_ERROR else None


@cache
def exact(model: Model, max_states: int = MAX_STATES, tolerance: float = TOLERANCE) -> Exact | None:
    """The exact values for ``model`` within ``tolerance`` (relative, on the mean tasks), or None when the
    state space needed is larger than ``max_states``. Cached in the process and on disk."""
    if model.policy not in POLICIES or model.lam >= model.n * model.mu or model.n < 1:
        return None
    key = f"{model.key()}|{max_states}|{tolerance}"
    path = disk_cache.cache_file("exact", key, (sys.modules[__name__],))
    data = disk_cache.read_or_solve(path, lambda: _as_json(_compute(model, max_states, tolerance)))
    if data is None:
        return None
    try:
        data["model"] = Model(**data["model"])
        return Exact(**data)
    except (TypeError, KeyError):  # a file of an older layout: solve again
        return _compute(model, max_states, tolerance)


def _as_json(x: Exact | None) -> dict[str, Any] | None:
    return None if x is None else asdict(x)
