"""Node models: the service disciplines, written once against a clock (docs/design.md, principle 3).

A model never reads a clock: every call carries ``now`` in model seconds. The simulator passes virtual time,
the server node passes wall time divided by ``time_scale``. A driver asks ``next_completion()`` for the
time of the next departure and calls ``complete(now)`` then; it must ask again after every completion,
after every arrival that does not wait, and after every ``set_speed``.

``set_speed(now, speed)`` changes the node's speed from ``now`` on, exactly: the work a task in service
has received by ``now`` stays received, and what remains is served at the new speed (docs/faults.md,
"Timed speed changes"). Both drivers apply the spec's timed speed changes (``model.conditions``) through it.

Every model keeps the exact time integrals of docs/design.md, principle 5: seconds spent with exactly k tasks,
task-seconds and utility-seconds, advanced at every change of occupancy, and the integral of its speed while
idle (``idle_capacity_seconds``: speed x idle seconds, corrected at every speed change).
"""

from __future__ import annotations

import heapq
import math
from typing import ClassVar

from lbtestbed.model.utility import Utility
from lbtestbed.model.workload import Task

INF = math.inf


class NodeModel:
    """Common state: occupancy and its time integrals.

    ``index``, ``due`` and ``live`` are a driver's bookkeeping, which the model never reads: the node's
    number, and the time and sequence number of the completion event the driver has queued for it (the
    simulator keeps them here, in the object it touches anyway, rather than in lists by node)."""

    discipline: ClassVar[str] = ""
    __slots__ = (
        "arrivals",
        "completions",
        "due",
        "idle_offset",
        "index",
        "last",
        "live",
        "speed",
        "task_seconds",
        "time_at",
        "utility",
        "utility_seconds",
        "x",
    )

    def __init__(self, speed: float = 1.0, utility: Utility | None = None, now: float = 0.0) -> None:
        self.x = 0  # tasks present, in service or waiting
        self.last = now
        self.index = 0
        self.due = INF
        self.live = 0
        self.speed = speed
        self.utility = utility
        self.time_at: list[float] = [0.0]  # time_at[k]: seconds spent holding exactly k tasks
        self.task_seconds = 0.0
        self.utility_seconds = 0.0
        self.arrivals = 0
        self.completions = 0
        # idle_capacity_seconds = speed x time_at[0] + idle_offset: each speed change adds what the idle
        # time so far would otherwise be counted at the new speed instead of the old
        self.idle_offset = 0.0

    def idle_capacity_seconds(self) -> float:
        """The integral of the node's speed over the time it held no task, exactly (up to ``last``)."""
        return self.speed * self.time_at[0] + self.idle_offset

    def _new_speed(self, speed: float) -> None:
        """Take ``speed`` from ``last`` on (after ``advance``): the idle time so far keeps the old one."""
        self.idle_offset += (self.speed - speed) * self.time_at[0]
        self.speed = speed

    def advance(self, now: float) -> None:
        """Bring the integrals up to ``now``."""
        dt = now - self.last
        if dt > 0.0:
            x = self.x
            self.time_at[x] += dt
            self.task_seconds += x * dt
            if self.utility is not None:
                self.utility_seconds += self.utility.value(x) * dt
            self.last = now

    def _grow(self) -> None:
        self.x += 1
        if self.x == len(self.time_at):
            self.time_at.append(0.0)

    def arrive(self, task: Task, now: float) -> bool:
        """Accept a task; True when it has to wait for service (fcfs only).

        A task that waits changes nothing about the tasks in service, so ``next_completion()`` is the same
        as before the arrival: a driver need not ask again then (the simulator relies on it)."""
        raise NotImplementedError

    def next_completion(self) -> float:
        """Model time of the next departure, ``inf`` when idle."""
        raise NotImplementedError

    def complete(self, now: float) -> Task:
        """Remove and return the task that completes at ``now``."""
        raise NotImplementedError

    def set_speed(self, now: float, speed: float) -> None:
        """Serve at ``speed`` (> 0) from ``now`` on; the driver must ask ``next_completion()`` again."""
        raise NotImplementedError


class PoolNode(NodeModel):
    """Infinite-server pool: every task is in service at once, for its own work / speed."""

    discipline: ClassVar[str] = "pool"
    __slots__ = ("_heap", "_seq")

    def __init__(self, speed: float = 1.0, utility: Utility | None = None, now: float = 0.0) -> None:
        super().__init__(speed, utility, now)
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = 0

    def arrive(self, task: Task, now: float) -> bool:
        self.advance(now)
        self._grow()
        self.arrivals += 1
        self._seq += 1
        heapq.heappush(self._heap, (now + task.work / self.speed, self._seq, task))
        return False

    def next_completion(self) -> float:
        return self._heap[0][0] if self._heap else INF

    def complete(self, now: float) -> Task:
        self.advance(now)
        self.x -= 1
        self.completions += 1
        return heapq.heappop(self._heap)[2]

    def set_speed(self, now: float, speed: float) -> None:
        # a task due at f has (f - now) * old speed of work left: it is now due (f - now) * old / new later;
        # the map is increasing, so the heap's order (and its invariant) stays as it was
        self.advance(now)
        ratio = self.speed / speed
        self._heap = [(now + (f - now) * ratio, seq, task) for f, seq, task in self._heap]
        self._new_speed(speed)


class PSNode(NodeModel):
    """Processor sharing: q tasks are each served at speed / q.

    Virtual time V is the work each present task has received since V = 0; a task of work w that arrives at
    virtual time V0 leaves when V reaches V0 + w.
    """

    discipline: ClassVar[str] = "ps"
    __slots__ = ("_heap", "_seq", "_v")

    def __init__(self, speed: float = 1.0, utility: Utility | None = None, now: float = 0.0) -> None:
        super().__init__(speed, utility, now)
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = 0
        self._v = 0.0

    def advance(self, now: float) -> None:
        if self.x:
            self._v += (now - self.last) * self.speed / self.x
        NodeModel.advance(self, now)

    def arrive(self, task: Task, now: float) -> bool:
        self.advance(now)
        self.last = now  # also when dt == 0, so that V and the integrals share one reference time
        self._grow()
        self.arrivals += 1
        self._seq += 1
        heapq.heappush(self._heap, (self._v + task.work, self._seq, task))
        return False

    def next_completion(self) -> float:
        if not self._heap:
            return INF
        return self.last + (self._heap[0][0] - self._v) * self.x / self.speed

    def complete(self, now: float) -> Task:
        self.advance(now)
        self.last = now
        vf, _, task = heapq.heappop(self._heap)
        self._v = max(self._v, vf)  # absorb rounding: the leaving task has received exactly its work
        self.x -= 1
        self.completions += 1
        if not self._heap:
            self._v = 0.0  # restart virtual time on an idle node to keep it small
        return task

    def set_speed(self, now: float, speed: float) -> None:
        # virtual time is the work each task has received: bring it to now at the old speed, then it grows
        # at the new one (next_completion reads the speed)
        self.advance(now)
        self.last = now
        self._new_speed(speed)


class FCFSNode(NodeModel):
    """A single server at rate ``speed`` with a FIFO queue.

    The queue is linked through the tasks (``Task.next``): ``head`` is in service, ``tail`` the last to
    arrive, and ``x`` says how many there are (a task's ``next`` is set once another queues behind it). A
    node then costs no memory beyond its own fields, which matters at a million nodes (a deque would take
    600 bytes each).
    """

    discipline: ClassVar[str] = "fcfs"
    __slots__ = ("_finish", "head", "tail")

    head: Task
    tail: Task

    def __init__(self, speed: float = 1.0, utility: Utility | None = None, now: float = 0.0) -> None:
        super().__init__(speed, utility, now)
        self._finish = INF

    def arrive(self, task: Task, now: float) -> bool:
        x = self.x
        dt = now - self.last
        if dt > 0.0:  # advance(now), inlined: this is the simulator's hottest path
            self.time_at[x] += dt
            self.task_seconds += x * dt
            if self.utility is not None:
                self.utility_seconds += self.utility.value(x) * dt
            self.last = now
        self.x = x + 1
        if x + 1 == len(self.time_at):
            self.time_at.append(0.0)
        self.arrivals += 1
        if x == 0:
            self.head = self.tail = task
            self._finish = now + task.work / self.speed
            return False
        self.tail.next = task
        self.tail = task
        return True

    def next_completion(self) -> float:
        return self._finish

    def complete(self, now: float) -> Task:
        x = self.x
        dt = now - self.last
        if dt > 0.0:  # advance(now), inlined
            self.time_at[x] += dt
            self.task_seconds += x * dt
            if self.utility is not None:
                self.utility_seconds += self.utility.value(x) * dt
            self.last = now
        self.x = x - 1
        self.completions += 1
        task = self.head
        if x == 1:
            self._finish = INF
        else:
            head = self.head = task.next
            self._finish = now + head.work / self.speed
        return task

    def set_speed(self, now: float, speed: float) -> None:
        # the task in service has (finish - now) * old speed of work left; the ones waiting start later at
        # the new speed (complete reads it)
        self.advance(now)
        if self._finish < INF:
            self._finish = now + (self._finish - now) * self.speed / speed
        self._new_speed(speed)


MODELS: dict[str, type[NodeModel]] = {"pool": PoolNode, "ps": PSNode, "fcfs": FCFSNode}


def make_node(discipline: str, speed: float, utility: Utility | None = None, now: float = 0.0) -> NodeModel:
    """The node model of a discipline named in the spec."""
    return MODELS[discipline](speed, utility, now)
