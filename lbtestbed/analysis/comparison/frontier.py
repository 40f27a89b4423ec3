"""The frontier of messages against delay: for each message budget, the best measured policy.

A point is one policy at one setting of its message knob, measured (simulated or on a cluster): messages
per task and a delay (mean wait, or the 99th percentile of the sojourn), each with its 95% interval. The
frontier is the lower envelope of the points: at a budget of b messages per task, the point with the
lowest delay among those that send at most b (by their measured means). It is a staircase that steps down
at each point that beats every cheaper one; ``envelope`` gives its steps, each with the best point of
another policy within its budget range, so that a reader sees whether the win is clear of the intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """One point of one curve: a policy at one setting of its knob, with 95% half-widths (None when the
    measurement gives none)."""

    policy: str  # the spec's policy.name
    curve: str  # the curve it lies on: "power_of_d: JSQ(d)", or the policy's name for a policy of one point
    knob: str  # the setting on that curve, "d=2"; "" for a policy of one point
    messages: float  # state messages per task
    value: float  # the delay: lower is better
    ci95: float | None = None
    messages_ci95: float | None = None

    @property
    def name(self) -> str:
        """How a label names the point: its curve and setting."""
        return f"{self.curve} {self.knob}" if self.knob else self.curve


@dataclass(frozen=True)
class Step:
    """One step of the frontier: ``winner`` is the best point for every budget from ``start`` (its own
    messages per task) up to ``end`` (the next step's start; None for the last step, which holds on)."""

    start: float
    end: float | None
    winner: Measured
    #: the best point of any other policy that sends less than ``end``: the one the winner beats
    runner_up: Measured | None

    @property
    def clear(self) -> bool | None:
        """Whether the winner's 95% interval lies wholly below the runner-up's; None without a runner-up
        or without both intervals."""
        w, r = self.winner, self.runner_up
        if r is None or w.ci95 is None or r.ci95 is None:
            return None
        return w.value + w.ci95 < r.value - r.ci95

    def to_json(self) -> dict[str, object]:
        def point(m: Measured | None) -> dict[str, object] | None:
            if m is None:
                return None
            return {
                "policy": m.policy,
                "curve": m.curve,
                "knob": m.knob,
                "messages_per_task": m.messages,
                "value": m.value,
                "ci95": m.ci95,
            }

        return {
            "from": self.start,
            "to": self.end,
            "winner": point(self.winner),
            "runner_up": point(self.runner_up),
            "clear": self.clear,
        }


def envelope(points: Sequence[Measured]) -> list[Step]:
    """The frontier's steps, cheapest first. A point starts a step when its delay is below that of every
    point sending no more messages; of points equal in messages the lowest delay counts, and of equal
    delays the cheaper (the first step holds it)."""
    order = sorted(points, key=lambda m: (m.messages, m.value))
    winners: list[Measured] = []
    for m in order:
        if not winners or m.value < winners[-1].value:
            winners.append(m)
    steps = []
    for i, w in enumerate(winners):
        end = winners[i + 1].messages if i + 1 < len(winners) else None
        others = [m for m in points if m.policy != w.policy and (end is None or m.messages < end)]
        runner_up = min(others, key=lambda m: (m.value, m.messages), default=None)
        steps.append(Step(w.messages, end, w, runner_up))
    return steps


def describe(steps: Sequence[Step], unit: str = "") -> list[str]:
    """One line per step: the budget range, the winner with its value, and how it stands against the
    runner-up."""
    out = []
    for s in steps:
        budget = f"{s.start:.3g} to {s.end:.3g}" if s.end is not None else f"{s.start:.3g} or more"
        w = s.winner
        ci = f" ± {w.ci95:.2g}" if w.ci95 is not None else ""
        line = f"{budget} messages per task: {w.name} ({w.value:.4g}{ci}{unit})"
        r = s.runner_up
        if r is not None:
            rci = f" ± {r.ci95:.2g}" if r.ci95 is not None else ""
            verdict = {True: "clear of", False: "within the intervals of", None: "against"}[s.clear]
            line += f", {verdict} {r.name} ({r.value:.4g}{rci}{unit})"
        out.append(line)
    return out
