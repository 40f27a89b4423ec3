"""The dispatcher's health checks as requests and timers: the shell around ``dispatcher.health``.

Every node process is asked ``GET /v1/state`` every heartbeat; the answer or the failure goes to the core
with its instants, and so do the loop watch's ticks, the ends of outlier intervals and the resend timer.
What the core decides (``DispatcherCore.outbox``) the host carries out (``act``) after each event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import orjson

from lbtestbed.dispatcher.core import DispatcherCore
from lbtestbed.dispatcher.health import LoopWatch, NodeProcess, Report
from lbtestbed.transport.http import LOCAL_ERRNOS, LocalError
from lbtestbed.transport.signing import SIGNATURE, Signer
from lbtestbed.transport.tasks import TaskSet
from lbtestbed.transport.wire import PREFIX


class CheckFailed(Exception):
    """A health check without an answer: ``kind`` as ``failure_kind`` says."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


def failure_kind(e: BaseException) -> str:
    """``gone``, ``timeout`` or ``local`` (``health.FAILURE_KINDS``) for an exception of a request to a
    node process."""
    if isinstance(e, CheckFailed):
        return e.kind
    if isinstance(e, TimeoutError):
        return "timeout"
    code = getattr(getattr(e, "os_error", None), "errno", None) or getattr(e, "errno", None)
    if isinstance(e, LocalError) or code in LOCAL_ERRNOS:
        return "local"
    return "gone"


def failure_reason(e: BaseException) -> str:
    return str(e) or type(e).__name__


class HealthChecks:
    """The timers and requests of ``core``'s health bookkeeping; ``act`` carries out what the core decided.
    ``ready`` is set once the core is ready (every node process answered once, or the first-contact wait
    is over)."""

    def __init__(self, core: DispatcherCore, signer: Signer, act: Callable[[], None]) -> None:
        self.core, self.signer, self.act = core, signer, act
        self.ready = asyncio.Event()
        self.tasks = TaskSet(f"dispatcher {core.index} health checks")
        # health checks ride on kept-alive connections to processes that answer, and on a fresh connection
        # each to a process that is down, so that a check never rides on a connection to whatever holds its
        # address now (a squatter on a dead process's port keeps its connections open)
        self.session: aiohttp.ClientSession | None = None
        self.fresh: aiohttp.ClientSession | None = None

    def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None), timeout=timeout
        )
        self.fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, force_close=True), timeout=timeout
        )
        core = self.core
        for p in core.health.processes:
            self.tasks.spawn(self._watch(p))
        self.tasks.spawn(self._every(core.health.interval, core.resend_overdue))
        self.tasks.spawn(self._every(LoopWatch.TICK, core.tick))
        self.tasks.spawn(self._every(core.exp.health.outlier_interval, core.outlier_interval))

    async def stop(self) -> None:
        await self.tasks.close()
        for session in (self.session, self.fresh):
            if session is not None:
                await session.close()

    async def _every(self, interval: float, event: Callable[[float], None]) -> None:
        """``event`` at the end of every ``interval`` wall seconds."""
        while True:
            await asyncio.sleep(interval)
            event(time.monotonic())
            self.act()

    async def _watch(self, p: NodeProcess) -> None:
        interval = self.core.health.interval
        while True:
            began = time.monotonic()
            await self._check(p)
            if self.core.health.ready:
                self.ready.set()
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))

    async def _check(self, p: NodeProcess) -> None:
        """Ask ``p`` for its state; a timeout that this process's own stall caused is asked again."""
        while True:
            began = time.monotonic()
            try:
                incarnation, reports = await self._ask(p)
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, CheckFailed) as e:
                again = self.core.check_failed(
                    p.index, failure_kind(e), failure_reason(e), began, time.monotonic()
                )
                self.act()
                if again:
                    continue
                return
            self.core.check_answered(p.index, incarnation, reports, time.monotonic())
            self.act()
            return

    async def _ask(self, p: NodeProcess) -> tuple[int, dict[int, Report]]:
        session = self.session if p.up and p.contacted else self.fresh
        assert session is not None
        url = f"{p.url}{PREFIX}/state"
        headers, tag = self.signer.headers("GET", url)
        async with session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=self.core.health.timeout)
        ) as resp:
            raw = await resp.read()
            if not self.signer.answer_ok(tag, resp.status, raw, resp.headers.get(SIGNATURE)):
                raise CheckFailed("gone", f"an answer without the cluster's signature (status {resp.status})")
            if resp.status != 200:
                raise ValueError(f"status {resp.status}")
        body = orjson.loads(raw)
        incarnation = int(body["incarnation"])
        got = body["reports"]
        return incarnation, {k: tuple(int(v) for v in got[str(k)]) for k in p.nodes}
