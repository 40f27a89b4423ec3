"""The protocol served with aiohttp: reading a request's body, writing a ``wire.Reply``, signed routes.

Only what ties the codec (``transport.wire``) to aiohttp lives here: a body read within the protocol's
limits, JSON errors and answers as aiohttp responses, the signature check around the peers' routes
(``signed``), the handlers of ``/metrics``, ``/v1/timings`` and ``/v1/faults``, and a host's start and stop
with its app. Another server (an asyncio.Protocol one) would hold its own copy of these few functions and
call the same hosts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import orjson
from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from lbtestbed.transport import wire
from lbtestbed.transport.message_faults import MessageFaults
from lbtestbed.transport.metrics import MessageAges
from lbtestbed.transport.signing import AUTHORIZATION, SCHEME, SIGNATURE, Unauthorized, Verifier

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def respond(reply: wire.Reply) -> web.Response:
    """The aiohttp response of a ``wire.Reply``: compact (orjson) on the task path, else as
    ``json.dumps`` writes it (``web.json_response``)."""
    if reply.compact:
        return web.Response(
            status=reply.status, body=orjson.dumps(reply.body), content_type="application/json"
        )
    return web.json_response(reply.body, status=reply.status)


def error(status: int, message: str, field: str = "", **extra: Any) -> web.Response:
    """A JSON error; ``extra`` adds fields (the node of a lost or refused task)."""
    return respond(wire.error_reply(status, message, field, **extra))


def signed(verifier: Verifier, handler: Handler) -> Handler:
    """``handler`` for peers only: the request must be signed with the cluster's key, for this process,
    and new (401 otherwise, before anything else is looked at but the body's size), and the answer is
    signed for the sender to check (docs/protocol.md, "Authentication: signed requests")."""

    async def handle(request: web.Request) -> web.StreamResponse:
        value = request.headers.get(AUTHORIZATION)
        if not value or not value.startswith(SCHEME + " "):
            verifier.refused += 1
            return error(401, "missing signature (Authorization: LBT-MAC sender:counter:time:mac)")
        try:
            body = await read_body(request)
        except wire.BadRequest as e:
            return error(e.status, str(e))
        try:
            tag = verifier.verify(request.method, request.raw_path, value, body, request.host)
        except Unauthorized as e:
            return error(401, str(e))
        try:
            response = await handler(request)
        except web.HTTPException as e:  # an answer like any other
            response = web.Response(
                status=e.status, body=e.body, content_type=e.content_type, charset=e.charset
            )
        assert isinstance(response, web.Response), response
        body = response.body if isinstance(response.body, bytes) else b""
        response.headers[SIGNATURE] = verifier.sign(tag, response.status, body)
        return response

    return handle


async def read_body(request: web.Request) -> bytes:
    """The request's body, or BadRequest: too large (413), unreadable, or not complete within
    ``wire.BODY_TIMEOUT`` (408: a client that trickles its body holds a connection for nothing)."""
    try:
        if request.content.is_eof():  # all there (the usual case): no timer needed
            return await request.read()
        return await asyncio.wait_for(request.read(), wire.BODY_TIMEOUT)
    except web.HTTPRequestEntityTooLarge:
        raise wire.BadRequest(f"body larger than {wire.MAX_BODY} bytes", status=413) from None
    except TimeoutError:
        raise wire.BadRequest(f"body not complete within {wire.BODY_TIMEOUT:g} s", status=408) from None
    except (web.RequestPayloadError, HttpProcessingError, ClientPayloadError, ConnectionError) as e:
        # a body that does not inflate as its Content-Encoding says, or a client that left mid-body
        raise wire.BadRequest(f"body could not be read: {type(e).__name__}") from None


async def read_json(request: web.Request) -> Mapping[str, Any]:
    """The request's JSON object, or BadRequest naming what is wrong."""
    return wire.decode_json(await read_body(request), request.charset)


JsonRoute = Callable[[Mapping[str, Any]], Awaitable[wire.Reply]]


def json_route(route: JsonRoute) -> Handler:
    """An aiohttp handler for a route that takes the request's JSON object and gives a ``wire.Reply``
    (a malformed body gets its 4xx without the route)."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
        except wire.BadRequest as e:
            return respond(wire.bad_request(e))
        return respond(await route(body))

    return handle


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """A handler serving a prometheus_client registry in the text exposition format."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


def timings_handler(ages: MessageAges) -> Handler:
    """A handler serving ``GET /v1/timings``: the recent ages of the messages applied here."""

    async def handle(request: web.Request) -> web.Response:
        return web.json_response(ages.to_json())

    return handle


def faults_handler(faults: MessageFaults) -> Handler:
    """``POST /v1/faults`` ``{"fault": i, "active": true}``: switch the spec's fault i on or off (a signed
    request: the app wraps it with ``signed``)."""

    async def handle(request: web.Request) -> web.Response:
        try:
            index, active = wire.fault_switch(await read_json(request))
            faults.set(index, active)
        except wire.BadRequest as e:
            return respond(wire.bad_request(e))
        return web.json_response({"ok": True, "active": sorted(faults.active)})

    return handle


class Startable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def run_with(app: web.Application, host: Startable) -> web.Application:
    """Start ``host`` (its async ``start``) with the app and stop it (``stop``) when the app shuts down."""

    async def on_startup(_: web.Application) -> None:
        await host.start()

    async def on_cleanup(_: web.Application) -> None:
        await host.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
