"""The result ``lbt predict`` builds: each metric's value, what it is (its regime), and the note that
justifies or withholds it (docs/theory.md, "What `lbt predict` returns" and "Regimes: what each value is").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lbtestbed.analysis.results.regime import EXACT, FINITE_N, LIMIT, regime_of
from lbtestbed.analysis.results.result import METRICS, Result
from lbtestbed.model.experiment import Experiment

THEORY = "docs/theory.md"
#: the keys that describe a metric's value (replaced with it)
VALUE_KEYS = ("regime", "error", "error_order", "limit", "gap")


class Prediction:
    """Collects metric values and the note that justifies or withholds each.

    A value's regime is given where it is set, or follows from its note's ``assumes`` when the result is
    built (``regime_of``), so that every value carries one whatever produced it. A finite-n value that
    replaces a limit keeps the limit beside it; a limit value can carry its estimated finite-n gap."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.metrics: dict[str, Any] = {k: {"value": None, "ci95": None} for k in METRICS}
        self.metrics["occupancy_tail"] = {c.name: None for c in exp.classes}
        self.notes: list[dict[str, Any]] = []
        self.bounds: dict[str, Any] = {}
        self.warnings: list[str] = []

    def _note(self, metric: str) -> dict[str, Any] | None:
        return next((n for n in self.notes if n["metric"] == metric), None)

    def set(
        self,
        metric: str,
        value: float,
        formula: str,
        source: str,
        assumes: Sequence[str] = (),
        regime: str | None = None,
    ) -> None:
        """Predict a metric; a later, more specific formula replaces an earlier one."""
        m = self.metrics[metric]
        for key in VALUE_KEYS:
            m.pop(key, None)  # what described the value this one replaces
        m["value"] = float(value)
        if regime is not None:
            m["regime"] = regime
        self.notes = [n for n in self.notes if n["metric"] != metric]
        self.notes.append({"metric": metric, "formula": formula, "source": source, "assumes": list(assumes)})

    def tail(
        self,
        cls: str,
        tail: Sequence[float],
        formula: str,
        source: str,
        assumes: Sequence[str] = (),
        regime: str | None = None,
        errors: Sequence[float] | None = None,
    ) -> None:
        points: list[dict[str, Any]] = [{"value": float(p), "ci95": None} for p in tail]
        for j, point in enumerate(points):
            if regime is not None:
                point["regime"] = regime
            if errors is not None and j < len(errors):
                point["error"] = float(errors[j])
        self.metrics["occupancy_tail"][cls] = points
        name = f"occupancy_tail[{cls}]"
        self.notes = [n for n in self.notes if n["metric"] != name]
        self.notes.append({"metric": name, "formula": formula, "source": source, "assumes": list(assumes)})

    def finite(
        self,
        metric: str,
        value: float,
        formula: str,
        source: str,
        regime: str,
        error: float | None,
        assumes: Sequence[str] = (),
    ) -> None:
        """A value at the spec's n (``exact`` or ``finite_n``) in place of a limit, which stays beside it
        (``limit`` in the metric, the limit's formula in the note)."""
        assert regime in (EXACT, FINITE_N)
        limit, note = self.metrics[metric].get("value"), self._note(metric)
        self.set(metric, value, formula, source, assumes, regime)
        new = self.metrics[metric]
        if error is not None:
            new["error"] = float(error)
        if regime == FINITE_N:
            new["error_order"] = "O(1/n^2)"
        if limit is not None and note is not None and "formula" in note:
            new["limit"] = limit
            self.notes[-1]["limit"] = {k: note[k] for k in ("formula", "source", "assumes")}

    def approximate(
        self, metric: str, value: float, formula: str, source: str, assumes: Sequence[str]
    ) -> None:
        """A value at the spec's n from a model without a proved error bound, in place of a limit, which
        stays beside it as in ``finite``. Its regime is ``limit``: shown, never counted in a verdict."""
        limit, note = self.metrics[metric].get("value"), self._note(metric)
        self.set(metric, value, formula, source, assumes, LIMIT)
        if limit is not None and note is not None and "formula" in note:
            self.metrics[metric]["limit"] = limit
            self.notes[-1]["limit"] = {k: note[k] for k in ("formula", "source", "assumes")}

    def finite_tail(
        self,
        cls: str,
        tail: Sequence[float],
        errors: Sequence[float] | None,
        formula: str,
        source: str,
        regime: str,
        assumes: Sequence[str] = (),
    ) -> None:
        name = f"occupancy_tail[{cls}]"
        note = self._note(name)
        self.tail(cls, tail, formula, source, assumes, regime, errors)
        if note is not None and "formula" in note:
            self.notes[-1]["limit"] = {k: note[k] for k in ("formula", "source", "assumes")}

    def gap(self, metric: str, value: float, kind: str, how: str) -> None:
        """The estimated finite-n gap of a limit value: value at this n minus the limit, ``kind`` one of
        "estimate", "at least", "at most" (a bound on the gap)."""
        self.metrics[metric]["gap"] = {"value": float(value), "kind": kind, "how": how}

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def null_many(self, metrics: Sequence[str], reason: str) -> None:
        for metric in metrics:
            self.null(metric, reason)

    def null(self, metric: str, reason: str) -> None:
        if not any(n["metric"] == metric for n in self.notes):
            self.notes.append({"metric": metric, "null": reason})

    def _why_null(self, metric: str) -> str:
        exp = self.exp
        discs = {c.discipline for c in exp.classes}
        if metric == "utility":
            if discs != {"pool"}:
                return "utility is defined for pools"
            return (
                "some class has no utility"
                if any(c.utility is None for c in exp.classes)
                else (f"no formula for the utility of {exp.policy.name} in the papers; the bounds still hold")
            )
        if metric == "slta_r":
            return "only slta learns r"
        if metric == "wait_probability" and "fcfs" not in discs:
            return "only fcfs nodes make tasks wait (ps shares, pools serve all at once)"
        if metric in ("idle_capacity", "idle_nodes") and "pool" in discs:
            return "pools have no capacity to leave idle"
        if metric in ("sojourn_p50", "sojourn_p99") and "ps" in discs:
            return "no closed form for the sojourn-time distribution on ps nodes"
        return f"no formula in {THEORY} covers {metric} for {exp.policy.name} on this spec"

    def _label(self) -> None:
        """Every value gets its regime: the one it was set with, else its note's (``regime_of``)."""
        by_metric = {n["metric"]: n for n in self.notes if "assumes" in n}
        for metric in METRICS:
            if metric == "occupancy_tail":
                for cls, tail in self.metrics[metric].items():
                    note = by_metric.get(f"occupancy_tail[{cls}]")
                    for point in tail:
                        point.setdefault("regime", regime_of(note["assumes"]) if note else EXACT)
                continue
            m = self.metrics[metric]
            if m["value"] is not None:
                note = by_metric.get(metric)
                m.setdefault("regime", regime_of(note["assumes"]) if note else EXACT)
        for note in self.notes:
            if "assumes" in note:
                name = note["metric"]
                if name.startswith("occupancy_tail["):
                    tail = self.metrics["occupancy_tail"].get(name[len("occupancy_tail[") : -1]) or []
                    note["regime"] = tail[0]["regime"] if tail else regime_of(note["assumes"])
                elif name in self.metrics:
                    note["regime"] = self.metrics[name].get("regime", regime_of(note["assumes"]))

    def result(self) -> Result:
        exp = self.exp
        for metric in METRICS:
            value = self.metrics[metric]
            empty = (
                all(v is None for v in value.values())
                if metric == "occupancy_tail"
                else value["value"] is None
            )
            if empty:
                self.null(metric, self._why_null(metric))
        for name, tail in self.metrics["occupancy_tail"].items():
            if tail is None:
                self.metrics["occupancy_tail"][name] = []
        self._label()
        context = {
            "spec": exp.source,
            "n": exp.n,
            "load": exp.workload.load,
            "arrival_rate": exp.workload.arrival_rate,
        }
        extras: dict[str, Any] = {"bounds": self.bounds, "notes": self.notes}
        if self.warnings:
            extras["warnings"] = self.warnings
        return Result(exp.name, exp.policy.name, "theory", self.metrics, context, extras)


__all__ = ["LIMIT", "Prediction"]
