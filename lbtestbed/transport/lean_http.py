"""A lean HTTP/1.1 server for the task path: an ``asyncio.Protocol`` on httptools (llhttp, the parser uvicorn
and aiohttp's own C parser use).

A task crosses two servers (the dispatcher's and the node host's). An aiohttp ``web.Application`` echo costs
its process about 65-85 µs of CPU a request on this kind of machine, a bare ``asyncio.Protocol`` echo 17 µs
and this server 30 µs (39 on a signed route); ``benchmarks/bench_lean_server.py`` measures all of them in one
run, with the instructions of each one's own code (a third of aiohttp's here). It serves a small route
table: exact paths, and paths with one integer segment (``/v1/nodes/{}/tasks``). A handler takes a
``Request`` (method, target, headers, the whole body, the peer) and returns a ``Response`` (status, body,
content type, extra headers), at once or from a coroutine: a task stays open until its node has served it
(synchronous completion), so many requests are in flight at once. Everything else (the admin routes,
``/metrics``) goes to an optional ``fallback``, an aiohttp ``web.Server``: a connection whose request matches
no route here is handed over to it whole, so one port serves both.

What it keeps of the protocol (docs/protocol.md, "The lean server of the task path"): keep-alive by default,
``Connection: close`` and HTTP/1.0 honoured, pipelined requests answered in order, every answer with a
Content-Length;
bodies up to ``wire.MAX_BODY`` (413), complete within ``wire.BODY_TIMEOUT`` of their head (408), chunked or
with a Content-Length, gzip or deflate inflated (the limit counts the inflated bytes); a head of at most
``MAX_HEAD`` bytes and ``MAX_HEADERS`` lines (431); connections without a request for ``IDLE_TIMEOUT`` closed.
A request the parser cannot frame (a bad Content-Length, Transfer-Encoding with Content-Length, a control or
non-ASCII byte in the target or a header) gets 400 and the connection closes; every such refusal is one log
line, never a traceback, and never a 500. A handler that raises is a bug of ours: 500 and one log line
naming where it raised. Routes of peers (``verifier``) check the request's signature before the handler and
sign its answer (``transport.signing``, as ``aiohttp_glue.signed`` does for aiohttp handlers).

Typical use (a process's shell)::

    routes = Routes()
    routes.post("/v1/tasks", host.post_task)
    routes.post("/v1/nodes/{}/tasks", host.post_node_task, verifier=host.verifier)
    server = LeanServer(routes, fallback=runner.server)   # runner: the aiohttp AppRunner of the rest
    await server.start("127.0.0.1", 8000, guard=guard)    # guard: transport.process.ConnectionGuard
    ...
    await server.close()   # stops listening, lets requests in flight finish (1 s), closes every connection

or, as the hosts do (``dispatcher.app``, ``server_node.app``), ``mount(routes, app)`` the task routes on the
process's aiohttp app (which then answers every route by itself, and carries them) and serve the app with
``transport.process.serve`` (a process) or ``start_serving`` (a test): the lean server in front, on one
port. A handler returns a ``Response`` or a ``wire.Reply``, at once, from a coroutine (a task runs it), or
as an ``asyncio.Future`` (answered from its done callback, without a task: the node host's tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import sys
import time
import traceback
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

import httptools
import orjson
from aiohttp import web

from lbtestbed.transport import aiohttp_glue, wire
from lbtestbed.transport.http import IDLE_TIMEOUT
from lbtestbed.transport.signing import AUTHORIZATION, SCHEME, SIGNATURE, Unauthorized, Verifier

#: bytes of a request head (request line and header lines) and header lines a request may have (431 beyond)
MAX_HEAD = 16 * 1024
MAX_HEADERS = 100
#: requests of one connection awaiting their answers before the server stops reading it (a client that
#: pipelines); beyond MAX_PIPELINED within one read the earlier ones are answered and the connection closed
PAUSE_PIPELINED = 16
MAX_PIPELINED = 256

#: refusals logged in a burst, and per second beyond it
LOG_BURST, LOG_RATE = 50, 10.0

JSON = b"application/json; charset=utf-8"
TEXT = b"text/plain; charset=utf-8"

log = logging.getLogger("lbtestbed.lean_http")

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES = {status: b"HTTP/1.1 %d %s\r\n" % (status, reason) for status, reason in _REASONS.items()}
_AUTH = AUTHORIZATION.lower().encode()
_SCHEME = SCHEME.encode() + b" "
_SIGNATURE = SIGNATURE.encode()
_SEGMENT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)?\}")
_INFLATE = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


class Response:
    """What a handler returns: status, body, content type and extra headers (name, value) pairs."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        content_type: bytes = JSON,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        if type(body) is not bytes:
            body = bytes(body)  # a bytearray or memoryview; a str is refused here, in its handler (500)
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = tuple(headers)


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(status, orjson.dumps(obj))


def error(status: int, message: str, field: str = "", **extra: Any) -> Response:
    """The protocol's JSON error (``wire.error_reply``'s very bytes, without aiohttp)."""
    return Response(status, json.dumps(wire.error_body(message, field, **extra)).encode())


def reply(r: wire.Reply) -> Response:
    """The answer of a ``wire.Reply``: compact (orjson) on the task path, else as ``json.dumps`` writes it
    (as ``aiohttp_glue.respond`` does)."""
    return Response(r.status, orjson.dumps(r.body) if r.compact else json.dumps(r.body).encode())


def _response(result: Any, request: Request, server: LeanServer) -> Response:
    """A handler's ``Response``, or the one of its ``wire.Reply``; anything else is a bug (500)."""
    kind = type(result)
    if kind is Response:
        return cast(Response, result)
    if kind is wire.Reply:
        return reply(result)
    return server._handler_failed(request, TypeError(f"handler returned {result!r}"))


def _plain(status: int) -> Response:
    """aiohttp's own plain-text answer for an unknown path or method, e.g. ``404: Not Found``."""
    return Response(status, b"%d: %s" % (status, _REASONS[status]), TEXT)


class Request:
    """One request as a handler sees it. ``target`` is the request target as sent (path and query: what a
    signature covers), ``path`` the part before any ``?``, ``param`` the digits of a route's integer
    segment (a string: a client may send thousands of digits), ``headers`` the header values by lowercase
    name (the first of repeated ones), ``peer`` the client's (host, port)."""

    __slots__ = ("body", "headers", "method", "param", "peer", "target")

    def __init__(
        self,
        method: str,
        target: str,
        param: str | None,
        headers: dict[bytes, bytes],
        body: bytes,
        peer: Any,
    ) -> None:
        self.method, self.target, self.param = method, target, param
        self.headers, self.body, self.peer = headers, body, peer

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def header(self, name: str) -> str | None:
        value = self.headers.get(name.lower().encode())
        return None if value is None else value.decode("latin-1")

    @property
    def charset(self) -> str | None:
        """The ``charset`` parameter of the Content-Type, if any."""
        raw = self.headers.get(b"content-type", b"")
        if b";" not in raw:  # no parameters (the usual case)
            return None
        for param in raw.decode("latin-1").split(";")[1:]:
            key, _, v = param.partition("=")
            if key.strip().lower() == "charset":
                return v.strip().strip('"') or None
        return None

    def json(self) -> Mapping[str, Any]:
        """The body as a JSON object, or ``wire.BadRequest`` naming what is wrong (``read_json``'s rule)."""
        return wire.decode_json(self.body, self.charset)


#: what a handler returns: a ``Response`` or a ``wire.Reply`` (encoded as ``reply`` does), at once, or from a
#: coroutine, or as the result of an ``asyncio.Future`` (answered by its done callback, without a task)
Answer = Response | wire.Reply
Handler = Callable[[Request], "Answer | Awaitable[Answer]"]


@dataclass(frozen=True)
class Route:
    handler: Handler
    verifier: Verifier | None


class Routes:
    """The route table: an exact path, or a path with one ``{}`` (or ``{name}``) standing for a segment of
    ASCII digits; the name is what the segment is called where the routes are mounted on an aiohttp app."""

    def __init__(self) -> None:
        self.exact: dict[bytes, dict[bytes, Route]] = {}
        #: (prefix, suffix, routes by method, the segment's name) of every path with an integer segment
        self.patterns: list[tuple[bytes, bytes, dict[bytes, Route], str]] = []

    def add(self, method: str, path: str, handler: Handler, *, verifier: Verifier | None = None) -> None:
        """Serve ``method`` on ``path`` with ``handler``; with a ``verifier`` only signed requests reach it
        (401 otherwise) and its answers are signed. A GET route answers HEAD too (without the body)."""
        segment = _SEGMENT.search(path)
        rest = path if segment is None else path[: segment.start()] + path[segment.end() :]
        if not path.startswith("/") or "{" in rest or "}" in rest:
            raise ValueError(f"{path!r}: a path with at most one {{}} or {{name}} (an integer segment)")
        if segment is not None:
            prefix, suffix = path[: segment.start()].encode(), path[segment.end() :].encode()
            found = [m for p, s, m, _ in self.patterns if (p, s) == (prefix, suffix)]
            methods = found[0] if found else {}
            if not found:
                self.patterns.append((prefix, suffix, methods, segment.group(1) or "param"))
        else:
            methods = self.exact.setdefault(path.encode(), {})
        if method.upper().encode() in methods:
            raise ValueError(f"{method} {path} has a route already")
        methods[method.upper().encode()] = Route(handler, verifier)

    def get(self, path: str, handler: Handler, *, verifier: Verifier | None = None) -> None:
        self.add("GET", path, handler, verifier=verifier)

    def post(self, path: str, handler: Handler, *, verifier: Verifier | None = None) -> None:
        self.add("POST", path, handler, verifier=verifier)

    def match(self, method: bytes, path: bytes) -> tuple[Route | None, bytes | None, dict[bytes, Route]]:
        """(the route, the integer segment, the path's routes by method): no route and no methods for an
        unknown path, no route but some methods for another method (405)."""
        methods = self.exact.get(path)
        param = None
        if methods is None:
            for prefix, suffix, candidates, _ in self.patterns:
                if path.startswith(prefix) and path.endswith(suffix):
                    middle = path[len(prefix) : len(path) - len(suffix)]
                    if middle.isdigit():  # ASCII digits only (bytes)
                        methods, param = candidates, middle
                        break
            else:
                return None, None, {}
        route = methods.get(method)
        if route is None and method == b"HEAD":
            route = methods.get(b"GET")
        return route, param, methods


#: the lean routes an aiohttp app carries (``mount``): a process serves them on the lean server
ROUTES = web.AppKey("lean_routes", Routes)


def mount(routes: Routes, app: web.Application) -> None:
    """Serve ``routes`` on the aiohttp ``app`` too, and attach them to it (``app[ROUTES]``), so that the app
    is the process's whole interface: ``transport.process`` serves its lean routes on the lean server and
    hands it the rest, and an app served by aiohttp alone still answers every route. On a connection
    handed over to the app (a client that asked for an admin route first, then for a task on the same
    connection) the same handlers run, with aiohttp's body checks and ``aiohttp_glue.signed``, and each
    answer closes its connection, so that the client's next request opens a new one, which the lean server
    serves. Call it before the app's runner is set up."""
    app[ROUTES] = routes
    for raw, methods in routes.exact.items():
        for method, route in methods.items():
            app.router.add_route(method.decode(), raw.decode(), _adapted(route, ""))
    for prefix, suffix, methods, name in routes.patterns:
        path = f"{prefix.decode()}{{{name}:[0-9]+}}{suffix.decode()}"
        for method, route in methods.items():
            app.router.add_route(method.decode(), path, _adapted(route, name))


def _adapted(route: Route, segment: str) -> aiohttp_glue.Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            body = await aiohttp_glue.read_body(request)
        except wire.BadRequest as e:
            return aiohttp_glue.error(e.status, str(e))
        headers: dict[bytes, bytes] = {}
        for name, value in request.raw_headers:
            headers.setdefault(name.lower(), value)
        lean = Request(
            request.method,
            request.raw_path,
            request.match_info.get(segment),
            headers,
            body,
            request.transport.get_extra_info("peername") if request.transport else None,
        )
        result = route.handler(lean)
        if type(result) is not Response and type(result) is not wire.Reply:
            result = await cast(Awaitable[Answer], result)
        answer = result if type(result) is Response else reply(cast(wire.Reply, result))
        response = web.Response(status=answer.status, body=answer.body, headers=dict(answer.headers))
        response.headers["Content-Type"] = answer.content_type.decode()
        response.force_close()
        return response

    return handle if route.verifier is None else aiohttp_glue.signed(route.verifier, handle)


@dataclass
class Stats:
    """What the server did, for its process's metrics. With a ConnectionGuard's counts (connections refused
    at the limit, silent ones shed) every connection a client opened is counted once."""

    connections: int = 0  # accepted (a ConnectionGuard counts those it refused or shed)
    requests: int = 0  # answered by a handler (including its 4xx and 5xx)
    refused: dict[int, int] = field(default_factory=dict)  # answered by the server itself, by status
    idle_closed: int = 0  # closed after IDLE_TIMEOUT without a request
    reset: int = 0  # the client left with a request unanswered or half-sent
    handed_over: int = 0  # given to the fallback
    errors: int = 0  # handlers that raised (500): bugs


def stats_metrics(role: str, stats: Stats) -> Iterator[Any]:
    """The lean server's counts as Prometheus families ``lbtestbed_<role>_http_*`` (a process's collector
    yields them beside ``metrics.listener_metrics``)."""
    from prometheus_client.core import CounterMetricFamily

    def counter(name: str, doc: str, value: int) -> Any:
        family = CounterMetricFamily(f"lbtestbed_{role}_http_{name}", doc)
        family.add_metric([], value)
        return family

    yield counter("connections", "Connections the lean server accepted", stats.connections)
    yield counter("requests", "Requests that reached a handler of the lean server", stats.requests)
    refused = CounterMetricFamily(
        f"lbtestbed_{role}_http_refused",
        "Requests the lean server answered itself: unknown path or method, unsigned, too large, too slow, "
        "malformed",
        labels=["status"],
    )
    for status, count in sorted(stats.refused.items()):
        refused.add_metric([str(status)], count)
    yield refused
    yield counter("idle_closed", "Connections closed after the idle timeout", stats.idle_closed)
    yield counter("resets", "Connections the client left with a request unanswered or half sent", stats.reset)
    yield counter("handed_over", "Connections handed to the aiohttp app (other routes)", stats.handed_over)
    yield counter("errors", "Requests answered 500: a handler raised (a bug)", stats.errors)


class _Refused(Exception):
    """A request the server answers itself (``status``), raised inside a parser callback."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _HandOver(Exception):
    """The request belongs to the fallback: stop parsing here."""


class _Slot:
    """One request's place in its connection's answers (they go out in the order the requests came)."""

    __slots__ = ("close", "done", "head", "http10", "response", "tag", "task", "verifier")

    def __init__(self, close: bool, head: bool) -> None:
        self.done = False
        self.response: Response | None = None  # None once done: close the connection without an answer
        self.close = close  # the connection closes after this answer
        self.head = head  # a HEAD request: the answer goes without its body
        self.http10 = False  # an HTTP/1.0 client that asked to keep the connection open
        self.tag = b""
        self.verifier: Verifier | None = None
        self.task: asyncio.Task[None] | None = None


if sys.version_info >= (3, 12):

    def _task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)

else:

    def _task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)


class _Connection(asyncio.Protocol):
    """One client connection: the parser's callbacks build the request, answers go out in order."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.queue: deque[_Slot] = deque()  # requests awaiting their answers, oldest first
        self.fallback: asyncio.Protocol | None = None
        self.idle_since = time.monotonic()
        self.body_since = 0.0  # when the current request's head was complete and its body was not
        self.broken = False  # refused a request it could not frame, or stopped reading: read no further
        self.write_paused = False
        self.reading_paused = False
        self.hand_over_pending = False
        self.in_message = self.in_head = False
        self.clean = True  # a request that begins in the current read begins at its first byte
        self.chunk = b""
        self.begun = 0  # requests begun on this connection
        self.head_chunks: list[bytes] | None = None  # the reads since the request began (for a hand-over)
        self._begin()

    def _begin(self) -> None:
        self.url = self.method = b""
        self.headers: dict[bytes, bytes] = {}
        self.head_size = self.head_fed = 0
        self.body: bytes | bytearray = b""
        self.body_size = 0
        self.inflater: Any = None
        self.route: Route | None = None
        self.param: bytes | None = None
        self.verdict: Response | None = None  # the answer decided from the head (404, 405, 401, 415)

    # ------------------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport
        self.peer = transport.get_extra_info("peername")
        self.server.connections.add(self)
        self.server.stats.connections += 1

    def data_received(self, data: bytes) -> None:
        if self.fallback is not None:
            self.fallback.data_received(data)
            return
        if self.broken:
            return
        if self.hand_over_pending:
            assert self.head_chunks is not None
            self.head_chunks.append(data)
            return
        self.clean = not self.in_message
        self.chunk = data
        was_in_head, begun, count = self.in_head, self.head_chunks, self.begun
        if was_in_head and begun is not None:
            begun.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._stop_reading()  # an Upgrade or CONNECT request: answered, and nothing more is read
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, _HandOver):
                self._hand_over()
            elif isinstance(cause, _Refused):
                self._refuse(cause.status, str(cause))
            else:  # a bug of ours in a callback
                self.broken = True
                slot = _Slot(True, False)
                self.queue.append(slot)
                self._answer(slot, self.server._handler_failed(None, cause or e))
        except httptools.HttpParserError as e:
            self._refuse(400, f"malformed request: {e}")
        else:
            if self.in_head and was_in_head and self.begun == count:  # the whole read was one head's
                # (llhttp holds a partial header line out of the callbacks' sight: count the reads)
                self.head_fed += len(data)
                if self.head_fed > MAX_HEAD:
                    self._refuse(431, f"request head larger than {MAX_HEAD} bytes")
            elif self.in_message and not self.in_head and not self.body_since:
                self.body_since = time.monotonic()

    def eof_received(self) -> bool | None:
        if self.fallback is not None:
            return self.fallback.eof_received()
        if self.queue:  # half-closed after its last request: answer it, then close
            self.queue[-1].close = True
            self.broken = True
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.fallback is not None:
            self.fallback.connection_lost(exc)
        elif self.queue or (self.in_message and not self.broken):
            self.server.stats.reset += 1
        self.transport = None
        self.queue.clear()
        self.server._forget(self)

    def pause_writing(self) -> None:
        if self.fallback is not None:
            self.fallback.pause_writing()
        else:
            self.write_paused = True
            self._update_reading()

    def resume_writing(self) -> None:
        if self.fallback is not None:
            self.fallback.resume_writing()
        else:
            self.write_paused = False
            self._update_reading()

    # ------------------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self.begun += 1
        self.in_message = self.in_head = True
        # the reads of a request that may go to the fallback: all of them from its first byte, if known
        self.head_chunks = [self.chunk] if self.clean and self.server.fallback is not None else None
        self._begin()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_size += len(url)
        if self.head_size > MAX_HEAD:
            raise _Refused(431, f"request head larger than {MAX_HEAD} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self.headers
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD or len(headers) >= MAX_HEADERS:  # (repeated names count in the size)
            raise _Refused(431, f"request head larger than {MAX_HEAD} bytes or {MAX_HEADERS} header lines")
        name = name.lower()
        if not value.isascii() and name != _AUTH:  # the signature check refuses a bad Authorization (401)
            raise _Refused(400, f"non-ASCII byte in header {name.decode()}")
        if name not in headers:
            headers[name] = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        url = self.url
        if not url.isascii():  # llhttp refuses these already; a second guard costs nothing
            raise _Refused(400, "non-ASCII byte in the request target")
        end = url.find(b"?")
        path = url if end < 0 else url[:end]
        method = self.method = self.parser.get_method()
        routes = self.server.routes
        methods = routes.exact.get(path)  # the usual case, without a call
        route = methods.get(method) if methods is not None else None
        if route is None:
            route, self.param, methods = routes.match(method, path)
        self.route = route
        if route is None:
            if methods:
                allowed = {*methods, b"HEAD"} if b"GET" in methods else set(methods)
                answer = _plain(405)
                answer.headers = (("Allow", ",".join(sorted(m.decode() for m in allowed))),)
                self.verdict = answer
            elif self.server.fallback is not None:
                raise _HandOver()
            else:
                self.verdict = _plain(404)
        elif route.verifier is not None and not self.headers.get(_AUTH, b"").startswith(_SCHEME):
            route.verifier.refused += 1
            self.verdict = error(401, "missing signature (Authorization: LBT-MAC sender:counter:time:mac)")
        self._check_body_head()

    def _check_body_head(self) -> None:
        """The body's framing, from the head: its declared size (413), its coding (415), Expect."""
        headers = self.headers
        coding = headers.get(b"content-encoding")
        if coding is not None and self.verdict is None:
            coding = coding.strip().lower()
            if coding in _INFLATE:
                self.inflater = zlib.decompressobj(_INFLATE[coding])
            elif coding != b"identity":
                self.verdict = error(415, f"unsupported Content-Encoding {coding.decode()!r}")
        length = headers.get(b"content-length")
        if length is not None and int(length) > self.server.max_body:  # llhttp checked it is digits
            raise _Refused(self.verdict.status if self.verdict else 413, self._too_large())
        expect = headers.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue" and not self.queue:
            if self.verdict is not None:  # the client need not send the body: answer now and close
                raise _Refused(self.verdict.status, "")
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _too_large(self) -> str:
        return f"body larger than {self.server.max_body} bytes"

    def on_body(self, data: bytes) -> None:
        if self.inflater is not None:
            try:
                data = self.inflater.decompress(data, self.server.max_body + 1 - self.body_size)
            except zlib.error:
                raise _Refused(400, "body could not be read: it does not inflate") from None
        size = self.body_size = self.body_size + len(data)
        if size > self.server.max_body or (self.inflater is not None and self.inflater.unconsumed_tail):
            raise _Refused(self.verdict.status if self.verdict else 413, self._too_large())
        if self.verdict is not None:
            return  # refused already: read and dropped
        body = self.body
        if not body:
            self.body = data
        elif type(body) is bytes:
            self.body = bytearray(body) + data
        else:
            cast(bytearray, body).extend(data)

    def on_message_complete(self) -> None:
        self.in_message = False
        self.clean = False  # a request after this one in the same read begins inside it
        self.head_chunks = None
        self.body_since = 0.0
        parser = self.parser
        keep_alive = parser.should_keep_alive()
        slot = _Slot(not keep_alive or self.server.closing, self.method == b"HEAD")
        # an HTTP/1.0 client keeps the connection only if it asked to (Connection: keep-alive): say we do
        slot.http10 = keep_alive and b"connection" in self.headers and parser.get_http_version() == "1.0"
        self.queue.append(slot)
        if self.verdict is not None:
            self.server._count(self.verdict.status)
            self._answer(slot, self.verdict)
        else:
            self._dispatch(slot)
        if len(self.queue) >= PAUSE_PIPELINED:
            self._update_reading()
            if len(self.queue) >= MAX_PIPELINED:  # all in one read: answer these, then close
                slot.close = True
                self.broken = True
                raise _Refused(0, "")

    # ------------------------------------------------------------------------------ requests and answers

    def _dispatch(self, slot: _Slot) -> None:
        """Run the request's handler, after its signature check and inflation."""
        route = self.route
        assert route is not None
        body = self.body
        if self.inflater is not None:
            try:
                body = bytes(body) + self.inflater.flush()
            except zlib.error:
                self._answer(slot, self._server_refusal(400, "body could not be read: it does not inflate"))
                return
            if not self.inflater.eof:
                self._answer(slot, self._server_refusal(400, "body could not be read: it ends early"))
                return
        elif type(body) is not bytes:
            body = bytes(body)
        url = self.url.decode()
        method = self.method.decode()
        if route.verifier is not None:
            value = self.headers[_AUTH].decode("latin-1")  # the verifier refuses non-ASCII ones
            host = self.headers.get(b"host", b"").decode("latin-1")
            try:
                slot.tag = route.verifier.verify(method, url, value, body, host)
            except Unauthorized as e:
                self._answer(slot, error(401, str(e)))
                return
            slot.verifier = route.verifier
        request = Request(
            method,
            url,
            None if self.param is None else self.param.decode(),
            self.headers,
            body,
            self.peer,
        )
        self.server.stats.requests += 1
        self._handle(slot, route, request)

    def _handle(self, slot: _Slot, route: Route, request: Request) -> None:
        """Run the handler: its answer now, or when its future is done, or its coroutine returns."""
        server = self.server
        try:
            result = route.handler(request)
        except Exception as e:
            self._answer(slot, server._handler_failed(request, e))
            return
        kind = type(result)
        if kind is Response or kind is wire.Reply:
            self._answer(slot, _response(result, request, server))
        elif isinstance(result, asyncio.Future):  # answered by its done callback: no task at all
            server.tasks.add(result)
            result.add_done_callback(functools.partial(self._settled, slot, request))
        else:
            # the coroutine that awaits the handler answers as the handler returns (a done callback would
            # cost one more turn of the loop); Python 3.12 runs it eagerly, up to the handler's first wait
            task = _task(self._run(slot, request, cast(Awaitable[Answer], result)))
            slot.task = task
            if not task.done():
                server.tasks.add(task)

    async def _run(self, slot: _Slot, request: Request, handler: Awaitable[Answer]) -> None:
        try:
            result = await handler
        except asyncio.CancelledError:  # the server is closing: no answer
            self._answer(slot, None)
            raise
        except Exception as e:
            result = self.server._handler_failed(request, e)
        finally:
            self.server.tasks.discard(slot.task)
        self._answer(slot, _response(result, request, self.server))

    def _settled(self, slot: _Slot, request: Request, future: asyncio.Future[Answer]) -> None:
        """A handler's future is done: its answer (none if it was cancelled: the server is closing)."""
        self.server.tasks.discard(future)
        if future.cancelled():
            self._answer(slot, None)
            return
        failed = future.exception()
        if failed is not None:
            self._answer(slot, self.server._handler_failed(request, failed))
            return
        self._answer(slot, _response(future.result(), request, self.server))

    def _answer(self, slot: _Slot, response: Response | None) -> None:
        """Give ``slot`` its answer (None: close without one) and send what is ready, in order."""
        slot.done, slot.response = True, response
        queue = self.queue
        while queue and queue[0].done:
            ready = queue.popleft()
            transport = self.transport
            if transport is None:
                continue
            if ready.response is not None:
                transport.write(self.server._encode(ready, ready.response))
            if ready.close or ready.response is None:
                transport.close()
                self.transport = None
        if not queue:
            self.idle_since = time.monotonic()
            if self.hand_over_pending:
                self._hand_over()
        if self.reading_paused:
            self._update_reading()

    def _refuse(self, status: int, message: str) -> None:
        """The server's own answer to a request it could not take (after the earlier ones), then close."""
        self.broken = True
        if status == 0:  # the pipelining limit: the earlier requests are answered, then the connection closes
            if self.queue:
                self.queue[-1].close = True
            elif self.transport is not None:
                self.transport.close()
            return
        slot = _Slot(True, False)
        self.queue.append(slot)
        if not message:  # answering a refusal decided from the head (Expect: 100-continue)
            assert self.verdict is not None
            self.server._count(self.verdict.status)
            self._answer(slot, self.verdict)
            return
        if self.verdict is not None and status == self.verdict.status:  # refused from its head already
            self.server._count(status)
            self._answer(slot, self.verdict)
        else:
            self._answer(slot, self._server_refusal(status, message))

    def _server_refusal(self, status: int, message: str) -> Response:
        self.server._count(status)
        self.server._log_refusal(status, message, self.peer)
        return error(status, message)

    def _stop_reading(self) -> None:
        self.broken = True
        if self.queue:
            self.queue[-1].close = True
        elif self.transport is not None:
            self.transport.close()

    def _update_reading(self) -> None:
        if self.transport is None:
            return
        pause = self.write_paused or self.hand_over_pending or len(self.queue) >= PAUSE_PIPELINED
        if pause != self.reading_paused:
            self.reading_paused = pause
            (self.transport.pause_reading if pause else self.transport.resume_reading)()

    def _hand_over(self) -> None:
        """Give the connection to the fallback, from the start of the request that is not ours."""
        if self.head_chunks is None:  # it began inside a read after another request: where is unknown
            self._stop_reading()  # the earlier ones are answered, then the connection closes (RFC 9112 9.3.2)
            return
        if self.queue:  # answers of ours still due: hand over when they are sent
            self.hand_over_pending = True
            self._update_reading()
            return
        server, transport = self.server, self.transport
        assert server.fallback is not None and transport is not None
        data = b"".join(self.head_chunks).lstrip(b"\r\n")
        self.head_chunks = None
        self.hand_over_pending = False
        self.fallback = server.fallback()
        server.stats.handed_over += 1
        self.fallback.connection_made(transport)
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        self.fallback.data_received(data)

    # ------------------------------------------------------------------------------ timeouts and closing

    def check(self, now: float) -> None:
        """The server's sweep: a body too slow gets 408, a connection idle too long is closed."""
        if self.fallback is not None or self.transport is None or self.broken:
            return
        server = self.server
        if self.body_since and now - self.body_since > server.body_timeout:
            self._refuse(408, f"body not complete within {server.body_timeout:g} s")
        elif self._idle() and now - self.idle_since > server.idle_timeout:
            server.stats.idle_closed += 1
            self.transport.close()
            self.transport = None

    def _idle(self) -> bool:
        """No answer due and no body on its way (a head may be: a client that never completes one)."""
        return not self.queue and not (self.in_message and not self.in_head)

    def shut(self) -> None:
        """The server closes: an idle connection now, a busy one after its last answer."""
        if self.fallback is not None:
            return
        if self.queue:
            self.queue[-1].close = True
            self.broken = True
        elif self.transport is not None:
            self.transport.close()
            self.transport = None

    def abort(self) -> None:
        if self.transport is not None:  # also a handed-over connection's
            self.transport.abort()


class LeanServer:
    """Serves ``routes`` on the connections its listener accepts; ``fallback`` (a protocol factory such as
    aiohttp's ``web.Server``) takes the connections whose request matches no route. The timeouts and the
    body limit default to the protocol's (a test may shorten them); ``stats`` (default: new ones) is where
    it counts what it did (a host passes its own, to export them)."""

    def __init__(
        self,
        routes: Routes,
        fallback: Callable[[], asyncio.Protocol] | None = None,
        *,
        max_body: int = wire.MAX_BODY,
        body_timeout: float = wire.BODY_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        stats: Stats | None = None,
    ) -> None:
        self.routes = routes
        self.fallback = fallback
        self.max_body, self.body_timeout, self.idle_timeout = max_body, body_timeout, idle_timeout
        self.stats = stats if stats is not None else Stats()
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Future[Any]] = set()  # handlers' tasks and futures not done yet
        self.closing = False
        self.listener: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._all_closed: asyncio.Event | None = None
        self._date = formatdate(usegmt=True).encode()
        self._logged, self._unlogged, self._log_tokens = 0.0, 0, float(LOG_BURST)

    def __call__(self) -> asyncio.Protocol:
        """A protocol for a new connection (``loop.create_server``'s factory, or a ConnectionGuard's)."""
        if self._sweeper is None:
            self._sweep()
        return _Connection(self)

    async def start(self, host: str, port: int, guard: Any = None, backlog: int = 4096) -> asyncio.Server:
        """Listen on ``host:port`` (0: any free port); ``guard``, a ``transport.process.ConnectionGuard``,
        caps the connections (it makes them with this server). Returns the listener."""
        factory: Callable[[], asyncio.Protocol] = self
        if guard is not None:
            guard.server = self
            factory = guard
        loop = asyncio.get_running_loop()
        self.listener = await loop.create_server(factory, host, port, backlog=backlog, reuse_address=True)
        return self.listener

    @property
    def port(self) -> int:
        assert self.listener is not None
        return int(self.listener.sockets[0].getsockname()[1])

    async def close(self, grace: float = 1.0) -> None:
        """Stop listening, close idle connections, give requests in flight ``grace`` seconds to be answered,
        then cancel their handlers and close every connection (handed-over ones included)."""
        self.closing = True
        if self.listener is not None:
            self.listener.close()
        self._all_closed = asyncio.Event()
        for conn in list(self.connections):
            conn.shut()
        fallbacks = [c.fallback for c in self.connections if c.fallback is not None]
        shutdowns = [p.shutdown(grace) for p in fallbacks if hasattr(p, "shutdown")]  # aiohttp's handlers
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.gather(*shutdowns, return_exceptions=True)
                if self.connections:
                    await self._all_closed.wait()
        for task in list(self.tasks):
            task.cancel()
        for conn in list(self.connections):
            conn.abort()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                if self.connections:
                    await self._all_closed.wait()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.listener is not None:
            await self.listener.wait_closed()

    def _forget(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()

    def _sweep(self) -> None:
        now = time.monotonic()
        self._date = formatdate(usegmt=True).encode()
        for conn in list(self.connections):
            conn.check(now)
        interval = min(1.0, max(0.05, min(self.idle_timeout, self.body_timeout) / 10))
        self._sweeper = asyncio.get_running_loop().call_later(interval, self._sweep)

    def _encode(self, slot: _Slot, r: Response) -> bytes:
        extra = b""
        if slot.verifier is not None:
            extra = b"%s: %s\r\n" % (_SIGNATURE, slot.verifier.sign(slot.tag, r.status, r.body).encode())
        if r.headers:
            extra += b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in r.headers)
        if slot.close:
            extra += b"Connection: close\r\n"
        elif slot.http10:
            extra += b"Connection: keep-alive\r\n"
        line = _STATUS_LINES.get(r.status) or b"HTTP/1.1 %d Unknown\r\n" % r.status
        head = b"%sContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s\r\n" % (
            line,
            r.content_type,
            len(r.body),
            self._date,
            extra,
        )
        return head if slot.head else head + r.body

    def _count(self, status: int) -> None:
        self.stats.refused[status] = self.stats.refused.get(status, 0) + 1

    def _log_refusal(self, status: int, message: str, peer: Any) -> None:
        """One line per refusal; beyond a burst of LOG_BURST, LOG_RATE lines a second (the rest are counted
        into the next line), so that a flood of bad requests cannot flood the log."""
        now = time.monotonic()
        self._log_tokens = min(LOG_BURST, self._log_tokens + (now - self._logged) * LOG_RATE)
        self._logged = now
        if self._log_tokens < 1:
            self._unlogged += 1
            return
        self._log_tokens -= 1
        more = f" ({self._unlogged} more not logged)" if self._unlogged else ""
        log.warning("%d to %s: %s%s", status, _peer(peer), message, more)
        self._unlogged = 0

    def _handler_failed(self, request: Request | None, exc: BaseException) -> Response:
        """A handler (or this server) raised: a bug of ours. 500, and one line naming the exception and
        where it was raised."""
        self.stats.errors += 1
        tb = traceback.extract_tb(exc.__traceback__)
        frames = [f for f in tb if f.filename != __file__] or list(tb)  # the handler's, not ours
        where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        what = f"{request.method} {request.path}" if request is not None else "a request"
        log.error("500 on %s: %s: %s%s", what, type(exc).__name__, exc, where)
        return error(500, "internal error")


def _peer(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
