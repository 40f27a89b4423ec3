"""Rate schedules: steps and linear ramps of the arrival rate, as an exact non-homogeneous Poisson process.

A schedule is a list of segments over model time; each gives a *multiplier* of the spec's arrival rate,
constant (a step) or changing linearly (a ramp). The text form (docs/load.md)::

    20@1, 30@1->3, 50@3, 20@0.5     # 20 model s at the spec's rate, a ramp to 3x over 30 s, 50 s at 3x, ...

Arrivals are the spec's own homogeneous Poisson arrival times S_1 < S_2 < ... (rate lambda, seeded) put
through the inverse of the cumulative multiplier M(t) = integral of m over [0, t]: T_i = M^-1(S_i). This
time change is exact (no thinning, no per-step rounding): the T_i are a Poisson process of intensity
lambda * m(t). Work sizes are the spec's size stream in order, so a schedule changes when tasks come, never
which tasks come, and a schedule of one segment at 1 gives exactly the spec's workload.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

from lbtestbed.model.experiment import Experiment
from lbtestbed.model.workload import PoissonWorkload

_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_SEGMENT = re.compile(rf"^({_NUMBER})@({_NUMBER})(?:->({_NUMBER}))?$")


class ScheduleError(ValueError):
    """A schedule text that cannot be read; the message names the segment and what is wrong."""


@dataclass(frozen=True)
class Segment:
    duration: float  # model seconds
    start: float  # multiplier of the spec's rate at the segment's start
    end: float  # multiplier at its end; equal to ``start`` for a step

    @property
    def area(self) -> float:
        """Integral of the multiplier over the segment (model seconds at the spec's rate)."""
        return 0.5 * (self.start + self.end) * self.duration

    def text(self) -> str:
        if self.start == self.end:
            return f"{self.duration:g}@{self.start:g}"
        return f"{self.duration:g}@{self.start:g}->{self.end:g}"


class RateSchedule:
    """A piecewise-linear multiplier m(t) >= 0 over [0, duration] model seconds."""

    def __init__(self, segments: tuple[Segment, ...]) -> None:
        if not segments:
            raise ScheduleError("a schedule needs at least one segment")
        self.segments = segments
        self.starts: list[float] = []  # model time at which each segment starts
        self.cumulative: list[float] = []  # M at each segment's start
        t = m = 0.0
        for s in segments:
            self.starts.append(t)
            self.cumulative.append(m)
            t += s.duration
            m += s.area
        self.duration = t
        self.total = m  # M(duration)

    @classmethod
    def constant(cls, duration: float, multiplier: float = 1.0) -> RateSchedule:
        return cls((Segment(duration, multiplier, multiplier),))

    def text(self) -> str:
        return ", ".join(s.text() for s in self.segments)

    def _segment(self, t: float) -> int:
        return max(0, min(len(self.segments) - 1, bisect_right(self.starts, t) - 1))

    def multiplier(self, t: float) -> float:
        """m(t); 0 outside [0, duration]."""
        if t < 0 or t > self.duration:
            return 0.0
        i = self._segment(t)
        s = self.segments[i]
        return s.start + (s.end - s.start) * (t - self.starts[i]) / s.duration

    def integral(self, t: float) -> float:
        """M(t) = integral of m over [0, t]."""
        if t <= 0:
            return 0.0
        if t >= self.duration:
            return self.total
        i = self._segment(t)
        s, x = self.segments[i], t - self.starts[i]
        return self.cumulative[i] + s.start * x + 0.5 * (s.end - s.start) * x * x / s.duration

    def inverse(self, u: float, first: int = 0) -> tuple[float, int]:
        """The t with M(t) = u, for 0 <= u <= total, and its segment; the search starts at segment ``first``.

        Segments where m is 0 hold no arrivals: a u on their boundary maps to their start.
        """
        i = first
        last = len(self.segments) - 1
        while i < last and self.cumulative[i + 1] < u:
            i += 1
        s = self.segments[i]
        v = max(0.0, u - self.cumulative[i])
        # solve  start*x + (slope/2)*x^2 = v  in the form that is stable for every slope, zero included
        slope = (s.end - s.start) / s.duration
        root = math.sqrt(max(0.0, s.start * s.start + 2.0 * slope * v))
        denominator = s.start + root
        x = 2.0 * v / denominator if denominator > 0 else 0.0
        return self.starts[i] + min(x, s.duration), i


def parse_schedule(text: str) -> RateSchedule:
    """Read ``DURATION@MULT`` (a step) and ``DURATION@MULT->MULT`` (a linear ramp) segments.

    Segments are separated by commas, semicolons or new lines; ``#`` starts a comment; spaces are ignored.
    Durations are model seconds (> 0); multipliers are of the spec's arrival rate (>= 0).
    """
    items: list[str] = []
    for line in text.splitlines() or [""]:
        line = line.split("#", 1)[0]
        items.extend(part for part in re.split(r"[,;]", line))
    segments: list[Segment] = []
    for raw in items:
        item = "".join(raw.split())
        if not item:
            continue
        where = f"segment {len(segments) + 1} {item!r}"
        m = _SEGMENT.match(item)
        if m is None:
            raise ScheduleError(f"{where}: expected DURATION@MULT (a step) or DURATION@MULT->MULT (a ramp)")
        duration, start = float(m.group(1)), float(m.group(2))
        end = float(m.group(3)) if m.group(3) is not None else start
        if not math.isfinite(duration) or duration <= 0:
            raise ScheduleError(f"{where}: the duration must be a positive number of model seconds")
        if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end < 0:
            raise ScheduleError(f"{where}: multipliers must be finite and >= 0")
        segments.append(Segment(duration, start, end))
    if not segments:
        raise ScheduleError("empty schedule: give segments like '60@1, 30@1->2, 60@2'")
    schedule = RateSchedule(tuple(segments))
    if schedule.total <= 0:
        raise ScheduleError("every multiplier is 0: the schedule sends nothing")
    return schedule


def scheduled_tasks(
    exp: Experiment, schedule: RateSchedule, replication: int = 0
) -> Iterator[tuple[float, float]]:
    """(model arrival time, work) of the spec's workload with its rate multiplied by ``schedule``."""
    workload = PoissonWorkload(exp, replication)
    segment = 0
    while True:
        u, work = workload.next()  # homogeneous at the spec's rate: u is in units of M
        if u > schedule.total:
            return
        t, segment = schedule.inverse(u, segment)
        yield t, work
