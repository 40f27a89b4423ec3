"""Point estimates with 95% confidence intervals: batch means within a run, or independent replications."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=256)
def t_quantile(df: float, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for ``df`` degrees of freedom."""
    from scipy import special  # imported here: predictions need no interval and start faster without it

    return float(special.stdtrit(df, 0.5 + level / 2.0))


@dataclass(frozen=True)
class Estimate:
    """A value with the half-width of its 95% interval and the interval's degrees of freedom (a t
    interval on ``df``); all None where the metric does not apply."""

    value: float | None
    ci95: float | None
    df: int | None = None

    @classmethod
    def none(cls) -> Estimate:
        return cls(None, None)

    def to_json(self) -> dict[str, float | None]:
        return {"value": self.value, "ci95": self.ci95, "df": self.df}


def mean_ci(samples: Sequence[float] | np.ndarray, center: float | None = None) -> Estimate:
    """Mean of i.i.d.-ish samples (batch means or replication values) with a t interval.

    ``center`` replaces the sample mean as the point estimate (e.g. a ratio of sums).
    """
    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Estimate.none()
    value = float(x.mean()) if center is None else center
    if x.size < 2:
        return Estimate(value, None)
    half = t_quantile(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Estimate(value, half, x.size - 1)


def ratio_estimate(num: np.ndarray, den: np.ndarray) -> Estimate:
    """sum(num) / sum(den) with a batch-means interval over the per-batch ratios."""
    total = float(den.sum())
    if total <= 0:
        return Estimate.none()
    ok = den > 0
    return mean_ci(num[ok] / den[ok], center=float(num.sum()) / total)


def replication_estimate(values: Sequence[float | None]) -> Estimate:
    """Mean over independent replications with a t interval."""
    xs = [v for v in values if v is not None]
    return mean_ci(xs) if xs else Estimate.none()
