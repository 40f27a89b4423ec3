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

from lbtestbed.cluster import ClusterError, ClusterFile


def raise_fd_limit() -> None:
    """Every task in flight holds a connection (synchronous completion): allow as many as the system does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def process_args(role: str) -> tuple[ClusterFile, int]:
    parser = argparse.ArgumentParser(prog=f"python -m lbtestbed.{role}", description=f"one {role} process")
    parser.add_argument(
        "--cluster", required=True, type=Path, help="the cluster file written by lbt cluster up"
    )
    parser.add_argument("--index", required=True, type=int, help="which of the file's processes this is")
    args = parser.parse_args()
    try:
        return ClusterFile.load(args.cluster), args.index
    except ClusterError as e:
        print(f"{role}: error: {e}", file=sys.stderr)
        sys.exit(2)


def serve(app: web.Application, url: str, name: str) -> None:
    """Serve ``app`` on the host and port of ``url`` until SIGTERM or SIGINT."""
    import uvloop

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    raise_fd_limit()
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, int(port), backlog=4096, reuse_address=True)
        await site.start()
        logging.info("serving on %s", url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        logging.info("stopping")
        await runner.cleanup()

    uvloop.run(main())
