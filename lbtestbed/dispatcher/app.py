"""The dispatcher process's aiohttp application: the routes of docs/protocol.md on a ``DispatcherHost``.

Each handler only reads the request, calls the host and writes its ``wire.Reply``.
"""

from __future__ import annotations

import time

from aiohttp import web

from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.transport import wire
from lbtestbed.transport.aiohttp_glue import (
    faults_handler,
    json_route,
    metrics_handler,
    read_json,
    respond,
    run_with,
    signed,
    timings_handler,
)


def build_app(host: DispatcherHost) -> web.Application:
    async def post_task(request: web.Request) -> web.Response:
        accepted = time.monotonic()  # not the loop clock: uvloop's has millisecond resolution
        try:
            body = await read_json(request)
        except wire.BadRequest as e:
            return respond(wire.bad_request(e))
        return respond(await host.task(body, accepted))

    async def get_health(request: web.Request) -> web.Response:
        return respond(host.health_reply())

    app = web.Application(client_max_size=wire.MAX_BODY)
    app.router.add_post(wire.PREFIX + "/tasks", post_task)
    app.router.add_post(wire.PREFIX + "/messages", signed(host.verifier, json_route(host.messages)))
    app.router.add_get(wire.PREFIX + "/health", get_health)
    app.router.add_post(wire.PREFIX + "/faults", signed(host.verifier, faults_handler(host.faults)))
    app.router.add_get(wire.PREFIX + "/timings", timings_handler(host.metrics.ages))
    app.router.add_get("/metrics", metrics_handler(host.registry))
    return run_with(app, host)
