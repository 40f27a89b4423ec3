"""An independent reference for lbtestbed/analysis/theory/sparse_feedback.py: a plain discrete-event
simulation of exactly the models there (docs/theory.md, "Sparse feedback: JSQ on occasional updates"),
sharing no code with the package.

N identical FCFS servers of rate 1, exponential work, Poisson arrivals at rate load N, one dispatcher:

- ``async``: the dispatcher sends each task to a server of least estimate (ties uniformly at random) and
  raises its estimate by one; every server sends its queue length at the times of its own Poisson process
  of rate delta = messages x load, which sets its estimate;
- ``sync``: the same, every server sending its queue length at the times k T, T = 1 / (messages x load);
- ``jiq``: sparsified JIQ: a server left idle sends a token with probability p = m / (1 - load + load m);
  a task goes to a token's server (the oldest token) if the dispatcher holds one, else to a uniformly
  random server.

Each replication starts empty, runs ``warmup`` then ``duration`` model seconds, and reports, for the
tasks that arrived in that window, their mean sojourn (the run goes on until the last of them is done, so
that long sojourns are not cut off), the fraction that waited and the messages sent in the window per
task. Replications use the seeds seed, seed + 1, ...; the 95 % interval is Student's t over them.

    .venv/bin/python benchmarks/reference_sparse_feedback.py async --load 0.7 --messages 1.0 --n 500
    .venv/bin/python benchmarks/reference_sparse_feedback.py table      # docs/theory.md's table
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass

#: Student's t quantile (0.975) by degrees of freedom
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    19: 2.093,
    29: 2.045,
}


@dataclass
class Run:
    mean_sojourn: float
    wait: float
    messages_per_task: float


class Servers:
    """Queues (arrival times, FCFS) and the set of busy servers, for picking one uniformly."""

    def __init__(self, n: int) -> None:
        self.queue: list[deque[float]] = [deque() for _ in range(n)]
        self.busy: list[int] = []
        self.where = [-1] * n

    def arrive(self, k: int, now: float) -> bool:
        """A task joins server k; True if it has to wait."""
        q = self.queue[k]
        q.append(now)
        if len(q) == 1:
            self.where[k] = len(self.busy)
            self.busy.append(k)
            return False
        return True

    def complete(self, k: int) -> float:
        """Server k finishes its head task; its arrival time."""
        q = self.queue[k]
        t = q.popleft()
        if not q:
            i, last = self.where[k], self.busy[-1]
            self.busy[i], self.where[last] = last, i
            self.busy.pop()
            self.where[k] = -1
        return t


class Estimates:
    """The dispatcher's estimates in buckets, for a uniform pick among the least."""

    def __init__(self, n: int) -> None:
        self.value = [0] * n
        self.bucket: dict[int, list[int]] = {0: list(range(n))}
        self.where = list(range(n))
        self.low = 0

    def _remove(self, k: int) -> None:
        b = self.bucket[self.value[k]]
        i, last = self.where[k], b[-1]
        b[i], self.where[last] = last, i
        b.pop()

    def _add(self, k: int, v: int) -> None:
        b = self.bucket.setdefault(v, [])
        self.where[k] = len(b)
        b.append(k)
        self.value[k] = v

    def set(self, k: int, v: int) -> None:
        self._remove(k)
        self._add(k, v)
        self.low = min(self.low, v)

    def pick(self, rng: random.Random) -> int:
        while not self.bucket.get(self.low):
            self.low += 1
        b = self.bucket[self.low]
        k = b[int(rng.random() * len(b))]
        self.set(k, self.low + 1)
        return k


def simulate(
    scheme: str, n: int, load: float, messages: float, warmup: float, duration: float, seed: int
) -> Run:
    rng = random.Random(seed)
    servers = Servers(n)
    est = Estimates(n)
    tokens: deque[int] = deque()
    p = messages / (1.0 - load + load * messages) if scheme == "jiq" else 0.0
    delta = messages * load
    period = 1.0 / (messages * load) if scheme == "sync" else math.inf
    next_sync = period
    end = warmup + duration
    now = 0.0
    open_tasks = 0  # tasks that arrived in the window and are not done: the run goes on until none is left
    lam = load * n
    total_sojourn = 0.0
    done = waited = arrived = sent = 0
    while True:
        rate = lam + len(servers.busy) + (delta * n if scheme == "async" else 0.0)
        step = rng.expovariate(rate)
        if now + step >= next_sync:  # all servers report at once (sync); the race restarts (memoryless)
            now = next_sync
            next_sync += period
            if now >= end and not open_tasks:
                break
            for k in range(n):
                est.set(k, len(servers.queue[k]))
            if warmup <= now < end:
                sent += n
            continue
        now += step
        if now >= end and not open_tasks:
            break
        window = warmup <= now < end
        x = rng.random() * rate
        if x < lam:
            # JSQ on estimates, or sparsified JIQ: the oldest token, else a uniformly random server
            k = est.pick(rng) if scheme != "jiq" else (tokens.popleft() if tokens else int(rng.random() * n))
            waits = servers.arrive(k, now)
            if window:
                arrived += 1
                open_tasks += 1
                waited += waits
        elif x < lam + len(servers.busy):
            k = servers.busy[int(rng.random() * len(servers.busy))]
            t = servers.complete(k)
            if warmup <= t < end:
                total_sojourn += now - t
                done += 1
                open_tasks -= 1
            if scheme == "jiq" and not servers.queue[k] and rng.random() < p:
                tokens.append(k)
                if window:
                    sent += 1
            continue
        else:  # an asynchronous update
            k = int(rng.random() * n)
            est.set(k, len(servers.queue[k]))
            if window:
                sent += 1
    return Run(total_sojourn / done, waited / arrived, sent / arrived)


def replicate(
    scheme: str, n: int, load: float, messages: float, warmup: float, duration: float, seed: int, reps: int
) -> dict[str, tuple[float, float]]:
    """Each metric's mean over ``reps`` replications and its 95 % half-width (Student's t)."""
    runs = [simulate(scheme, n, load, messages, warmup, duration, seed + r) for r in range(reps)]
    t = T975.get(reps - 1, 1.96)
    out = {}
    for name in ("mean_sojourn", "wait", "messages_per_task"):
        xs = [getattr(r, name) for r in runs]
        out[name] = (statistics.fmean(xs), t * statistics.stdev(xs) / math.sqrt(reps))
    return out


#: docs/theory.md's table: loads and message rates (tokens per task at most 1 for sparsified JIQ)
TABLE_LOADS = (0.5, 0.9)
TABLE_MESSAGES = (0.2, 0.5, 1.0, 2.0)


def table(n: int, reps: int, seed: int) -> None:
    """Fluid limit against this simulation, for the three schemes, at the loads and rates above."""
    from lbtestbed.analysis.theory import sparse_feedback as sf

    fluid = {"async": sf.asynchronous, "sync": sf.synchronous, "jiq": sf.sparse_jiq}
    print(f"N = {n}, {reps} replications; fluid limit | simulation (95 % interval)")
    print("| load | messages/task | scheme | W fluid | W simulated | P(wait) fluid | P(wait) simulated |")
    print("|---|---|---|---|---|---|---|")
    for load in TABLE_LOADS:
        for m in TABLE_MESSAGES:
            for scheme in ("async", "sync", "jiq"):
                if scheme == "jiq" and m > 1:
                    continue
                # warm up over ten update intervals (or periods) and at least 400 (near load 1 the queues take
                # hundreds of service times to build up from empty); measure over twenty, at least 200
                interval = 1.0 / (m * load)
                res = replicate(
                    scheme, n, load, m, max(400.0, 10 * interval), max(200.0, 20 * interval), seed, reps
                )
                f = fluid[scheme](load, m)
                (w, dw), (p, dp) = res["mean_sojourn"], res["wait"]
                print(
                    f"| {load} | {m} | {scheme} | {f.mean_sojourn:.4f} | {w:.4f} ± {dw:.4f} | {f.wait:.4f} | "
                    f"{p:.4f} ± {dp:.4f} |",
                    flush=True,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scheme", choices=("async", "sync", "jiq", "table"))
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--messages", type=float, default=1.0, help="update messages (or tokens) per task")
    ap.add_argument("--warmup", type=float, default=200.0)
    ap.add_argument("--duration", type=float, default=1000.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replications", type=int, default=5)
    args = ap.parse_args()
    if args.scheme == "table":
        table(args.n, args.replications, args.seed)
        return
    res = replicate(
        args.scheme,
        args.n,
        args.load,
        args.messages,
        args.warmup,
        args.duration,
        args.seed,
        args.replications,
    )
    for name, (mean, half) in res.items():
        print(f"{name:18s} {mean:.5f} ± {half:.5f}")


if __name__ == "__main__":
    main()
