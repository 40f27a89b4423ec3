"""The node process's routes (docs/protocol.md) on a ``NodeHost``.

The task path (a node's signed ``tasks``, ``probe`` and ``messages``) is served by the lean server
(``transport.lean_http``: ``task_routes``); the admin routes (health, state, faults, origin, timings,
``/metrics``) by aiohttp. ``build_app`` gives the aiohttp app with the task routes mounted on it, so that
it answers every route by itself and ``transport.process`` serves its task routes on the lean server.
Each handler only reads the request, calls the host and writes its ``wire.Reply``. A node route names its
node first: one this host does not serve is a 404 whatever the body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

from aiohttp import web

from lbtestbed.server_node.host import NodeHost
from lbtestbed.transport import wire
from lbtestbed.transport.aiohttp_glue import (
    faults_handler,
    json_route,
    metrics_handler,
    respond,
    run_with,
    signed,
    timings_handler,
)
from lbtestbed.transport.lean_http import Request, Routes, mount


def task_routes(host: NodeHost) -> Routes:
    """The task path's routes, for the lean server (every one signed: only dispatchers call them)."""

    def post_task(request: Request) -> wire.Reply | Awaitable[wire.Reply]:
        k = host.node_of(request.param or "")  # the route admits digits only
        if isinstance(k, wire.Reply):
            return k
        try:
            body = request.json()
        except wire.BadRequest as e:
            return wire.bad_request(e)
        return host.task(k, body)  # its reply when served: a future, answered without a task

    def post_probe(request: Request) -> wire.Reply:
        k = host.node_of(request.param or "")
        return k if isinstance(k, wire.Reply) else host.probe(k)

    def post_messages(request: Request) -> wire.Reply:
        k = host.node_of(request.param or "")
        if isinstance(k, wire.Reply):
            return k
        try:
            body = request.json()
        except wire.BadRequest as e:
            return wire.bad_request(e)
        return host.messages(k, body)

    routes = Routes()
    node = wire.PREFIX + "/nodes/{node}"
    routes.post(node + "/tasks", post_task, verifier=host.verifier)
    routes.post(node + "/probe", post_probe, verifier=host.verifier)
    routes.post(node + "/messages", post_messages, verifier=host.verifier)
    return routes


def build_app(host: NodeHost) -> web.Application:
    async def get_state(request: web.Request) -> web.Response:
        return respond(host.state())

    async def get_health(request: web.Request) -> web.Response:
        return respond(host.health_reply())

    async def origin(body: Mapping[str, Any]) -> wire.Reply:
        return host.origin_reply(body)

    app = web.Application(client_max_size=wire.MAX_BODY)
    mount(task_routes(host), app)
    p = wire.PREFIX
    app.router.add_get(p + "/health", get_health)
    app.router.add_get(p + "/state", signed(host.verifier, get_state))
    app.router.add_post(p + "/faults", signed(host.verifier, faults_handler(host.faults)))
    app.router.add_post(p + "/origin", signed(host.verifier, json_route(origin)))
    app.router.add_get(p + "/timings", timings_handler(host.metrics.ages))
    app.router.add_get("/metrics", metrics_handler(host.registry))
    return run_with(app, host)
