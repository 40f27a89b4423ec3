"""JIQ with several dispatchers in the large-system limit with the ratio of nodes to dispatchers fixed
(Lu, Xie, Kliot, Geller, Larus and Greenberg 2011, §4; docs/theory.md, "Several dispatchers").

n nodes of equal speed at load lambda < 1 (each busy a fraction lambda of the time), K dispatchers, r = n / K
nodes per dispatcher. Each dispatcher's tokens form its idle queue (I-queue). In the limit the n (1 -
lambda) idle nodes are spread over the K I-queues, r (1 - lambda) per I-queue on average, and rho, the
fraction of I-queues that hold a token, solves

    JIQ-Random (an idle node joins a uniformly random I-queue):   rho / (1 - rho) = r (1 - lambda)
    JIQ-SQ(d) (it joins the shortest of d):   sum_{i >= 1} rho^((d^i - 1)/(d - 1)) = r (1 - lambda)

(each I-queue is an M/M/1 queue, or the supermarket model's queue with d choices, whose "customers" are
idle nodes and whose "service" is the arrivals at its dispatcher; its mean length is r (1 - lambda)). A
task finds its dispatcher's I-queue empty with probability 1 - rho and goes to a uniformly random node:
each node receives such tasks as a Poisson stream of rate lambda' = lambda (1 - rho) (in units of its
service rate), and tasks that use a token only ever reach idle nodes. A node's busy periods are therefore
those of an M/G/1 queue with load lambda' (the rest is derived here in docs/theory.md): its mean sojourn is
that queue's, P(N >= j) = lambda lambda'^(j-1) for j >= 1 (exponential work, or processor sharing), an
FCFS task waits with probability (1 - rho) lambda, and a node sends 1 - lambda' tokens per task.
"""

from __future__ import annotations

from lbtestbed.analysis.theory.numeric import bisect


def iqueue_length(ratio: float, load: float) -> float:
    """r (1 - lambda): the mean number of tokens a dispatcher holds in the limit."""
    return ratio * (1.0 - load)


def occupied_iqueues(ratio: float, load: float, d: int = 1) -> float:
    """rho: the fraction of dispatchers holding at least one token, for JIQ-Random (d = 1) or JIQ-SQ(d)."""
    if not 0.0 <= load < 1.0:
        raise ValueError(f"JIQ's limit needs a load in [0, 1), got {load!r}")
    m = iqueue_length(ratio, load)
    if m == 0.0:
        return 0.0
    if d == 1:
        return m / (1.0 + m)
    return bisect(lambda rho: supermarket_mean(rho, d) - m, 0.0, 1.0 - 1e-15)


def supermarket_mean(rho: float, d: int) -> float:
    """sum_{i >= 1} rho^((d^i - 1)/(d - 1)): the mean queue length of the supermarket model at load rho
    with d choices (its tail P(Q >= i) is the i-th term)."""
    total, i = 0.0, 1
    while True:
        term = rho ** ((d**i - 1) // (d - 1))
        total += term
        if term < 1e-17 or i > 200:
            return total
        i += 1


def random_share(ratio: float, load: float, d: int = 1) -> float:
    """lambda' / lambda = 1 - rho: the fraction of tasks routed at random (their dispatcher held no token)."""
    return 1.0 - occupied_iqueues(ratio, load, d)
