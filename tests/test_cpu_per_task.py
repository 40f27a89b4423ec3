"""CPU seconds per task (lbtestbed.analysis.measurement.cpu) on snapshots made by hand: the increase of
each process's counter over the tasks the dispatchers accepted, a restarted process counted from 0, a
process missing at a boundary left out."""

from __future__ import annotations

from lbtestbed.analysis.measurement.cpu import cpu_per_task
from lbtestbed.analysis.measurement.scrape import ProcessSamples, Snapshot


def proc(cpu: float | None, decisions: float | None = None) -> ProcessSamples:
    p = ProcessSamples()
    if cpu is not None:
        p.samples.append(("process_cpu_seconds_total", {}, cpu))
    if decisions is not None:  # two outcomes: the counter is their sum
        p.samples.append(("lbtestbed_dispatcher_decisions_total", {"outcome": "idle"}, decisions / 2))
        p.samples.append(("lbtestbed_dispatcher_decisions_total", {"outcome": "busy"}, decisions / 2))
    return p


def test_cpu_per_task_by_hand() -> None:
    roles = {
        "d0": ("dispatcher", 0),
        "d1": ("dispatcher", 1),
        "n0": ("nodes", 0),
        "n1": ("nodes", 1),
        "n2": ("nodes", 2),
    }
    first = Snapshot(
        0.0, {"d0": proc(1.0, 100), "d1": proc(2.0, 50), "n0": proc(3.0), "n1": proc(9.0), "n2": proc(1.0)}
    )
    # d1 restarted in the window: its counters start again from 0; n2 did not answer at the end
    last = Snapshot(
        10.0, {"d0": proc(3.0, 900), "d1": proc(0.5, 30), "n0": proc(4.5), "n1": proc(9.5)}, ["n2"]
    )
    out = cpu_per_task(first, last, roles, [10.0, 14.0])
    tasks = (900 - 100) + 30  # d1 counts from its restart
    assert out["tasks"] == tasks
    got = {(p["role"], p["index"]): (p["cpu_seconds"], p["per_task"]) for p in out["processes"]}
    assert got == {
        ("dispatcher", 0): (2.0, 2.0 / tasks),
        ("dispatcher", 1): (0.5, 0.5 / tasks),
        ("nodes", 0): (1.5, 1.5 / tasks),
        ("nodes", 1): (0.5, 0.5 / tasks),
        ("generator", 0): (4.0, 4.0 / tasks),
    }
    assert out["per_task_by_role"] == {
        "dispatcher": 2.5 / tasks,
        "nodes": 2.0 / tasks,
        "generator": 4.0 / tasks,
    }


def test_no_tasks_no_per_task_figure() -> None:
    snap = Snapshot(0.0, {"d0": proc(1.0, 10)})
    out = cpu_per_task(snap, snap, {"d0": ("dispatcher", 0)})
    assert out["tasks"] == 0 and out["processes"] == [
        {"role": "dispatcher", "index": 0, "cpu_seconds": 0.0, "per_task": None}
    ]
