"""Probability distributions of the experiment spec: work sizes, node speeds, message delays.

Every sampler draws from a numpy ``Generator`` handed in by the caller, so that one seed fixes an
experiment. Work sizes and delays are drawn in blocks, which is what makes the simulator fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

#: names accepted for ``dist`` in work-size and delay tables
SIZE_DISTRIBUTIONS = ("exponential", "deterministic", "hyperexponential", "lognormal")


@dataclass(frozen=True)
class SizeDistribution:
    """A positive random variable given by its family, mean and squared coefficient of variation."""

    dist: str
    mean: float
    scv: float

    @classmethod
    def of(cls, dist: str, mean: float, scv: float | None = None) -> SizeDistribution:
        """Build one, filling in the scv the family implies (exponential 1, deterministic 0)."""
        fixed = {"exponential": 1.0, "deterministic": 0.0}
        if dist in fixed:
            return cls(dist, mean, fixed[dist])
        if scv is None:
            raise ValueError(f"{dist} needs scv")
        return cls(dist, mean, scv)

    @property
    def second_moment(self) -> float:
        return self.mean * self.mean * (1.0 + self.scv)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw ``size`` values."""
        m = self.mean
        if self.dist == "exponential":
            return rng.exponential(m, size)
        if self.dist == "deterministic":
            return np.full(size, m)
        if self.dist == "hyperexponential":
            # balanced means H2: each phase carries half of the mean
            c2 = self.scv
            p1 = 0.5 * (1.0 + math.sqrt((c2 - 1.0) / (c2 + 1.0)))
            phase1 = rng.random(size) < p1
            means = np.where(phase1, m / (2.0 * p1), m / (2.0 * (1.0 - p1)))
            return rng.exponential(1.0, size) * means
        if self.dist == "lognormal":
            s2 = math.log1p(self.scv)
            return rng.lognormal(math.log(m) - s2 / 2.0, math.sqrt(s2), size)
        raise ValueError(f"unknown distribution {self.dist!r}")

    def describe(self) -> str:
        if self.dist in ("exponential", "deterministic"):
            return f"{self.dist}(mean={self.mean:g})"
        return f"{self.dist}(mean={self.mean:g}, scv={self.scv:g})"


class BlockSampler:
    """Hands out draws one at a time from numpy blocks (scalar numpy calls are slow)."""

    __slots__ = ("_block", "_dist", "_i", "_rng", "_size")

    def __init__(self, dist: SizeDistribution, rng: np.random.Generator, block: int = 4096) -> None:
        self._dist = dist
        self._rng = rng
        self._size = block
        self._block: list[float] = []
        self._i = 0

    def __call__(self) -> float:
        i = self._i
        if i == len(self._block):
            self._block = self._dist.sample(self._rng, self._size).tolist()
            i = 0
        self._i = i + 1
        return self._block[i]


@dataclass(frozen=True)
class SpeedSpec:
    """A node class's speed: one exact value, or uniform(low, high) drawn per node."""

    value: Fraction | None = None
    low: float | None = None
    high: float | None = None

    def draw(self, rng: np.random.Generator, count: int) -> list[float]:
        if self.value is not None:
            return [float(self.value)] * count
        assert self.low is not None and self.high is not None
        return rng.uniform(self.low, self.high, count).tolist()

    @property
    def mean(self) -> float:
        if self.value is not None:
            return float(self.value)
        assert self.low is not None and self.high is not None
        return (self.low + self.high) / 2.0

    def describe(self) -> str:
        if self.value is not None:
            return str(self.value)
        return f"uniform({self.low:g}, {self.high:g})"
