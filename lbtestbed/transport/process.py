"""Running one cluster process: uvloop, the file-descriptor budget, logging, and a clean stop on SIGTERM.

A process never lets its clients take the descriptors it needs for its peers. Every task in flight holds
a connection at every hop (synchronous completion), so a dispatcher needs two descriptors per task (its
client's and its own to the node) and a node host one. ``Budget`` splits the process's descriptor limit:
``RESERVE`` stay for peer traffic (health checks, state messages, logs), a dispatcher takes at most
``in_flight`` tasks at once (503 beyond) and each listener holds at most ``connections`` connections
(``ConnectionGuard``: at the limit a connection that has sent nothing makes room, else the new one is
closed; both counted and logged). Connections without a request for ``IDLE_TIMEOUT`` wall seconds
(including ones that never send a whole request head) are closed, and a body must arrive within
``wire.BODY_TIMEOUT``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from lbtestbed.model.experiment import Experiment
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile
from lbtestbed.transport.http import IDLE_TIMEOUT
from lbtestbed.transport.lean_http import ROUTES, LeanServer, Routes, Stats, mount

#: descriptors a process keeps for its peers whatever its clients do
RESERVE = 512

log = logging.getLogger("lbtestbed.process")


def machine() -> str:
    """This machine's boot id (Linux): processes that read the same one read one monotonic clock (also in
    other network namespaces and containers); "" when unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def raise_fd_limit() -> int:
    """Every task in flight holds a connection (synchronous completion): allow as many as the system does.
    Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return int(hard)


@dataclass(frozen=True)
class Budget:
    """What a process may hold at once: connections per listener, and (a dispatcher) tasks in flight."""

    connections: int
    in_flight: int

    @classmethod
    def of(cls, role: str, limit: int) -> Budget:
        """The budget of a ``role`` (``dispatcher`` or ``server_node``) with ``limit`` descriptors: a
        dispatcher's tasks need two each, so 2/5 of what is left after the reserve goes to tasks in
        flight and 3/5 to connections (those beyond the tasks get their 503 on a connection of their own)."""
        usable = max(16, limit - RESERVE)
        if role == "dispatcher":
            in_flight = usable * 2 // 5
            return cls(usable - in_flight, in_flight)
        return cls(usable, usable)


class ConnectionGuard:
    """The protocol factory of a listener that holds at most ``limit`` connections.

    At the limit it first closes the oldest connection that has sent nothing for ``GRACE`` seconds since it
    opened (no client is about to use it: ours write their request as soon as they connect), then, if there
    is none, closes the new one at once. Both are counted; refusals are logged at most once a second. A
    connection that has sent a request is never closed here: it may carry a task in service, and a
    kept-alive one may be reused by its client at any moment (the idle timeout closes those)."""

    GRACE = 1.0

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: makes the protocol of each connection it takes: an aiohttp ``web.Server`` or a
        #: ``lean_http.LeanServer``; set by ``serve`` once the app runs
        self.server: Callable[[], asyncio.Protocol] | None = None
        self.refused = 0  # new connections closed at the limit
        self.shed = 0  # silent connections closed to make room
        self.connections: dict[_Tracked, None] = {}  # open, oldest first
        self.silent: dict[_Tracked, float] = {}  # open and nothing received yet: when each opened
        self._logged, self._unlogged = 0.0, 0

    def __call__(self) -> asyncio.Protocol:
        assert self.server is not None
        if len(self.connections) >= self.limit and not self._shed_one():
            self.refused += 1
            self._unlogged += 1
            now = time.monotonic()
            if now - self._logged >= 1.0:
                log.warning("refused %d connection(s): at the limit of %d open", self._unlogged, self.limit)
                self._logged, self._unlogged = now, 0
            return _Refuse()
        return _Tracked(self, self.server())

    def _shed_one(self) -> bool:
        """Close the oldest connection that has been silent for GRACE since it opened; whether one was."""
        now = time.monotonic()
        for conn, opened in self.silent.items():
            if now - opened < self.GRACE:
                return False  # the others opened later
            self.shed += 1
            conn.close()
            return True
        return False

    @property
    def open(self) -> int:
        return len(self.connections)


class _Tracked(asyncio.Protocol):
    """A connection as its guard sees it: the aiohttp request handler behind, and whether it has spoken."""

    __slots__ = ("guard", "inner", "transport")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guard.connections[self] = None
        self.guard.silent[self] = time.monotonic()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.guard.silent.pop(self, None)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.connections.pop(self, None)
        self.guard.silent.pop(self, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def close(self) -> None:
        self.guard.silent.pop(self, None)
        if self.transport is not None:
            self.transport.close()


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def process_parser(role: str) -> argparse.ArgumentParser:
    """The command line of a cluster process (``role``: ``server_node`` or ``dispatcher``)."""
    what = "node host" if role == "server_node" else role
    parser = argparse.ArgumentParser(
        prog=f"python -m lbtestbed.{role}",
        description=f"One {what} of a cluster file. The token comes from the file, or from the environment "
        "variable LBT_TOKEN when the file has none (containers: the file from a ConfigMap, the token from a "
        "Secret).",
    )
    parser.add_argument(
        "--cluster", required=True, type=Path, help="the cluster file (lbt cluster up writes one)"
    )
    parser.add_argument("--index", required=True, type=int, help="which of the file's processes this is")
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="address to bind (default: the host and port of this process's URL in the cluster file, "
        "which is what peers use; in a container e.g. 0.0.0.0:8000)",
    )
    return parser


def process_args(role: str) -> tuple[ClusterFile, Experiment, int, str | None]:
    """The cluster file, the experiment it holds, this process's index and the address to bind; exit 2
    with one line if bad."""
    args = process_parser(role).parse_args()
    try:
        cluster = ClusterFile.load(args.cluster)
    except ClusterError as e:
        print(f"{role}: error: {e}", file=sys.stderr)
        sys.exit(2)
    processes = cluster.node_hosts if role == "server_node" else cluster.dispatchers
    problem = cluster.check()
    if problem:
        problem = f"{args.cluster}: {problem}"
    elif not cluster.token:
        problem = f"{args.cluster}: no token in the file and LBT_TOKEN is not set"
    elif not 0 <= args.index < len(processes):
        problem = (
            f"--index {args.index}: the file has {len(processes)} of this role (0 to {len(processes) - 1})"
        )
    elif args.listen is not None and not _host_port(args.listen):
        problem = f"--listen {args.listen!r}: expected HOST:PORT, e.g. 0.0.0.0:8000"
    if problem:
        print(f"{role}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    return cluster, cluster.experiment(), args.index, args.listen


def _host_port(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


class Serving:
    """An app served on one port (``start_serving``): its aiohttp runner, and the lean server of its task
    path in front when it has one. ``close`` stops both."""

    def __init__(self, runner: web.AppRunner, listener: asyncio.Server, lean: LeanServer | None) -> None:
        self.runner, self.listener, self.lean = runner, listener, lean

    @property
    def port(self) -> int:
        return int(self.listener.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self.listener.close()
        if self.lean is not None:
            await self.lean.close()
        await self.runner.cleanup()


async def start_serving(
    app: web.Application,
    host: str,
    port: int,
    guard: ConnectionGuard | None = None,
    routes: Routes | None = None,
    stats: Stats | None = None,
) -> Serving:
    """Serve ``app`` on ``host:port`` (0: a free port) as a cluster process does: the lean routes the app
    carries (``lean_http.mount``), or ``routes``, on a ``lean_http.LeanServer`` that hands every other
    request to the app; the app alone if it has none. ``guard`` caps the connections; ``stats``: the lean
    server's counts (a host exports them)."""
    if routes is not None:
        mount(routes, app)  # for connections the lean server hands to the app
    routes = app.get(ROUTES)
    # tasks still in service when the process stops are lost anyway: do not wait for them long
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
        keepalive_timeout=IDLE_TIMEOUT,  # also closes a connection that never sends a whole request
    )
    await runner.setup()
    if routes is None:
        assert runner.server is not None
        factory: Callable[[], asyncio.Protocol] = runner.server
        if guard is not None:
            guard.server, factory = runner.server, guard
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(factory, host, port, backlog=4096, reuse_address=True)
        return Serving(runner, listener, None)
    lean = LeanServer(routes, runner.server, stats=stats)
    return Serving(runner, await lean.start(host, port, guard), lean)


def serve(
    app: web.Application,
    url: str,
    name: str,
    listen: str | None = None,
    guard: ConnectionGuard | None = None,
    routes: Routes | None = None,
    stats: Stats | None = None,
) -> None:
    """Serve ``app`` on ``listen`` (HOST:PORT), by default the host and port of ``url``, until SIGTERM;
    ``guard`` caps its connections (default: a node host's budget). The task path (the lean routes the app
    carries, or ``routes``) is served by a ``lean_http.LeanServer``, which hands every other request to
    ``app`` on the same port and counts into ``stats``."""
    import uvloop

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    limit = raise_fd_limit()
    guard = guard or ConnectionGuard(Budget.of("server_node", limit).connections)
    bind = _host_port(listen or url.rsplit("//", 1)[1])
    assert bind is not None, url
    host, port = bind

    async def main() -> None:
        serving = await start_serving(app, host, port, guard, routes, stats)
        lean = "" if serving.lean is None else ", the task path on the lean server"
        logging.info("serving on %s:%d as %s (at most %d connections%s)", host, port, url, guard.limit, lean)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        logging.info("stopping")
        await serving.close()

    uvloop.run(main())
