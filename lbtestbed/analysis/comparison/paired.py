"""Paired comparisons: two runs on the same tasks, compared batch by batch.

The cluster, its twin and the simulation see the very same tasks (the spec's seeded workload) and cut the
measured window at the same model times, so their estimates of batch b share that batch's arrivals and
work sizes. The difference of the two estimates, batch by batch, removes what they share; what is left
is what differs between the two systems. Its mean over the B batches, with a Student-t interval on B - 1
degrees of freedom (the batches are treated as independent, as batch means are), can see a systematic gap
of a percent where two unpaired intervals, each as wide as the batch-to-batch variation of the workload,
cannot.

Positive quantities whose effect is relative (sojourn times, tasks, messages per task) are compared on
the log scale: the per-batch log ratio, whose mean exp()-1 is the relative gap. The others (fractions,
utility, a learned index) are compared by their per-batch difference.

A divergence confined to one batch of B (a stall, a burst of lost state) moves the mean by 1/B of itself and
widens its interval as much: the mean's test barely sees it however large it is. Each comparison therefore
also asks whether one batch stands apart from the others (Grubbs' test for one outlier among the per-batch
gaps, exact for normal gaps: G = max |d_b - mean| / s, referred to the t distribution on B - 2 degrees of
freedom, two-sided, Bonferroni over the B batches). The two tests share the comparison's 5 % (each at
2.5 %: Bonferroni), so a run that agrees is no more likely to disagree than before, and a lone batch that
diverges by a multiple of the others' spread is seen (``tests/test_comparison.py``). A batch counts as apart
only when its gap is also large (``BATCH_GAP``, 10 %): a twin replays most batches to the last digit and
parts from the cluster in a few by the chaos of queueing (once a decision falls the other way, the rest of
the batch differs by a few percent), so the gaps are mostly zero with rare small jumps, far from normal,
and Grubbs' test alone would call those jumps outliers. Grubbs' test needs
batches alike in law; where the spec's node speeds change over time (schedules, antagonists) or faults are
injected (a system recovering from one is not like itself elsewhere) a batch is noisier than the others by
nature, and the check is left out (``outliers=False``).

Two runs that made the very same decisions (a twin that replayed every one) still sum their integrals in
another order, so their batch values can differ in the last digits. A per-batch gap within ``ROUNDING`` of
the values' size is that rounding, not a gap, and counts as 0: otherwise identical batches whose
rounding happened to lean one way would "disagree" by many standard errors of nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import QUANTILE_METRICS, RATIO_METRICS
from lbtestbed.analysis.results.statistics import t_quantile

#: metrics compared on the log scale (per-batch log ratios); the others by their per-batch difference
LOG_SCALE = frozenset(
    {
        "mean_sojourn",
        "sojourn_p50",
        "sojourn_p99",
        "mean_tasks_per_node",
        "tasks_in_system",
        "messages_per_task",
    }
)

#: the least gap of a lone batch that counts, relative: below it a batch apart is the chaos of a queueing
#: system whose decisions once parted from its twin's (a tie broken the other way moves a batch of a
#: busy run by a few percent: 2 to 4.5 % seen), above it a stall, lost state or a bug
BATCH_GAP = 0.1
#: a per-batch gap at most this share of the values' size is floating-point rounding (doubles carry
#: about 1e-16; sums over a batch's events lose a few digits more), far below any gap a run can show
ROUNDING = 1e-9


@dataclass(frozen=True)
class Paired:
    """The mean over paired batches of a per-batch difference (or log ratio), with its t interval, and the
    batch that stands furthest from the others with Grubbs' p-value for it (module docstring)."""

    scale: str  # "difference" or "log_ratio"
    mean: float
    se: float | None  # None with fewer than two pairs
    df: int
    pairs: int
    outlier: int | None = None  # the window position of the batch furthest from the mean (3 pairs or more)
    outlier_gap: float = 0.0  # its own per-batch difference (or log ratio)
    outlier_p: float | None = None  # Grubbs' two-sided p-value for it (None: fewer than 3 pairs)
    common: tuple[int, ...] = ()  # the window positions of the batches paired

    def mean_p(self) -> float | None:
        """The two-sided p-value of the mean's t test (None without an interval)."""
        if self.se is None:
            return None
        d = self.distance()
        if math.isinf(d):
            return 0.0
        from scipy import special

        return min(1.0, 2.0 * float(special.stdtr(self.df, -d)))

    def p(self, outlier: bool = True) -> float | None:
        """The comparison's p-value: the smaller of the mean's and the outlier's, Bonferroni over the two
        (``outlier`` False: the outlier test's share goes unused, so that the rule's level stays the
        same whether or not the batch furthest apart is large enough to count)."""
        mp, op = self.mean_p(), self.outlier_p
        if op is None:
            return mp
        return min(1.0, 2 * min(mp if mp is not None else 1.0, op if outlier else 1.0))

    def outlier_decides(self, level: float = 0.05) -> bool:
        """Whether the outlier test, not the mean's, rejects at ``level`` (each test at half of it)."""
        mp, op = self.mean_p(), self.outlier_p
        return op is not None and op <= level / 2 and (mp is None or mp > level / 2)

    def outlier_large(self, reference: float) -> bool:
        """Whether the batch furthest apart is far enough to count: BATCH_GAP relative on the log scale,
        else BATCH_GAP of ``reference`` (the metric's size)."""
        if self.outlier is None:
            return False
        if self.scale == "log_ratio":
            return abs(self.outlier_gap) >= math.log1p(BATCH_GAP)
        return abs(self.outlier_gap) >= BATCH_GAP * abs(reference)

    @property
    def ci95(self) -> float | None:
        return None if self.se is None else t_quantile(self.df) * self.se

    def distance(self) -> float:
        """|mean| in standard errors (inf when the pairs do not vary and the mean is not 0)."""
        if self.se is None:
            return math.nan
        if self.se == 0.0:
            return 0.0 if self.mean == 0.0 else math.inf
        return abs(self.mean) / self.se

    def relative(self) -> tuple[float, float | None] | None:
        """On the log scale: the relative gap exp(mean) - 1 and the half-width of its interval, mapped
        from the log scale (asymmetric there; the larger side is given)."""
        if self.scale != "log_ratio":
            return None
        half = self.ci95
        rel = math.expm1(self.mean)
        if half is None:
            return rel, None
        return rel, max(math.expm1(self.mean + half) - rel, rel - math.expm1(self.mean - half))


def positions(raw: RawRun) -> list[int]:
    """The window positions of a run's batches (a cluster run may have left some out)."""
    return raw.positions()


def batch_values(raw: RawRun, metric: str) -> dict[int, float]:
    """Each batch's estimate of ``metric`` by window position; batches without one are left out."""
    pos = positions(raw)
    if metric in QUANTILE_METRICS:
        q = QUANTILE_METRICS[metric]
        return {p: float(np.quantile(s, q)) for p, s in zip(pos, raw.sojourns, strict=True) if len(s)}
    if metric not in raw.ratios:
        return {}
    num, den = raw.ratios[metric]
    return {p: float(n / d) for p, n, d in zip(pos, num, den, strict=True) if d > 0}


def batch_table(raw: RawRun) -> dict[str, Any]:
    """Every scalar metric's estimate batch by batch (``results.json``'s ``batch_values``: what a paired
    comparison compares, for anyone to recompute it): ``batches``, the window positions of the run's
    batches, and ``values``, per metric one value per batch in that order (null in a batch without one,
    and for a metric the run does not have), so that every run of a spec has the same keys."""
    held = positions(raw)
    values: dict[str, list[float | None]] = {}
    for metric in (*RATIO_METRICS, *QUANTILE_METRICS):
        by_batch = batch_values(raw, metric)
        values[metric] = [by_batch.get(p) for p in held]
    return {"batches": held, "values": values}


def pair(a: dict[int, float], b: dict[int, float], log_scale: bool, outliers: bool = True) -> Paired | None:
    """The paired comparison of ``a`` and ``b`` over the batches both have (None without any); with
    ``outliers``, the batch that stands apart and Grubbs' p-value for it (batches alike in law only)."""
    common = sorted(a.keys() & b.keys())
    scale = "log_ratio" if log_scale else "difference"
    if log_scale and any(a[p] <= 0 or b[p] <= 0 for p in common):
        scale = "difference"  # a batch without the quantity (no task waited, say): compare plainly
    if not common:
        return None
    if scale == "log_ratio":
        d = np.array([math.log(a[p] / b[p]) for p in common])
        size = np.ones(len(common))
    else:
        d = np.array([a[p] - b[p] for p in common])
        size = np.array([max(abs(a[p]), abs(b[p])) for p in common])
    d[np.abs(d) <= ROUNDING * size] = 0.0
    n = len(d)
    se = float(d.std(ddof=1)) / math.sqrt(n) if n >= 2 else None
    worst, gap, p = grubbs(d) if outliers else (None, 0.0, None)
    return Paired(
        scale,
        float(d.mean()),
        se,
        max(n - 1, 0),
        n,
        None if worst is None else common[worst],
        gap,
        p,
        tuple(common),
    )


def grubbs(d: np.ndarray) -> tuple[int | None, float, float | None]:
    """The index of the value furthest from the mean, the value, and Grubbs' two-sided p-value that it is an
    outlier among normal values (None with fewer than 3): G = max |d - mean| / s; with
    t^2 = n (n - 2) G^2 / ((n - 1)^2 - n G^2), p = min(1, 2 n P(T_{n-2} > t))."""
    n = len(d)
    if n < 3:
        return None, 0.0, None
    dev = np.abs(d - d.mean())
    worst = int(dev.argmax())
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return worst, float(d[worst]), 1.0
    g = float(dev[worst]) / sd
    room = (n - 1) ** 2 - n * g * g
    if room <= 0:  # G at its largest possible value, (n - 1) / sqrt(n): every other value equal
        return worst, float(d[worst]), 0.0
    from scipy import special

    t = math.sqrt(n * (n - 2) * g * g / room)
    return worst, float(d[worst]), min(1.0, 2.0 * n * float(special.stdtr(n - 2, -t)))


def paired_metric(a: RawRun, b: RawRun, metric: str, outliers: bool = True) -> Paired | None:
    return pair(batch_values(a, metric), batch_values(b, metric), metric in LOG_SCALE, outliers)


def tail_levels(raw: RawRun, c: int) -> int:
    """How many levels j of class c's occupancy tail the run has."""
    j = 0
    while f"tail:{c}:{j}" in raw.ratios:
        j += 1
    return j


def paired_tail(a: RawRun, b: RawRun, c: int, floor: float) -> list[tuple[int, Paired]]:
    """Class c's occupancy tail, level by level (j >= 1), paired by batch. A level is left out where what
    it counts is rare on both runs: fewer than ``floor`` of the class's nodes hold j tasks or more, or
    fewer than ``floor`` hold fewer (a batch then sees a handful of such moments, and a t interval on
    those is no interval). A run whose tail stops early holds no node at the levels beyond its end (0 in
    every batch)."""
    out = []
    for j in range(1, max(tail_levels(a, c), tail_levels(b, c))):
        key = f"tail:{c}:{j}"
        va = batch_values(a, key) if key in a.ratios else {p: 0.0 for p in positions(a)}
        vb = batch_values(b, key) if key in b.ratios else {p: 0.0 for p in positions(b)}
        pa, pb = _pooled(a, key), _pooled(b, key)
        if max(pa, pb) < floor or min(pa, pb) > 1.0 - floor:
            continue
        p = pair(va, vb, log_scale=False)
        if p is not None:
            out.append((j, p))
    return out


def _pooled(raw: RawRun, key: str) -> float:
    if key not in raw.ratios:
        return 0.0
    num, den = raw.ratios[key]
    total = float(den.sum())
    return float(num.sum()) / total if total > 0 else 0.0


def pairs_of(raws: Sequence[RawRun]) -> int:
    """Batches the runs have in common (what a paired comparison of them can use)."""
    common = set(positions(raws[0]))
    for r in raws[1:]:
        common &= set(positions(r))
    return len(common)
