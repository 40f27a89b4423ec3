"""Running one cluster process: uvloop, the file-descriptor limit, logging, and a clean stop on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import sys
from pathlib import Path

from aiohttp import web

from lbtestbed.transport.cluster_file import ClusterError, ClusterFile


def raise_fd_limit() -> None:
    """Every task in flight holds a connection (synchronous completion): allow as many as the system does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def process_parser(role: str) -> argparse.ArgumentParser:
    """The command line of a cluster process (``role``: ``server_node`` or ``dispatcher``)."""
    what = "node host" if role == "server_node" else role
    parser = argparse.ArgumentParser(
        prog=f"python -m lbtestbed.{role}",
        description=f"One {what} of a cluster file. The token comes from the file, or from the environment "
        "variable LBT_TOKEN when the file has none (containers: the file from a ConfigMap, the token from a "
        "Secret).",
    )
    parser.add_argument(
        "--cluster", required=True, type=Path, help="the cluster file (lbt cluster up writes one)"
    )
    parser.add_argument("--index", required=True, type=int, help="which of the file's processes this is")
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="address to bind (default: the host and port of this process's URL in the cluster file, "
        "which is what peers use; in a container e.g. 0.0.0.0:8000)",
    )
    return parser


def process_args(role: str) -> tuple[ClusterFile, int, str | None]:
    """The cluster file, this process's index and the address to bind; exit 2 with one line if bad."""
    args = process_parser(role).parse_args()
    try:
        cluster = ClusterFile.load(args.cluster)
    except ClusterError as e:
        print(f"{role}: error: {e}", file=sys.stderr)
        sys.exit(2)
    processes = cluster.node_hosts if role == "server_node" else cluster.dispatchers
    problem = None
    if not cluster.token:
        problem = f"{args.cluster}: no token in the file and LBT_TOKEN is not set"
    elif not 0 <= args.index < len(processes):
        problem = (
            f"--index {args.index}: the file has {len(processes)} of this role (0 to {len(processes) - 1})"
        )
    elif args.listen is not None and not _host_port(args.listen):
        problem = f"--listen {args.listen!r}: expected HOST:PORT, e.g. 0.0.0.0:8000"
    if problem:
        print(f"{role}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    return cluster, args.index, args.listen


def _host_port(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def serve(app: web.Application, url: str, name: str, listen: str | None = None) -> None:
    """Serve ``app`` on ``listen`` (HOST:PORT), by default the host and port of ``url``, until SIGTERM."""
    import uvloop

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    raise_fd_limit()
    bind = _host_port(listen or url.rsplit("//", 1)[1])
    assert bind is not None, url
    host, port = bind

    async def main() -> None:
        # tasks still in service when the process stops are lost anyway: do not wait for them long
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        await site.start()
        logging.info("serving on %s:%d as %s", host, port, url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        logging.info("stopping")
        await runner.cleanup()

    uvloop.run(main())
