"""The node process's aiohttp application: the routes of docs/protocol.md on a ``NodeHost``.

Each handler only reads the request, calls the host and writes its ``wire.Reply``. A node route names its
node first: one this host does not serve is a 404 whatever the body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from lbtestbed.server_node.host import NodeHost
from lbtestbed.transport import wire
from lbtestbed.transport.aiohttp_glue import (
    Handler,
    faults_handler,
    json_route,
    metrics_handler,
    read_json,
    respond,
    run_with,
    signed,
    timings_handler,
)

NodeRoute = Callable[[int, Mapping[str, Any]], Awaitable[wire.Reply]]


def build_app(host: NodeHost) -> web.Application:
    def node_route(route: NodeRoute) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            k = host.node_of(request.match_info["node"])  # the route admits digits only
            if isinstance(k, wire.Reply):
                return respond(k)
            try:
                body = await read_json(request)
            except wire.BadRequest as e:
                return respond(wire.bad_request(e))
            return respond(await route(k, body))

        return signed(host.verifier, handle)

    async def post_probe(request: web.Request) -> web.Response:
        k = host.node_of(request.match_info["node"])
        return respond(k if isinstance(k, wire.Reply) else host.probe(k))

    async def messages(k: int, body: Mapping[str, Any]) -> wire.Reply:
        return host.messages(k, body)

    async def get_state(request: web.Request) -> web.Response:
        return respond(host.state())

    async def get_health(request: web.Request) -> web.Response:
        return respond(host.health_reply())

    async def origin(body: Mapping[str, Any]) -> wire.Reply:
        return host.origin_reply(body)

    app = web.Application(client_max_size=wire.MAX_BODY)
    p = wire.PREFIX
    app.router.add_post(p + r"/nodes/{node:\d+}/tasks", node_route(host.task))
    app.router.add_post(p + r"/nodes/{node:\d+}/probe", signed(host.verifier, post_probe))
    app.router.add_post(p + r"/nodes/{node:\d+}/messages", node_route(messages))
    app.router.add_get(p + "/health", get_health)
    app.router.add_get(p + "/state", signed(host.verifier, get_state))
    app.router.add_post(p + "/faults", signed(host.verifier, faults_handler(host.faults)))
    app.router.add_post(p + "/origin", signed(host.verifier, json_route(origin)))
    app.router.add_get(p + "/timings", timings_handler(host.metrics.ages))
    app.router.add_get("/metrics", metrics_handler(host.registry))
    return run_with(app, host)
