"""Node speed over model time: speed schedules (steps, ramps), antagonists (docs/spec.md, Speed over time).

A node's speed at model time t is its spec speed times a *factor*, the product of what acts on it
(``model.conditions.speed_changes`` multiplies them): its speed schedule's level, its antagonist's
factor while the antagonist is on, and the speed of a ``slow`` fault while that fault is on.

- A **schedule** is a list of entries in time order; its level is 1 until the first entry.
  A step ``Step(at, factor)`` sets the level to ``factor`` from ``at`` on. A ramp ``Ramp(start, end, to,
  frm, steps)`` is a staircase of ``steps`` equal steps over [start, end): with h = (end - start) / steps
  and f0 = ``frm`` (when None: the level in effect at ``start``), the level on [start + j h,
  start + (j + 1) h) is f0 + (to - f0) (j + 1/2) / steps, the mean of the linear ramp from f0 to ``to``
  over that step (so a busy node serves over each step exactly the work the linear ramp would serve); from
  ``end`` on the level is ``to``.
- An **antagonist** is an alternating on/off process of its own on each node it acts on: at model time 0
  it is on with probability mean_on / (mean_on + mean_off) (its stationary law), each period in a state
  lasts an exponential time of that state's mean (mean_on, mean_off), independently; while on the node
  serves at ``factor`` times its speed. Node k's draws come from Python's ``random.Random`` seeded with the
  first 32-bit word of ``numpy.random.SeedSequence([seed, replication, 11, k])``: first ``random()`` (on
  when below mean_on / (mean_on + mean_off)), then one ``expovariate(1 / mean)`` per period, in order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

#: the antagonists' stream id in ``SeedSequence([seed, replication, stream, node])`` (model.spec's streams)
ANTAGONIST_STREAM = 11


@dataclass(frozen=True)
class Step:
    """From model time ``at`` on, the schedule's level is ``factor``."""

    at: float
    factor: float

    @property
    def begins(self) -> float:
        return self.at

    @property
    def ends(self) -> float:
        return self.at


@dataclass(frozen=True)
class Ramp:
    """A staircase of ``steps`` equal steps from ``frm`` (None: the level at ``start``) to ``to`` over
    [``start``, ``end``), each step at the linear ramp's mean over it; ``to`` from ``end`` on."""

    start: float
    end: float
    to: float
    frm: float | None = None
    steps: int = 10

    @property
    def begins(self) -> float:
        return self.start

    @property
    def ends(self) -> float:
        return self.end


Entry = Step | Ramp


@dataclass(frozen=True)
class Antagonist:
    """An on/off process: off for Exp(mean ``mean_off``), on for Exp(mean ``mean_on``), alternating; the
    node serves at ``factor`` times its speed while it is on."""

    factor: float
    mean_on: float
    mean_off: float

    @property
    def on_share(self) -> float:
        """The long-run share of time it is on (and its probability of being on at time 0)."""
        return self.mean_on / (self.mean_on + self.mean_off)

    @property
    def mean_factor(self) -> float:
        """The node's long-run mean speed factor under it."""
        return 1.0 - self.on_share * (1.0 - self.factor)


@dataclass(frozen=True)
class NodeSpeed:
    """One node's own speed over time (``[[nodes]]``): each key given replaces its class's."""

    node: int
    schedule: tuple[Entry, ...] | None = None
    antagonist: Antagonist | None = None


def levels(schedule: tuple[Entry, ...]) -> list[tuple[float, float]]:
    """The schedule as (model time, level from then on), in time order; the level is 1 before the first."""
    out: list[tuple[float, float]] = []
    level = 1.0
    for e in schedule:
        if isinstance(e, Step):
            out.append((e.at, e.factor))
            level = e.factor
            continue
        f0 = level if e.frm is None else e.frm
        m = e.steps
        for j in range(m):
            out.append((e.start + (e.end - e.start) * j / m, f0 + (e.to - f0) * (j + 0.5) / m))
        out.append((e.end, e.to))
        level = e.to
    return out


def antagonist_random(seed: int, node: int, replication: int = 0) -> random.Random:
    """Node ``node``'s antagonist stream (module docstring)."""
    state = np.random.SeedSequence([seed, replication, ANTAGONIST_STREAM, node]).generate_state(1)
    return random.Random(int(state[0]))


def switches(a: Antagonist, rng: random.Random, horizon: float) -> tuple[bool, list[float]]:
    """The antagonist's state at time 0 and its switching times in (0, ``horizon``), drawn from ``rng``."""
    on = rng.random() < a.on_share
    state, t = on, 0.0
    times: list[float] = []
    while True:
        t += rng.expovariate(1.0 / (a.mean_on if state else a.mean_off))
        if t >= horizon:
            return on, times
        times.append(t)
        state = not state
