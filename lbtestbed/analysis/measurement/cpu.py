"""What a task costs in CPU: each process's CPU seconds over the measured window, per task.

Every process exports ``process_cpu_seconds_total`` (user and system CPU of all its threads, read from
``/proc`` at the scrape: prometheus_client's ``ProcessCollector``). ``lbt run`` scrapes every process at the
window's first and last boundary; the increase between the two, divided by the tasks the dispatchers
accepted in between (the increase of ``lbtestbed_dispatcher_decisions_total``), is the process's CPU seconds
per task. A process started again inside the window (a fault) counts from its restart: its counter began
at 0. The generator is ``lbt run``'s own process (the send loop, and the scrapes at the boundaries), read
with ``os.times`` at the same instants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lbtestbed.analysis.measurement.scrape import Snapshot

CPU = "process_cpu_seconds_total"
DECISIONS = "lbtestbed_dispatcher_decisions_total"


def _increase(first: float, last: float) -> float:
    """A counter's increase; a counter that went down was reset (its process restarted) and counts from 0."""
    return last - first if last >= first else last


def cpu_per_task(
    first: Snapshot,
    last: Snapshot,
    roles: Mapping[str, tuple[str, int]],
    generator: Sequence[float] = (),
) -> dict[str, Any]:
    """``roles``: each process's URL (the snapshots' keys) -> (role, index). ``generator``: the generator's
    CPU seconds at the two boundaries, when it ran in this process. Per process and per role: CPU seconds
    in the window and per task; ``tasks``: the tasks the dispatchers accepted in the window."""
    tasks = 0.0
    for url, (role, _) in roles.items():
        a, b = first.processes.get(url), last.processes.get(url)
        if role == "dispatcher" and a is not None and b is not None:
            tasks += _increase(a.value(DECISIONS), b.value(DECISIONS))
    used: list[tuple[str, int, float]] = []  # (role, index, CPU seconds in the window)
    for url, (role, index) in roles.items():
        a, b = first.processes.get(url), last.processes.get(url)
        if a is None or b is None or not any(n == CPU for n, _, _ in b.samples):
            continue  # not answering at a boundary (a fault), or a process without the collector
        used.append((role, index, _increase(a.value(CPU), b.value(CPU))))
    if len(generator) == 2:
        used.append(("generator", 0, generator[1] - generator[0]))
    by_role: dict[str, float] = {}
    for role, _, cpu in used:
        by_role[role] = by_role.get(role, 0.0) + cpu
    processes = [
        {"role": role, "index": index, "cpu_seconds": cpu, "per_task": cpu / tasks if tasks else None}
        for role, index, cpu in used
    ]
    return {
        "tasks": tasks,
        "processes": processes,
        "per_task_by_role": {role: (cpu / tasks if tasks else None) for role, cpu in by_role.items()},
        "source": f"increase of {CPU} between the window's first and last scrape, over the tasks accepted",
    }
