"""JIQ with K dispatchers whose tokens can be stale (docs/theory.md, "JIQ with K dispatchers: stale tokens").

The policy is lbtestbed's (``policies/jiq.py``): a node that becomes idle sends one token, to a uniformly
random dispatcher (JIQ-Random) or to the one of d probed holding the fewest (JIQ-SQ(d)); a dispatcher that
already holds a token of that node keeps the old one (superseded); a token stays valid until used, so it
can send a task to a node that another dispatcher has made busy meanwhile (a stale token). Arrivals reach
the K dispatchers uniformly at random; a dispatcher with tokens sends the task to a token's node, without
one to a uniformly random node. n identical nodes, exponential work; time is in units of the mean service
time and ``load`` is the arrival rate per node in those units (each node is busy a fraction ``load``).

Two entry points, both pure functions of numbers:

- ``limit(ratio, load, d)``: the mean field of a node when n -> infinity with n / K = ``ratio`` fixed (Lu
  et al.'s regime), stale tokens included. A limit; derived here in the spirit of Mitzenmacher 2016
  (arXiv 1606.01833), whose full text the project did not have.
- ``finite(n, dispatchers, load, d)``: an approximation at the given n and K: a Markov chain on (idle
  nodes, waiting tasks) whose closures come from one product form (docs/theory.md). No error bound; its
  error against long simulations is tabulated there.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np

from lbtestbed.analysis.theory import ctmc, disk_cache, numeric
from lbtestbed.analysis.theory import dispatchers as dispatchers_module
from lbtestbed.analysis.theory.ctmc import stationary_by_level
from lbtestbed.analysis.theory.dispatchers import occupied_iqueues, supermarket_mean
from lbtestbed.analysis.theory.numeric import falsi

#: the node's chain is cut where the mass beyond is below this
TAIL = 1e-11
#: and the chain of idle nodes and waiting tasks where the mass at its edges is below this
EDGE = 1e-9


@dataclass(frozen=True)
class JIQValues:
    """Stationary values of JIQ with several dispatchers; times in units of the mean service time."""

    mean_sojourn: float
    mean_tasks: float  # per node
    wait: float  # P(a task finds its node busy): the fcfs wait probability
    token_share: float  # fraction of tasks sent on a token (the rest went to a random node)
    stale_share: float  # fraction of the tasks sent on a token whose node was busy
    tokens_per_task: float  # idle tokens sent per task, superseded ones included
    messages_per_task: float  # the tokens and, for JIQ-SQ(d), the d probes and d answers before each


@dataclass(frozen=True)
class _NodeLaw:
    """The law of one node's (tasks q, tokens out j) in its mean-field environment."""

    pi: np.ndarray  # pi[q, j]
    theta: float  # rate at which each of its tokens is used
    random: np.ndarray  # rate of randomly routed tasks reaching the node, per j
    keep: np.ndarray  # per j: the chance that a new token is not superseded

    def arrivals(self) -> tuple[np.ndarray, np.ndarray]:
        """Rates of tasks reaching the node in each state: on a token, at random."""
        j = np.arange(self.pi.shape[1])
        return self.pi * j * self.theta, self.pi * self.random

    def tokens_sent(self) -> float:
        return float(self.pi[1].sum())

    def tokens_kept(self) -> float:
        return float(self.pi[1] @ self.keep)


def _node_chain(load: float, random: np.ndarray, theta: float, keep: np.ndarray, levels: int) -> np.ndarray:
    """pi[q, j] of the node's chain with q <= ``levels`` and j < len(keep): each of its j tokens is used at
    rate theta, a random task comes at rate random[j], a task completes at rate 1, and a node left idle
    sends a token, kept (j + 1) with chance keep[j] and otherwise superseded (j unchanged)."""
    from scipy import sparse

    width = len(keep)
    q_idx, j_idx = (v.ravel() for v in np.meshgrid(np.arange(levels + 1), np.arange(width), indexing="ij"))
    # an idle node always holds a token somewhere (it sent one, and only its use makes it busy)
    live = (q_idx > 0) | (j_idx > 0)
    number = np.cumsum(live) - 1
    q_idx, j_idx = q_idx[live], j_idx[live]
    rows, cols, rates = [], [], []

    def add(mask: np.ndarray, dq: int, dj: np.ndarray, rate: np.ndarray) -> None:
        src = np.nonzero(mask & (rate > 0))[0]
        rows.append(src)
        cols.append(number[(q_idx[src] + dq) * width + j_idx[src] + dj[src]])
        rates.append(rate[src])

    zero, one = np.zeros(len(q_idx), dtype=np.int64), np.ones(len(q_idx), dtype=np.int64)
    up = q_idx < levels
    add(up & (j_idx > 0), 1, -one, j_idx * theta)  # one of its tokens is used
    add(up, 1, zero, random[j_idx])  # a randomly routed task
    add(q_idx >= 2, -1, zero, one.astype(float))  # a completion, tasks left
    last = q_idx == 1
    add(last, -1, (j_idx < width - 1).astype(np.int64), keep[j_idx])  # idle, its token kept
    add(last & (j_idx > 0), -1, zero, 1.0 - keep[j_idx])  # ... or superseded
    size = len(q_idx)
    gen = sparse.csr_matrix(
        (np.concatenate(rates), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size)
    )
    pi = np.zeros((levels + 1) * width)
    pi[live] = stationary_by_level(q_idx, gen)
    return pi.reshape(levels + 1, width)


@dataclass
class _Cuts:
    """Where the node's chain was cut last, and the random rate's scale: a warm start for the next solve."""

    levels: int = 32
    width: int = 8
    scale: float = 1.0


def _node_law(load: float, rho: float, theta: float, dispatchers: int | None, cuts: _Cuts) -> _NodeLaw:
    """The node's law in its environment. ``dispatchers`` None is the limit K -> oo: random tasks at rate
    load (1 - rho) whatever the node holds, every new token kept. With K dispatchers a random task comes
    only from a dispatcher without a token, so never from one holding this node's token: its rate is
    proportional to (K - j) / K, scaled so that the random tasks total load (1 - rho); and a new token goes
    to a dispatcher already holding one of the node's with chance j / K (superseded). The cuts in q and j
    grow until the mass at the edge is below ``TAIL``."""
    if dispatchers is not None:
        cuts.width = dispatchers + 1
    while True:
        j = np.arange(cuts.width)
        share = np.ones(cuts.width) if dispatchers is None else (dispatchers - j) / dispatchers
        keep = share
        for _ in range(100):
            random = load * (1.0 - rho) * share * cuts.scale
            pi = _node_chain(load, random, theta, keep, cuts.levels)
            if dispatchers is None:
                break
            new = 1.0 / float(pi.sum(axis=0) @ share)  # the random tasks must total load (1 - rho)
            done = abs(new - cuts.scale) <= 1e-12 * new
            cuts.scale = new
            if done:
                break
        edge_q = float(pi[-1].sum())
        edge_j = float(pi[:, -1].sum()) if dispatchers is None else 0.0
        if edge_q <= TAIL and edge_j <= TAIL:
            return _NodeLaw(pi, theta, random, keep)
        if edge_q > TAIL:
            if cuts.levels >= 4096:
                raise ArithmeticError(f"JIQ node chain: the queue does not settle (load {load})")
            cuts.levels *= 2
        if edge_j > TAIL:
            cuts.width *= 2


def _token_mean(rho: float, d: int) -> float:
    """Mean tokens at a dispatcher holding one with probability rho: its token count is an M/M/1 queue
    (JIQ-Random) or the supermarket model's queue with d choices (JIQ-SQ(d)), as in Lu et al. 2011, §4."""
    return rho / (1.0 - rho) if d == 1 else supermarket_mean(rho, d)


def _mean_field(ratio: float, load: float, d: int, dispatchers: int | None) -> tuple[float, _NodeLaw]:
    """rho, the fraction of arrivals that find a token, and the node's law at the fixed point: rho =
    (tokens kept per node per unit time) / load, each token used at rate theta = load rho ratio / (mean
    tokens at a dispatcher), which makes tokens used = tokens kept."""

    cuts = _Cuts()

    def law(rho: float) -> _NodeLaw:
        return _node_law(load, rho, load * rho * ratio / _token_mean(rho, d), dispatchers, cuts)

    def excess(rho: float) -> float:
        return law(rho).tokens_kept() / load - rho

    # bracket the root from Lu et al.'s value outwards (near 0 or 1 the node's chain needs huge cuts)
    lo = hi = occupied_iqueues(ratio, load, d)
    if 1.0 - lo < 1e-9:
        # a token at every dispatcher all but always (1 - rho is then below what the equation resolves):
        # no random tasks, a node's idle time is its token's wait 1 / theta, and busy fraction load fixes it
        return lo, _node_law(load, lo, load / (1.0 - load), dispatchers, cuts)
    if excess(lo) > 0:
        while excess(hi) > 0:
            lo, hi = hi, 1.0 - (1.0 - hi) / 2
    else:
        while excess(lo) <= 0:
            lo, hi = lo / 2, lo
    rho = falsi(excess, lo, hi, tol=1e-11)
    return rho, law(rho)


def _values_of_node(law: _NodeLaw, load: float, d: int) -> JIQValues:
    on_token, at_random = law.arrivals()
    total = float(on_token.sum() + at_random.sum())
    q = np.arange(law.pi.shape[0])
    mean_tasks = float(q @ law.pi.sum(axis=1))
    busy_tokens = float(on_token[1:].sum())
    tokens = law.tokens_sent() / load
    return JIQValues(
        mean_sojourn=mean_tasks / load,
        mean_tasks=mean_tasks,
        wait=float(on_token[1:].sum() + at_random[1:].sum()) / total,
        token_share=float(on_token.sum()) / total,
        stale_share=busy_tokens / float(on_token.sum()) if on_token.sum() > 0 else 0.0,
        tokens_per_task=tokens,
        messages_per_task=tokens * (1 + 2 * d if d > 1 else 1),
    )


def _check(load: float, d: int) -> None:
    if not 0.0 < load < 1.0:
        raise ValueError(f"JIQ needs a load in (0, 1), got {load!r}")
    if d < 1:
        raise ValueError(f"JIQ-SQ(d) needs d >= 1, got {d!r}")


@cache
def limit(ratio: float, load: float, d: int = 1) -> JIQValues:
    """JIQ-Random (d = 1) or JIQ-SQ(d) with stale tokens, in the limit n -> infinity with ``ratio`` = n / K
    nodes per dispatcher fixed (Lu et al. 2011, §4's regime).

    Regime: a limit (mean field). Assumptions: equal speeds, exponential work (fcfs or ps: the same queue
    lengths), Poisson arrivals split uniformly over the dispatchers, messages delivered at once. Each token
    is used after an exponential time whose mean is Little's law's for the dispatcher's token queue (an
    M/M/1 queue for JIQ-Random, the supermarket model's for JIQ-SQ(d), as in Lu et al.); for JIQ-Random with
    tokens used oldest first that time is exactly exponential in the limit (M/M/1 FCFS sojourn), otherwise it
    is an approximation. Unlike Lu et al.'s analysis a token can be stale: a node holds j tokens at j
    dispatchers and receives random tasks whatever its state. Source: derived here (docs/theory.md, "JIQ with
    K dispatchers: stale tokens"), after the mean-field approach of Mitzenmacher 2016 (arXiv 1606.01833).
    Times in units of the mean service time."""
    _check(load, d)
    if ratio <= 0:
        raise ValueError(f"nodes per dispatcher must be positive, got {ratio!r}")
    _, law = _mean_field(ratio, load, d, None)
    return _values_of_node(law, load, d)


def uniform_split_empty(tokens: np.ndarray, dispatchers: int) -> np.ndarray:
    """P(a given dispatcher holds no token) when ``tokens`` tokens lie at ``dispatchers`` dispatchers with
    every composition equally likely: (K - 1) / (T + K - 1), and 1 for T = 0. Exact for JIQ-Random's token
    counts when tokens arrive at uniformly random dispatchers at a rate that depends on the total only and
    each dispatcher holding one loses one at a fixed rate (the chain is then reversible with a law that
    depends on the total only: docs/theory.md)."""
    t = np.asarray(tokens, dtype=float)
    return np.where(t > 0, (dispatchers - 1) / np.maximum(t + dispatchers - 1, 1e-300), 1.0)


def _sorted_counts(dispatchers: int, top: int) -> list[tuple[int, ...]]:
    """Token counts of K dispatchers, sorted high to low, with total at most ``top``."""
    out: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...], left: int, cap: int) -> None:
        if len(prefix) == dispatchers:
            out.append(prefix)
            return
        for c in range(min(cap, left), -1, -1):
            grow((*prefix, c), left - c, c)

    grow((), top, top)
    return out


@cache
def _split_structure(dispatchers: int, d: int, top: int) -> tuple[np.ndarray, ...]:
    """The sorted token counts of K dispatchers with total <= ``top`` and their moves: (from, to, total of
    from, weight, is_birth) per move, where a birth's weight is the chance that the least loaded of d
    sampled dispatchers has the count that grows (ties uniform) and a death's is how many hold that count;
    and each state's total and its share of empty dispatchers."""
    states = _sorted_counts(dispatchers, top)
    index = {st: i for i, st in enumerate(states)}
    subsets = math.comb(dispatchers, d)
    rows, cols, totals, weights, births = [], [], [], [], []
    for i, st in enumerate(states):
        total = sum(st)
        for v in sorted(set(st)):
            at_least, above = sum(c >= v for c in st), sum(c > v for c in st)
            rest = [c for c in st if c != v] + [v] * (at_least - above - 1)
            for step, weight, birth in (
                (1, (math.comb(at_least, d) - math.comb(above, d)) / subsets, total < top),
                (-1, float(at_least - above), v > 0),
            ):
                if birth if step == 1 else v > 0:
                    rows.append(i)
                    cols.append(index[tuple(sorted((*rest, v + step), reverse=True))])
                    totals.append(total)
                    weights.append(weight)
                    births.append(step == 1)
    level = np.array([sum(st) for st in states])
    empty = np.array([sum(c == 0 for c in st) / dispatchers for st in states])
    return (
        np.array(rows),
        np.array(cols),
        np.array(totals),
        np.array(weights),
        np.array(births),
        level,
        empty,
    )


def sq_split_empty(dispatchers: int, d: int, birth: np.ndarray, death: float) -> np.ndarray:
    """P(a given dispatcher holds no token | T tokens in all), T = 0..len(birth) - 1, for JIQ-SQ(d): tokens
    arrive at total rate birth[T], each at the least loaded of d distinct dispatchers chosen uniformly (ties
    uniform); each dispatcher holding a token loses one at rate ``death``. Solved exactly on the sorted
    counts, the total cut at len(birth) - 1 (no birth there)."""
    from scipy import sparse

    top = len(birth) - 1
    rows, cols, totals, weights, births, level, empty = _split_structure(dispatchers, d, top)
    rates = np.where(births, birth[totals] * weights, death * weights)
    keep = rates > 0
    size = len(level)
    gen = sparse.csr_matrix((rates[keep], (rows[keep], cols[keep])), shape=(size, size))
    pi = stationary_by_level(level, gen)
    mass = np.bincount(level, weights=pi, minlength=top + 1)
    return np.bincount(level, weights=pi * empty, minlength=top + 1) / np.maximum(mass, 1e-300)


Split = Callable[[np.ndarray], np.ndarray]
#: JIQ-SQ(d)'s split is solved on the sorted token counts, whose number grows fast with K
SQ_SPLIT_MAX = 6


@dataclass(frozen=True)
class _Box:
    """Where the chain of idle nodes and waiting tasks is cut: low_i <= I <= top_i, X <= top_x."""

    low_i: int
    top_i: int
    top_x: int


def _chain_values(
    n: int, load: float, split: Split, extra: float, stale: float, box: _Box
) -> tuple[tuple[float, ...], float, float]:
    """The values of the chain of (idle nodes I, waiting tasks X) cut to ``box`` (tasks per node, P(wait),
    token share, stale share, tokens sent per task), the mass at its edges in I and in X."""
    from scipy import sparse

    lam = load * n
    idle, waiting = (
        v.ravel()
        for v in np.meshgrid(np.arange(box.low_i, box.top_i + 1), np.arange(box.top_x + 1), indexing="ij")
    )
    busy = n - idle
    # nodes holding >= 2 tasks: X tasks over B busy nodes, every composition equally likely
    multi = np.where(waiting > 0, busy * waiting / np.maximum(waiting + busy - 1, 1), 0.0)
    held = idle + extra  # tokens at the dispatchers
    has = held > 0
    empty = np.where(has, split(held), 1.0)  # P(the arrival's dispatcher holds no token)
    on_token = np.where(has, 1.0 - empty, 0.0)
    hits_busy = np.where(idle > 0, stale, 1.0)  # a token used points to a busy node
    to_idle = lam * (empty * idle / n + on_token * (1.0 - hits_busy))
    to_busy = lam * (empty * busy / n + on_token * hits_busy)
    rows, cols, rates = [], [], []

    def add(mask: np.ndarray, di: int, dx: int, rate: np.ndarray) -> None:
        src = np.nonzero(mask & (rate > 0))[0]
        rows.append(src)
        cols.append((idle[src] + di - box.low_i) * (box.top_x + 1) + waiting[src] + dx)
        rates.append(rate[src])

    add(idle > box.low_i, -1, 0, to_idle)  # an idle node gets a task
    add(waiting < box.top_x, 0, 1, to_busy)  # a busy node gets one
    add(idle < box.top_i, 1, 0, busy - multi)  # a node holding one task completes: idle
    add(waiting > 0, 0, -1, multi)  # a node holding more completes one
    size = len(idle)
    gen = sparse.csr_matrix(
        (np.concatenate(rates), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size)
    )
    pi = stationary_by_level(busy + waiting, gen)
    share = float(pi @ on_token)
    values = (
        float(pi @ (busy + waiting)) / n,
        float(pi @ to_busy) / lam,
        share,
        float(pi @ (on_token * hits_busy)) / share if share else 0.0,
        float(pi @ (busy - multi)) / lam,  # every node left idle sends a token
    )
    edge_i = float(pi[(idle == box.top_i) | ((idle == box.low_i) & (box.low_i > 0))].sum())
    return values, edge_i, float(pi[waiting == box.top_x].sum())


@cache
def finite(n: int, dispatchers: int, load: float, d: int = 1) -> JIQValues:
    """``solve_finite``'s values, kept on disk (``disk_cache``): 0.5 to 4 s at 50 to 200 nodes, solved once
    per machine."""
    key = f"{n}|{dispatchers}|{load!r}|{d}"
    path = disk_cache.cache_file("jiq-stale", key, (sys.modules[__name__], ctmc, dispatchers_module, numeric))
    return JIQValues(**disk_cache.read_or_solve(path, lambda: asdict(solve_finite(n, dispatchers, load, d))))


def solve_finite(n: int, dispatchers: int, load: float, d: int = 1) -> JIQValues:
    """JIQ-Random (d = 1) or JIQ-SQ(d) with K = ``dispatchers`` dispatchers on n nodes: an approximation at
    this n and K.

    Regime: a finite-n approximation without a proved error bound (docs/theory.md tabulates its error
    against long simulations: within about 2 % at n = 50). Assumptions: equal speeds, exponential work
    (fcfs or ps), Poisson arrivals split uniformly over the dispatchers, messages delivered at once. The
    state is (idle nodes I, waiting tasks X); two closures, both from the product form of a reversible chain
    (docs/theory.md): the tokens lie at the dispatchers with every composition equally likely (JIQ-Random;
    JIQ-SQ(d) solves its split exactly instead), and the waiting tasks lie on the busy nodes likewise. The
    tokens beyond one per idle node and the chance that a token is stale come from the node's chain at this
    K (``limit``'s, with the corrections for K) in the environment the chain finds, the two solved in turn
    until they agree. With one dispatcher nothing is stale and the chain is JIQ's own, up to the second
    closure. JIQ-SQ(d) is solved for at most ``SQ_SPLIT_MAX`` dispatchers. Source: derived here
    (docs/theory.md, "JIQ with K dispatchers: stale tokens"). Times in units of the mean service time."""
    _check(load, d)
    if n < 1 or dispatchers < 1 or d > dispatchers:
        raise ValueError(f"JIQ needs n >= 1 and 1 <= d <= K, got n={n!r}, K={dispatchers!r}, d={d!r}")
    K = dispatchers
    # the idle count stays within a few of its binomial-like spread around n (1 - load)
    spread = 8 * math.sqrt(n * load * (1 - load) + 1) + 10
    low, top = max(0, math.floor(n * (1 - load) - spread)), min(n, math.ceil(n * (1 - load) + spread))
    box = _Box(low, top, 16 + n // 8)
    node = _NodeTerms(0.0, 0.0, 0.0)
    if K > 1:  # to start with, the node's own mean field (Lu et al.'s token queues)
        node = _node_terms(n, _mean_field(n / K, load, d, K)[1], load, d)
    cuts = _Cuts()
    for _ in range(50):
        vals, box = _solve_chain(n, K, load, d, node, box)
        if K == 1:
            break
        # the node in the environment the chain finds: its token share, and each token used at the rate
        # tokens are used (load n share) over the tokens held (n (1 - load) idle nodes' and the extra ones)
        share = vals[2]
        theta = load * n * share / (n * (1 - load) + node.extra)
        new = _node_terms(n, _node_law(load, share, theta, K, cuts), load, d)
        done = abs(new.stale - node.stale) <= 1e-7 and abs(new.extra - node.extra) <= 1e-6 * n
        node = new
        if done:
            break
    tasks, wait, share, stale_share, tokens = vals
    return JIQValues(
        mean_sojourn=tasks / load,
        mean_tasks=tasks,
        wait=wait,
        token_share=share,
        stale_share=stale_share,
        tokens_per_task=tokens,
        messages_per_task=tokens * (1 + 2 * d if d > 1 else 1),
    )


@dataclass(frozen=True)
class _NodeTerms:
    """What the node's mean field gives the chain: the tokens beyond one per idle node (in all), the chance
    that a token used points to a busy node, and the nodes holding two tasks or more (in all)."""

    extra: float
    stale: float
    multi: float


def _node_terms(n: int, law: _NodeLaw, load: float, d: int) -> _NodeTerms:
    tokens_out = float(np.arange(law.pi.shape[1]) @ law.pi.sum(axis=0))
    return _NodeTerms(
        extra=n * (tokens_out - float(law.pi[0].sum())),
        stale=_values_of_node(law, load, d).stale_share,
        multi=n * float(law.pi[2:].sum()),
    )


def _solve_chain(
    n: int, K: int, load: float, d: int, node: _NodeTerms, box: _Box
) -> tuple[tuple[float, ...], _Box]:
    """The chain's values, its cuts widened until the mass at its edges is below ``EDGE``."""
    split = _split(n, K, load, d, node.extra, node.multi, box.top_i)
    while True:
        vals, edge_i, edge_x = _chain_values(n, load, split, node.extra, node.stale, box)
        wide = edge_i > EDGE and (box.low_i > 0 or box.top_i < n)
        if not wide and edge_x <= EDGE:
            return vals, box
        if wide:  # by half again: each solve costs about the cube of the cut in I
            box = _Box(box.low_i // 2, min(n, box.top_i + box.top_i // 2), box.top_x)
            split = _split(n, K, load, d, node.extra, node.multi, box.top_i)
        if edge_x > EDGE:
            box = _Box(box.low_i, box.top_i, box.top_x + box.top_x // 2)


def _split(n: int, K: int, load: float, d: int, extra: float, multi: float, top_i: int) -> Split:
    """P(a dispatcher holds no token) as a function of the tokens T in all (arrays of T)."""
    if K == 1 or d == 1:
        return lambda t: uniform_split_empty(t, K)
    if K > SQ_SPLIT_MAX:
        raise ValueError(f"JIQ-SQ(d)'s token split is solved for at most {SQ_SPLIT_MAX} dispatchers, got {K}")
    # tokens are born as nodes holding one task complete: about n - (idle nodes) - (nodes holding >= 2);
    # the split is solved up to 8 K tokens in all (an empty dispatcher is rare beyond) or the idle cut
    top = max(4, min(8 * K, top_i + math.ceil(extra) + 2))
    totals = np.arange(top + 1)
    birth = np.maximum(n - np.maximum(totals - extra, 0.0) - multi, 0.0)
    table = sq_split_empty(K, d, birth, load * n / K)
    # beyond the cut the share falls on geometrically (the last ratio, taken below the cut)
    ratio = min(table[top - 2] / table[top - 3], 1.0) if table[top - 3] > 0 else 0.0

    def empty(t: np.ndarray) -> np.ndarray:
        far = table[top - 2] * ratio ** np.maximum(t - (top - 2), 0.0)
        return np.where(t <= top - 2, np.interp(t, totals, table), far)

    return empty
