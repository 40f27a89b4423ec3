"""locust distributed (docs/load.md, "Distributed: a master and workers"): which of the plan's tasks each
worker sends, and the run's report the master puts together from the workers' parts.

Every worker builds the same seeded plan from the master's options; worker i of W sends the tasks
i, i + W, i + 2W, ... of it, so the W shares together are exactly the plan's tasks, each sent once, at the
plan's times from one common time zero. When its share is done, a worker sends its part of the report (a
plain dict, so that it travels in a locust message) to the master. This module does not import locust
(see plan.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from lbtestbed.loadgen.openloop import LoadReport


def share(n_tasks: int, index: int, of: int) -> range:
    """The indices of the plan's tasks that worker ``index`` of ``of`` sends."""
    if not 0 <= index < of:
        raise ValueError(f"worker index {index} is not one of 0..{of - 1}")
    return range(index, n_tasks, of)


def part(report: LoadReport, index: int, start_epoch: float) -> dict[str, Any]:
    """A worker's part of the run's report, for the master (``start_epoch``: its run's time zero)."""
    return {
        "index": index,
        "start_epoch": start_epoch,
        "scheduled": report.scheduled,
        "outcomes": dict(report.outcomes),
        "late": report.late,
        "lateness": list(report.lateness),
        "sojourns": list(report.sojourns),
        "send_seconds": report.send_seconds,
        "wall_seconds": report.wall_seconds,
    }


def failed_part(index: int, start_epoch: float, error: str) -> dict[str, Any]:
    """The part of a worker that could not build the plan (``error`` says why): its share counts as
    unfinished, and the master need not wait for it."""
    return {**part(LoadReport(), index, start_epoch), "error": error}


def merged(parts: Iterable[dict[str, Any]], scheduled: int) -> LoadReport:
    """The run's report from the workers' parts; ``scheduled``: the plan's tasks, so that the tasks of a share
    whose part never came count as unfinished. Send and wall seconds are the latest worker's."""
    report = LoadReport(scheduled=scheduled, outcomes=Counter())
    for p in parts:
        report.outcomes.update(p["outcomes"])
        report.late += p["late"]
        report.lateness += p["lateness"]
        report.sojourns += p["sojourns"]
        report.send_seconds = max(report.send_seconds, p["send_seconds"])
        report.wall_seconds = max(report.wall_seconds, p["wall_seconds"])
    return report


def worker_rows(parts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per worker for the summary: its share's counts and when it stopped (wall seconds from time
    zero to its last send and to its last reply)."""
    rows = []
    for p in sorted(parts, key=lambda p: p["index"]):
        out = Counter(p["outcomes"])
        rows.append(
            {
                "index": p["index"],
                "scheduled": p["scheduled"],
                "sent": p["scheduled"] - out["dropped"] - out["unsent"],
                "completed": out["completed"],
                "send_seconds": p["send_seconds"],
                "wall_seconds": p["wall_seconds"],
                **({"error": p["error"]} if "error" in p else {}),
            }
        )
    return rows
