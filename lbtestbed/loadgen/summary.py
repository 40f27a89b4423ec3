"""The quantities of a load run's summary: their units, how they print, and thresholds on them.

``lbt load`` prints every key of the summary with its unit (``model s``, ``wall s``, ``wall ms``, ``tasks``,
...), and ``--threshold 'sojourn_p99<5'`` sets the exit code from them, as k6 thresholds do: a threshold
names one of ``METRICS`` (in the summary's own units), a comparison and a number. This module imports
nothing heavy, so ``lbt load`` can check its thresholds before anything starts.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: every quantity a threshold can name: (unit, meaning). The summary's numeric keys, two derived from them
#: (``incomplete``, ``incomplete_fraction``) and, with ``--locust`` only, locust's keys.
METRICS: dict[str, tuple[str, str]] = {
    "scheduled": ("tasks", "tasks the plan holds"),
    "sent": ("tasks", "scheduled minus dropped and unsent"),
    "completed": ("tasks", "answered 200"),
    "refused": ("tasks", "answered 503"),
    "lost": ("tasks", "answered 502 (the node failed)"),
    "dropped": ("tasks", "not sent: --max-outstanding tasks were open"),
    "failed": ("tasks", "no answer (connection errors, other statuses)"),
    "expired": ("tasks", "no answer within --deadline"),
    "cancelled": ("tasks", "out when Ctrl-C came"),
    "unsent": ("tasks", "not sent yet when Ctrl-C came"),
    "incomplete": ("tasks", "scheduled minus completed"),
    "incomplete_fraction": ("of scheduled", "incomplete / scheduled"),
    "rate_sent": ("tasks/wall s", "tasks sent per wall second"),
    "late_sends": ("tasks", "sends that left more than 2 ms late"),
    "lateness_p50_ms": ("wall ms", "median lateness of the sends"),
    "lateness_p99_ms": ("wall ms", "99th percentile of the lateness"),
    "lateness_max_ms": ("wall ms", "largest lateness"),
    "mean_sojourn": ("model s", "mean sojourn of the completed tasks"),
    "sojourn_p50": ("model s", "median sojourn"),
    "sojourn_p99": ("model s", "99th percentile of the sojourn"),
    "wall_seconds": ("wall s", "from time zero to the last reply"),
    "model_seconds": ("model s", "the same in model seconds"),
    "expected": ("tasks", "--locust: mean number of tasks the schedule asks for"),
    "unfinished": ("tasks", "--locust: of failed, still open at the end"),
    "locust_requests": ("requests", "--locust: locust's request count"),
    "locust_failures": ("requests", "--locust: locust's failure count"),
}
#: names that only a ``--locust`` run's summary has
LOCUST_ONLY = ("expected", "unfinished", "locust_requests", "locust_failures")
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
_THRESHOLD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Threshold:
    text: str
    metric: str
    op: str
    bound: float

    def check(self, summary: Mapping[str, Any]) -> tuple[bool, float | None]:
        """(whether the summary meets the threshold, the value it has); a missing value fails."""
        value = values(summary).get(self.metric)
        if value is None or math.isnan(value):
            return False, None
        return COMPARISONS[self.op](value, self.bound), value


def parse_threshold(text: str) -> Threshold:
    """``NAME OP NUMBER`` (OP one of < <= > >= == !=); ValueError naming what is wrong."""
    m = _THRESHOLD.match(text)
    if not m:
        raise ValueError(f"{text!r}: expected NAME OP NUMBER, e.g. 'sojourn_p99<5' (OP: < <= > >= == !=)")
    name, op, number = m.groups()
    if name not in METRICS:
        raise ValueError(f"{text!r}: unknown metric {name!r}; one of {', '.join(METRICS)}")
    try:
        bound = float(number)
    except ValueError:
        raise ValueError(f"{text!r}: {number!r} is not a number") from None
    if not math.isfinite(bound):
        raise ValueError(f"{text!r}: the bound must be a finite number")
    return Threshold(text.strip(), name, op, bound)


def values(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The summary's numbers by metric name, the derived ones included (None where there is no value)."""
    out: dict[str, float | None] = {}
    for key in METRICS:
        v = summary.get(key)
        out[key] = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    scheduled, completed = summary.get("scheduled"), summary.get("completed")
    if isinstance(scheduled, int) and isinstance(completed, int):
        out["incomplete"] = scheduled - completed
        out["incomplete_fraction"] = (scheduled - completed) / scheduled if scheduled else 0.0
    return out


def lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary as the terminal shows it: one key a line, its value and its unit."""
    out = []
    for key, value in summary.items():
        if isinstance(value, list):  # a distributed locust run's workers: a line each
            out.append(f"  {key}")
            for row in value:
                out.append("    " + ", ".join(f"{k} {_shown(v)}" for k, v in row.items()))
            continue
        shown = _shown(value)
        unit = METRICS.get(key, ("", ""))[0] if value is not None else ""
        if key == "start_epoch" and isinstance(value, float):  # model time 0 of a locust run
            shown = datetime.fromtimestamp(value, UTC).isoformat(sep=" ", timespec="milliseconds")
        out.append(f"  {key:<16} {shown} {unit}".rstrip())
    return out


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def verdicts(thresholds: list[Threshold], summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each threshold with the value it was checked on and whether it held (the JSON's ``thresholds``)."""
    out = []
    for t in thresholds:
        ok, value = t.check(summary)
        out.append({"threshold": t.text, "metric": t.metric, "value": value, "ok": ok})
    return out


def describe(verdict: Mapping[str, Any]) -> str:
    """One line for a threshold's verdict."""
    value = verdict["value"]
    unit = METRICS[verdict["metric"]][0]
    shown = "no value" if value is None else f"{verdict['metric']} = {value:.6g} {unit}"
    return f"  threshold {verdict['threshold']:<24} {'ok' if verdict['ok'] else 'FAILED'} ({shown})"


def help_text() -> str:
    """The metric names for ``--help``."""
    return ", ".join(f"{k} ({u})" for k, (u, _) in METRICS.items())
