"""Who serves: every process of the cluster watched while a run goes on (docs/faults.md, "Observed windows
and unplanned faults").

Every ``health.heartbeat`` wall seconds the watch asks each process whether it serves (``GET /v1/health``
answered 200: a dispatcher still waiting for its nodes' first answers says 503, ``starting``) and, for the
processes this run started, whether it still runs (the pid, start time and command line the cluster file
records) or is stopped (the kernel's state ``T``). A process that does not serve is **out** from the first
check that found it so to the first that finds it serving again: an *outage*, with its cause (``dead``,
``stopped``, ``not answering``: two checks in a row without an answer within ``health.timeout``,
``starting``) and its window in model seconds (``last_seen``: the last check that found it serving,
``start``, ``end``: None while it lasts). An outage that begins during one of the spec's process faults on
that process (kill, pause, restart_dispatcher) is that fault's *observed window*; any other is an
*unplanned fault*.

With ``health.restart = true`` the run supervises its cluster: a process found dead outside the spec's
faults on it is started again at once (the same command on the same port: a new incarnation, as a kill
fault's restart), and one that has answered nothing for ``health.restart_after`` wall seconds (stopped or
hung) is killed and started again. A run on a cluster it did not start (``--endpoints``) only watches.

``exclusions`` turns outages into the windows the comparison leaves out: from the last check that saw the
process serving to the end of its outage (the end of the run if it never came back), plus the settle time
of the fault it belongs to (``run.warmup`` for an unplanned one).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from lbtestbed.cluster.launcher import spawn, started
from lbtestbed.model.experiment import PROCESS_FAULTS, Experiment
from lbtestbed.transport.cluster_file import ClusterFile, Endpoint
from lbtestbed.transport.wire import PREFIX

#: wall seconds after a process fault's end within which its process may still be out without being
#: started again by the watch (the injector starts it again at the end of the fault: a check just before
#: may find it dead)
GRACE = 0.5
#: wall seconds a process started again has to answer before the watch takes it for hung (Python and the
#: host's imports take one or two on a busy machine; the launcher gives a new cluster 30)
START = 30.0


@dataclass
class Outage:
    """A process out of service, as the watch saw it (module docstring); model seconds."""

    id: int
    process: str  # "dispatcher-0", "nodes-1"
    role: str
    index: int
    nodes: list[int]
    cause: str
    last_seen: float  # the last check that found it serving
    start: float  # the first check that found it out
    end: float | None = None  # the first check that found it serving again
    fault: int | None = None  # the spec's fault it belongs to (None: an unplanned fault)
    restarted: list[float] = field(default_factory=list)  # when the watch started it again
    error: str = ""  # what went wrong restarting it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def key_of(e: Endpoint) -> str:
    return f"{e.role}-{e.index}"


def planned_on(exp: Experiment, f: ClusterFile, e: Endpoint) -> list[tuple[int, float, float]]:
    """The spec's process faults on the process of ``e``: (fault index, at, until)."""
    out = []
    for i, fault in enumerate(exp.faults):
        if fault.kind not in (*PROCESS_FAULTS, "restart_dispatcher"):
            continue
        if fault.kind == "restart_dispatcher":
            hit = e.role == "dispatcher" and e.index == fault.dispatcher
        else:
            hit = e.role == "nodes" and fault.node in e.nodes
        if hit:
            out.append((i, fault.at, fault.until))
    return out


class Watch:
    """Watches (and, with ``health.restart``, supervises) the processes of ``f`` on the run's clock:
    model time 0 is the monotonic instant ``origin``. ``local``: this run started them (their pids mean
    something); ``path``: the cluster file, for restarts; ``note``: where each outage is written as it
    changes (the run's journal)."""

    def __init__(
        self,
        exp: Experiment,
        f: ClusterFile,
        path: Path,
        origin: float,
        say: Callable[[str], None],
        note: Callable[[dict[str, Any]], None],
        local: bool = True,
    ) -> None:
        self.exp, self.f, self.path, self.origin, self.say, self.note = exp, f, path, origin, say, note
        self.local = local
        self.supervise = local and exp.health.restart
        self.outages: list[Outage] = []
        self.open: dict[str, Outage] = {}

    def now(self) -> float:
        return (time.monotonic() - self.origin) / self.exp.run.time_scale

    async def run(self) -> None:
        """Watch every process until cancelled (one loop each: a stalled process holds up no other)."""
        connector = aiohttp.TCPConnector(force_close=True)  # never a connection to an earlier process
        async with aiohttp.ClientSession(connector=connector) as session:
            ends = self.f.dispatchers + self.f.node_hosts
            await asyncio.gather(*(self._watch(session, e) for e in ends))

    async def _watch(self, session: aiohttp.ClientSession, e: Endpoint) -> None:
        last_seen = self.now()  # the last check that found it serving
        first_miss: float | None = None  # the first of the checks in a row left unanswered
        served_by = e.pid  # the process that served at the last check that found one serving
        silent = _Silence()
        while True:
            at = self.now()
            cause = await self._check(session, e)
            if cause == "no answer":
                if first_miss is None:  # once may be the machine: twice in a row is the process
                    first_miss = at
                    await asyncio.sleep(self.exp.health.heartbeat)
                    continue
                cause, at = "not answering", first_miss
            if cause is None and self.local and e.pid != served_by and key_of(e) not in self.open:
                # another process serves than at the last check: the one before died (a kill and its
                # restart within a heartbeat, or a restart still starting at the check that missed it),
                # out from the last check that saw it serving to the first that missed (or this one)
                self._out(e, "dead", last_seen, first_miss if first_miss is not None else at)
            first_miss = None
            if cause is None:
                self._serving(e)
                last_seen, served_by = at, e.pid
                silent.answered(e.pid)
            else:
                self._out(e, cause, last_seen, at)
                if self.supervise:
                    self._supervise(e, cause, silent.hung(e.pid, cause, self.exp.health.restart_after))
            await asyncio.sleep(self.exp.health.heartbeat)

    async def _check(self, session: aiohttp.ClientSession, e: Endpoint) -> str | None:
        """Why ``e`` does not serve now (None: it serves): ``dead``, ``stopped``, ``starting``, or ``no
        answer`` (one check unanswered). A process of ours is also looked at every heartbeat while its
        health request is out: one stopped while the request was on its way answers it when continued
        (within the timeout: a stall of 0.3 s), or misses only this one check (forgiven once), and no
        check would have seen it out."""
        if not self.local:
            return await self._health(session, e)
        proc = started(e)
        if not proc.ours():
            return "dead"
        if _stopped(proc.pid):
            return "stopped"
        health = asyncio.ensure_future(self._health(session, e))
        try:
            while not health.done():
                await asyncio.wait({health}, timeout=self.exp.health.heartbeat)
                if not health.done() and _stopped(proc.pid):
                    return "stopped"
            return health.result()
        finally:  # stopped, or the watch itself cancelled: no request left behind
            if not health.done():
                health.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await health

    async def _health(self, session: aiohttp.ClientSession, e: Endpoint) -> str | None:
        """``e``'s answer to its health request: None (serves), ``starting`` or ``no answer``."""
        try:
            timeout = aiohttp.ClientTimeout(total=self.exp.health.timeout)
            async with session.get(f"{e.url}{PREFIX}/health", timeout=timeout) as resp:
                await resp.read()
                if resp.status == 200:
                    return None
                return "starting" if resp.status == 503 else "no answer"
        except (aiohttp.ClientError, TimeoutError, OSError):
            return "no answer"

    def _serving(self, e: Endpoint) -> None:
        outage = self.open.pop(key_of(e), None)
        if outage is None:
            return
        outage.end = self.now()
        self.note({"e": "outage", **outage.to_json()})
        self.say(
            f"{outage.process} serves again at model time {outage.end:.4g} (out from {outage.start:.4g})"
        )

    def _out(self, e: Endpoint, cause: str, last_seen: float, at: float) -> None:
        if key_of(e) in self.open:
            return  # still out (its cause is the first one seen)
        # a check in flight when the fault began finds it out from an instant before it (up to a check's time)
        early = (self.exp.health.heartbeat + self.exp.health.timeout) / self.exp.run.time_scale
        planned = planned_on(self.exp, self.f, e)
        fault = next((i for i, a, u in planned if a - early <= at <= u + self._grace()), None)
        outage = Outage(len(self.outages), key_of(e), e.role, e.index, list(e.nodes), cause, last_seen, at)
        outage.fault = fault
        self.outages.append(outage)
        self.open[key_of(e)] = outage
        self.note({"e": "outage", **outage.to_json()})
        what = "" if fault is not None else " (unplanned)"
        self.say(f"{outage.process} out ({cause}) at model time {at:.4g}{what}")

    def _grace(self) -> float:
        """GRACE in model seconds."""
        return GRACE / self.exp.run.time_scale

    def _supervise(self, e: Endpoint, cause: str, hung: bool) -> None:
        """Start ``e`` again if it died, or kill and start it if it has answered nothing too long
        (``hung``); never inside one of the spec's faults on it (its injector acts there)."""
        now = self.now()
        if any(a <= now <= u + self._grace() for _, a, u in planned_on(self.exp, self.f, e)):
            return
        if cause != "dead" and not hung:
            return
        outage = self.open[key_of(e)]
        if cause != "dead":
            proc = started(e)
            proc.signal(signal.SIGCONT)  # a stopped process must run to take the SIGKILL at once
            proc.signal(signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(proc.pid, 0)  # our child: reap it now
        try:
            spawn(self.path, self.f, e)  # same port: the dispatchers find it again, a new incarnation
            self.f.save(self.path)
        except OSError as problem:
            outage.error = str(problem)
            return
        outage.restarted.append(now)
        self.note({"e": "outage", **outage.to_json()})
        self.say(f"{outage.process} started again at model time {now:.4g} (it was {cause})")

    def close(self) -> list[dict[str, Any]]:
        """Every outage seen, as JSON objects (those still open have no end)."""
        return [o.to_json() for o in self.outages]


class _Silence:
    """How long one endpoint's process has answered nothing: a process that answered before is hung after
    ``health.restart_after`` of silence; one that has not answered yet since it started (a restart, by the
    injector or the watch) is given ``START`` to come up, as the launcher gives a new cluster."""

    def __init__(self) -> None:
        self.answered_pid = 0  # the process that answered last
        self.since: tuple[int, float] | None = None  # (pid, monotonic instant) its silence began

    def answered(self, pid: int) -> None:
        self.answered_pid, self.since = pid, None

    def hung(self, pid: int, cause: str, restart_after: float) -> bool:
        """Whether process ``pid``, out for ``cause``, has been silent too long (a dead one never is:
        it is started again at once)."""
        if cause == "dead":
            self.since = None
            return False
        if self.since is None or self.since[0] != pid:
            self.since = (pid, time.monotonic())
        limit = restart_after if pid == self.answered_pid else max(restart_after, START)
        return time.monotonic() - self.since[1] >= limit


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP); a process gone is not."""
    with contextlib.suppress(psutil.Error):
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    return False


def exclusions(exp: Experiment, outages: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """The windows (model seconds) the comparison leaves out for the ``outages`` (module docstring)."""
    out = []
    for o in outages:
        fault = o.get("fault")
        settle = exp.faults[fault].settle if fault is not None and fault < len(exp.faults) else exp.run.warmup
        end = o.get("end")
        out.append((o["last_seen"], (math.inf if end is None else end) + settle))
    return out


def unplanned(outages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in outages if o.get("fault") is None]
