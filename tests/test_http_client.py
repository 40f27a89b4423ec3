"""The task path's lean HTTP/1.1 client (lbtestbed/transport/http.py), against real sockets on 127.0.0.1.

An aiohttp server stands for the cluster's own servers; small raw socket servers write hand-made bytes for
what a misbehaving server may do, which must fail the request with ``HttpError`` and never give a wrong
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType

import pytest
from aiohttp import web

from lbtestbed.transport.http import HttpError, HttpPool, Observer, Peers

# ============================================================================================ the servers


@contextlib.asynccontextmanager
async def pool_to(
    url: str, headers: dict[str, str] | None = None, observer: Observer | None = None
) -> AsyncIterator[HttpPool]:
    """An ``HttpPool`` to ``url`` that is closed when the block ends, however it ends."""
    pool = HttpPool(url, headers, observer)
    try:
        yield pool
    finally:
        pool.close()


#: a bound on requests to the raw servers, so that a client that never notices a failure fails the test
#: (with TimeoutError) instead of hanging it
PATIENCE = 5.0

#: answers the n-th request (counted over all connections); returns whether to go on reading that connection
Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


def response(body: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    """A well-formed HTTP/1.1 response with a Content-Length; ``extra`` is more header lines."""
    return b"HTTP/1.1 %d Whatever\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def scripted(*scripts: Sequence[bytes | None]) -> Respond:
    """Request n gets ``scripts[n]``: each bytes item is a write of its own, None closes the connection."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        for i, item in enumerate(scripts[n]):
            if item is None:
                return False
            if i:
                await asyncio.sleep(0.01)  # so that the pieces arrive as separate reads
            writer.write(item)
            await writer.drain()
        return True

    return respond


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One whole request (head and Content-Length body), or None at the end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    assert found is not None, head
    return head + await reader.readexactly(int(found[1]))


class RawServer:
    """A socket server that reads whole requests and answers them with ``respond``'s hand-made bytes."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.connections = 0
        self.requests: list[tuple[int, bytes]] = []  # (connection number, the request as received)
        self.eofs = 0  # connections the client closed
        self.closed = 0  # connections this server closed
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._closing = False

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        self._closing = True
        for writer in self._writers:  # ends the handlers still reading
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        number = self.connections
        self.connections += 1
        try:
            while True:
                request = await read_request(reader)
                if request is None:
                    self.eofs += not self._closing
                    return
                self.requests.append((number, request))
                if not await self.respond(reader, writer, len(self.requests) - 1):
                    return
        except ConnectionError:
            return
        finally:
            writer.close()
            self.closed += 1


class WebServer:
    """An aiohttp server: POST /echo answers ``echo:`` and the body, /status/{code} that status, /together
    answers once ``together`` requests are in; it keeps what every request brought."""

    def __init__(self, together: int = 0) -> None:
        self.together = together
        self.arrived = 0
        self.all_in = asyncio.Event()
        self.seen: list[tuple[str, dict[str, str], bytes]] = []  # (path and query, headers, body)
        self.transports: list[object] = []  # kept, so that their ids stay distinct
        self.url = ""
        app = web.Application()
        app.router.add_post("/echo", self._echo)
        app.router.add_post("/status/{code}", self._status)
        app.router.add_post("/together", self._together)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)

    @property
    def connections(self) -> int:
        return len({id(t) for t in self.transports})

    async def __aenter__(self) -> WebServer:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._runner.cleanup()

    async def _record(self, request: web.Request) -> bytes:
        body = await request.read()
        self.seen.append((request.path_qs, dict(request.headers), body))
        self.transports.append(request.transport)
        return body

    async def _echo(self, request: web.Request) -> web.Response:
        return web.Response(body=b"echo:" + await self._record(request), content_type="application/json")

    async def _status(self, request: web.Request) -> web.Response:
        await self._record(request)
        code = int(request.match_info["code"])
        return web.json_response({"code": code}, status=code)

    async def _together(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        self.arrived += 1
        if self.arrived >= self.together:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 5.0)  # fails the request if they never overlap
        return web.Response(body=b"echo:" + body, content_type="application/json")


class Recorder:
    """An Observer that writes down what it is told."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def started(self) -> None:
        self.events.append("started")

    def ended(self, status: int) -> None:
        self.events.append(f"ended {status}")

    def failed(self) -> None:
        self.events.append("failed")


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (a bound on the wait so that a failing test does not hang, not a timing)."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    assert condition()


# ============================================================================================ normal answers


@pytest.mark.parametrize("status", [200, 201, 404, 500, 503])
async def test_a_post_gets_its_status_and_body_back(status: int) -> None:
    """The status and body the server answered come back exactly, whatever the status."""
    async with WebServer() as server, pool_to(server.url) as pool:
        assert await pool.post("/echo", b'{"work": 1.5}') == (200, b'echo:{"work": 1.5}')
        assert await pool.post(f"/status/{status}", b"{}") == (status, b'{"code": %d}' % status)


async def test_the_request_reaches_the_server_as_sent() -> None:
    """Path, query, body, Host, Content-Type, Content-Length and the pool's headers all reach the server."""
    fixed = {"Authorization": "Bearer T0K3N", "X-Trace": "a b"}
    async with WebServer() as server, pool_to(f"{server.url}/v1/nodes/3", fixed) as pool:
        await pool.post("/echo?since=4", b'{"id": 7}')
        await pool.post("/echo", b"")
    (path, headers, body), (path2, headers2, body2) = server.seen
    assert (path, body, path2, body2) == ("/echo?since=4", b'{"id": 7}', "/echo", b"")
    assert headers["Host"] == server.url.removeprefix("http://")
    assert headers["Content-Type"] == "application/json"
    assert (headers["Content-Length"], headers2["Content-Length"]) == ("9", "0")
    assert headers["Authorization"] == headers2["Authorization"] == "Bearer T0K3N"
    assert headers["X-Trace"] == "a b"


async def test_a_large_body_comes_back_whole() -> None:
    """A 200 kB request body reaches the server and a 200 kB answer comes back byte for byte."""
    big = bytes(range(256)) * 800
    async with WebServer() as server, pool_to(server.url) as pool:
        assert await pool.post("/echo", big) == (200, b"echo:" + big)
    assert server.seen[0][2] == big


async def test_a_response_split_across_writes_is_put_together() -> None:
    """A response that arrives in pieces, cut inside the head, its blank line and the body, is read whole."""
    pieces = [b"HTTP/1.1 2", b"00 OK\r\nContent-Le", b"ngth: 11\r\n\r", b"\nhello", b" wor", b"ld"]
    async with RawServer(scripted(pieces, [response(b"next")])) as server, pool_to(server.url) as pool:
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"hello world")
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"next")
    assert server.connections == 1


async def test_sequential_requests_reuse_one_connection() -> None:
    """Requests one after another all go over the one kept-alive connection."""
    async with WebServer() as server, pool_to(server.url) as pool:
        for i in range(10):
            assert await pool.post("/echo", b"%d" % i) == (200, b"echo:%d" % i)
    assert server.connections == 1


async def test_overlapping_requests_each_get_their_own_answer_on_their_own_connection() -> None:
    """Five requests at once open five connections, each gets its own answer, and a next five reuse them."""
    async with WebServer(together=5) as server, pool_to(server.url) as pool:
        bodies = [b'{"i": %d}' % i for i in range(5)]
        answers = await asyncio.gather(*(pool.post("/together", b) for b in bodies))
        assert answers == [(200, b"echo:" + b) for b in bodies]
        assert server.connections == 5
        answers = await asyncio.gather(*(pool.post("/together", b) for b in reversed(bodies)))
        assert answers == [(200, b"echo:" + b) for b in reversed(bodies)]
    assert server.connections == 5


# ======================================================================================= misbehaving servers

MISBEHAVIOURS: dict[str, list[bytes | None]] = {
    "closed before answering": [None],
    "closed mid-head": [b"HTTP/1.1 200 OK\r\nContent-Le", None],
    "closed mid-body": [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel", None],
    "no Content-Length, then closed": [b"HTTP/1.1 200 OK\r\n\r\nhello", None],
    "no Content-Length, kept open": [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}"],
    "chunked": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"],
    "HTTP/1.0": [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"],
    "garbage head": [b"hello there\r\n\r\n"],
    "bad status": [b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}"],
    "bad Content-Length": [b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n{}"],
}


@pytest.mark.parametrize("script", MISBEHAVIOURS.values(), ids=MISBEHAVIOURS.keys())
async def test_a_misbehaving_answer_fails_the_request_and_the_pool_goes_on(
    script: list[bytes | None],
) -> None:
    """A bad answer raises HttpError (an OSError), and the next request works on a new connection."""
    async with RawServer(scripted(script, [response(b"fine")])) as server, pool_to(server.url) as pool:
        with pytest.raises(HttpError) as caught:
            await pool.post("/", b"{}", timeout=PATIENCE)
        assert isinstance(caught.value, OSError)
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"fine")
    assert server.connections == 2
    assert [conn for conn, _ in server.requests] == [0, 1]


async def test_a_negative_content_length_fails_the_request() -> None:
    """A head with a negative Content-Length is malformed and fails, rather than answering an empty body."""
    bad = b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n"
    async with RawServer(scripted([bad], [response(b"fine")])) as server, pool_to(server.url) as pool:
        with pytest.raises(HttpError):
            await pool.post("/", b"{}", timeout=PATIENCE)
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"fine")


async def test_an_unasked_for_extra_response_is_not_taken_as_the_next_answer() -> None:
    """Bytes after a response (here a whole second one) never become the answer to the next request."""
    first = response(b'"first"') + response(b'"stale"')
    async with RawServer(scripted([first], [response(b'"second"')])) as server, pool_to(server.url) as pool:
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b'"first"')
        try:
            answer = await pool.post("/", b"{}", timeout=PATIENCE)
        except HttpError:
            pass  # failing is allowed
        else:
            assert answer == (200, b'"second"')


async def test_connection_close_from_the_server_is_not_reused() -> None:
    """After `Connection: close` the client closes that connection and sends the next request on a new one."""
    # the server keeps the connection open and would answer there, so only the client's care shows
    script = scripted([response(b"one", extra=b"Connection: close\r\n")], [response(b"two")])
    async with RawServer(script) as server, pool_to(server.url) as pool:
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"one")
        await eventually(lambda: server.eofs == 1)
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"two")
    assert server.connections == 2
    assert [conn for conn, _ in server.requests] == [0, 1]


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    """A kept-alive connection the server closed after answering is passed over for a new one."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(response(b"%d" % n))
        await writer.drain()
        return False  # and close: no Connection: close header, as a server's idle timeout does

    async with RawServer(respond) as server, pool_to(server.url) as pool:
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"0")
        await eventually(lambda: server.closed == 1)
        await asyncio.sleep(0.05)  # for the client's side of the loop to read the end of the connection
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"1")
    assert server.connections == 2


async def test_a_timeout_raises_timeout_error_and_drops_the_connection() -> None:
    """No answer in time raises TimeoutError; the client closes that connection and opens another."""
    never_then_fine = scripted([], [response(b"fine")])  # the first is never answered
    async with RawServer(never_then_fine) as server, pool_to(server.url) as pool:
        with pytest.raises(TimeoutError):
            await pool.post("/", b"{}", timeout=0.2)
        await eventually(lambda: server.eofs == 1)
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"fine")
    assert server.connections == 2
    assert [conn for conn, _ in server.requests] == [0, 1]


async def test_connecting_to_a_closed_port_raises_http_error() -> None:
    """A port nobody listens on fails the request with HttpError, an OSError."""
    assert issubclass(HttpError, OSError)
    with socket.socket() as taken:  # bound, so that nobody else takes it, and not listening
        taken.bind(("127.0.0.1", 0))
        pool = HttpPool(f"http://127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(HttpError, match="cannot connect"):
            await pool.post("/", b"{}", timeout=PATIENCE)
        pool.close()


@pytest.mark.parametrize(
    "url", ["https://x", "https://127.0.0.1:8443/v1", "ftp://x/y", "http:///no-host", "x:80"]
)
def test_only_http_urls_are_accepted(url: str) -> None:
    """A pool is only for http://host[:port] URLs: anything else is a ValueError at once."""
    with pytest.raises(ValueError, match="only http"):
        HttpPool(url)


# ======================================================================================== the pools' keeping


async def test_an_observer_sees_every_request_start_and_end_once() -> None:
    """An Observer is told started, then ended(status) or failed, once for each request, whatever happens."""
    script = scripted(
        [response(b"a")],
        [response(b"b", status=404)],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel", None],
        [],  # never answered
    )
    seen = Recorder()
    observer: Observer = seen
    async with RawServer(script) as server, pool_to(server.url, observer=observer) as pool:
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (200, b"a")
        assert await pool.post("/", b"{}", timeout=PATIENCE) == (404, b"b")
        with pytest.raises(HttpError):
            await pool.post("/", b"{}", timeout=PATIENCE)
        with pytest.raises(TimeoutError):
            await pool.post("/", b"{}", timeout=0.2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        nowhere = HttpPool(f"http://127.0.0.1:{taken.getsockname()[1]}", observer=observer)
        with pytest.raises(HttpError):
            await nowhere.post("/", b"{}", timeout=PATIENCE)
    assert seen.events == ["started", "ended 200", "started", "ended 404"] + ["started", "failed"] * 3


async def test_close_closes_the_open_connections() -> None:
    """``close()`` closes every connection the pool holds: the server reads the end of each."""
    all_in = asyncio.Event()

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 5.0)  # so that the three overlap
        writer.write(response(b"%d" % n))
        await writer.drain()
        return True

    async with RawServer(respond) as server:
        pool = HttpPool(server.url)
        answers = await asyncio.gather(*(pool.post("/", b"{}", timeout=PATIENCE) for _ in range(3)))
        assert sorted(answers) == [(200, b"0"), (200, b"1"), (200, b"2")]
        await asyncio.sleep(0.05)
        assert (server.connections, server.eofs) == (3, 0)  # kept alive until now
        pool.close()
        await eventually(lambda: server.eofs == 3)


async def test_peers_keep_one_pool_per_origin_with_the_headers() -> None:
    """``Peers.pool`` gives one pool per origin, the same each time, all sending Peers' headers."""
    peers = Peers({"Authorization": "Bearer T"})
    async with WebServer() as one, WebServer() as two:
        try:
            assert peers.pool(one.url) is peers.pool(one.url)
            assert peers.pool(one.url) is not peers.pool(two.url)
            assert await peers.pool(one.url).post("/echo", b"1") == (200, b"echo:1")
            assert await peers.pool(two.url).post("/echo", b"2") == (200, b"echo:2")
            assert await peers.pool(one.url).post("/echo", b"3") == (200, b"echo:3")
        finally:
            peers.close()
    assert [(body, headers["Authorization"]) for _, headers, body in one.seen] == [
        (b"1", "Bearer T"),
        (b"3", "Bearer T"),
    ]
    assert [(body, headers["Authorization"]) for _, headers, body in two.seen] == [(b"2", "Bearer T")]
    assert (one.connections, two.connections) == (1, 1)


async def test_peers_close_closes_their_pools_connections() -> None:
    """``Peers.close()`` closes the connections of every pool it made."""
    async with RawServer(scripted([response(b"a")])) as one, RawServer(scripted([response(b"b")])) as two:
        peers = Peers()
        assert await peers.pool(one.url).post("/", b"{}", timeout=PATIENCE) == (200, b"a")
        assert await peers.pool(two.url).post("/", b"{}", timeout=PATIENCE) == (200, b"b")
        assert (one.eofs, two.eofs) == (0, 0)
        peers.close()
        await eventually(lambda: (one.eofs, two.eofs) == (1, 1))
