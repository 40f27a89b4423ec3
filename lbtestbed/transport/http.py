"""A lean HTTP/1.1 client for the task path: small JSON POSTs over kept-alive loopback connections.

Every task crosses the cluster in two requests (client to dispatcher, dispatcher to node) and a probing
policy adds d more. aiohttp's client spends about 120 µs of CPU on each such request on this kind of
machine; this one about 15 µs (``benchmarks/bench_overhead.py`` measures both in one run). It does only what
the task path needs: POST a body already encoded, with headers fixed per peer, and read a response that
has a Content-Length (every aiohttp ``web.Response`` with a body has one). One request per connection at
a time; a pool per peer keeps idle connections and opens new ones as requests overlap. Anything else a
server may do (close the connection, answer without a length) fails the request with ``HttpError`` (an
``OSError``, as connection failures are), never with a wrong answer.

Between cluster processes every request is signed and every answer's signature checked
(``transport.signing``): an answer not signed with the cluster's key fails the request like a broken
connection. A connection kept idle longer than ``IDLE_REUSE`` is not reused: the servers close idle
connections after ``IDLE_TIMEOUT`` (``transport.process``), and a request written into a connection the
server is closing would be lost. A failure to connect that is this process's own shortage (no file
descriptor, no memory, no local port) raises ``LocalError``, so that nobody blames the peer for it.
"""

from __future__ import annotations

import asyncio
import errno
import time
from typing import Protocol, cast
from urllib.parse import urlsplit

from lbtestbed.transport.signing import SIGNATURE, Signer, authority

#: wall seconds a server keeps a connection open without a request (``transport.process`` sets it)
IDLE_TIMEOUT = 30.0
#: wall seconds a pool reuses an idle connection: well inside the server's IDLE_TIMEOUT
IDLE_REUSE = IDLE_TIMEOUT / 3
#: errors of ``connect`` that say this process (or machine) ran short, not that the peer is gone
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL})
_SIGNATURE_HEADER = b"\r\n" + SIGNATURE.lower().encode() + b":"


class HttpError(ConnectionError):
    """The request failed on the connection or the response was not one this client reads."""


class LocalError(HttpError):
    """The request could not leave: this process ran out of a resource (file descriptors, memory, local
    ports). The peer is not at fault."""


class _Connection(asyncio.Protocol):
    """One kept-alive connection of a pool, with at most one request out at a time (``pending``)."""

    __slots__ = (
        "buffer",
        "closed",
        "idle_since",
        "pending",
        "pool",
        "signature",
        "tag",
        "timer",
        "transport",
    )

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.pending: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False
        self.signature = b""  # the last answer's X-LBT-Signature
        self.tag = b""  # what the pending request's answer must be signed for (a signing pool)
        self.timer: asyncio.TimerHandle | None = None  # the pending request's deadline
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        if self.pending is None:  # bytes nobody asked for: this connection's answers can no longer be matched
            self._fail(HttpError("data without a request"))
            return
        self.buffer += data
        self._parse()

    def _parse(self) -> None:
        buf = self.buffer
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        try:
            head = bytes(buf[:end]).lower()
            if not head.startswith(b"http/1.1 "):
                raise HttpError(f"not an HTTP/1.1 response: {head[:20]!r}")
            status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                raise HttpError("response without a Content-Length")
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop > 0 else None])
            if length < 0:
                raise HttpError(f"negative Content-Length: {length}")
        except (ValueError, HttpError) as e:
            self._fail(e if isinstance(e, HttpError) else HttpError(f"bad response head: {e}"))
            return
        total = end + 4 + length
        if len(buf) < total:
            return
        body = bytes(buf[end + 4 : total])
        at = head.find(_SIGNATURE_HEADER)
        if at >= 0:
            stop = head.find(b"\r\n", at + 2)
            self.signature = head[at + len(_SIGNATURE_HEADER) : stop if stop > 0 else None].strip()
        else:
            self.signature = b""
        del buf[:total]
        if buf or b"\r\nconnection: close" in head:  # bytes beyond the answer: not reused
            self.closed = True
            buf.clear()
        self._answered(status, body)

    def _answered(self, status: int, body: bytes) -> None:
        """The pending request's answer is in: the connection goes back to its pool, the future is set."""
        pool = self.pool
        signer = pool.signer
        if signer is not None and not signer.answer_ok(self.tag, status, body, self.signature):
            self._fail(HttpError(f"{pool.host}:{pool.port} answered without the cluster's signature"))
            return
        fut, self.pending = self.pending, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.closed:
            pool._drop(self)
        else:
            self.idle_since = time.monotonic()
            pool._idle.append(self)
        if pool.observer is not None:
            pool.observer.ended(status)
        if fut is not None and not fut.done():
            fut.set_result((status, body))

    def _fail(self, exc: BaseException) -> None:
        """The pending request failed (``exc``; its future set to it): the connection is dropped."""
        fut, self.pending = self.pending, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.pool._drop(self)
        if fut is not None:
            if self.pool.observer is not None:
                self.pool.observer.failed()
            if not fut.done():
                fut.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.pending is not None:
            self._fail(HttpError(f"connection lost: {exc or 'closed by the server'}"))


class Observer(Protocol):
    """Told of every request a pool makes (a benchmark keeping the balance of requests in flight)."""

    def started(self) -> None: ...

    def ended(self, status: int) -> None: ...

    def failed(self) -> None: ...


class HttpPool:
    """Kept-alive connections to the origin of ``url``; ``headers`` go with every request, and with a
    ``signer`` every request is signed and every answer's signature checked (``transport.signing``).

    ``request`` starts a POST and returns the future of its answer, with no task when an idle connection
    is at hand (the load generator's way: a task per request costs more than the request); ``post`` is
    the same as a coroutine."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        observer: Observer | None = None,
        signer: Signer | None = None,
    ) -> None:
        self.observer = observer
        self.signer = signer
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: only http://host:port URLs")
        self.host, self.port = parts.hostname, parts.port or 80
        self._to = authority(url).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._fixed = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\n{extra}".encode()
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    def _idle_connection(self) -> _Connection | None:
        """A kept-alive connection ready for a request, if the pool holds one."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_REUSE:
                return conn
            self._drop(conn)  # the server closed it while idle, or is about to
        return None

    async def _connect(self, timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            # a deadline on the connect too (a listener whose accept queue is full drops SYNs: the kernel
            # retries for minutes); asyncio.timeout cancels this task, with no task of its own
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError as e:
            what = LocalError if e.errno in LOCAL_ERRNOS else HttpError
            raise what(f"cannot connect to {self.host}:{self.port}: {e.strerror or e}") from None
        self._open.add(conn)
        return conn

    def request(
        self, path: str, body: bytes, timeout: float | None = None
    ) -> asyncio.Future[tuple[int, bytes]]:
        """Start a POST of ``body`` (JSON) to ``path``: the future of (status, response body), or of
        HttpError or TimeoutError. ``timeout`` (wall seconds) bounds the whole request, a new connection
        included. A task runs it only when a new connection must be opened first."""
        conn = self._idle_connection()
        if conn is None:
            return asyncio.ensure_future(self.post(path, body, timeout))
        if self.observer is not None:
            self.observer.started()
        loop = asyncio.get_running_loop()
        return self._send(conn, path, body, None if timeout is None else loop.time() + timeout)

    async def post(self, path: str, body: bytes, timeout: float | None = None) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path``; (status, response body). HttpError or TimeoutError if not;
        ``timeout`` (wall seconds) bounds the whole request, a new connection included."""
        if self.observer is not None:
            self.observer.started()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        conn = self._idle_connection()
        if conn is None:
            try:
                conn = await self._connect(timeout)
            except (HttpError, TimeoutError):
                if self.observer is not None:
                    self.observer.failed()
                raise
        fut = self._send(conn, path, body, deadline)
        try:
            return await fut
        except asyncio.CancelledError:  # the request did not finish: the connection is in an unknown state
            if conn.pending is fut:
                conn._fail(HttpError("request cancelled"))
            raise

    def _send(
        self, conn: _Connection, path: str, body: bytes, deadline: float | None
    ) -> asyncio.Future[tuple[int, bytes]]:
        """Write the request on ``conn``; the future of its answer (``conn`` settles it)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        conn.pending = fut
        if conn.closed or conn.transport is None or conn.transport.is_closing():
            # the server closed it between the connect and now (a listener at its connection limit)
            conn._fail(HttpError(f"{self.host}:{self.port} closed the connection before the request"))
            return fut
        raw_path = path.encode()
        if self.signer is None:
            auth = b""
        else:
            value, conn.tag = self.signer.sign(b"POST", self._to, raw_path, body)
            auth = b"Authorization: %s\r\n" % value
        conn.transport.write(
            b"POST %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s"
            % (raw_path, self._fixed, auth, len(body), body)
        )
        if deadline is not None:
            conn.timer = loop.call_at(deadline, _expire, conn)
        return fut

    def _drop(self, conn: _Connection) -> None:
        conn.closed = True
        if conn.transport is not None:
            conn.transport.close()
        self._open.discard(conn)

    def close(self) -> None:
        for conn in list(self._open):
            self._drop(conn)
        self._idle.clear()


def _expire(conn: _Connection) -> None:
    conn.timer = None
    conn._fail(TimeoutError("no answer in time"))


class Peers:
    """One ``HttpPool`` per origin, made on first use; each signs with ``signer`` if one is given."""

    def __init__(self, headers: dict[str, str] | None = None, signer: Signer | None = None) -> None:
        self.headers = headers or {}
        self.signer = signer
        self._pools: dict[str, HttpPool] = {}

    def pool(self, origin: str) -> HttpPool:
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = HttpPool(origin, self.headers, signer=self.signer)
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
