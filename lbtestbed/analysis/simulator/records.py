"""Per-task records of a simulation: ``lbt simulate --records FILE`` (one CSV row per task).

What Ciw's ``get_all_records()`` gives for its nodes, for the testbed's tasks: when each task arrived, which
dispatcher took it, when and by which rule it was routed to which node, when it reached the node, started
service and left, its work, and how it ended. Every time is the simulator's own (model seconds, exact);
nothing is sampled. The run is the simulator's, the same run as ``lbt simulate``'s
(tests/test_records.py compares the two).

Service start: on an FCFS node, the instant the task reached the head of the queue (its arrival when the
server was free, else the departure of the task before it); pools and processor-sharing nodes serve every
task from its arrival (a pool in a server of its own, PS at a share of the speed), so it is the node
arrival there.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from typing import IO, Any

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.engine import Progress, Simulator
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.nodes import FCFSNode, NodeModel, PoolNode, PSNode
from lbtestbed.model.workload import Task
from lbtestbed.policies import Route

#: the CSV's columns, in order (docs/spec.md, "Per-task records")
COLUMNS = (
    "task",  # its index in the workload: the i-th arrival, from 0 (the line of lbt load --record's trace)
    "dispatcher",  # the dispatcher that took it (policy.split)
    "arrival",  # model time it entered the system
    "batch",  # measured batch of its arrival, -1 outside the window [warmup, warmup + duration]
    "routed",  # model time of the routing decision (after the probe replies, if any)
    "rule",  # the decision's label (docs/spec.md, "decisions")
    "node",  # the node it was routed to
    "node_class",  # that node's class name
    "node_arrival",  # model time it reached the node (later than routed with network.forward_tasks)
    "service_start",  # see the module's docstring
    "departure",  # model time it completed (failed: was refused by a failing node)
    "sojourn",  # departure - arrival
    "work",  # its work; service time = work / speed on FCFS and pools
    "outcome",  # completed, failed (a fail fault), or in_system (not done when the run stopped)
)
Log = Callable[[Task, float], None]


def _recording(model: type[NodeModel], on_start: Log, on_done: Log) -> type[NodeModel]:
    """A node of ``model`` that reports its service starts and completions (one class per model)."""

    class Recording(model):  # type: ignore[valid-type,misc]
        __slots__ = ()

        def arrive(self, task: Task, now: float) -> bool:
            waits = bool(super().arrive(task, now))
            if not waits:
                on_start(task, now)
            return waits

        def complete(self, now: float) -> Task:
            task: Task = super().complete(now)
            on_done(task, now)
            if isinstance(self, FCFSNode) and self.x:  # the next in line starts now
                on_start(self.head, now)
            return task

    return Recording


class RecordingSimulator(Simulator):
    """The simulator, keeping a record of every task (``rows()``). It watches every routing decision, so
    the instant probe's arrival handler (which makes none) is not used."""

    instant_arrivals = False

    def __init__(self, exp: Experiment, replication: int = 0, progress: Progress | None = None) -> None:
        super().__init__(exp, replication, progress)
        self.records: dict[int, list[Any]] = {}
        kinds: dict[type[NodeModel], type[NodeModel]] = {
            m: _recording(m, self._started, self._done) for m in (PoolNode, PSNode, FCFSNode)
        }
        # the same nodes, fresh as the engine made them, that report what they do
        self.nodes = [kinds[type(n)](n.speed, n.utility, n.last) for n in self.nodes]

    def _record(self, task: Task) -> list[Any]:
        rec = self.records.get(task.id)
        if rec is None:
            rec = [task.id, task.origin, task.arrived, task.batch, *([None] * 9), "in_system"]
            rec[12] = task.work
            self.records[task.id] = rec
        return rec

    def dispatch(self, task: Task) -> None:
        self._record(task)
        super().dispatch(task)

    def route(self, task: Task, route: Route, probed: bool = False) -> None:
        rec = self._record(task)
        rec[4], rec[5], rec[6] = self.now, route.outcome, route.node
        rec[7] = self.exp.classes[self.exp.node_class[route.node]].name
        super().route(task, route, probed)

    def task_at_node(self, task: object, route: object) -> None:
        assert isinstance(task, Task)
        self._record(task)[8] = self.now
        super().task_at_node(task, route)

    def _failed_at_node(self, task: Task, k: int) -> None:
        rec = self._record(task)
        rec[10], rec[11], rec[13] = self.now, self.now - task.arrived, "failed"
        super()._failed_at_node(task, k)

    def _started(self, task: Task, now: float) -> None:
        self._record(task)[9] = now

    def _done(self, task: Task, now: float) -> None:
        rec = self._record(task)
        rec[10], rec[11], rec[13] = now, now - task.arrived, "completed"

    def rows(self) -> list[list[Any]]:
        """Every task that arrived, in arrival order."""
        return [self.records[k] for k in sorted(self.records)]


def write_records(out: IO[str], rows: list[list[Any]]) -> None:
    """The records as CSV with a header (floats as Python writes them back exactly; empty: no value)."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    w.writerows([repr(v) if type(v) is float else v for v in r] for r in rows)  # None: an empty cell


def simulate_with_records(
    exp: Experiment, out: IO[str], replication: int = 0, progress: Progress | None = None
) -> RawRun:
    """One replication of ``exp`` (the pure-Python engine), its records written to ``out``."""
    sim = RecordingSimulator(exp, replication, progress)
    raw = sim.run()
    write_records(out, sim.rows())
    return raw
