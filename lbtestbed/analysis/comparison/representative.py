"""Is a run representative of the model? The emulation's net cost held against the spec's tolerance.

A run answers two questions (docs/run.md, "Two answers"). *Faithful*: the cluster agrees with its twin, the
simulation of the system that actually ran with the delays it measured (``compare``). *Representative*:
those delays moved the policy's numbers by less than the user cares about. The second is the twin against
the zero-delay simulation, paired batch by batch, on the numbers a user reads a policy by (the mean and the
99th percentile of the sojourn, the utility, the wait probability, the messages per task): the run is
representative when every one of them, with its whole 95 % interval, lies within ``run.tolerance`` of the
model (relative, or in probability points for the wait probability). A cost whose interval reaches past the
tolerance is not shown to be small enough, so the run is not called representative: the interval, not the
point estimate, decides, and a longer run can only help.

The emulation's delays are wall times: at a time scale s a delay of w wall seconds is w / s model seconds,
so, for the same machine, a cost shrinks in proportion to s; its interval is the run's length (about
1/sqrt of the measured window). A run that is not representative says what would be:

* where a cost's interval alone is wider than the tolerance, the run is too short to show any cost small
  enough, whatever the time scale: it names how many times longer a run (``run.duration``) would narrow
  the widest interval to half the tolerance, (interval / (tolerance / 2))^2 rounded up to the 1-2-5 grid;
* and the time scale at which each cost's point estimate, shrunk in proportion, fits beside its interval
  (that of the longer run where one is named): s |cost| / (tolerance - interval), the largest over the
  costs beyond, rounded up on the 1-2-5 grid: an estimate that errs on the safe side, since a slower run
  also loads the machine less (and its paths part less, which narrows the interval too). None when the
  run's own time scale is enough.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lbtestbed.analysis.comparison.compare import Verdict

#: the numbers a policy is read by: what the emulation's delays must not move beyond the tolerance
METRICS = ("mean_sojourn", "sojourn_p99", "utility", "wait_probability", "messages_per_task")
#: metrics whose cost is in probability points (a difference of probabilities), not relative
ABSOLUTE = frozenset({"wait_probability"})
#: the verdicts that are net costs: the twin (what ran) against the simulation (the model)
NET_COST = ("twin", "simulation")
#: the time scales suggested: 1-2-5 steps
GRID = tuple(m * 10.0**e for e in range(-5, 4) for m in (1.0, 2.0, 5.0))


@dataclass(frozen=True)
class Cost:
    """One metric's net cost: the twin against the zero-delay simulation."""

    metric: str
    # relative (exp(mean log ratio) - 1, or the difference over the model's value), or probability points
    cost: float
    ci95: float | None
    absolute: bool  # in probability points rather than relative

    @property
    def bound(self) -> float:
        """The largest cost its 95 % interval allows."""
        return abs(self.cost) + (self.ci95 or 0.0)

    def text(self) -> str:
        """``metric +2.1 % ± 0.6 %``; an interval of zero width (every batch the same) says so."""
        if self.ci95 == 0:
            return f"{self.metric} {self._fmt(self.cost)} (all batches)"
        ci = "" if self.ci95 is None else f" ± {self._fmt(self.ci95, sign=False)}"
        return f"{self.metric} {self._fmt(self.cost)}{ci}"

    def _fmt(self, x: float, sign: bool = True) -> str:
        if self.absolute:
            return f"{x:+.3g}" if sign else f"{x:.2g}"
        return f"{100 * x:+.2g} %" if sign else f"{100 * x:.2g} %"


@dataclass(frozen=True)
class Representative:
    """The second answer of a run (module docstring)."""

    tolerance: float | None  # None: the user turned the check off
    costs: tuple[Cost, ...]
    time_scale: float  # the run's

    @property
    def judged(self) -> bool:
        return self.tolerance is not None and bool(self.costs)

    @property
    def holds(self) -> bool | None:
        """True or False when judged, None when not (no twin or no simulation, or the check is off)."""
        if not self.judged:
            return None
        assert self.tolerance is not None
        return all(c.bound <= self.tolerance for c in self.costs)

    @property
    def worst(self) -> Cost | None:
        return max(self.costs, key=lambda c: c.bound, default=None)

    def _beyond(self) -> list[Cost]:
        """The costs whose interval reaches past the tolerance (none unless judged)."""
        if self.holds is not False or self.tolerance is None:
            return []
        return [c for c in self.costs if c.bound > self.tolerance]

    def suggested_duration_factor(self) -> float | None:
        """How many times longer a run would narrow the widest interval to half the tolerance, when some
        interval alone is at least the tolerance (module docstring); else None."""
        tol = self.tolerance
        widest = max((c.ci95 or 0.0 for c in self._beyond()), default=0.0)
        if tol is None or widest < tol:
            return None
        return _on_grid((widest / (tol / 2)) ** 2)

    def suggested_time_scale(self) -> float | None:
        """The time scale at which every cost beyond would fit the tolerance beside its interval (that of
        the longer run ``suggested_duration_factor`` names, if any); None when it fits already, the check
        is off, or this run's time scale is enough (module docstring)."""
        beyond, tol = self._beyond(), self.tolerance
        if not beyond or tol is None:
            return None
        longer = self.suggested_duration_factor()
        need = 0.0
        for c in beyond:
            ci = c.ci95 or 0.0
            if longer is not None:
                ci /= math.sqrt(longer)
            need = max(need, self.time_scale * abs(c.cost) / (tol - ci))
        return None if need <= self.time_scale else _on_grid(need)

    def line(self) -> str | None:
        """The headline's second sentence, or None when not judged."""
        holds, worst = self.holds, self.worst
        if holds is None or worst is None:
            return None
        tol = f"±{100 * (self.tolerance or 0.0):.3g} %"
        if holds:
            return f"REPRESENTATIVE: every net cost within {tol} (run.tolerance; largest {worst.text()})"
        what = ", ".join(c.text() for c in sorted(self._beyond(), key=lambda c: -c.bound))
        longer, scale = self.suggested_duration_factor(), self.suggested_time_scale()
        would = []
        if longer is not None:
            would.append(f"a run {longer:g} times longer (run.duration) would narrow the interval")
        if scale is not None:
            would.append(f"time_scale {scale:g} would be (this run: {self.time_scale:g})")
        return (
            f"NOT REPRESENTATIVE: the emulation's own delays cost {what}, beyond {tol} (run.tolerance); "
            f"the measured costs say {' and '.join(would)}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tolerance": self.tolerance,
            "holds": self.holds,
            "costs": [{**asdict(c), "bound": c.bound} for c in self.costs],
            "suggested_time_scale": self.suggested_time_scale(),
            "suggested_duration_factor": self.suggested_duration_factor(),
        }


def _on_grid(x: float) -> float:
    """``x`` rounded up to the 1-2-5 grid (its largest step beyond)."""
    return next((s for s in GRID if s >= x * (1 - 1e-12)), GRID[-1])


def net_costs(verdicts: Sequence[Verdict]) -> tuple[Cost, ...]:
    """The net cost of each metric of METRICS from the twin-against-simulation verdicts (paired)."""
    out = []
    for metric in METRICS:
        found = (v for v in verdicts if v.metric == metric and (v.subject, v.reference) == NET_COST)
        v = next(found, None)
        if v is None or v.agrees is None or v.difference is None:
            continue
        if v.relative is not None:
            out.append(Cost(metric, v.relative, v.relative_ci95, False))
        elif metric in ABSOLUTE:
            out.append(Cost(metric, v.difference, v.difference_ci95, True))
        elif v.expected:
            scale = abs(v.expected)
            ci = None if v.difference_ci95 is None else v.difference_ci95 / scale
            out.append(Cost(metric, v.difference / scale, ci, False))
    return tuple(c for c in out if math.isfinite(c.cost))


def judge(verdicts: Sequence[Verdict], tolerance: float | None, time_scale: float) -> Representative:
    """The run's second answer from its verdicts (``tolerance`` None: the check is off)."""
    return Representative(tolerance, net_costs(verdicts), time_scale)
