"""The lean HTTP/1.1 server of the task path (lbtestbed/transport/lean_http.py), on real sockets on 127.0.0.1.

The server runs on uvloop in a thread of its own (``Served``), so that the tests can speak to it with plain
blocking sockets (hand-made bytes, malformed on purpose) and with the project's own client (``HttpPool``) in
an event loop of their own. Timeouts are shortened per server where a test waits for one; no test asserts
how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import pytest
import uvloop
from aiohttp import web
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lbtestbed.cluster.processes import free_ports
from lbtestbed.transport import aiohttp_glue, wire
from lbtestbed.transport.http import HttpError, HttpPool
from lbtestbed.transport.lean_http import (
    MAX_HEAD,
    MAX_HEADERS,
    LeanServer,
    Request,
    Response,
    Routes,
    json_response,
    mount,
    stats_metrics,
)
from lbtestbed.transport.process import ConnectionGuard
from lbtestbed.transport.signing import Signer, Verifier

KEY = "k" * 32
T = TypeVar("T")

# ============================================================================================ the server


class Served:
    """A ``LeanServer`` on its own uvloop in a thread; ``url`` and ``port`` once entered. ``app``, if given,
    is the aiohttp fallback (the lean routes mounted on it, as a process's shell does)."""

    def __init__(self, routes: Routes, app: web.Application | None = None, **options: Any) -> None:
        self.routes, self.app, self.options = routes, app, options
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.server: LeanServer

    def __enter__(self) -> Served:
        self.thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        fallback = None
        if self.app is not None:
            mount(self.routes, self.app)
            self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
            await self.runner.setup()
            fallback = self.runner.server
        guard = self.options.pop("guard", None)
        self.server = LeanServer(self.routes, fallback, **self.options)
        await self.server.start("127.0.0.1", 0, guard=guard)

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    async def close(self, grace: float = 1.0) -> None:
        await self.server.close(grace)
        if self.runner is not None:
            await self.runner.cleanup()

    def call(self, coro: Awaitable[T], timeout: float = 10.0) -> T:
        """Run ``coro`` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def soon(self, fn: Callable[[], object]) -> None:
        self.loop.call_soon_threadsafe(fn)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Gate:
    """Requests to ``/slow`` wait here until the test opens it (from the test's thread)."""

    def __init__(self) -> None:
        self.event: asyncio.Event | None = None
        self.waiting = 0

    async def wait(self) -> None:
        if self.event is None:
            self.event = asyncio.Event()
        self.waiting += 1
        await self.event.wait()


def make_routes(verifier: Verifier | None = None, gate: Gate | None = None) -> Routes:
    routes = Routes()

    async def echo(request: Request) -> Response:
        return Response(200, request.body)

    def length(request: Request) -> Response:  # a handler that is not a coroutine
        return json_response({"length": len(request.body)})

    async def info(request: Request) -> Response:
        return json_response(
            {"method": request.method, "target": request.target, "path": request.path, "param": request.param}
        )

    async def slow(request: Request) -> Response:
        assert gate is not None
        await gate.wait()
        return Response(200, request.body)

    async def boom(request: Request) -> Response:
        raise ValueError("a bug in a handler")

    def sync_boom(request: Request) -> Response:
        raise KeyError("a bug in a plain handler")

    async def not_a_response(request: Request) -> Response:
        return "OK"  # type: ignore[return-value]

    async def text_body(request: Request) -> Response:
        return Response(200, "OK")  # type: ignore[arg-type]

    async def parsed(request: Request) -> Response:
        try:
            return json_response(request.json())
        except wire.BadRequest as e:
            return Response(e.status, str(e).encode())

    routes.post("/echo", echo)
    routes.post("/length", length)
    routes.get("/info", info)
    routes.post("/v1/nodes/{}/tasks", info)
    routes.post("/slow", slow)
    routes.post("/boom", boom)
    routes.post("/sync-boom", sync_boom)
    routes.post("/not-a-response", not_a_response)
    routes.post("/text-body", text_body)
    routes.post("/json", parsed)
    if verifier is not None:
        routes.post("/v1/nodes/{}/probe", info, verifier=verifier)
        routes.post("/signed-echo", echo, verifier=verifier)
    return routes


@contextlib.contextmanager
def served(verifier: Verifier | None = None, gate: Gate | None = None, **options: Any) -> Iterator[Served]:
    with Served(make_routes(verifier, gate), **options) as s:
        yield s


def wait_for(condition: Callable[[], bool], what: str, patience: float = 5.0) -> None:
    """Wait until ``condition`` holds (it is the server thread's doing); fail after ``patience`` seconds."""
    for _ in range(int(patience / 0.01)):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"waited {patience} s for {what}")


# ============================================================================================ raw sockets


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


def parse_answers(data: bytes) -> tuple[list[Answer], bytes]:
    """The complete answers at the start of ``data`` (each must have a Content-Length, but a 1xx), and the
    bytes left."""
    out = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return out, data
        lines = data[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        assert lines[0].startswith("HTTP/1.1 "), lines[0]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            out.append(Answer(status, headers, b""))
            data = data[end + 4 :]
            continue
        assert "content-length" in headers, lines
        length = int(headers["content-length"])
        if len(data) < end + 4 + length:
            return out, data
        out.append(Answer(status, headers, data[end + 4 : end + 4 + length]))
        data = data[end + 4 + length :]


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_answers(sock: socket.socket, count: int) -> list[Answer]:
    """Read until ``count`` complete answers have come (TimeoutError if they do not)."""
    data = b""
    while True:
        answers, _ = parse_answers(data)
        if len(answers) >= count:
            return answers
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed after {len(answers)} of {count} answers: {data[:300]!r}")
        data += chunk


def read_to_eof(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (a timeout fails the test)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def exchange(port: int, data: bytes, half_close: bool = False) -> tuple[list[Answer], bytes]:
    """Send ``data`` on a new connection and read until the server closes it: the answers and what is left."""
    with connect(port) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return parse_answers(read_to_eof(s))


def post(path: str, body: bytes, *headers: str, version: str = "1.1") -> bytes:
    extra = "".join(h + "\r\n" for h in headers)
    head = f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def chunked(body: bytes, size: int) -> bytes:
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def lean_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "lbtestbed.lean_http"]


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for r in caplog.records:
        assert r.exc_info is None and "Traceback" not in r.getMessage(), r.getMessage()


# ============================================================================ keep-alive, ordering, client


def test_the_projects_client_reuses_one_connection_for_sequential_requests() -> None:
    """HttpPool's requests, one after the other: every answer is the request's own body, over one kept-alive
    connection; a plain (not coroutine) handler answers the same way."""

    async def client(url: str) -> list[tuple[int, bytes]]:
        pool = HttpPool(url)
        try:
            out = [await pool.post("/echo", b'{"n": %d}' % i) for i in range(20)]
            out.append(await pool.post("/length", b"12345"))
            return out
        finally:
            pool.close()

    with served() as s:
        answers = asyncio.run(client(s.url))
        assert answers[:20] == [(200, b'{"n": %d}' % i) for i in range(20)]
        assert answers[20] == (200, b'{"length":5}')
        assert s.server.stats.connections == 1
        assert s.server.stats.requests == 21


def test_requests_in_flight_together_are_each_answered_on_their_own_connection() -> None:
    """50 requests held by their handler at once (synchronous completion): the pool opens a connection
    for each; when the gate opens each gets its own body back."""
    gate = Gate()

    async def client(s: Served) -> list[tuple[int, bytes]]:
        pool = HttpPool(s.url)
        try:
            sent = [asyncio.ensure_future(pool.post("/slow", b"%d" % i, timeout=10)) for i in range(50)]
            for _ in range(500):
                if gate.waiting >= 50:
                    break
                await asyncio.sleep(0.01)
            assert not any(f.done() for f in sent)
            s.soon(lambda: gate.event.set() if gate.event else None)
            return list(await asyncio.gather(*sent))
        finally:
            pool.close()

    with served(gate=gate) as s:
        assert asyncio.run(client(s)) == [(200, b"%d" % i) for i in range(50)]
        assert s.server.stats.connections == 50


def test_pipelined_requests_are_answered_in_the_order_they_came() -> None:
    """Three requests in one write, the first held by its handler: the quick ones wait for it, and the
    answers come in the order of the requests."""
    gate = Gate()
    with served(gate=gate) as s, connect(s.port) as sock:
        sock.sendall(post("/slow", b"first") + post("/echo", b"second") + post("/length", b"third"))
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):  # the second is ready, but may not overtake the first
            sock.recv(1)
        sock.settimeout(5)
        s.soon(lambda: gate.event.set() if gate.event else None)
        answers = read_answers(sock, 3)
    assert [a.body for a in answers] == [b"first", b"second", b'{"length":5}']


@pytest.mark.parametrize(
    ("version", "connection", "stays_open", "says"),
    [
        ("1.1", None, True, None),
        ("1.1", "close", False, "close"),
        ("1.0", None, False, "close"),
        ("1.0", "keep-alive", True, "keep-alive"),
    ],
)
def test_connection_header_and_http_version(
    version: str, connection: str | None, stays_open: bool, says: str | None
) -> None:
    """HTTP/1.1 keeps the connection open unless the client says ``close``; HTTP/1.0 closes it unless the
    client asks for ``keep-alive``, and the answer says which."""
    headers = [f"Connection: {connection}"] if connection else []
    with served() as s, connect(s.port) as sock:
        sock.sendall(post("/echo", b"{}", *headers, version=version))
        (answer,) = read_answers(sock, 1)
        assert answer.headers.get("connection") == says
        if stays_open:
            sock.sendall(post("/echo", b"[]", *headers, version=version))
            assert read_answers(sock, 1)[0].body == b"[]"
        else:
            assert sock.recv(1) == b""


def test_routes_params_404_405_and_head() -> None:
    """An integer segment reaches the handler as its digits (any number of them); a segment that is not
    ASCII digits matches no route (aiohttp's plain-text 404); another method on a known path gets
    aiohttp's 405 with Allow; HEAD on a GET route has the GET answer's length and no body."""
    digits = "9" * 5000
    with served() as s:
        for segment in ("0", "17", digits):
            (a,), _ = exchange(s.port, post(f"/v1/nodes/{segment}/tasks?x=1", b"", "Connection: close"))
            assert a.status == 200 and wire.decode_json(a.body) == {
                "method": "POST",
                "target": f"/v1/nodes/{segment}/tasks?x=1",
                "path": f"/v1/nodes/{segment}/tasks",
                "param": segment,
            }
        for segment in ("-1", "1e0", "0x1", "%31", "", "1%2F0", "0.5", "\u0663".encode().decode("latin-1")):
            request = f"POST /v1/nodes/{segment}/tasks HTTP/1.1\r\nConnection: close\r\n\r\n"
            answers, _ = exchange(s.port, request.encode("latin-1"))
            assert [a.status for a in answers] in ([404], [400]), segment  # non-ASCII: 400
            if answers[0].status == 404:
                assert answers[0].body == b"404: Not Found"
                assert answers[0].headers["content-type"].startswith("text/plain")
        (a,), _ = exchange(s.port, b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert (a.status, a.body, a.headers["allow"]) == (405, b"405: Method Not Allowed", "POST")
        (a,), _ = exchange(s.port, post("/info", b"", "Connection: close"))
        assert (a.status, a.headers["allow"]) == (405, "GET,HEAD")
        (get,), _ = exchange(s.port, b"GET /info HTTP/1.1\r\nConnection: close\r\n\r\n")
        with connect(s.port) as sock:
            sock.sendall(b"HEAD /info HTTP/1.1\r\nConnection: close\r\n\r\n")
            head = read_to_eof(sock)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n"), head
        as_head = get.body.replace(b'"GET"', b'"HEAD"')  # the handler names the method
        assert b"\r\nContent-Length: %d\r\n" % len(as_head) in head


def test_every_route_answers_with_a_content_length_and_a_date() -> None:
    """The lean client reads answers by their Content-Length: every answer has one (the client's own
    parser checks too), and a Date (RFC 9110, 6.6.1)."""
    requests = [post("/echo", b"x" * 1000), b"GET /info HTTP/1.1\r\n\r\n", post("/nowhere", b"")]
    requests += [post("/boom", b""), b"DELETE /echo HTTP/1.1\r\n\r\n", post("/json", b"[")]
    with served() as s, connect(s.port) as sock:
        sock.sendall(b"".join(requests))
        answers = read_answers(sock, len(requests))
    assert [a.status for a in answers] == [200, 200, 404, 500, 405, 400]
    assert all("date" in a.headers for a in answers)


# ================================================================================================ limits


def test_a_body_of_the_limit_is_read_and_one_byte_more_is_413() -> None:
    """MAX_BODY bytes are served; MAX_BODY + 1 get 413 with the protocol's JSON error, declared by a
    Content-Length or sent chunked, and the connection closes; a gzip body that inflates beyond the limit
    is measured inflated."""
    limit = wire.MAX_BODY
    with served() as s:
        (a,), _ = exchange(s.port, post("/length", b"x" * limit, "Connection: close"))
        assert a.status == 200 and a.body == b'{"length":%d}' % limit
        over = b'{"error": "body larger than 65536 bytes"}'
        answers, _ = exchange(s.port, post("/length", b"x" * (limit + 1)))
        assert [(a.status, a.body) for a in answers] == [(413, over)]
        head = b"POST /length HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        answers, _ = exchange(s.port, head + chunked(b"x" * (limit + 1), 4096))
        assert [(a.status, a.body) for a in answers] == [(413, over)]
        bomb = gzip.compress(b"x" * (10 * limit))
        assert len(bomb) < limit
        answers, _ = exchange(s.port, post("/length", bomb, "Content-Encoding: gzip"))
        assert [(a.status, a.body) for a in answers] == [(413, over)]
        assert s.server.stats.refused == {413: 3}


def test_bodies_are_inflated_and_dechunked() -> None:
    """gzip and deflate bodies reach the handler inflated, a chunked body whole (here one byte a chunk);
    a body that does not inflate gets 400 and an unknown coding 415."""
    body = b'{"work": 2.5, "pad": "' + b"y" * 3000 + b'"}'
    head = b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    with served() as s, connect(s.port) as sock:
        sock.sendall(post("/echo", gzip.compress(body), "Content-Encoding: gzip"))
        sock.sendall(post("/echo", zlib.compress(body), "Content-Encoding: deflate"))
        sock.sendall(head + chunked(body[:50], 1))
        sock.sendall(post("/echo", body, "Content-Encoding: identity"))
        assert [a.body for a in read_answers(sock, 4)] == [body, body, body[:50], body]
    with served() as s:
        (a,), _ = exchange(s.port, post("/echo", b"not gzip at all", "Content-Encoding: gzip"))
        assert a.status == 400 and b"does not inflate" in a.body
        cut = gzip.compress(body)[:-12]
        (a,), _ = exchange(s.port, post("/echo", cut, "Content-Encoding: gzip", "Connection: close"))
        assert a.status == 400 and b"ends early" in a.body
        (a,), _ = exchange(s.port, post("/echo", body, "Content-Encoding: br", "Connection: close"))
        assert a.status == 415


def test_the_body_is_read_in_its_charset() -> None:
    """Request.json reads the body as its Content-Type's charset says, as wire.read_json does."""
    with served() as s, connect(s.port) as sock:
        sock.sendall(
            post("/json", '{"a": "é"}'.encode("latin-1"), "Content-Type: text/json; charset=latin-1")
        )
        sock.sendall(post("/json", b'{"a": 1}', "Content-Type: application/json; charset=nonsense"))
        sock.sendall(post("/json", '{"a": "é"}'.encode("latin-1")))  # not UTF-8
        a, b, c = read_answers(sock, 3)
    assert (a.status, wire.decode_json(a.body)) == (200, {"a": "é"})
    assert (b.status, b.body) == (400, b"unknown charset 'nonsense'")
    assert (c.status, c.body) == (400, b"body is not valid JSON")


def test_a_body_too_slow_gets_408_and_the_connection_closes(caplog: pytest.LogCaptureFixture) -> None:
    """Headers and part of a body, then nothing: 408 once the body timeout has passed (counted, one log
    line); a body that arrives a byte at a time within it is read as usual."""
    with served(body_timeout=0.3) as s:
        with connect(s.port) as sock:
            sock.sendall(b'POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"work"')
            answers, rest = parse_answers(read_to_eof(sock))
        assert [a.status for a in answers] == [408] and rest == b""
        assert b"not complete within 0.3 s" in answers[0].body
        assert s.server.stats.refused == {408: 1}
        with connect(s.port) as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\n")
            for byte in b"hello":
                sock.sendall(bytes([byte]))
            assert read_answers(sock, 1)[0].body == b"hello"
    assert len([r for r in lean_records(caplog) if "408" in r.getMessage()]) == 1


def test_idle_connections_are_closed_and_counted() -> None:
    """A connection that sends nothing, one that sends half a head and one kept alive after its request
    are all closed once idle for the idle timeout; each is counted."""
    with served(idle_timeout=0.3) as s:
        with connect(s.port) as silent, connect(s.port) as half, connect(s.port) as kept:
            half.sendall(b"POST /echo HTTP/1.1\r\nContent-Le")
            kept.sendall(post("/echo", b"{}"))
            assert read_answers(kept, 1)[0].status == 200
            for sock in (silent, half, kept):
                assert read_to_eof(sock) == b""
        assert s.server.stats.idle_closed == 3


def test_a_request_in_service_is_never_closed_as_idle() -> None:
    """A request held by its handler for several idle timeouts: its connection stays open and it is
    answered."""
    gate = Gate()
    with served(gate=gate, idle_timeout=0.1) as s, connect(s.port) as sock:
        sock.sendall(post("/slow", b"held"))
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.settimeout(5)
        s.soon(lambda: gate.event.set() if gate.event else None)
        assert read_answers(sock, 1)[0].body == b"held"
        assert s.server.stats.idle_closed == 0


@pytest.mark.parametrize(
    "request_bytes",
    [
        post("/echo", b"{}", "X-Big: " + "a" * MAX_HEAD),
        post("/echo", b"{}", *(f"X-{i}: {i}" for i in range(MAX_HEADERS + 1))),
        b"POST /" + b"a" * MAX_HEAD + b" HTTP/1.1\r\n\r\n",
    ],
    ids=["long-header", "too-many-headers", "long-target"],
)
def test_a_head_too_large_gets_431(request_bytes: bytes) -> None:
    with served() as s:
        answers, _ = exchange(s.port, request_bytes)
        assert [a.status for a in answers] == [431]
        assert s.server.stats.refused == {431: 1}


def test_a_head_that_grows_read_by_read_gets_431() -> None:
    """A header value sent a kilobyte at a time, never ending: refused once the head passes MAX_HEAD (the
    parser holds a partial header out of sight; the reads are counted instead)."""
    with served() as s, connect(s.port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nX-Long: ")
        answers: list[Answer] = []
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(4 * MAX_HEAD // 1024):
                sock.sendall(b"a" * 1024)
                sock.settimeout(0.02)
                with contextlib.suppress(TimeoutError):
                    data = sock.recv(65536)
                    answers, _ = parse_answers(data + read_to_eof_patiently(sock))
                    break
        assert [a.status for a in answers] == [431]


def read_to_eof_patiently(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    return read_to_eof(sock)


# ============================================================================ malformed requests, bugs

MALFORMED = {
    "bad-length": post("/echo", b"{}").replace(b"Content-Length: 2", b"Content-Length: 2x"),
    "negative-length": post("/echo", b"{}").replace(b"Content-Length: 2", b"Content-Length: -1"),
    "two-lengths": post("/echo", b"{}", "Content-Length: 3"),
    "length-and-chunked": post("/echo", b"{}", "Transfer-Encoding: chunked"),
    "bad-chunk": b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "gzip-transfer": b"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n{}",
    "nul-in-path": b"POST /ec\x00ho HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "non-ascii-path": b"POST /\xc3\xa9cho HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "nul-in-header": post("/echo", b"{}", "X-A: a\x00b"),
    "non-ascii-header": post("/echo", b"{}", "X-A: caf\xe9"),
    "non-ascii-header-name": post("/echo", b"{}", "X-\xe9: a"),
    "space-before-colon": post("/echo", b"{}", "X-A : a"),
    "folded-header": post("/echo", b"{}", "X-A: a\r\n b"),
    "bare-lf": b"POST /echo HTTP/1.1\nContent-Length: 0\n\n",
    "bad-version": b"POST /echo HTTP/1.x\r\n\r\n",
    "bad-method": b"P\xd6ST /echo HTTP/1.1\r\n\r\n",
    "tls-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not HTTP\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_request_that_cannot_be_framed_gets_400_one_log_line_and_a_closed_connection(
    request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier good request on the same connection is answered first; the malformed one gets the JSON
    400, the connection closes, one warning names what was wrong, and nothing has a traceback."""
    caplog.set_level(logging.INFO)
    with served() as s:
        answers, rest = exchange(s.port, post("/echo", b"[1]") + request_bytes)
        assert [a.status for a in answers] == [200, 400] and rest == b"", answers
        assert answers[0].body == b"[1]" and answers[1].headers["connection"] == "close"
        assert wire.decode_json(answers[1].body)["error"]
        assert s.server.stats.refused == {400: 1} and s.server.stats.requests == 1
    records = lean_records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.WARNING, records
    assert records[0].getMessage().startswith("400 to 127.0.0.1:")
    assert_no_traceback(caplog)


@pytest.mark.parametrize("path", ["/boom", "/sync-boom", "/not-a-response", "/text-body"])
def test_a_handler_that_fails_gives_500_and_one_line_naming_where(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that raises (or returns something else than a Response) is a bug of ours: 500, one error
    line with the exception and where it was raised, no traceback; the connection serves on."""
    with served() as s, connect(s.port) as sock:
        sock.sendall(post(path, b"{}") + post("/echo", b"after"))
        failed, after = read_answers(sock, 2)
        assert failed.status == 500 and after.body == b"after"
        assert s.server.stats.errors == 1
    (record,) = lean_records(caplog)
    assert record.levelno == logging.ERROR and f"500 on POST {path}" in record.getMessage()
    if path != "/not-a-response":
        assert "test_lean_http.py" in record.getMessage()
    assert_no_traceback(caplog)


def test_upgrade_and_expect() -> None:
    """``Expect: 100-continue`` gets ``100 Continue`` before the body; a request to upgrade the protocol is
    answered as a plain request and the connection then closes (nothing is upgraded)."""
    with served() as s:
        with connect(s.port) as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
            (interim,) = read_answers(sock, 1)
            assert interim.status == 100
            sock.sendall(b"body")
            assert read_answers(sock, 1)[0].body == b"body"
        upgrade = b"GET /info HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        answers, rest = exchange(s.port, upgrade + b"GET /info HTTP/1.1\r\n\r\n")
        assert [a.status for a in answers] == [200] and rest == b""


# ================================================================================================= signed


def test_a_signed_round_trip_and_every_way_to_fail_it() -> None:
    """The project's client with a Signer: accepted, and the answer's signature checks (the pool fails a
    request whose answer is unsigned). Unsigned, replayed, signed for another path or with a non-ASCII
    byte in the Authorization header: 401 and counted in the verifier's refusals, never a 500; the
    handler never runs for them."""

    async def client(url: str) -> list[tuple[int, bytes]]:
        pool = HttpPool(url, signer=Signer(KEY))
        try:
            out = [await pool.post("/v1/nodes/3/probe", b"") for _ in range(3)]
            out.append(await pool.post("/signed-echo", b'{"x": 1}'))
            with pytest.raises(HttpError, match="without the cluster's signature"):
                await pool.post("/echo", b"{}")  # an unsigned route: its answer is not signed
            return out
        finally:
            pool.close()

    verifier = Verifier(KEY)  # no URL of its own: requests are signed for their Host
    with served(verifier=verifier) as s:
        answers = asyncio.run(client(s.url))
        assert [status for status, _ in answers] == [200] * 4
        assert wire.decode_json(answers[0][1])["param"] == "3" and answers[3][1] == b'{"x": 1}'
        assert verifier.refused == 0
        requests = s.server.stats.requests
        signer = Signer(KEY)
        value, _ = signer.sign(b"POST", f"127.0.0.1:{s.port}".encode(), b"/signed-echo", b"{}")
        good = post("/signed-echo", b"{}", f"Authorization: {value.decode()}").replace(
            b"Host: x", f"Host: 127.0.0.1:{s.port}".encode()
        )
        assert exchange(s.port, good, half_close=True)[0][0].status == 200
        bad = [
            post("/signed-echo", b"{}"),  # unsigned
            good,  # a replay
            good.replace(b"/signed-echo", b"/v1/nodes/1/probe"),  # another path
            good.replace(b"Authorization: LBT-MAC ", b"Authorization: LBT-MAC \xe9"),
            good.replace(value[-4:], b"\xff\xfe\xfd\xfc"),
        ]
        for request in bad:
            answers, _ = exchange(s.port, request, half_close=True)
            assert [a.status for a in answers] == [401], request
            assert "x-lbt-signature" not in answers[0].headers
        assert verifier.refused == len(bad)
        assert s.server.stats.requests == requests + 1  # the good one only


async def test_a_non_ascii_authorization_gets_401_from_aiohttp_too() -> None:
    """The same check through ``aiohttp_glue.signed`` on an aiohttp app (the admin routes): 401, counted; it
    used to end in hmac.compare_digest's TypeError, a 500."""
    verifier = Verifier(KEY)

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/faults", aiohttp_glue.signed(verifier, handler))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        auth = b"Authorization: LBT-MAC 0011223344556677:1:1767268800.0:\xe9\xe9\r\n"
        writer.write(
            b"POST /v1/faults HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: 0\r\n\r\n" % auth
        )
        reply = await reader.read()
        writer.close()
    finally:
        await runner.cleanup()
    assert reply.startswith(b"HTTP/1.1 401 "), reply[:200]
    assert verifier.refused == 1


# ================================================================ the aiohttp fallback, guard and closing


def test_requests_for_other_routes_go_to_the_fallback_app() -> None:
    """With an aiohttp app behind: a connection whose request is not ours is handed to the app whole (its
    404 for unknown paths); a lean route asked on such a connection is still served (through the app) and
    that answer closes the connection, so the client's next connection is the lean server's again."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/v1/health", health)
    with Served(make_routes(), app) as s:
        with connect(s.port) as sock:
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answers(sock, 1)[0].body == b'{"status": "ok"}'
            sock.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answers(sock, 1)[0].status == 404
            sock.sendall(post("/v1/nodes/12/tasks", b"{}"))
            (a,) = read_answers(sock, 1)
            assert a.status == 200 and wire.decode_json(a.body)["param"] == "12"
            assert a.headers["connection"] == "close" and read_to_eof(sock) == b""
        assert s.server.stats.handed_over == 1 and s.server.stats.requests == 0  # that one was aiohttp's

        async def client(url: str) -> tuple[int, bytes]:
            pool = HttpPool(url)
            try:
                return await pool.post("/echo", b"lean")
            finally:
                pool.close()

        assert asyncio.run(client(s.url)) == (200, b"lean")
        assert s.server.stats.requests == 1 and s.server.stats.handed_over == 1


def test_a_fallback_request_behind_pipelined_lean_ones_waits_for_their_answers() -> None:
    """A lean request held by its handler, then (in a later write) a request for the app: the app's answer
    comes after the lean one's."""
    gate = Gate()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/v1/health", health)
    with Served(make_routes(gate=gate), app) as s, connect(s.port) as sock:
        sock.sendall(post("/slow", b"first"))
        wait_for(lambda: gate.waiting >= 1, "the handler to hold the request")
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.settimeout(5)
        s.soon(lambda: gate.event.set() if gate.event else None)
        assert [a.body for a in read_answers(sock, 2)] == [b"first", b'{"status": "ok"}']


def test_a_connection_guard_sheds_silent_connections_and_refuses_beyond_its_limit() -> None:
    """Under a ConnectionGuard of two connections: a silent connection makes room for a new one (shed);
    with both connections busy a third is closed at once (refused); each is counted, and the server's
    own count holds the connections it accepted."""
    gate = Gate()
    guard = ConnectionGuard(2)
    guard.GRACE = 0.05
    with served(gate=gate, guard=guard) as s:
        silent = connect(s.port)
        busy = connect(s.port)
        busy.sendall(post("/slow", b"busy"))
        wait_for(lambda: gate.waiting >= 1, "the handler to hold the request")
        threading.Event().wait(0.1)  # the silent one is now older than the grace
        with connect(s.port) as third:
            third.sendall(post("/echo", b"third"))
            assert read_answers(third, 1)[0].body == b"third"
        assert read_to_eof(silent) == b"" and guard.shed == 1
        wait_for(lambda: guard.open == 1, "the third connection to end")  # else busy2 would be refused
        busy2 = connect(s.port)
        busy2.sendall(post("/slow", b"busy2"))
        wait_for(lambda: gate.waiting >= 2, "the handler to hold the request")
        with connect(s.port) as refused:
            assert read_to_eof(refused) == b""
        assert guard.refused == 1
        s.soon(lambda: gate.event.set() if gate.event else None)
        assert read_answers(busy, 1)[0].body == b"busy" and read_answers(busy2, 1)[0].body == b"busy2"
        assert s.server.stats.connections == 4  # silent, busy, third, busy2; the refused one never was
        for sock in (silent, busy, busy2):
            sock.close()


def test_close_answers_or_cancels_what_is_in_flight_and_closes_every_connection() -> None:
    """close(): the listener stops, an idle connection closes at once, a request in service past the
    grace has its handler cancelled and its connection closed without an answer, a connection handed to
    the app is closed too; no connection is left."""
    gate = Gate()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/v1/health", health)
    s = Served(make_routes(gate=gate), app)
    with s:
        port = s.port
        idle = connect(port)
        handed = connect(port)
        handed.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answers(handed, 1)[0].status == 200
        held = connect(port)
        held.sendall(post("/slow", b"never"))
        wait_for(lambda: gate.waiting >= 1, "the handler to hold the request")
        s.call(s.server.close(grace=0.2))
        for sock in (idle, handed, held):
            assert read_to_eof(sock) == b""
            sock.close()
        assert s.server.connections == set() and s.server.tasks == set()
        with pytest.raises(ConnectionRefusedError):
            connect(port)


def test_a_client_that_pipelines_hundreds_of_requests_is_answered_in_order() -> None:
    """300 requests in one write, each for a coroutine handler: the server reads no further while 16 wait
    for their answers, and closes the connection after 256 that arrived in one read; whatever it answers
    is answered in order, and a connection it closes says so in its last answer."""
    requests = b"".join(post("/echo", b"%d" % i) for i in range(300))
    with served() as s, connect(s.port) as sock:
        sock.sendall(requests)
        data = b""
        while len(parse_answers(data)[0]) < 300 and (chunk := sock.recv(65536)):
            data += chunk
        answers, rest = parse_answers(data)
    assert rest == b"" and len(answers) >= 256
    assert [a.body for a in answers] == [b"%d" % i for i in range(len(answers))]
    if len(answers) < 300:  # (300 when the requests came in several reads)
        assert answers[-1].headers.get("connection") == "close"


SERVED_PROCESS = """
import sys
from aiohttp import web
from lbtestbed.transport.lean_http import Response, Routes
from lbtestbed.transport.process import ConnectionGuard, serve
async def health(request):
    return web.json_response({"status": "ok"})
async def task(request):
    return Response(200, request.body)
app = web.Application()
app.router.add_get("/v1/health", health)
routes = Routes()
routes.post("/v1/tasks", task)
serve(app, sys.argv[1], "lean-test", routes=routes, guard=ConnectionGuard(100))
"""


def test_a_process_serves_lean_routes_and_its_app_on_one_port_and_stops_cleanly() -> None:
    """``process.serve`` with routes, in a process of its own: the task route and the app's health route
    answer on the same port; SIGTERM stops it with exit code 0, its log has no traceback, and a client
    kept alive sees its connection closed."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVED_PROCESS, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: healthy(url), "the process to listen", patience=30)

        async def client() -> tuple[int, bytes]:
            pool = HttpPool(url)
            try:
                return await pool.post("/v1/tasks", b'{"work": 1}')
            finally:
                pool.close()

        assert asyncio.run(client()) == (200, b'{"work": 1}')
        kept = connect(port)
        kept.sendall(post("/v1/tasks", b"{}"))
        assert read_answers(kept, 1)[0].status == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopping" in err and "Traceback" not in err, err
        assert read_to_eof(kept) == b""
        kept.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def healthy(url: str) -> bool:
    try:
        with connect(int(url.rsplit(":", 1)[1]), timeout=1) as sock:
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answers, _ = parse_answers(read_to_eof(sock))
    except OSError:
        return False
    return [a.body for a in answers] == [b'{"status": "ok"}']


def test_the_counts_are_exported_as_metrics() -> None:
    """stats_metrics gives every count of the server under lbtestbed_<role>_http_*."""
    with served() as s:
        exchange(s.port, post("/echo", b"x" * (wire.MAX_BODY + 1)))
        exchange(s.port, post("/echo", b"{}", "Connection: close"))
        families = {f.name: f for f in stats_metrics("node", s.server.stats)}
    value = {
        name: sum(x.value for x in f.samples if x.name.endswith("_total")) for name, f in families.items()
    }
    assert value["lbtestbed_node_http_connections"] == 2
    assert value["lbtestbed_node_http_requests"] == 1
    refused = [(x.labels, x.value) for x in families["lbtestbed_node_http_refused"].samples]
    assert refused == [({"status": "413"}, 1.0)]


# ================================================================================================= fuzzing

VALID = [
    post("/echo", b'{"work": 1}'),
    post("/v1/nodes/3/tasks?x=1", b"{}", "Content-Type: application/json; charset=utf-8"),
    b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /info HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"POST /length HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    post("/echo", gzip.compress(b"{}"), "Content-Encoding: gzip"),
    post("/v1/nodes/1/probe", b"", "Authorization: LBT-MAC 0011223344556677:1:1.0:00"),
    post("/json", b'{"a": [1, 2]}', "Expect: 100-continue"),
]
PIECES = [
    b"GET", b"POST", b"DELETE", b" ", b"/echo", b"/v1/nodes/", b"7", b"/tasks", b"?", b"HTTP/1.1",
    b"HTTP/1.0",
    b"\r\n", b"\n", b":", b"Content-Length: ", b"Transfer-Encoding: chunked", b"Content-Encoding: gzip",
    b"Connection: close", b"Expect: 100-continue", b"Authorization: LBT-MAC ", b"0", b"-1", b"99999999999",
    b"\x00", b"\xff", b"\t", b"{}", b"\r\n\r\n",
]  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request with a few bytes replaced, inserted or deleted."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["replace", "insert", "delete"]))
        byte = draw(st.integers(0, 255))
        if kind == "insert" or at == len(data):
            data.insert(at, byte)
        elif kind == "replace":
            data[at] = byte
        else:
            del data[at]
    return bytes(data)


HEADS = st.one_of(
    st.binary(max_size=300),
    mutated(),
    st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join),
    st.tuples(st.sampled_from(VALID), st.binary(max_size=100)).map(b"".join),
)


def test_arbitrary_head_bytes_never_get_a_500_nor_log_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Random bytes, valid requests with bytes changed, and heaps of HTTP's own pieces, each on a new
    connection closed after writing: the server answers each request with a complete answer that is not a
    500 (or closes the connection), logs no error and no traceback, and serves a good request afterwards."""
    caplog.set_level(logging.INFO)
    with served(verifier=Verifier(KEY)) as s:

        @settings(max_examples=400, derandomize=True, database=None, deadline=None)
        @given(data=HEADS)
        def check(data: bytes) -> None:
            assume(b"HEAD" not in data)  # an answer to HEAD has no body: these answers could not be parsed
            answers, rest = exchange(s.port, data, half_close=True)
            assert all(a.status != 500 for a in answers), (data, answers)
            assert rest == b"" or not re.match(rb"HTTP/1\.1 \d\d\d ", rest), (data, rest)

        check()
        answers, _ = exchange(s.port, post("/echo", b"still here", "Connection: close"))
        assert answers[0].body == b"still here"
        assert s.server.stats.errors == 0
        assert s.server.connections == set() or all(c.transport is None for c in s.server.connections)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert_no_traceback(caplog)
