"""Metric-by-metric verdicts: does the measured cluster agree with the simulator and with the theory?

Two estimates agree when their difference lies within the combined 95% interval, the root sum of squares of
the two half-widths (a theory value has none: its interval is the measurement's alone). The distance is the
difference in combined standard errors (half-width / 1.96). An occupancy tail is one metric made of many
points: it agrees when every point does at the family-wise 95% level (Bonferroni over the points compared),
and its distance is that of the worst point.

The cluster and the simulator see the same tasks (same seed), so their difference is smaller than that of
two independent runs and the combined interval is conservative. Theory values that hold only in a limit
(many nodes, heavy traffic: the prediction's notes say so) are compared for information and marked
``limit``; they do not decide the verdict of the run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lbtestbed.analysis.results.result import METRICS, Result

Z95 = 1.959963984540054
#: the scalar metrics compared (the tail is handled per class)
SCALARS = tuple(m for m in METRICS if m != "occupancy_tail")
#: tail points below this fraction of nodes are too rare to compare
TAIL_FLOOR = 1e-3
#: relative tolerance of values compared without any interval (rounding of the same number)
EXACT = 1e-9
LIMIT_WORDS = ("infinity", "large n", "mean-field", "mean field", "heavy traffic", "halfin")


@dataclass
class Verdict:
    metric: str
    reference: str  # "simulation" or "theory"
    measured: float | None
    measured_ci95: float | None
    expected: float | None
    expected_ci95: float | None
    agrees: bool | None  # None: nothing to compare
    distance: float | None  # |difference| in combined standard errors
    counts: bool  # whether it decides the run's verdict
    why: str = ""
    worst_j: int | None = None  # occupancy tails: the level of the worst point

    @property
    def word(self) -> str:
        if self.agrees is None:
            return "-"
        if self.agrees:
            return "agrees"
        return f"disagrees ({self.distance:.1f} se)" if self.distance is not None else "disagrees"

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "verdict": self.word}
        if out["distance"] is not None and not math.isfinite(out["distance"]):
            out["distance"] = None  # JSON has no infinity: values without intervals that differ
        return out


def _bonferroni_z(m: int) -> float:
    from scipy import special  # only needed when there is a tail to compare

    return float(-special.ndtri(0.025 / max(m, 1)))


def _limit_metrics(theory: Result) -> set[str]:
    notes = theory.extras.get("notes", [])
    out = set()
    for note in notes:
        assumes = " ".join(note.get("assumes", [])).lower()
        if any(w in assumes for w in LIMIT_WORDS):
            out.add(note.get("metric", ""))
    return out


def compare_scalar(
    metric: str, measured: dict[str, Any], expected: dict[str, Any], reference: str, counts: bool
) -> Verdict:
    a, a_ci = measured.get("value"), measured.get("ci95")
    b, b_ci = expected.get("value"), expected.get("ci95")
    v = Verdict(metric, reference, a, a_ci, b, b_ci, None, None, counts)
    if a is None or b is None:
        v.counts = False
        v.why = "not measured" if a is None else f"no {reference} value"
        return v
    half = math.hypot(a_ci or 0.0, b_ci or 0.0)
    diff = abs(a - b)
    if half == 0.0:
        v.agrees = diff <= EXACT * max(1.0, abs(b))
        v.distance = 0.0 if v.agrees else math.inf
        v.why = "no interval: compared exactly"
        return v
    v.distance = diff / (half / Z95)
    v.agrees = diff <= half
    return v


def compare_tail(
    name: str, measured: list[dict[str, Any]], expected: list[dict[str, Any]], reference: str, counts: bool
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
        if max(a["value"], b["value"]) < TAIL_FLOOR:
            continue
        half = math.hypot(a.get("ci95") or 0.0, b.get("ci95") or 0.0)
        points.append((j, a["value"], b["value"], half))
    v = Verdict(f"occupancy_tail[{name}]", reference, None, None, None, None, None, None, counts)
    if not points:
        v.counts = False
        v.why = "no tail point to compare"
        return v
    z = _bonferroni_z(len(points))

    def distance(p: tuple[int, float, float, float]) -> float:
        diff = abs(p[1] - p[2])
        if p[3] > 0:
            return diff / (p[3] / Z95)
        return 0.0 if diff <= EXACT * max(1.0, abs(p[2])) else math.inf  # no interval: compared exactly

    worst = max(points, key=distance)
    j, a, b, _ = worst
    v.measured, v.expected = a, b
    v.measured_ci95 = (measured[j] if j < len(measured) else beyond).get("ci95")
    v.expected_ci95 = (expected[j] if j < len(expected) else beyond).get("ci95")
    v.distance = distance(worst)
    v.agrees = v.distance <= z
    v.worst_j = j
    v.why = f"{len(points)} points, family-wise 95% (z <= {z:.2f}); worst at >= {j} tasks"
    return v


def compare(cluster: Result, simulation: Result | None, theory: Result | None) -> list[Verdict]:
    """Verdicts of the cluster against each reference, metric by metric, in table order."""
    out: list[Verdict] = []
    refs: list[tuple[str, Result, set[str]]] = []
    if simulation is not None:
        refs.append(("simulation", simulation, set()))
    if theory is not None:
        refs.append(("theory", theory, _limit_metrics(theory)))
    for reference, result, limits in refs:
        for metric in SCALARS:
            v = compare_scalar(
                metric, cluster.metrics[metric], result.metrics[metric], reference, metric not in limits
            )
            if metric in limits:
                v.why = "limit prediction (n -> infinity): for information"
            out.append(v)
        tails = result.metrics["occupancy_tail"] or {}
        for name, measured in (cluster.metrics["occupancy_tail"] or {}).items():
            if name in tails:
                limit = f"occupancy_tail[{name}]" in limits
                v = compare_tail(name, measured, tails[name], reference, not limit)
                if limit:
                    v.why += "; limit prediction: for information"
                out.append(v)
    return out


def run_agrees(verdicts: list[Verdict]) -> bool:
    """The run agrees when some verdict counts and none that counts disagrees."""
    counted = [v for v in verdicts if v.counts and v.agrees is not None]
    return bool(counted) and all(v.agrees for v in counted)
