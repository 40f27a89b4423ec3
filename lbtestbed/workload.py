"""Tasks and the seeded workload that creates them (DESIGN principle 4: workloads are data)."""

from __future__ import annotations

import numpy as np

from lbtestbed.distributions import BlockSampler, SizeDistribution
from lbtestbed.spec import Experiment, seed_sequence


class Task:
    """One task: its work (in work units) and the model time it entered the system."""

    __slots__ = ("arrived", "batch", "id", "origin", "work")

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

    Arrival gaps and sizes come from separate streams, so changing the rate leaves the sizes alone.
    """

    def __init__(self, exp: Experiment, replication: int = 0) -> None:
        rate = exp.workload.arrival_rate
        self._gap = BlockSampler(
            SizeDistribution.of("exponential", 1.0 / rate),
            np.random.default_rng(seed_sequence(exp.seed, "arrivals", replication)),
        )
        self._size = BlockSampler(
            exp.workload.service, np.random.default_rng(seed_sequence(exp.seed, "sizes", replication))
        )
        self.time = 0.0
        self.count = 0

    def next(self) -> tuple[float, float]:
        """(arrival time, work) of the next task."""
        self.time += self._gap()
        self.count += 1
        return self.time, self._size()
