"""Metric-by-metric verdicts: does a measured run agree with a reference (twin, simulation, theory)?

Two runs on the same tasks (the cluster, its twin, the simulation: each with its batch data) are compared
**paired**, batch by batch (``paired``): the mean per-batch difference, or log ratio, with a t interval on
its degrees of freedom. They agree when the interval holds 0; the distance is the mean in standard
errors.

A run against a value without batch data (the theory) is compared **unpaired**: the difference of the two
estimates against the t interval of the measurement (each estimate's standard error is its half-width
over the t quantile of its own degrees of freedom; two intervals combine by the root sum of squares of
the standard errors, with Welch–Satterthwaite's degrees of freedom). An estimate without degrees of
freedom (a hand-made result) is taken as normal.

An occupancy tail is one metric made of many points: it agrees when every point does at the family-wise
95 % level (Bonferroni over the points compared, with t quantiles), and its distance is that of the worst
point. A theory value says what it is (its ``regime``, docs/theory.md, "Regimes: what each value is"): an
``exact`` or ``finite_n`` value counts, within its stated error (a bias bound added to the measurement's
interval); a ``limit`` value is compared for information, marked ``limit``, and does not decide a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lbtestbed.analysis.comparison import paired
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.regime import LIMIT, metric_regime
from lbtestbed.analysis.results.result import METRICS, Result
from lbtestbed.analysis.results.statistics import t_quantile
from lbtestbed.model.experiment import Experiment

Z95 = 1.959963984540054
#: the scalar metrics compared (the tail is handled per class)
SCALARS = tuple(m for m in METRICS if m != "occupancy_tail")
#: tail points below this fraction of nodes, or above 1 minus it, are too rare to compare
TAIL_FLOOR = 1e-3
#: mean sojourns of node time per batch at a tail level, below which the level is not held against theory
EXPOSURE = 25.0
#: relative tolerance of values compared without any interval (rounding of the same number)
EXACT = 1e-9


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a result, and its batch data where it has any (paired comparisons)."""

    result: Result
    raw: RawRun | None = None

    @property
    def name(self) -> str:
        return self.result.source


@dataclass
class Verdict:
    metric: str
    reference: str  # "twin", "simulation" or "theory"
    measured: float | None
    measured_ci95: float | None
    expected: float | None
    expected_ci95: float | None
    agrees: bool | None  # None: nothing to compare
    distance: float | None  # |difference| in standard errors
    counts: bool  # whether it decides the run's verdict
    why: str = ""
    worst_j: int | None = None  # occupancy tails: the level of the worst point
    subject: str = "cluster"  # what was measured: the cluster, or the twin (against the simulation)
    paired: bool = False
    difference: float | None = None  # measured - expected (paired: the mean of the batches' differences)
    difference_ci95: float | None = None
    relative: float | None = None  # log-scale metrics: the relative gap exp(mean log ratio) - 1
    relative_ci95: float | None = None
    df: float | None = None  # degrees of freedom of the interval that decided
    p: float | None = None  # two-sided p-value of the row (a tail's: Bonferroni over its points)
    points: int = 1  # occupancy tails: the points compared
    # a paired comparison's own p-value (its mean's and its outlier batch's tests, paired.Paired.p), and
    # the batch that stood apart when that test is what rejects
    own_p: float | None = None
    outlier_batch: int | None = None
    outlier_gap: float | None = None
    # the window positions of the batches the comparison is over (paired: those both sides have; against
    # a value without batches: the measured side's); None for a result without batch data
    batches: list[int] | None = None
    # the two sides cannot differ here by construction (the twin replays what decides the metric:
    # ``fixed_by_twin``): compared and shown, never counted
    by_construction: bool = False

    @property
    def word(self) -> str:
        if self.agrees is None:
            return "-"
        if self.agrees:
            return "agrees"
        if self.outlier_batch is not None:
            return f"disagrees (batch {self.outlier_batch} apart)"
        return f"disagrees ({self.distance:.1f} se)" if self.distance is not None else "disagrees"

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "verdict": self.word}
        for key in ("distance", "difference", "relative"):
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = None  # JSON has no infinity: values without intervals that differ
        return out


def _quantile(df: float | None, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of a t with ``df`` degrees of freedom (the normal's without)."""
    if df is None or not math.isfinite(df):
        from scipy import special  # imported here: predictions need no interval and start faster without it

        return Z95 if level == 0.95 else float(-special.ndtri((1.0 - level) / 2.0))
    return t_quantile(max(1.0, df), level)


def _se(ci95: float | None, df: float | None) -> float:
    return 0.0 if not ci95 else ci95 / _quantile(df)


def _combined(
    a_ci: float | None, a_df: float | None, b_ci: float | None, b_df: float | None
) -> tuple[float, float | None]:
    """Standard error of a difference of two independent estimates, and its Welch–Satterthwaite df."""
    sa, sb = _se(a_ci, a_df), _se(b_ci, b_df)
    se = math.hypot(sa, sb)
    if (a_df is None and sa > 0) or (b_df is None and sb > 0):
        return se, None
    parts = [(s, d) for s, d in ((sa, a_df), (sb, b_df)) if s > 0 and d]
    if not parts:
        return se, None
    df = se**4 / sum(s**4 / d for s, d in parts)
    return se, df


def _limit_metrics(theory: Result) -> set[str]:
    """The theory's metrics (and ``occupancy_tail[<class>]``) whose values are limits."""
    notes = theory.extras.get("notes", [])
    out = {m for m in SCALARS if metric_regime(theory.metrics[m], notes, m) == LIMIT}
    for cls, tail in (theory.metrics.get("occupancy_tail") or {}).items():
        name = f"occupancy_tail[{cls}]"
        if metric_regime(tail[0] if tail else {}, notes, name) == LIMIT:
            out.add(name)
    return out


def theory_tail_floor(measured: Result) -> float:
    """The rarest tail level a run can hold against a theory value: a batch must spend EXPOSURE mean
    sojourns of node time at or above it, n (duration / batches) P / W >= EXPOSURE. Below that a batch
    sees a handful of excursions at most, its mean is far from normal and the batch-means interval too
    narrow (a 20-node JSQ run of 1000 model s shows P(>= 4) = 0.0004 +- 0.0006 where the exact chain and a
    40 times longer run give 0.006); paired comparisons, whose batches see the same excursions, keep
    TAIL_FLOOR."""
    settings = measured.context.get("settings") or {}
    n, w = measured.context.get("n"), measured.metrics.get("mean_sojourn", {}).get("value")
    duration, batches = settings.get("duration"), settings.get("batches")
    if not (n and w and duration and batches):
        return TAIL_FLOOR
    return max(TAIL_FLOOR, EXPOSURE * w * batches / (n * duration))


def _error(expected: dict[str, Any]) -> float:
    """A theory value's stated error (the truncation of an exact chain, the O(1/n^2) term of a refined
    mean field): a bound on its bias, added to the measured interval rather than combined with it."""
    return float(expected.get("error") or 0.0)


# ------------------------------------------------------------------------------------------ unpaired


def compare_scalar(
    metric: str, measured: dict[str, Any], expected: dict[str, Any], reference: str, counts: bool
) -> Verdict:
    a, a_ci, a_df = measured.get("value"), measured.get("ci95"), measured.get("df")
    b, b_ci, b_df = expected.get("value"), expected.get("ci95"), expected.get("df")
    v = Verdict(metric, reference, a, a_ci, b, b_ci, None, None, counts)
    if a is None or b is None:
        v.counts = False
        v.why = "not measured" if a is None else f"no {reference} value"
        return v
    v.difference = a - b
    se, df = _combined(a_ci, a_df, b_ci, b_df)
    error = _error(expected)
    diff = max(0.0, abs(a - b) - error)  # what the stated error of the expected value does not explain
    if error:
        v.why = f"within the theory's stated error +-{error:.2g}"
    if se == 0.0:
        v.agrees = diff <= EXACT * max(1.0, abs(b))
        v.distance = 0.0 if v.agrees else math.inf
        v.why = "; ".join(w for w in ("no interval: compared exactly", v.why) if w)
        return v
    v.df = df
    # one side without an interval (a theory value): the other's interval as it is
    half = (a_ci or 0.0) if not b_ci else (b_ci if not a_ci else _quantile(df) * se)
    v.difference_ci95 = half + error
    v.distance = diff / se
    v.agrees = diff <= half
    return v


def compare_tail(
    name: str,
    measured: list[dict[str, Any]],
    expected: list[dict[str, Any]],
    reference: str,
    counts: bool,
    floor: float = TAIL_FLOOR,
) -> Verdict:
    # a tail that stops early holds no node at the levels beyond its end: compare those as zero (an empty
    # tail is no tail: nothing to compare)
    beyond: dict[str, Any] = {"value": 0.0, "ci95": 0.0}
    points = []
    for j in range(1, max(len(measured), len(expected)) if measured and expected else 0):
        a = measured[j] if j < len(measured) else beyond
        b = expected[j] if j < len(expected) else beyond
        if a.get("value") is None or b.get("value") is None:
            continue
        if max(a["value"], b["value"]) < floor or min(a["value"], b["value"]) > 1.0 - TAIL_FLOOR:
            continue  # rare on both sides, above or below the level: too few moments to compare
        se, df = _combined(a.get("ci95"), a.get("df"), b.get("ci95"), b.get("df"))
        points.append((j, a["value"], b["value"], se, df, _error(b)))
    v = Verdict(f"occupancy_tail[{name}]", reference, None, None, None, None, None, None, counts)
    if not points:
        v.counts = False
        v.why = "no tail point to compare"
        return v
    m = len(points)
    level = 1.0 - 0.05 / m

    def distance(p: tuple[int, float, float, float, float | None, float]) -> float:
        diff = max(0.0, abs(p[1] - p[2]) - p[5])
        if p[3] > 0:
            return diff / p[3]
        return 0.0 if diff <= EXACT * max(1.0, abs(p[2])) else math.inf  # no interval: compared exactly

    # each point against its own family-wise quantile (its degrees of freedom); the worst decides
    def excess(p: tuple[int, float, float, float, float | None, float]) -> float:
        return distance(p) / _quantile(p[4], level)

    worst = max(points, key=excess)
    j, a, b, _, df, _ = worst
    z = _quantile(df, level)
    v.measured, v.expected = a, b
    v.measured_ci95 = (measured[j] if j < len(measured) else beyond).get("ci95")
    v.expected_ci95 = (expected[j] if j < len(expected) else beyond).get("ci95")
    v.difference = a - b
    v.distance = distance(worst)
    v.agrees = v.distance <= z
    v.worst_j = j
    v.df = df
    v.points = m
    v.why = f"{m} points, family-wise 95% (|t| <= {z:.2f}); worst at >= {j} tasks"
    return v


# -------------------------------------------------------------------------------------------- paired


def compare_paired_scalar(
    metric: str, measured: Side, expected: Side, counts: bool, subject: str = "cluster", outliers: bool = True
) -> Verdict:
    """``metric`` of two runs on the same tasks, batch by batch (``outliers``: batches alike in law, so
    that one that stands apart is looked for: ``paired``)."""
    a, b = measured.result.metrics[metric], expected.result.metrics[metric]
    v = Verdict(
        metric,
        expected.name,
        a.get("value"),
        a.get("ci95"),
        b.get("value"),
        b.get("ci95"),
        None,
        None,
        counts,
    )
    v.subject, v.paired = subject, True
    assert measured.raw is not None and expected.raw is not None
    p = paired.paired_metric(measured.raw, expected.raw, metric, outliers)
    if v.measured is None or v.expected is None or p is None:
        v.counts = False
        v.why = "not measured" if v.measured is None else f"no {expected.name} value"
        return v
    if p.se is None:
        v.counts = False
        v.why = f"{p.pairs} paired batch: no interval"
        return v
    _fill_paired(v, p)
    v.batches = list(p.common)
    v.distance = p.distance()
    large = p.outlier_large(v.expected)
    v.own_p = p.p(outlier=large)
    v.agrees = v.own_p is None or v.own_p > 0.05
    v.why = f"paired over {p.pairs} batches ({p.scale.replace('_', ' ')})"
    if p.outlier is not None:
        gap = _batch_gap(p.scale, p.outlier_gap)
        small = "" if large else f", below the {100 * paired.BATCH_GAP:g} % that counts"
        v.why += f"; batch {p.outlier} furthest apart ({gap}, Grubbs p = {p.outlier_p:.2g}{small})"
        if large and p.outlier_decides():
            v.outlier_batch, v.outlier_gap = p.outlier, p.outlier_gap
    return v


def _batch_gap(scale: str, gap: float) -> str:
    """One batch's gap in words: relative on the log scale, else the difference."""
    return f"{100 * math.expm1(gap):+.2g}%" if scale == "log_ratio" else f"{gap:+.3g}"


def _fill_paired(v: Verdict, p: paired.Paired) -> None:
    v.df = p.df
    rel = p.relative()
    if rel is not None:
        v.relative, v.relative_ci95 = rel
        # on the log scale the gap in the metric's unit is the relative gap times the reference
        v.difference = rel[0] * (v.expected or 0.0)
        v.difference_ci95 = None if rel[1] is None else rel[1] * abs(v.expected or 0.0)
    else:
        v.difference, v.difference_ci95 = p.mean, p.ci95


def compare_paired_tail(
    c: int, name: str, measured: Side, expected: Side, counts: bool, subject: str = "cluster"
) -> Verdict:
    assert measured.raw is not None and expected.raw is not None
    points = paired.paired_tail(measured.raw, expected.raw, c, TAIL_FLOOR)
    points = [(j, p) for j, p in points if p.se is not None]
    v = Verdict(f"occupancy_tail[{name}]", expected.name, None, None, None, None, None, None, counts)
    v.subject, v.paired = subject, True
    if not points:
        v.counts = False
        v.why = "no tail point to compare"
        return v
    m = len(points)
    z = _quantile(points[0][1].df, 1.0 - 0.05 / m)  # Bonferroni over the points
    j, worst = max(points, key=lambda jp: jp[1].distance())
    ma = measured.result.metrics["occupancy_tail"].get(name) or []
    mb = expected.result.metrics["occupancy_tail"].get(name) or []
    beyond = {"value": 0.0, "ci95": 0.0}
    pa = ma[j] if j < len(ma) else beyond
    pb = mb[j] if j < len(mb) else beyond
    v.measured, v.measured_ci95 = pa.get("value"), pa.get("ci95")
    v.expected, v.expected_ci95 = pb.get("value"), pb.get("ci95")
    _fill_paired(v, worst)
    v.batches = list(worst.common)
    v.distance = worst.distance()
    v.agrees = v.distance <= z
    v.worst_j = j
    v.points = m
    v.why = f"paired, {m} points, family-wise 95% (|t| <= {z:.2f}); worst at >= {j} tasks"
    return v


# --------------------------------------------------------------------------------------------- whole


#: the settings two results must share to be compared: how many dispatchers ran, how they were fed and
#: what each saw (a system with other dispatchers is another system)
SAME_SYSTEM = ("dispatchers", "split", "view")


def check_comparable(a: Result, b: Result) -> None:
    """Refuse (ValueError, one line) to compare results of systems with different dispatchers."""
    sa, sb = a.context.get("settings") or {}, b.context.get("settings") or {}
    for key in SAME_SYSTEM:
        if key in sa and key in sb and sa[key] != sb[key]:
            raise ValueError(
                f"cannot compare {a.source} with {b.source}: policy.{key} is {sa[key]!r} in one and "
                f"{sb[key]!r} in the other"
            )


#: the sojourn metrics: on pool nodes the twin's equal the cluster's task by task
SOJOURNS = ("mean_sojourn", "sojourn_p50", "sojourn_p99")


def fixed_by_twin(exp: Experiment, cluster: RawRun | None, twin: RawRun | None) -> dict[str, str]:
    """The metrics on which the cluster and its twin cannot disagree by the twin's construction, and why.

    On pool nodes (infinite servers) a task is served the moment it arrives, for its own work over its
    node's speed, whatever else the node holds. The twin places every completed task at its node when the
    cluster did (its measured legs) and hands its answer to the client after the cluster's measured
    delay, so its sojourn is the cluster's, task by task (``analysis/simulator/twin.py``; up to a leg the
    twin takes as 0 where two clock readings made it a hair negative): the sojourn's mean and quantiles
    are the cluster's own measurements replayed, not a test of the emulation. That holds when every class
    is a pool and the two runs hold the same tasks in every batch (a task the cluster did not complete is
    one the twin serves with median delays: then they may differ). Under FCFS and PS a task's sojourn
    depends on the others at its node, so the twin can differ there and those rows decide."""
    if not exp.classes or any(c.discipline != "pool" for c in exp.classes):
        return {}
    if cluster is None or twin is None:
        return {}
    counts_c = dict(zip(cluster.positions(), map(len, cluster.sojourns), strict=True))
    counts_t = dict(zip(twin.positions(), map(len, twin.sojourns), strict=True))
    if any(counts_t.get(b) != n for b, n in counts_c.items()):
        return {}
    why = "equal by construction on pool nodes: the twin's sojourn is the task's own service plus its legs"
    return dict.fromkeys(SOJOURNS, why)


def compare(
    measured: Side,
    expected: Side,
    counts: bool = True,
    alike: bool = True,
    fixed: Mapping[str, str] | None = None,
) -> list[Verdict]:
    """Verdicts of ``measured`` against ``expected``, metric by metric in table order: paired when both
    carry batch data of the same window, unpaired otherwise (limit predictions never count). ``alike``:
    the batches are alike in law (constant speeds), so a paired comparison also looks for one that stands
    apart. ``fixed``: metrics on which the two cannot disagree by construction (``fixed_by_twin``), and
    why: compared and shown, not counted."""
    check_comparable(measured.result, expected.result)
    subject = measured.name
    out: list[Verdict] = []
    is_paired = (
        measured.raw is not None
        and expected.raw is not None
        and paired.pairs_of([measured.raw, expected.raw]) >= 2
    )
    limits = _limit_metrics(expected.result) if expected.name == "theory" else set()
    unpaired_batches = measured.raw.positions() if measured.raw is not None else None
    for metric in SCALARS:
        counted = counts and metric not in limits
        if is_paired:
            v = compare_paired_scalar(metric, measured, expected, counted, subject, alike)
        else:
            v = compare_scalar(
                metric,
                measured.result.metrics[metric],
                expected.result.metrics[metric],
                expected.name,
                counted,
            )
            v.subject = subject
            v.batches = unpaired_batches
        if fixed and metric in fixed:
            v.counts, v.by_construction = False, True
            v.why = "; ".join(w for w in (fixed[metric], v.why) if w)
        if metric in limits:
            v.why = "limit prediction (n -> infinity): for information"
            gap = expected.result.metrics[metric].get("gap")
            if gap:
                v.why += f"; finite-n gap {gap['kind']} {gap['value']:+.3g} ({gap['how']})"
        out.append(v)
    tails = expected.result.metrics["occupancy_tail"] or {}
    names = list(measured.result.metrics["occupancy_tail"] or {})
    for c, name in enumerate(names):
        if name not in tails:
            continue
        limit = f"occupancy_tail[{name}]" in limits
        if is_paired:
            v = compare_paired_tail(c, name, measured, expected, counts and not limit, subject)
        else:
            measured_tail = measured.result.metrics["occupancy_tail"][name]
            floor = theory_tail_floor(measured.result) if expected.name == "theory" else TAIL_FLOOR
            v = compare_tail(name, measured_tail, tails[name], expected.name, counts and not limit, floor)
            v.subject = subject
            v.batches = unpaired_batches
        if limit:
            v.why += "; limit prediction: for information"
        out.append(v)
    return out


def p_value(v: Verdict) -> float | None:
    """The row's two-sided p-value: a paired scalar's own (its mean's and its outlier batch's tests), else
    from its distance and degrees of freedom (a tail's worst point, times the number of its points:
    Bonferroni within the tail)."""
    if v.own_p is not None:
        return v.own_p
    if v.agrees is None or v.distance is None:
        return None
    if math.isinf(v.distance):
        return 0.0
    from scipy import special

    d = v.distance
    one = float(special.stdtr(v.df, -d)) if v.df and math.isfinite(v.df) else float(special.ndtr(-d))
    return min(1.0, 2.0 * one * v.points)


def holm(verdicts: Sequence[Verdict], level: float = 0.05) -> None:
    """Decide the verdicts that count as one family at the family-wise ``level`` (Holm's step-down
    Bonferroni): each keeps its distance and interval, and ``agrees`` becomes whether the family's test
    keeps it. A run of m comparisons that are each right 95 % of the time would otherwise disagree
    somewhere far more often than 5 % of the time."""
    rows = [(p_value(v), v) for v in verdicts if v.counts and v.agrees is not None]
    rows.sort(key=lambda pv: pv[0] if pv[0] is not None else 1.0)
    m = len(rows)
    rejecting = True
    for i, (p, v) in enumerate(rows):
        v.p = p
        rejecting = rejecting and p is not None and p <= level / (m - i)
        v.agrees = not rejecting
        if m > 1:
            v.why = (v.why + "; " if v.why else "") + f"family-wise over {m} comparisons (Holm)"


def run_agrees(verdicts: Sequence[Verdict]) -> bool:
    """The run agrees when some verdict counts and none that counts disagrees."""
    counted = [v for v in verdicts if v.counts and v.agrees is not None]
    return bool(counted) and all(v.agrees for v in counted)
