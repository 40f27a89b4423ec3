"""A dispatcher stand-in that completes every task at once: what is left to measure is the load generator.

It answers ``POST /v1/tasks`` with a fixed reply of the dispatcher's shape (docs/protocol.md) as soon as it
has the request, ``GET /v1/health``, and ``GET /v1/count`` with the number of tasks answered (so that a
benchmark can check that every send arrived); anything else gets a 404.

It is a bare asyncio protocol on uvloop rather than an aiohttp app because on a 2-core machine the sink
shares the CPU with the generator it measures: it must cost as little as possible. It speaks just enough
HTTP/1.1 for the generators here: keep-alive, requests with a Content-Length (or no body), pipelining.

    .venv/bin/python benchmarks/sink.py --port P
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import cast

import uvloop

# the reply of a task that arrived, started and completed at one instant on node 0
TASK = b'{"node": 0, "sojourn": 0.0, "arrived": 0.0, "completed": 0.0, "waited": false}'
HEALTH = b'{"status": "ok"}'
MAX_HEAD = 16 * 1024  # bytes; a request head longer than this is not one of ours


def response(status: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


TASK_RESPONSE = response("200 OK", TASK)
HEALTH_RESPONSE = response("200 OK", HEALTH)
NOT_FOUND = response("404 Not Found", b'{"error": "not found"}')
BAD_REQUEST = response("400 Bad Request", b'{"error": "unsupported request"}')


class Sink(asyncio.Protocol):
    """One connection: answers each complete request in order."""

    tasks = 0  # over all connections

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass, but has write()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        out: list[bytes] = []
        refused = False
        while not refused:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                refused = len(self.buffer) > MAX_HEAD
                break
            head = bytes(self.buffer[:end]).lower()
            length = self._content_length(head)
            if length is None:
                refused = True
                break
            if len(self.buffer) < end + 4 + length:
                break  # the body is still on its way
            del self.buffer[: end + 4 + length]
            line = head.split(b"\r\n", 1)[0]
            if line.startswith(b"post /v1/tasks "):
                Sink.tasks += 1
                out.append(TASK_RESPONSE)
            elif line.startswith(b"get /v1/health "):
                out.append(HEALTH_RESPONSE)
            elif line.startswith(b"get /v1/count "):
                out.append(response("200 OK", json.dumps({"tasks": Sink.tasks}).encode()))
            else:
                out.append(NOT_FOUND)
        if refused:
            out.append(BAD_REQUEST)
        if out:
            self.transport.write(b"".join(out))
        if refused:
            self.transport.close()
            self.buffer.clear()

    @staticmethod
    def _content_length(head: bytes) -> int | None:
        """The body's length from a lower-cased request head; None for what this sink does not read."""
        if b"\r\ntransfer-encoding:" in head:
            return None
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            return 0
        stop = head.find(b"\r\n", at + 2)
        try:
            length = int(head[at + 17 : stop if stop >= 0 else None])
        except ValueError:
            return None
        return length if length >= 0 else None


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Sink, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    args = parser.parse_args()
    uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
