"""Tasks and the seeded workload that creates them (docs/design.md, principle 4: workloads are data)."""

from __future__ import annotations

import numpy as np

from lbtestbed.model.experiment import Experiment
from lbtestbed.model.streams import seed_sequence, seeded_random


class Task:
    """One task: its work (in work units) and the model time it entered the system."""

    __slots__ = ("arrived", "batch", "forwarded", "id", "next", "origin", "work")

    forwarded: float  # when its dispatcher forwarded it: set by the driver that forwards it
    next: Task  # the task behind it in its node's FIFO, once there is one (model.nodes.FCFSNode)

    def __init__(self, id: int, work: float, arrived: float, origin: int = 0, batch: int = -1) -> None:
        self.id = id
        self.work = work
        self.arrived = arrived
        self.origin = origin  # index of the dispatcher that routed it
        self.batch = batch  # measurement batch of its arrival, -1 outside the measured window

    def __repr__(self) -> str:
        return f"Task(id={self.id}, work={self.work:.4g}, arrived={self.arrived:.6g})"


class PoissonWorkload:
    """Poisson arrivals at the spec's rate with work sizes from its service distribution.

    Arrival gaps and sizes come from separate streams, so changing the rate leaves the sizes alone. Both are
    drawn in blocks; ``next`` hands them out one by one and ``next_block`` a block at a time.
    """

    BLOCK = 4096

    def __init__(self, exp: Experiment, replication: int = 0) -> None:
        self._mean_gap = 1.0 / exp.workload.arrival_rate
        self._service = exp.workload.service
        self._gaps = np.random.default_rng(seed_sequence(exp.seed, "arrivals", replication))
        self._sizes = np.random.default_rng(seed_sequence(exp.seed, "sizes", replication))
        self.time = 0.0  # arrival time of the last task handed out
        self.count = 0  # tasks handed out
        self._t: list[float] = []
        self._w: list[float] = []
        self._i = 0
        self._end = 0.0  # arrival time of the last task drawn

    def next_block(self) -> tuple[list[float], list[float]]:
        """Arrival times and works of the next BLOCK tasks (the caller counts what it uses)."""
        times = self._end + np.cumsum(self._gaps.exponential(self._mean_gap, self.BLOCK))
        self._end = float(times[-1])
        return times.tolist(), self._service.sample(self._sizes, self.BLOCK).tolist()

    def next(self) -> tuple[float, float]:
        """(arrival time, work) of the next task."""
        if self._i == len(self._t):
            self._t, self._w = self.next_block()
            self._i = 0
        i = self._i
        self._i = i + 1
        self.count += 1
        self.time = self._t[i]
        return self.time, self._w[i]


class DispatcherSplit:
    """Which of the spec's ``policy.dispatchers`` dispatchers each arrival reaches, in arrival order:
    uniformly at random from the experiment's own stream (``split = "random"``) or in turn from dispatcher
    0 (``"round_robin"``). The simulator, its twin and both load generators draw the same sequence, so that
    task i reaches the same dispatcher in all of them."""

    def __init__(self, exp: Experiment, replication: int = 0) -> None:
        self.k = exp.policy.dispatchers
        self.in_turn = exp.policy.split == "round_robin"
        self._random = seeded_random(exp.seed, "split", replication).random
        self._turn = -1

    def next(self) -> int:
        if self.k == 1:
            return 0
        if self.in_turn:
            self._turn = (self._turn + 1) % self.k
            return self._turn
        return int(self._random() * self.k)

    def take(self, count: int) -> list[int]:
        """The dispatchers of the next ``count`` arrivals."""
        return [self.next() for _ in range(count)]
