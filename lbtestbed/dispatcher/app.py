"""The dispatcher process's HTTP application: the routes of docs/protocol.md on a ``DispatcherHost``."""

from __future__ import annotations

from aiohttp import web

from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.transport import wire


def build_app(host: DispatcherHost) -> web.Application:
    app = web.Application(client_max_size=wire.MAX_BODY)
    app.router.add_post(wire.PREFIX + "/tasks", host.post_task)
    app.router.add_post(wire.PREFIX + "/messages", wire.signed(host.verifier, host.post_messages))
    app.router.add_get(wire.PREFIX + "/health", host.get_health)
    app.router.add_post(wire.PREFIX + "/faults", wire.signed(host.verifier, host.post_faults))
    app.router.add_get(wire.PREFIX + "/timings", wire.timings_handler(host.ages))
    app.router.add_get("/metrics", wire.metrics_handler(host.registry))
    return wire.run_with(app, host)
