"""What happens to the nodes over model time: timed speed changes and failing windows (docs/faults.md).

A spec's gray failures act on single nodes over model times [at, until) of the run (the load's model time 0
is the start of the warm-up):

- ``slow``: the node serves at ``speed`` times its own speed, then at its own speed again. This is the
  general mechanism of *timed speed changes*: a list of (model time, node, factor) that both drivers
  apply exactly, the simulator at its event times, the server node on its clock from the run's origin,
  each through ``NodeModel.set_speed``. Other sources of speed changes (steps and ramps of a node's
  speed, an antagonist process: issue 19) add changes to the same list.
- ``fail``: the node refuses each task that reaches it with probability ``fraction`` (it answers 500 and
  never admits it); both drivers draw from a seeded stream of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from lbtestbed.model.spec import Experiment


@dataclass(frozen=True)
class SpeedChange:
    """From model time ``at`` on, node ``node`` serves at ``factor`` times its spec speed."""

    at: float
    node: int
    factor: float


@dataclass(frozen=True)
class FailWindow:
    """Over model times [``at``, ``until``), node ``node`` fails each task with probability ``fraction``."""

    at: float
    until: float
    node: int
    fraction: float


def speed_changes(exp: Experiment) -> tuple[SpeedChange, ...]:
    """Every timed speed change of the spec, in time order (changes at one instant in spec order)."""
    changes: list[SpeedChange] = []
    for f in exp.faults:
        if f.kind == "slow":
            changes += [SpeedChange(f.at, f.node, f.speed), SpeedChange(f.until, f.node, 1.0)]
    return tuple(sorted(changes, key=lambda c: c.at))


def fail_windows(exp: Experiment) -> tuple[FailWindow, ...]:
    return tuple(FailWindow(f.at, f.until, f.node, f.fraction) for f in exp.faults if f.kind == "fail")


def failing(windows: tuple[FailWindow, ...], node: int, t: float) -> float:
    """The probability that node ``node`` fails a task that reaches it at model time ``t`` (0: none)."""
    for w in windows:
        if w.node == node and w.at <= t < w.until:
            return w.fraction
    return 0.0
