"""The dispatcher process's routes (docs/protocol.md) on a ``DispatcherHost``.

The task path (``POST /v1/tasks``, and the nodes' signed ``POST /v1/messages``) is served by the lean server
(``transport.lean_http``: ``task_routes``); the admin routes (health, faults, timings, ``/metrics``) by
aiohttp. ``build_app`` gives the aiohttp app with the task routes mounted on it, so that it answers every
route by itself and ``transport.process`` serves its task routes on the lean server. Each handler only
reads the request, calls the host and writes its ``wire.Reply``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable

from aiohttp import web

from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.transport import wire
from lbtestbed.transport.aiohttp_glue import (
    faults_handler,
    metrics_handler,
    respond,
    run_with,
    signed,
    timings_handler,
)
from lbtestbed.transport.lean_http import Request, Routes, mount


def task_routes(host: DispatcherHost) -> Routes:
    """The task path's routes, for the lean server."""

    def post_task(request: Request) -> wire.Reply | Awaitable[wire.Reply]:
        accepted = time.monotonic()  # not the loop clock: uvloop's has millisecond resolution
        try:
            body = request.json()
        except wire.BadRequest as e:
            return wire.bad_request(e)
        return host.task(body, accepted)  # the answer once the task's node has served it

    def post_messages(request: Request) -> wire.Reply:
        try:
            body = request.json()
        except wire.BadRequest as e:
            return wire.bad_request(e)
        return host.messages(body)

    routes = Routes()
    routes.post(wire.PREFIX + "/tasks", post_task)
    routes.post(wire.PREFIX + "/messages", post_messages, verifier=host.verifier)
    return routes


def build_app(host: DispatcherHost) -> web.Application:
    async def get_health(request: web.Request) -> web.Response:
        return respond(host.health_reply())

    app = web.Application(client_max_size=wire.MAX_BODY)
    mount(task_routes(host), app)
    app.router.add_get(wire.PREFIX + "/health", get_health)
    app.router.add_post(wire.PREFIX + "/faults", signed(host.verifier, faults_handler(host.faults)))
    app.router.add_get(wire.PREFIX + "/timings", timings_handler(host.metrics.ages))
    app.router.add_get("/metrics", metrics_handler(host.registry))
    return run_with(app, host)
