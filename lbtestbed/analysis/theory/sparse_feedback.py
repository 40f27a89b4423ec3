"""JSQ on sparse queue-length feedback, and sparsified JIQ at the same message rate (van der Boor, Borst
and van Leeuwaarden, "Hyper-Scalable JSQ with Sparse Feedback", 2019, arXiv 1903.02337; docs/theory.md,
"Sparse feedback: JSQ on occasional updates").

The model: N identical servers of rate 1 (fcfs, exponential work), Poisson arrivals at rate load N, one
dispatcher. The dispatcher keeps an estimate of every queue; a task goes to a server of least estimate
(ties uniformly at random) and raises that estimate by one. A server's update message sets its estimate to
its true queue length: asynchronously, each server at the times of its own Poisson process of rate delta,
or synchronously, all servers every T. Messages per task: delta / load, or 1 / (load T).

Every function is the fluid limit N -> infinity (a mean field), derived here in docs/theory.md: the project
had the paper's abstract, not its full text. Times are in units of the mean service time; ``messages`` is
update messages per task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from lbtestbed.analysis.theory.ctmc import gth_stationary
from lbtestbed.analysis.theory.numeric import falsi


@dataclass(frozen=True)
class FeedbackValues:
    """Stationary values of one server in the fluid limit; times in units of the mean service time."""

    mean_sojourn: float
    mean_wait: float  # fcfs: the mean time before service starts
    wait: float  # P(a task finds its server busy)
    mean_queue: float  # tasks per server
    tail: tuple[float, ...]  # P(queue >= k), k = 0, 1, ...
    messages_per_task: float


def _check(load: float, messages: float) -> None:
    if not 0.0 < load < 1.0:
        raise ValueError(f"sparse feedback needs a load in (0, 1), got {load!r}")
    if not messages > 0.0:
        raise ValueError(f"sparse feedback needs a positive message rate, got {messages!r}")


def zero_wait_messages(load: float) -> float:
    """The least update rate, in messages per task, at which the fluid limit has no waiting: 1 / (1 - load),
    for asynchronous and synchronous updates alike (derived here, docs/theory.md: every task must go to a
    server the dispatcher knows to be idle, and only an update that finds its server idle, a fraction
    1 - load of them, makes one known)."""
    if not 0.0 < load < 1.0:
        raise ValueError(f"sparse feedback needs a load in (0, 1), got {load!r}")
    return 1.0 / (1.0 - load)


# -- asynchronous updates -------------------------------------------------------------------------------


def _async_chain(level: int, push: float, delta: float) -> tuple[list[tuple[int, int]], np.ndarray]:
    """One server's states (estimate e, queue q) at the fluid fixed point with water level ``level`` = m,
    and their stationary law. Estimates are m or m + 1; a server at estimate m gets tasks at rate ``push``
    (to m + 1); it serves at rate 1; an update (rate delta) sets e = q, and a server updating below m is
    filled to m at once (the dispatcher sends it m - q tasks before anyone else). With push = 0 nothing
    reaches m + 1 and only the states at m are kept."""
    states = [(level, q) for q in range(level + 1)]
    if push > 0:
        states += [(level + 1, q) for q in range(level + 2)]
    index = {s: i for i, s in enumerate(states)}
    rates = np.zeros((len(states), len(states)))
    for (e, q), i in index.items():
        if q > 0:
            rates[i, index[(e, q - 1)]] += 1.0
        if e == level and push > 0:
            rates[i, index[(level + 1, q + 1)]] += push
        after = (max(q, level),) * 2
        if after != (e, q):
            rates[i, index[after]] += delta
    return states, gth_stationary(rates)


def _async_flow(level: int, push: float, delta: float) -> float:
    """Tasks per server per unit time that the dispatcher sends at this level and push rate."""
    states, pi = _async_chain(level, push, delta)
    at_level = sum(p for (e, _), p in zip(states, pi, strict=True) if e == level)
    fills = sum(p * (level - q) for (_, q), p in zip(states, pi, strict=True) if q < level)
    return push * at_level + delta * fills


@cache
def asynchronous(load: float, messages: float) -> FeedbackValues:
    """JSQ on asynchronous updates (each server at rate delta = ``messages`` x ``load``), fluid limit.

    Regime: a limit (N -> infinity, the fixed point of the fluid limit). Assumptions: exponential work of
    rate 1, fcfs, one dispatcher with ties broken uniformly, updates delivered at once. The fixed point has
    a water level m: every estimate is m or m + 1; servers at m share the tasks that do not go to filling
    servers whose update showed fewer than m. m and the push rate solve "tasks sent = load". Waiting
    vanishes iff messages >= 1 / (1 - load) (then m = 0); as messages -> 0 the level, and the wait, grow
    like load / delta. Source: derived here (docs/theory.md, "Sparse feedback: JSQ on occasional updates"),
    for the model of van der Boor et al. 2019 (arXiv 1903.02337)."""
    _check(load, messages)
    delta = messages * load
    level = 0
    while _async_flow(level + 1, 0.0, delta) <= load:  # the level at which push = 0 still sends too little
        level += 1
        if level > 10_000:
            raise ArithmeticError(f"no fixed point found for load {load} at {messages} messages per task")
    push = 0.0
    if _async_flow(level, 0.0, delta) < load:  # the push rate that makes up the rest (a finite one exists)
        top = 1.0
        while _async_flow(level, top, delta) < load:
            top *= 2
        push = falsi(lambda x: _async_flow(level, x, delta) - load, 0.0, top, tol=1e-13)
    states, pi = _async_chain(level, push, delta)
    arrivals_busy = push * sum(p for (e, q), p in zip(states, pi, strict=True) if e == level and q > 0)
    # a fill of m - q tasks: the first finds q tasks, the others find the ones sent before them
    arrivals_busy += delta * sum(
        p * (level - q - (q == 0)) for (_, q), p in zip(states, pi, strict=True) if q < level
    )
    return _values(states, pi, load, arrivals_busy / load, messages)


def _values(
    states: list[tuple[int, int]], pi: np.ndarray, load: float, wait: float, messages: float
) -> FeedbackValues:
    top = max(q for _, q in states)
    mass = np.zeros(top + 1)
    for (_, q), p in zip(states, pi, strict=True):
        mass[q] += p
    return _from_queue(mass, load, wait, messages)


def _from_queue(mass: np.ndarray, load: float, wait: float, messages: float) -> FeedbackValues:
    """Values from the time-stationary queue-length law ``mass`` (Little's law for the sojourn)."""
    tail = np.cumsum(mass[::-1])[::-1]
    mean_queue = float(tail[1:].sum())
    sojourn = mean_queue / load
    return FeedbackValues(
        mean_sojourn=sojourn,
        mean_wait=sojourn - 1.0,
        wait=wait,
        mean_queue=mean_queue,
        tail=tuple(float(t) for t in tail),
        messages_per_task=messages,
    )


# -- sparsified JIQ ------------------------------------------------------------------------------------


@cache
def sparse_jiq(load: float, messages: float) -> FeedbackValues:
    """Sparsified JIQ, one dispatcher: a server that becomes idle sends a token with probability p (else
    nothing); a task goes to a token's server if the dispatcher holds one, else to a uniformly random
    server. ``messages`` (tokens per task, at most 1) fixes p = m / (1 - load + load m).

    Regime: a limit (N -> infinity, fluid fixed point). Assumptions: exponential work of rate 1, fcfs.
    For p < 1 the tokens arrive more slowly than tasks, so each is used at once: a server that sends a token
    gets its next task immediately, and every server receives random tasks at rate a = load (1 - p) /
    (1 - load p); its queue is then a birth-death chain (births a, deaths 1, the step 1 -> 0 thinned to
    1 - p), geometric above 1: P(wait) = a, tokens per task p (1 - load) / (1 - load p), mean sojourn
    (1 - load) / ((1 - load p) (1 - a)^2). p = 1 is JIQ: no wait, one token per task. Source: derived here
    (docs/theory.md, "Sparse feedback: JSQ on occasional updates"); the paper compares its schemes with
    sparsified JIQ (arXiv 1903.02337, abstract)."""
    _check(load, messages)
    if messages > 1.0:
        raise ValueError(f"sparsified JIQ sends at most one token per task, got {messages!r}")
    p = messages / (1.0 - load + load * messages)
    a = load * (1.0 - p) / (1.0 - load * p)
    first = (1.0 - load) * load / (1.0 - load * p)  # P(one task)
    top = 1 if a == 0 else max(2, math.ceil(math.log(1e-15) / math.log(a)) + 2)
    mass = np.array([1.0 - load] + [first * a ** (k - 1) for k in range(1, top + 1)])
    return _from_queue(mass, load, a, messages)


# -- synchronous updates -------------------------------------------------------------------------------

#: Gauss-Legendre points for the arrival time inside a window
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(16)


def _drain(size: int, t: float) -> np.ndarray:
    """D[a, b] = P(a server holding a tasks holds b after t of service at rate 1), a, b < size."""
    k = np.arange(size)
    logs = np.array([math.lgamma(i + 1) for i in range(size)])
    pmf = np.exp(k * math.log(t) - t - logs) if t > 0 else (k == 0) * 1.0
    a, b = np.meshgrid(k, k, indexing="ij")
    d = np.where((b >= 1) & (a >= b), pmf[np.clip(a - b, 0, size - 1)], 0.0)
    d[:, 0] = np.maximum(0.0, 1.0 - np.concatenate([[0.0], np.cumsum(pmf)[:-1]]))
    return d


def _shift(v: np.ndarray) -> np.ndarray:
    """One more task on each row's queue (the last entry keeps its mass: the cut)."""
    out = np.zeros_like(v)
    out[..., 1:] = v[..., :-1]
    out[..., -1] += v[..., -1]
    return out


def _period(
    start: np.ndarray, windows: list[tuple[float, float]], joins: list[np.ndarray], period: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Servers through one period, one row each: row r's queue law at the start is start[r]; in window i
    the rows with joins[i] get one task at a uniform time in it (a window cut by the period's end only with
    the chance that its time falls before it). Returns per row the law at the period's end, the expected
    tasks received, those finding the server busy and the tasks found on arrival."""
    v, now = start.copy(), 0.0
    rows, size = v.shape
    tasks, busy, found = np.zeros(rows), np.zeros(rows), np.zeros(rows)
    queue = np.arange(size)
    for (lo, hi), join in zip(windows, joins, strict=True):
        if lo >= period:
            break
        v = v @ _drain(size, lo - now)
        end = min(hi, period)
        chance = (end - lo) / (hi - lo)
        after = np.zeros_like(v)
        for x, w in zip(_NODES, _WEIGHTS, strict=True):
            u = lo + (x + 1) / 2 * (end - lo)
            seen = v @ _drain(size, u - lo)
            weight = w / 2 * chance
            busy += weight * (1.0 - seen[:, 0]) * join
            found += weight * (seen @ queue) * join
            after += weight * (_shift(seen) @ _drain(size, end - u))
        tasks += chance * join
        stay = (1 - chance) * (v @ _drain(size, end - lo))
        v = np.where(join[:, None] > 0, after + stay, v @ _drain(size, end - lo))
        now = end
    return v @ _drain(size, period - now), tasks, busy, found


@cache
def synchronous(load: float, messages: float, size: int = 60) -> FeedbackValues:
    """JSQ on synchronous updates (every server every T = 1 / (``messages`` x ``load``)), fluid limit.

    Regime: a limit (N -> infinity, the fixed point of the fluid model's map from one update to the next).
    Assumptions: exponential work of rate 1, fcfs, one dispatcher with ties broken uniformly, queues below
    ``size``. After an update the dispatcher knows every queue; it water-fills: with F(k) the fraction of
    servers holding at most k, the estimates move from k to k + 1 during a window of length F(k) / load, in
    which each of those servers gets one task at a uniform time. Waiting vanishes iff messages >= 1 /
    (1 - load); as messages -> 0 the windows become a round robin, one task per server every 1 / load at a
    uniform time in its window, and the wait tends to that queue's (``round_robin_limit``). Source: derived
    here (docs/theory.md, "Sparse feedback: JSQ on occasional updates"), for the model of van der Boor et
    al. 2019 (arXiv 1903.02337)."""
    _check(load, messages)
    period = 1.0 / (messages * load)
    law = np.zeros(size)
    law[0] = 1.0
    start = np.eye(size)
    for _ in range(5000):
        cdf = np.cumsum(law)
        windows, joins, t = [], [], 0.0
        for k in range(size):  # window k: estimates k -> k + 1, for the servers that started at <= k
            length = cdf[k] / load
            if length > 0 and t < period:
                windows.append((t, t + length))
                joins.append((np.arange(size) <= k).astype(float))
            t += length
        end, tasks, busy, found = _period(start, windows, joins, period)
        new = law @ end
        if np.abs(new - law).sum() < 1e-12:
            break
        law = new
    tasks_all, busy_all, found_all = law @ tasks, law @ busy, law @ found
    mean_sojourn = 1.0 + found_all / tasks_all  # fcfs, exponential: one service per task found, and its own
    return FeedbackValues(
        mean_sojourn=mean_sojourn,
        mean_wait=mean_sojourn - 1.0,
        wait=busy_all / tasks_all,
        mean_queue=load * mean_sojourn,
        tail=(),
        messages_per_task=messages,
    )


@cache
def round_robin_limit(load: float, size: int = 80) -> FeedbackValues:
    """The synchronous scheme as messages -> 0: each server gets one task in every window of length
    1 / load, at a uniform time in it (the water-filling of equal estimates in random order). The queue
    seen at window starts is a Markov chain; solved exactly (queues below ``size``).

    Regime: a limit (N -> infinity, then messages per task -> 0). Assumptions as ``synchronous``. Source:
    derived here (docs/theory.md); van der Boor et al. 2019 (arXiv 1903.02337, abstract) state that the
    mean wait tends to a constant in this regime."""
    if not 0.0 < load < 1.0:
        raise ValueError(f"sparse feedback needs a load in (0, 1), got {load!r}")
    length = 1.0 / load
    everyone = [np.ones(size)]
    step, tasks, busy, found = _period(np.eye(size), [(0.0, length)], everyone, length)
    rates = step.copy()
    np.fill_diagonal(rates, 0.0)
    law = gth_stationary(rates)
    mean_sojourn = 1.0 + (law @ found) / (law @ tasks)
    return FeedbackValues(
        mean_sojourn=mean_sojourn,
        mean_wait=mean_sojourn - 1.0,
        wait=(law @ busy) / (law @ tasks),
        mean_queue=load * mean_sojourn,
        tail=(),
        messages_per_task=0.0,
    )
