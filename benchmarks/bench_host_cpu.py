"""CPU per task of a whole cluster in one process, against a bare aiohttp echo in the same run.

A node host and a dispatcher (random policy, two pool nodes, tasks of 0.1 ms of wall time) are served in
this process as their processes serve them (``transport.process.start_serving``: the task path on the lean
server, the rest on aiohttp; on a tree older than that, their aiohttp apps) and the lean client posts tasks
to the dispatcher, ``BATCH`` at a time:
the process's CPU time over the tasks is every side's (client, dispatcher, node) CPU per task, with no
other process and no scheduling noise between them. The baseline, in alternating rounds: the same client
posting to a bare aiohttp echo (one round trip, answered at once). Their ratio compares trees and machines
(run it under ``PYTHONPATH=<other tree>`` for another version of the hosts).

    .venv/bin/python benchmarks/bench_host_cpu.py [--tasks 6000] [--rounds 8] [--json]
    .venv/bin/python benchmarks/bench_host_cpu.py --profile host.prof   # cProfile of the cluster rounds

``--profile FILE`` writes a cProfile of the cluster rounds only (``python -m pstats FILE``, or snakeviz).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from aiohttp import web

from lbtestbed.cluster.processes import free_ports
from lbtestbed.dispatcher.app import build_app as dispatcher_app
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.server_node.app import build_app as node_app
from lbtestbed.server_node.host import NodeHost
from lbtestbed.spec import parse_spec
from lbtestbed.transport.http import HttpPool

BATCH = 50
EXP = {
    "name": "host-cpu",
    "seed": 1,
    "classes": [{"name": "p", "count": 2, "discipline": "pool"}],
    "workload": {"load": 0.5, "service": {"dist": "exponential", "mean": 1.0}},
    "policy": {"name": "random"},
    "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 1e-4},
}


class _Closing:
    def __init__(self, runner: web.AppRunner) -> None:
        self.runner = runner

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve(app: web.Application, port: int) -> Any:
    """``app`` served as its process serves it (an object with an async ``close``)."""
    try:
        from lbtestbed.transport.process import start_serving
    except ImportError:  # a tree before the lean task path: aiohttp alone
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return _Closing(runner)
    return await start_serving(app, "127.0.0.1", port)


async def cpu_per_request(
    post: Callable[[], Awaitable[None]], n: int, profile: cProfile.Profile | None = None
) -> float:
    """CPU microseconds of this process per request, ``BATCH`` requests at a time (after a warm-up)."""
    for _ in range(4):
        await asyncio.gather(*(post() for _ in range(BATCH)))
    if profile is not None:
        profile.enable()
    began = time.process_time()
    for _ in range(n // BATCH):
        await asyncio.gather(*(post() for _ in range(BATCH)))
    spent = time.process_time() - began
    if profile is not None:
        profile.disable()
    return 1e6 * spent / (n // BATCH * BATCH)


async def main(tasks: int, rounds: int, profile: cProfile.Profile | None) -> dict[str, list[float]]:
    exp = parse_spec(EXP)
    node_port, disp_port, echo_port = free_ports(3)
    nodes, disp = f"http://127.0.0.1:{node_port}", f"http://127.0.0.1:{disp_port}"
    node = NodeHost(exp, [0, 1], [disp], "t", url=nodes)
    dispatcher = DispatcherHost(exp, 0, 1, [f"{nodes}/v1/nodes/{k}" for k in range(2)], "t", url=disp)

    async def echo(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    bare = web.Application()
    bare.router.add_post("/echo", echo)
    runners = [
        await serve(node_app(node), node_port),
        await serve(dispatcher_app(dispatcher), disp_port),
        await serve(bare, echo_port),
    ]
    # (before the hosts were split into core and shell, the event was the health object's)
    ready: asyncio.Event = getattr(dispatcher, "ready", None) or dispatcher.health.ready
    await ready.wait()
    to_dispatcher, to_echo = HttpPool(disp), HttpPool(f"http://127.0.0.1:{echo_port}")

    async def task() -> None:
        status, _ = await to_dispatcher.post("/v1/tasks", b'{"work": 1.0}')
        assert status == 200, status

    async def round_trip() -> None:
        status, _ = await to_echo.post("/echo", b'{"work": 1.0}')
        assert status == 200, status

    out: dict[str, list[float]] = {"echo": [], "cluster": []}
    try:
        for r in range(rounds):
            print(f"round {r + 1}/{rounds}", file=sys.stderr)
            out["echo"].append(await cpu_per_request(round_trip, tasks))
            out["cluster"].append(await cpu_per_request(task, tasks, profile))
    finally:
        to_dispatcher.close()
        to_echo.close()
        for runner in reversed(runners):
            await runner.close()
    return out


def cli() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--tasks", type=int, default=6000, help="tasks per round and path (default 6000)")
    p.add_argument("--rounds", type=int, default=8, help="rounds of echo then cluster (default 8)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--profile", metavar="FILE", help="write a cProfile of the cluster rounds to FILE")
    args = p.parse_args()
    profile = cProfile.Profile() if args.profile else None
    got = uvloop.run(main(args.tasks, args.rounds, profile))
    if profile is not None:
        profile.dump_stats(args.profile)
    ratios = [c / e for e, c in zip(got["echo"], got["cluster"], strict=True)]
    out = {
        "echo_us": statistics.median(got["echo"]),
        "cluster_us": statistics.median(got["cluster"]),
        "ratio": statistics.median(ratios),
        "rounds": got,
    }
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(
        f"CPU per task, medians of {args.rounds} rounds: echo round trip {out['echo_us']:.1f} µs, "
        f"client + dispatcher + node {out['cluster_us']:.1f} µs ({out['ratio']:.2f} x echo)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(cli())
