"""A pre-flight that measures: the spec's own tasks, at its own rate, on the machine as it is now.

The table of ``preflight`` (CPU per task and the overhead at low load, measured once per machine) tells
whether a spec would saturate the machine; it does not tell what the machine costs while other work runs
on it, and on a busy machine its overhead was 6 to 8 times low. Here a short burst of the spec's own
tasks (the first ``SECONDS`` wall seconds of its workload, at a candidate time scale) runs on a cluster
of the spec's own, and what it measures is the estimate: the transport-and-dispatch overhead per task
(sojourn minus the stay at the node, wall seconds) and the busiest process's share of a core. Against the
model's mean sojourn W (the theory's value, or the mean service time where it has none: a smaller W, so
a larger estimate) the overhead gives the net cost the run's mean sojourn will show, overhead / (time scale
x W). ``time_scale = "auto"`` takes the smallest scale on the 1-2-5 grid whose live estimate stays within
half the tolerance (the other half for what delays cost beyond the sojourn: a policy's staleness), trying
at most ``ATTEMPTS`` scales from the table's own pick upwards; every report says how close the estimate
came (docs/run.md, "Before it starts").
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.loadgen.openloop import drive, poisson_tasks
from lbtestbed.model.experiment import Experiment

#: the time scales ``time_scale = "auto"`` picks from: 1-2-5 steps from 0.0001 to 500
AUTO_GRID = tuple(sorted({round(m * 10.0**e, 12) for e in range(-4, 3) for m in (1.0, 2.0, 5.0)}))
#: wall seconds of the spec's own load in one calibration
SECONDS = 2.0
#: scales tried at most by time_scale = "auto"
ATTEMPTS = 3
#: the share of the tolerance the estimated sojourn cost may take
MARGIN = 0.5


@dataclass(frozen=True)
class Live:
    """What a burst of the spec's tasks measured at ``time_scale``."""

    time_scale: float
    tasks: int
    tasks_per_s: float
    overhead_p50_ms: float
    overhead_mean_ms: float
    busy: float  # the busiest cluster process's share of a core over the burst
    model_sojourn: float  # W, model seconds
    cost: float  # the estimated net cost on the mean sojourn: overhead mean / (time_scale W)

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)

    def text(self) -> str:
        return (
            f"at time_scale {self.time_scale:g} ({self.tasks_per_s:.0f} tasks/s) the overhead was "
            f"{self.overhead_p50_ms:.2g} ms p50, {self.overhead_mean_ms:.2g} ms mean: about "
            f"{100 * self.cost:.2g} % of the mean sojourn"
        )


def mean_service(exp: Experiment) -> float:
    """Mean service time in model seconds: the mean work over the nodes' mean speed."""
    speeds = exp.node_speeds
    return exp.workload.service.mean / (sum(speeds) / len(speeds))


def at_scale(exp: Experiment, time_scale: float) -> Experiment:
    """``exp`` with its time scale set."""
    run = dataclasses.replace(exp.run, time_scale=time_scale, auto_time_scale=False)
    return dataclasses.replace(exp, run=run)


def model_sojourn(exp: Experiment) -> float:
    """W: the theory's mean sojourn where it has one, else the mean service time (a lower bound)."""
    from lbtestbed.analysis.theory.predict import predict  # the theory only for this

    value = predict(exp).value("mean_sojourn")
    return value if value is not None and value > 0 else mean_service(exp)


def measure_live(exp: Experiment, node_processes: int | None, seconds: float = SECONDS) -> Live:
    """Run the first ``seconds`` wall seconds of ``exp``'s load (at its time scale) on a cluster of its
    own, and measure it."""
    import psutil

    scale = exp.run.time_scale
    tasks = list(poisson_tasks(exp, seconds / scale))
    with (
        tempfile.TemporaryDirectory(prefix="lbt-calibrate-") as tmp,
        Cluster(Path(tmp) / "c.json") as cluster,
    ):
        f = cluster.up(exp, node_processes=node_processes)
        procs = [psutil.Process(e.pid) for e in (*f.dispatchers, *f.node_hosts)]
        before, t0 = [sum(p.cpu_times()[:2]) for p in procs], time.monotonic()
        report = asyncio.run(drive([d.url for d in f.dispatchers], tasks, scale))
        after, t1 = [sum(p.cpu_times()[:2]) for p in procs], time.monotonic()
    overhead = np.array([(r.sojourn - r.stay) * scale for r in report.records], float)
    overhead = overhead[np.isfinite(overhead)]
    if not overhead.size:
        raise RuntimeError("the calibration's tasks did not complete")
    busy = max((b - a) / (t1 - t0) for a, b in zip(before, after, strict=True))
    w = model_sojourn(exp)
    mean = float(overhead.mean())
    return Live(
        scale,
        len(report.records),
        len(tasks) / seconds,
        1e3 * float(np.median(overhead)),
        1e3 * mean,
        busy,
        w,
        mean / (scale * w),
    )


def auto_scale(
    exp: Experiment, first: float, node_processes: int | None, say: Callable[[str], None]
) -> tuple[float, list[Live], str]:
    """The time scale ``time_scale = "auto"`` runs at (module docstring), the calibrations it took and why,
    starting from the table's pick ``first``."""
    tolerance = exp.run.tolerance if exp.run.tolerance is not None else 0.05
    goal = MARGIN * tolerance
    scale, tried = first, []
    for _ in range(ATTEMPTS):
        say(f"calibrating: the spec's own load at time_scale {scale:g} for {SECONDS:g} s")
        live = measure_live(at_scale(exp, scale), node_processes)
        tried.append(live)
        if live.cost <= goal:
            why = f"time_scale = auto picked {scale:g}: {live.text()}, within {100 * goal:.2g} %"
            return scale, tried, why
        need = scale * live.cost / goal
        scale = next((s for s in AUTO_GRID if s >= need), AUTO_GRID[-1])
    why = (
        f"time_scale = auto picked {scale:g}, where the last calibration ({tried[-1].text()}) says the cost "
        f"falls within {100 * goal:.2g} % (not measured there: {ATTEMPTS} calibrations tried)"
    )
    return scale, tried, why


def how_close(
    how: str, overhead_ms: float, cost: float | None, measured_ms: float | None, measured_cost: float | None
) -> str:
    """How close the pre-flight's estimate (``how``: live or the table's; ``overhead_ms`` p50 and the
    ``cost`` on the mean sojourn, where estimated) came to what the run measured."""
    parts = [f"the pre-flight ({how}) estimated {overhead_ms:.2g} ms of overhead p50"]
    if measured_ms is not None and math.isfinite(measured_ms) and overhead_ms > 0:
        parts.append(
            f"the run measured {measured_ms:.2g} ms ({measured_ms / overhead_ms:.2g} times the estimate)"
        )
    if cost is not None and measured_cost is not None:
        parts.append(
            f"a net cost on the mean sojourn of {100 * cost:+.2g} % estimated, {100 * measured_cost:+.2g} % "
            "measured"
        )
    return "; ".join(parts)
