"""The node process's HTTP application: the routes of docs/protocol.md on a ``NodeHost``, and its metrics."""

from __future__ import annotations

from aiohttp import web

from lbtestbed.server_node.host import NodeHost
from lbtestbed.server_node.metrics import registry_for
from lbtestbed.transport import wire


def build_app(host: NodeHost) -> web.Application:
    app = web.Application(client_max_size=wire.MAX_BODY)
    p = wire.PREFIX

    def peers_only(handler: wire.Handler) -> wire.Handler:
        return wire.signed(host.verifier, handler)

    app.router.add_post(p + r"/nodes/{node:\d+}/tasks", peers_only(host.post_task))
    app.router.add_post(p + r"/nodes/{node:\d+}/probe", peers_only(host.post_probe))
    app.router.add_post(p + r"/nodes/{node:\d+}/messages", peers_only(host.post_messages))
    app.router.add_get(p + "/health", host.get_health)
    app.router.add_get(p + "/state", peers_only(host.get_state))
    app.router.add_post(p + "/faults", peers_only(host.post_faults))
    app.router.add_post(p + "/origin", peers_only(host.post_origin))
    app.router.add_get(p + "/timings", wire.timings_handler(host.ages))
    app.router.add_get("/metrics", wire.metrics_handler(registry_for(host)))
    return wire.run_with(app, host)
