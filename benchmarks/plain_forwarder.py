"""The baseline of bench_cluster.py: an aiohttp forwarder with no policy, in front of the same nodes.

It does what any dispatcher must do and nothing more: parse the task, pick a node uniformly, forward the
task over a persistent connection, return the node's reply.

    LBT_TOKEN=... python benchmarks/plain_forwarder.py --port P --node URL [--node URL ...]

The cluster's key (nodes accept tasks only signed by cluster processes: docs/protocol.md) comes from the
environment; the forwarder signs every task as a dispatcher does (it does not check the answers'
signatures, which a dispatcher does: a few µs it saves).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random

import aiohttp
import uvloop
from aiohttp import web

from lbtestbed.transport.signing import Signer


async def main(port: int, nodes: list[str]) -> None:
    signer = Signer(os.environ["LBT_TOKEN"])
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    rng = random.Random(1)

    async def task(request: web.Request) -> web.Response:
        body = await request.json()
        url, data = f"{rng.choice(nodes)}/tasks", json.dumps({"work": body["work"]}).encode()
        headers, _ = signer.headers("POST", url, data)
        async with session.post(url, data=data, headers=headers) as resp:
            return web.json_response(await resp.json(), status=resp.status)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/tasks", task)
    app.router.add_get("/v1/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    try:
        while True:
            await asyncio.sleep(3600)
    finally:
        await session.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--node", action="append", required=True, help="base URL of a node (.../v1/nodes/k)")
    args = parser.parse_args()
    uvloop.run(main(args.port, args.node))
