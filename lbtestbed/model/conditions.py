"""What happens to the nodes over model time: timed speed changes and failing windows (docs/faults.md).

A spec's gray failures act on single nodes over model times [at, until) of the run (the load's model time 0
is the start of the warm-up):

- ``slow``: the node serves at ``speed`` times its own speed, then at its own speed again. This is one
  source of the general mechanism of *timed speed changes*: a list of (model time, node, factor) that both
  drivers apply exactly, the simulator at its event times, the server node on its clock from the run's
  origin, each through ``NodeModel.set_speed``. The other sources are the spec's speed schedules (steps
  and ramps) and antagonists (``model.schedules``); a node's factor is the product of all three.
- ``fail``: the node refuses each task that reaches it with probability ``fraction`` (it answers 500 and
  never admits it); both drivers draw from a seeded stream of their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lbtestbed.model.experiment import Experiment
from lbtestbed.model.schedules import antagonist_random, levels, switches


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


def speed_varies(exp: Experiment) -> str | None:
    """Why the nodes' speeds change over the whole run (a schedule or antagonist that changes some node's
    speed), or None; ``slow`` faults are not counted (the comparison leaves their batches out)."""
    for i, c in enumerate(exp.classes):
        if any(level != 1.0 for _, level in levels(c.speed_schedule)):
            return f"classes[{i}].speed_schedule changes the speed of class {c.name!r} over time"
        if c.antagonist is not None and c.antagonist.factor != 1.0:
            return f"classes[{i}].antagonist changes the speed of class {c.name!r} at random times"
    for i, own in enumerate(exp.nodes):
        if own.schedule is not None and any(level != 1.0 for _, level in levels(own.schedule)):
            return f"nodes[{i}].speed_schedule changes the speed of node {own.node} over time"
        if own.antagonist is not None and own.antagonist.factor != 1.0:
            return f"nodes[{i}].antagonist changes the speed of node {own.node} at random times"
    return None


def horizon(exp: Experiment) -> float:
    """The model time up to which antagonists switch: the run and the simulator's longest drain."""
    return exp.run.warmup + 2.0 * exp.run.duration


def speed_changes(
    exp: Experiment, replication: int = 0, nodes: Iterable[int] | None = None
) -> tuple[SpeedChange, ...]:
    """Every timed speed change of the spec (of ``nodes`` only, when given: a node host's), in time order
    (then node order): at each model time where a node's factor (schedule level x antagonist factor while
    on x slow fault's speed while on) takes a new value, that value. Events of one node at one instant
    apply together, in spec order. A node's changes do not depend on the other nodes'."""
    slow: dict[int, list[tuple[float, int, float]]] = {}
    for f in exp.faults:
        if f.kind == "slow":
            slow.setdefault(f.node, []).extend(((f.at, 2, f.speed), (f.until, 2, 1.0)))
    shared: dict[int, list[tuple[float, float]]] = {}  # a class's schedule levels, computed once
    end = horizon(exp)
    changes: list[SpeedChange] = []
    own = {o.node for o in exp.nodes}
    # without a class-wide schedule or antagonist only nodes of [[nodes]] tables and slow faults can vary
    classwide = any(c.speed_schedule or c.antagonist is not None for c in exp.classes)
    if nodes is None:
        which: Iterable[int] = range(exp.n) if classwide else sorted(own | slow.keys())
    else:
        which = sorted(set(nodes)) if classwide else sorted((own | slow.keys()) & set(nodes))
    for k in which:
        if k in own:
            schedule, antagonist = exp.speed_over_time(k)
        else:
            c = exp.classes[exp.node_class[k]]
            schedule, antagonist = c.speed_schedule, c.antagonist
        if not schedule and antagonist is None and k not in slow:
            continue
        # (time, source, value): source 0 the schedule's level, 1 the antagonist (1: on, 0: off), 2 slow
        events: list[tuple[float, int, float]] = []
        if schedule:
            if schedule is exp.classes[exp.node_class[k]].speed_schedule:
                steps = shared.setdefault(exp.node_class[k], levels(schedule))
            else:
                steps = levels(schedule)
            events += [(t, 0, level) for t, level in steps]
        if antagonist is not None:
            on, times = switches(antagonist, antagonist_random(exp.seed, k, replication), end)
            events.append((0.0, 1, float(on)))
            events += [(t, 1, float((i % 2 == 0) != on)) for i, t in enumerate(times)]
        events += slow.get(k, [])
        events.sort(key=lambda e: e[0])  # stable: one source's events at one instant keep their order
        state = [1.0, 0.0, 1.0]
        factor = 1.0
        for i, (t, source, value) in enumerate(events):
            state[source] = value
            if i + 1 < len(events) and events[i + 1][0] == t:
                continue  # the node's other events at this instant apply with this one
            on_factor = antagonist.factor if antagonist is not None and state[1] else 1.0
            new = state[0] * on_factor * state[2]
            if new != factor:
                changes.append(SpeedChange(t, k, new))
                factor = new
    return tuple(sorted(changes, key=lambda c: (c.at, c.node)))


def fail_windows(exp: Experiment) -> tuple[FailWindow, ...]:
    return tuple(FailWindow(f.at, f.until, f.node, f.fraction) for f in exp.faults if f.kind == "fail")


def failing(windows: tuple[FailWindow, ...], node: int, t: float) -> float:
    """The probability that node ``node`` fails a task that reaches it at model time ``t`` (0: none)."""
    for w in windows:
        if w.node == node and w.at <= t < w.until:
            return w.fraction
    return 0.0
