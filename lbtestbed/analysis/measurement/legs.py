"""Each leg of the task path held against what the machine itself costs right now (docs/run.md, "Two
answers", "Legs held against the machine").

The twin replays every leg the cluster measured, so a leg that is slow for a reason of the emulation's own (a
timer that fires late, a reply that waits for nothing) passes the cluster-against-twin comparison: the twin
is slow in the same way. What tells such a bug from a busy machine is the machine: beside the cluster, a
bare probe process answers a low-rate echo over loopback through the same kind of HTTP stack and measures
its own timer's lateness (``experiment.machine``). That gives, for the moment of the run, the cost of one hop
``h`` (half the echo's round trip) and of one timer wake-up ``t``. Each leg of a task crosses a known number
of them:

========================  ==================================================  ==========
leg                       what it is                                          explained
========================  ==================================================  ==========
``late``                  the generator's send, after its timer               t
``to_dispatcher``         generator to dispatcher                             h
``decide``                the decision (probes: a round trip)                 2 h
``forward``               dispatcher to node                                  h
``notify``                the node's completion timer, its reply to the       t + h
                          dispatcher
``reply``                 the same and the dispatcher's answer to the client  t + 2 h
========================  ==================================================  ==========

The probe, idle, is served by the machine at once; a cluster process is not. Over the window a process is
unavailable to a new request for a share a of the time: running something else (its CPU share) or
runnable and waiting for a core (its run delay, from the kernel's own account in ``/proc/PID/schedstat``:
on a machine that other work keeps busy this is the larger part). A request that finds the process at a
random moment waits about 1 / (1 - a) times longer than it would on an idle one (the M/M/1 inflation,
taking a as the server's busy share); the least available process of the run sets a, so that no leg is
blamed for a busy machine. A leg whose median is more than ``FACTOR`` times what the machine explains (at
least ``FLOOR`` wall seconds) is named: the emulation spends time there that the machine does not, and the
run is not faithful whatever the twin says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lbtestbed.loadgen.openloop import TaskRecord

#: a leg beyond this many times what the machine explains is named (the inflation model's own error and
#: the processes' software on top of the probe's leave a factor of 2 to 3 on a busy machine)
FACTOR = 4.0
#: the least a leg is allowed, wall seconds: Python's own work per request, which the probe's echo does not
#: repeat exactly, is a few tenths of a millisecond
FLOOR = 1e-3
#: the largest unavailable share the inflation is taken at (beyond, a process is saturated: the inflation
#: would explain anything)
MAX_BUSY = 0.95
#: how many hops (h) and timer wake-ups (t) each leg crosses (module docstring)
CROSSES: dict[str, tuple[int, int]] = {
    "late": (0, 1),
    "to_dispatcher": (1, 0),
    "decide": (2, 0),
    "forward": (1, 0),
    "notify": (1, 1),
    "reply": (2, 1),
}


@dataclass(frozen=True)
class MachineCost:
    """What the machine cost the probe during the run, wall seconds: echo round trips and timer
    lateness."""

    round_trips: Sequence[float]
    timer_lateness: Sequence[float]

    @property
    def hop(self) -> float:
        return float(np.median(self.round_trips)) / 2 if len(self.round_trips) else float("nan")

    @property
    def timer(self) -> float:
        return float(np.median(self.timer_lateness)) if len(self.timer_lateness) else float("nan")


@dataclass(frozen=True)
class LegHeld:
    leg: str
    measured: float  # the leg's median over the run's tasks, wall seconds
    explained: float  # what the machine explains, wall seconds (inflated, at least FLOOR)
    beyond: bool

    @property
    def ratio(self) -> float:
        return self.measured / self.explained if self.explained > 0 else float("inf")

    def text(self) -> str:
        return (
            f"leg {self.leg} p50 {1e3 * self.measured:.3g} ms, {self.ratio:.1f} times what the machine "
            f"explains ({1e3 * self.explained:.2g} ms)"
        )


@dataclass(frozen=True)
class LegCheck:
    machine: MachineCost
    busy: float  # the least available cluster process's unavailable share over the window (module docstring)
    legs: tuple[LegHeld, ...]

    @property
    def explained(self) -> bool:
        """Every leg within what the machine explains."""
        return not any(leg.beyond for leg in self.legs)

    def to_json(self) -> dict[str, Any]:
        return {
            "explained": self.explained,
            "hop_ms": 1e3 * self.machine.hop,
            "timer_ms": 1e3 * self.machine.timer,
            "round_trips": len(self.machine.round_trips),
            "timer_samples": len(self.machine.timer_lateness),
            "busy": self.busy,
            "factor": FACTOR,
            "legs": [{**asdict(leg), "ratio": leg.ratio} for leg in self.legs],
        }


def leg_seconds(records: Sequence[TaskRecord], leg: str, scale: float) -> np.ndarray:
    """Every task's ``leg`` in wall seconds (the records keep model seconds)."""
    if leg == "to_dispatcher":
        values = [r.arrive - r.late for r in records]
    else:
        values = [float(getattr(r, leg)) for r in records]
    x = np.asarray(values, float) * scale
    return x[np.isfinite(x)]


def hold(records: Sequence[TaskRecord], machine: MachineCost, busy: float, scale: float) -> LegCheck | None:
    """Each leg of ``records`` (model seconds, at ``scale``) against ``machine``; None without probe samples
    or tasks."""
    if not len(machine.round_trips) or not len(machine.timer_lateness) or not records:
        return None
    inflation = 1.0 / (1.0 - min(max(busy, 0.0), MAX_BUSY))
    held = []
    for leg, (hops, timers) in CROSSES.items():
        x = leg_seconds(records, leg, scale)
        if not x.size:
            continue
        explained = max(FLOOR, (hops * machine.hop + timers * machine.timer) * inflation)
        measured = float(np.median(x))
        held.append(LegHeld(leg, measured, explained, measured > FACTOR * explained))
    return LegCheck(machine, busy, tuple(held))


#: a process's account from /proc/PID/schedstat: (CPU nanoseconds, run-delay nanoseconds, time slices)
SchedStat = tuple[int, int, int]


def read_schedstat(pid: int) -> SchedStat | None:
    """The kernel's account of process ``pid`` (None where it is not readable: not on this machine, gone,
    or a kernel without schedstats)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            cpu, delay, slices = (int(x) for x in f.read().split()[:3])
    except (OSError, ValueError):
        return None
    return cpu, delay, slices


def unavailable(first: Mapping[int, SchedStat], last: Mapping[int, SchedStat], wall: float) -> float | None:
    """The largest share of ``wall`` seconds that a process of ``first`` and ``last`` (schedstats by pid, at
    the window's ends) was running or waiting for a core; None without any process read at both ends."""
    shares = [
        ((last[p][0] - a[0]) + (last[p][1] - a[1])) / 1e9 / wall
        for p, a in first.items()
        if p in last and wall > 0 and last[p][0] >= a[0]
    ]
    return max(shares, default=None)


def busiest(cpu: Mapping[str, Any], window_wall: float) -> float:
    """The busiest cluster process's share of a core over the window, from ``cpu_per_task``'s object (the
    generator aside: its lateness is its own leg): the unavailable share where schedstats are missing."""
    shares = [
        p["cpu_seconds"] / window_wall
        for p in cpu.get("processes", [])
        if p.get("role") != "generator" and window_wall > 0
    ]
    return max(shares, default=0.0)
