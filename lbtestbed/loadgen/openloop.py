"""The open-loop generator: Poisson arrivals that never wait for the system.

Tasks follow an absolute schedule (model arrival times from the spec's seeded workload, the same tasks the
simulator draws for the same seed) scaled to wall time, so the rate never drifts. Each send is a separate
request; nothing waits for earlier tasks. A task's sojourn is measured from its *intended* send time, so a
generator that falls behind does not hide the delay (no coordinated omission). Sends that leave late are
counted with their lateness; tasks that would exceed the bound on outstanding requests are dropped and
counted. Every task has a deadline (``TASK_DEADLINE`` wall seconds from its send, overridable): one not
answered by then is given up and counted ``expired``, so a run ends within its schedule plus the deadline
whatever the cluster does. Every task ends completed, refused (503), lost (502, the node failed), dropped,
expired, or failed to reach a dispatcher at all; a run interrupted (Ctrl-C) counts the tasks it had out as
``cancelled`` and the ones it had not sent yet as ``unsent``. The counts add up to the tasks scheduled.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import json
import math
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson
import uvloop

from lbtestbed.loadgen import TASK_DEADLINE
from lbtestbed.loadgen import journal as events
from lbtestbed.loadgen.journal import Journal
from lbtestbed.model.experiment import MAX_PROCESS_BYTES, SENT_TASK_BYTES, Experiment
from lbtestbed.model.workload import PoissonWorkload
from lbtestbed.transport.alarm import Alarm
from lbtestbed.transport.http import HttpPool
from lbtestbed.transport.wire import PREFIX

LATE = 0.002  # wall seconds: a send that leaves later than this after its intended time counts as late
#: how a scheduled task can end, as LoadReport.summary() lists them (they add up to ``scheduled``)
OUTCOMES = ("completed", "refused", "lost", "dropped", "failed", "expired", "cancelled", "unsent")
JSON_BODY = {"Content-Type": "application/json"}


NAN = float("nan")


class TaskRecord(NamedTuple):
    """One completed task as the client saw it; times in model seconds.

    The legs (docs/run.md, "Where the time goes") add up: sojourn = arrive + decide + forward + stay +
    reply. They come from the monotonic instants the dispatcher and the node put in the reply (one
    machine's clock); NaN where a dispatcher or node did not stamp them."""

    t: float  # intended arrival time (model seconds from the start of the load)
    work: float
    node: int
    sojourn: float  # from the intended send to the reply, network included
    stay: float  # at the node: from its arrival there to its completion
    waited: bool  # the node did not start serving it at once (fcfs)
    late: float = NAN  # from the intended send to the request's start (the generator's lateness)
    arrive: float = NAN  # from the intended send to the dispatcher accepting it
    decide: float = NAN  # from the accept to the routing decision (probes included)
    forward: float = NAN  # from the decision to the node's arrival instant
    notify: float = NAN  # from the node's completion instant to the dispatcher reading the reply
    reply: float = NAN  # from the node's completion instant to the client reading the reply
    leave: float = NAN  # from the node's completion instant to the dispatcher's answer being ready


def legs_of(
    reply: dict[str, object], intended: float, sent: float, done: float, scale: float
) -> tuple[float, ...]:
    """(late, arrive, decide, forward, notify, reply, leave) in model seconds from a dispatcher's reply;
    NaN for a leg whose stamps the reply lacks."""
    stamps = reply.get("legs")
    late = (sent - intended) / scale
    if not isinstance(stamps, dict) or "node_due" not in stamps:
        return (late, NAN, NAN, NAN, NAN, NAN, NAN)
    s = {k: float(v) for k, v in stamps.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    accepted, decided, due = (s.get(k, NAN) for k in ("accepted", "decided", "node_due"))
    return (
        late,
        (accepted - intended) / scale,
        (decided - accepted) / scale,
        (s.get("node_arrived", NAN) - decided) / scale,
        (s.get("answered", NAN) - due) / scale,
        (done - due) / scale,
        (s.get("released", NAN) - due) / scale,
    )


@dataclass
class LoadReport:
    scheduled: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # OUTCOMES
    late: int = 0
    lateness: list[float] = field(default_factory=list)  # wall seconds, every send
    sojourns: list[float] = field(default_factory=list)  # model seconds, completed tasks
    records: list[TaskRecord] = field(default_factory=list)  # completed tasks
    failures: list[tuple[float, str, int]] = field(default_factory=list)  # (t, outcome, node or -1)
    wall_seconds: float = 0.0  # until the last task came back
    send_seconds: float = 0.0  # from the first intended send to the last actual send
    model_seconds: float = 0.0
    interrupted: bool = False  # stopped early (Ctrl-C): tasks out are cancelled, the rest unsent
    # model seconds from the intended send to the answer (or to giving up: expired) of the tasks that ended
    # refused, lost, failed or expired, with their outcome (the completed ones are in ``sojourns``)
    other_sojourns: list[tuple[str, float]] = field(default_factory=list)
    due: float | None = None  # monotonic intended send time of the next task, while the loop sends

    def completed(
        self,
        t: float,
        work: float,
        reply: dict[str, Any],
        intended: float,
        sent: float,
        done: float,
        scale: float,
    ) -> TaskRecord:
        """Record a task its dispatcher answered (``reply``: the answer's JSON; monotonic instants: the
        intended send, the request leaving, the answer read). A malformed answer raises before anything is
        counted."""
        sojourn = (done - intended) / scale
        stay = float(reply.get("completed", 0.0)) - float(reply.get("arrived", 0.0))
        node, waited = int(reply.get("node", -1)), bool(reply.get("waited"))
        legs = legs_of(reply, intended, sent, done, scale)
        record = TaskRecord(t, work, node, sojourn, stay, waited, *legs)
        self.outcomes["completed"] += 1
        self.sojourns.append(sojourn)
        self.records.append(record)
        return record

    def ended(self, t: float, outcome: str, node: int, sojourn: float | None) -> None:
        """Record a task that did not complete: refused, lost, failed, expired or cancelled (``sojourn``:
        model seconds from its intended send to its answer or to giving up; None for cancelled)."""
        self.outcomes[outcome] += 1
        self.failures.append((t, outcome, node))
        if sojourn is not None:
            self.other_sojourns.append((outcome, sojourn))

    @classmethod
    def from_events(
        cls, journal: Iterable[Mapping[str, Any]], scheduled: int, time_scale: float
    ) -> LoadReport:
        """The report as a journal's events tell it (``loadgen.journal``). A task sent without a fate in the
        journal (the run was cut short before its answer was written) counts as ``cancelled``, a task not
        sent when the journal ends as ``unsent``."""
        report = cls(scheduled=scheduled)
        open_tasks: dict[int, float] = {}
        late_limit, finished = LATE, False
        for e in journal:
            kind = e["e"]
            if kind == "sent":
                open_tasks[e["i"]] = e["t"]
                report.lateness.append(e["late"])
            elif kind == "dropped":
                report.lateness.append(e["late"])
                report.outcomes["dropped"] += 1
            elif kind == "completed":
                open_tasks.pop(e["i"], None)
                record = TaskRecord(
                    *(e[k] for k in TaskRecord._fields[:6]),  # t, work, node, sojourn, stay, waited
                    *(NAN if e.get(k) is None else float(e[k]) for k in TaskRecord._fields[6:]),
                )
                report.outcomes["completed"] += 1
                report.records.append(record)
                report.sojourns.append(record.sojourn)
            elif kind in events.FATES:
                open_tasks.pop(e["i"], None)
                report.ended(e["t"], kind, e["node"], e.get("sojourn"))
            elif kind == "unsent":
                report.outcomes["unsent"] += e["count"]
                report.interrupted = True
            elif kind == "load":
                finished, late_limit = True, e.get("late_limit", LATE)
                report.send_seconds, report.wall_seconds = e["send_seconds"], e["wall_seconds"]
                report.model_seconds = report.wall_seconds / time_scale
                report.interrupted = report.interrupted or bool(e.get("interrupted"))
        for t in open_tasks.values():
            report.ended(t, "cancelled", -1, None)
        if not finished:
            report.interrupted = True
            report.outcomes["unsent"] = scheduled - len(report.lateness)  # sent or dropped: one lateness each
        report.late = sum(1 for x in report.lateness if x > late_limit)
        return report

    def summary(self) -> dict[str, object]:
        lat = np.array(self.lateness) if self.lateness else np.zeros(1)
        soj = np.array(self.sojourns) if self.sojourns else np.full(1, np.nan)
        sent = self.scheduled - self.outcomes["dropped"] - self.outcomes["unsent"]
        return {
            "scheduled": self.scheduled,
            "sent": sent,
            **{k: self.outcomes[k] for k in OUTCOMES},
            "rate_sent": sent / self.send_seconds if self.send_seconds else None,
            "late_sends": self.late,
            "lateness_p50_ms": 1e3 * float(np.quantile(lat, 0.5)),
            "lateness_p99_ms": 1e3 * float(np.quantile(lat, 0.99)),
            "lateness_max_ms": 1e3 * float(lat.max()),
            "mean_sojourn": float(np.nanmean(soj)) if self.sojourns else None,
            "sojourn_p50": float(np.quantile(soj, 0.5)) if self.sojourns else None,
            "sojourn_p99": float(np.quantile(soj, 0.99)) if self.sojourns else None,
            "wall_seconds": self.wall_seconds,
            "model_seconds": self.model_seconds,
            "interrupted": self.interrupted,
        }


def poisson_tasks(
    exp: Experiment, model_seconds: float, replication: int = 0
) -> Iterator[tuple[float, float]]:
    """(model arrival time, work) of the spec's workload up to ``model_seconds``: the simulator's tasks."""
    workload = PoissonWorkload(exp, replication)
    while True:
        t, work = workload.next()
        if t > model_seconds:
            return
        yield t, work


def write_trace(path: Path, tasks: Sequence[tuple[float, float]]) -> None:
    with open(path, "w") as f:
        f.write("# lbtestbed trace v1: model arrival time, work\n")
        for t, w in tasks:
            f.write(f"{t!r},{w!r}\n")


#: the longest line of a trace (two numbers) and the most tasks one may hold (what a generator can keep)
MAX_TRACE_LINE = 256
MAX_TRACE_TASKS = MAX_PROCESS_BYTES // SENT_TASK_BYTES


def read_trace(path: Path) -> list[tuple[float, float]]:
    """A recorded workload; a malformed line is an error (ValueError) naming the file and the line, and so
    are a line longer than MAX_TRACE_LINE and more than MAX_TRACE_TASKS tasks: a trace of a device that
    never ends (``/dev/zero``) is refused at its first line, with the memory it holds bounded."""
    tasks: list[tuple[float, float]] = []
    with open(path, encoding="utf-8") as f:
        for i in itertools.count(1):
            try:
                line = f.readline(MAX_TRACE_LINE + 1)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{i}: not UTF-8 text: {e.reason}") from None
            if not line:
                return tasks
            if len(line) > MAX_TRACE_LINE:
                raise ValueError(f"{path}:{i}: a line longer than {MAX_TRACE_LINE} characters: not a trace")
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                t, w = (float(x) for x in line.split(","))
            except ValueError:
                raise ValueError(f"{path}:{i}: expected 'time,work', got {line!r}") from None
            if not (math.isfinite(t) and math.isfinite(w)) or w <= 0 or (tasks and t < tasks[-1][0]):
                raise ValueError(
                    f"{path}:{i}: times must be finite and not decrease, work finite and positive"
                )
            if len(tasks) >= MAX_TRACE_TASKS:
                raise ValueError(
                    f"{path}:{i}: more than {MAX_TRACE_TASKS:,} tasks: more than a generator holds"
                )
            tasks.append((t, w))
    return tasks


class YoungCollector:
    """The cyclic garbage collector while a run sends: its young generation only, once a second.

    Per-task objects are freed by reference counting (they form no cycles), so the collector only adds
    pauses, and its full passes, which scan every record kept, grew to hundreds of milliseconds in runs of
    tens of seconds: the generator fell behind its schedule. What exists when the run starts (the task list
    among it) is frozen, so that not even the first young pass scans it. The caller's settings come back at
    the end.
    """

    def __init__(self) -> None:
        self.enabled = gc.isenabled()
        self.frozen = gc.get_freeze_count()
        gc.freeze()
        gc.disable()

    def tick(self) -> None:
        """Collect the young generation (cycles from failed requests), if the caller had collection on."""
        if self.enabled:
            gc.collect(0)

    def close(self) -> None:
        if self.frozen == 0:
            gc.unfreeze()
        if self.enabled:
            gc.enable()


class Interrupt:
    """Stops a ``drive`` early (Ctrl-C): the schedule's wait ends at once, nothing more is sent; called
    again, it cuts short the wait for the tasks out (``drain``)."""

    def __init__(self) -> None:
        self.set = False
        self.wake: Callable[[], None] | None = None  # the drive's, to stop waiting for its next send
        self._nap: asyncio.Future[None] | None = None

    def __call__(self) -> None:
        self.set = True
        if self._nap is not None and not self._nap.done():
            self._nap.set_result(None)
        if self.wake is not None:
            self.wake()

    async def drain(self, pending: set[asyncio.Future[Any]], seconds: float) -> None:
        """Wait up to ``seconds`` for the ``pending`` requests to end, unless interrupted again."""
        if not pending or seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        self._nap = nap = loop.create_future()
        handle = loop.call_later(seconds, _wake, nap)
        everything = asyncio.ensure_future(asyncio.wait(set(pending)))
        try:
            await asyncio.wait({everything, nap}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            handle.cancel()
            everything.cancel()


def _wake(nap: asyncio.Future[None]) -> None:
    if not nap.done():
        nap.set_result(None)


class _Sender:
    """One ``drive``: the schedule's sends, from an ``Alarm`` at each intended instant (several at once when
    they are due together), and the requests out, each a future of its answer whose done callback records
    how it ended (no task per request: one costs more CPU than a request on a kept-alive connection), in
    the report and in the journal."""

    def __init__(
        self,
        tasks: Sequence[tuple[float, float]],
        time_scale: float,
        start: float,
        pools: Sequence[HttpPool],
        routes: Sequence[int] | None,
        report: LoadReport,
        interrupt: Interrupt,
        journal: Journal | None,
    ) -> None:
        self.tasks, self.time_scale, self.start = tasks, time_scale, start
        self.pools, self.routes, self.report, self.interrupt = pools, routes, report, interrupt
        self.journal = journal
        self.max_outstanding, self.deadline = 10_000, TASK_DEADLINE
        self.progress: Callable[[int, int], None] | None = None
        self.path = f"{PREFIX}/tasks"
        self.outstanding = 0
        self.pending: set[asyncio.Future[tuple[int, bytes]]] = set()
        self.next = 0  # the next task to send
        self.next_report = start + 1.0
        self.collector = YoungCollector()
        loop = asyncio.get_running_loop()
        self.alarm = Alarm(loop)
        self.all_sent: asyncio.Future[None] = loop.create_future()
        interrupt.wake = self.tick

    def tick(self) -> None:
        """Send every task that is due, then wait for the next one (or end: all sent, or interrupted)."""
        tasks, report, n, journal = self.tasks, self.report, len(self.tasks), self.journal
        now = time.monotonic()
        while self.next < n and not self.interrupt.set:
            t, work = tasks[self.next]
            intended = self.start + t * self.time_scale
            report.due = intended
            if now < intended:  # no send leaves before its intended time
                self.alarm.at(intended, self.tick)
                return
            self.next += 1
            if self.outstanding >= self.max_outstanding:
                report.lateness.append(now - intended)
                if now - intended > LATE:
                    report.late += 1
                report.outcomes["dropped"] += 1
                if journal is not None:
                    journal.write({"e": "dropped", "i": self.next - 1, "t": t, "late": now - intended})
            else:
                self.send(self.next - 1, t, work, intended)
            if now > self.next_report:
                self.next_report = now + 1.0
                self.collector.tick()
                if journal is not None:
                    journal.flush()
                if self.progress is not None:
                    self.progress(self.next, n)
            now = time.monotonic()
        self.alarm.cancel()
        if not self.all_sent.done():
            self.all_sent.set_result(None)

    def send(self, i: int, t: float, work: float, intended: float) -> None:
        self.outstanding += 1
        sent = time.monotonic()  # a send's lateness is taken when its request starts
        lateness = sent - intended
        self.report.lateness.append(lateness)
        if lateness > LATE:
            self.report.late += 1
        route = self.routes[i] if self.routes is not None else i % len(self.pools)
        if self.journal is not None:
            self.journal.write(events.sent(i, t, route, lateness))
        body = orjson.dumps({"work": work})  # a finite float's shortest form, faster than repr's
        answer = self.pools[route].request(self.path, body, timeout=self.deadline)
        self.pending.add(answer)
        answer.add_done_callback(functools.partial(self.ended, i, t, work, intended, sent))

    def ended(
        self, i: int, t: float, work: float, intended: float, sent: float, answer: asyncio.Future[Any]
    ) -> None:
        """A request ended: completed, refused (503), lost (502), failed, expired or cancelled."""
        self.outstanding -= 1
        self.pending.discard(answer)
        report, journal, now = self.report, self.journal, time.monotonic()
        outcome, node = "failed", -1
        sojourn: float | None = (now - intended) / self.time_scale
        if answer.cancelled():  # interrupted: its answer no longer counts
            outcome, sojourn = "cancelled", None
        elif (failed := answer.exception()) is not None:
            outcome = "expired" if isinstance(failed, TimeoutError) else "failed"
        else:
            status, raw = answer.result()
            try:
                if status == 200:
                    record = report.completed(
                        t, work, orjson.loads(raw), intended, sent, now, self.time_scale
                    )
                    if journal is not None:
                        journal.write(events.completed(i, record))
                    return
                outcome = {503: "refused", 502: "lost"}.get(status, "failed")
                node = _node_of(raw)
            except (ValueError, AttributeError, TypeError):
                pass  # a malformed answer: failed
        report.ended(t, outcome, node, sojourn)
        if journal is not None:
            journal.write(events.ended(i, outcome, t, node, sojourn))

    async def run(self, drain: float) -> None:
        """Send on schedule, then wait for every answer; once interrupted, the requests out have up to
        ``drain`` wall seconds to come back (an interrupt again cuts it short), the rest are cancelled."""
        report = self.report
        self.tick()
        await self.all_sent
        report.send_seconds = max(
            0.0, time.monotonic() - self.start
        )  # 0 when none was due before the lead-in
        report.due = None
        if self.interrupt.set:
            report.interrupted = True
            unsent = len(self.tasks) - self.next
            report.outcomes["unsent"] += unsent
            if self.journal is not None:
                self.journal.write({"e": "unsent", "from": self.next, "count": unsent})
            await self.interrupt.drain(self.pending, drain)
            for answer in list(self.pending):
                answer.cancel()
        if self.pending:
            await asyncio.wait(self.pending)
            await asyncio.sleep(0)  # the done callbacks, scheduled before the wait's own, have run

    def close(self) -> None:
        self.report.due = None
        self.alarm.close()
        self.collector.close()
        self.interrupt.wake = None


async def drive(
    dispatchers: Sequence[str],
    tasks: Sequence[tuple[float, float]],
    time_scale: float,
    max_outstanding: int = 10_000,
    progress: Callable[[int, int], None] | None = None,
    start: float | None = None,
    pools: Sequence[HttpPool] | None = None,
    routes: Sequence[int] | None = None,
    deadline: float = TASK_DEADLINE,
    interrupt: Interrupt | None = None,
    report: LoadReport | None = None,
    journal: Journal | None = None,
    drain: float = 0.0,
) -> LoadReport:
    """Send ``tasks`` on their schedule, task i to dispatcher ``routes[i]`` (the spec's split:
    ``DispatcherSplit``; by default in turn); return what happened.

    Model time 0 is the monotonic instant ``start`` (default: 50 ms from now), so a caller can line up
    measurements with the schedule. A send's lateness is taken when its request starts, and no send leaves
    before its intended time (``Alarm``: a timerfd where there is one; the loop's timers, which can fire up
    to 1 ms early, are checked against the clock). A task not answered within ``deadline`` wall seconds of
    its send is expired; ``interrupt`` stops the run early (the report says what was sent and completed
    until then). ``report``: an empty report to fill, for a caller that reads it while the run goes on
    (``loadgen.metrics``). ``journal``: where every task's fate is appended as it happens
    (``loadgen.journal``). Once interrupted, the tasks out have up to ``drain`` wall seconds to come back
    (an interrupt again cuts it short); the rest are cancelled.
    """
    report = report if report is not None else LoadReport()
    report.scheduled = len(tasks)
    own = pools is None  # a caller may share its pools (one per dispatcher) between drives
    if pools is None:
        pools = [HttpPool(d) for d in dispatchers]  # kept-alive connections: the task path's lean client
    if start is None:
        start = time.monotonic() + 0.05
    sender = _Sender(tasks, time_scale, start, pools, routes, report, interrupt or Interrupt(), journal)
    sender.max_outstanding, sender.deadline, sender.progress = max_outstanding, deadline, progress
    try:
        await sender.run(drain)
    finally:
        sender.close()
        report.wall_seconds = max(0.0, time.monotonic() - start)
        report.model_seconds = report.wall_seconds / time_scale
        for pool in pools if own else ():
            pool.close()
        if journal is not None:
            journal.write(
                {
                    "e": "load",
                    "send_seconds": report.send_seconds,
                    "wall_seconds": report.wall_seconds,
                    "interrupted": report.interrupted,
                    "late_limit": LATE,
                }
            )
            journal.flush()
    return report


def _node_of(raw: bytes) -> int:
    """The node a refused or lost task was routed to, from the dispatcher's error body (-1: none)."""
    try:
        node = json.loads(raw).get("node", -1)
    except (ValueError, AttributeError):
        return -1
    return node if isinstance(node, int) else -1


def run_load(
    dispatchers: Sequence[str],
    tasks: Sequence[tuple[float, float]],
    time_scale: float,
    max_outstanding: int = 10_000,
    progress: Callable[[int, int], None] | None = None,
    routes: Sequence[int] | None = None,
    deadline: float = TASK_DEADLINE,
    report: LoadReport | None = None,
) -> LoadReport:
    """``drive`` on a uvloop event loop of its own (asyncio's loop fell behind earlier at high rates). The
    first SIGINT (Ctrl-C) stops the run and returns what it did so far (``interrupted``), as locust does;
    a second one raises KeyboardInterrupt as usual."""

    report = report if report is not None else LoadReport()

    # main returns nothing: when it ends, Python 3.11's runner formats its task, result included, in a
    # message it throws away (asyncio.Runner.run, signal.getsignal): a report of 10,000 tasks took 0.1 s
    async def main() -> None:
        interrupt = Interrupt()
        loop = asyncio.get_running_loop()

        def first_interrupt() -> None:
            loop.remove_signal_handler(signal.SIGINT)  # the next one goes to Python's own handler
            interrupt()

        loop.add_signal_handler(signal.SIGINT, first_interrupt)
        try:
            await drive(
                dispatchers,
                tasks,
                time_scale,
                max_outstanding,
                progress,
                routes=routes,
                deadline=deadline,
                interrupt=interrupt,
                report=report,
            )
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    uvloop.run(main())
    return report
