"""The watch's check of one process (``experiment.watch``), against a real process on loopback: a process
stopped while its health request is on its way is seen stopped, although it answers that request once
continued (the nemesis dealt a stall of 1.2 s that began during a check, and no check saw it out)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from lbtestbed.experiment.watch import Watch
from lbtestbed.spec import load_spec
from lbtestbed.transport.cluster_file import ClusterFile, Endpoint
from lbtestbed.transport.wire import PREFIX

ROOT = Path(__file__).resolve().parents[1]
#: wall seconds the child takes to answer a health request: the window in which it is stopped
ANSWER_AFTER = 0.4
#: a stdlib HTTP server whose health answer takes ANSWER_AFTER (the request is on its way meanwhile)
SERVER = f"""
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep({ANSWER_AFTER})
        self.send_response(200 if self.path == "{PREFIX}/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def child() -> Iterator[Endpoint]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "the child server did not start"
            time.sleep(0.05)
        ps = psutil.Process(proc.pid)
        yield Endpoint(
            "nodes", 0, f"http://127.0.0.1:{port}", [0], proc.pid, "", ps.create_time(), ps.cmdline()
        )
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(30)


def watch_of(e: Endpoint, tmp_path: Path) -> Watch:
    exp = load_spec(str(ROOT / "examples" / "jiq_faults.toml"))
    # a timeout far beyond the child's answer: the request is answered, not timed out, either way
    exp = dataclasses.replace(exp, health=dataclasses.replace(exp.health, heartbeat=0.05, timeout=5.0))
    f = ClusterFile("spec.toml", {}, "token", [], [e])
    return Watch(exp, f, tmp_path / "cluster.json", time.monotonic(), lambda _: None, lambda _: None)


def check(watch: Watch, e: Endpoint, stop_for: float | None) -> str | None:
    """One check of ``e``; with ``stop_for``, the child is stopped 0.1 s into it (its request on its way)
    for that long, then continued."""

    async def main() -> str | None:
        async with aiohttp.ClientSession() as session:
            checking = asyncio.ensure_future(watch._check(session, e))
            if stop_for is not None:
                await asyncio.sleep(0.1)
                os.kill(e.pid, signal.SIGSTOP)
                await asyncio.sleep(stop_for)
                os.kill(e.pid, signal.SIGCONT)
            return await checking

    return asyncio.run(main())


def test_a_process_answering_slowly_serves(child: Endpoint, tmp_path: Path) -> None:
    assert check(watch_of(child, tmp_path), child, None) is None


def test_a_process_stopped_while_its_check_is_out_is_seen_stopped(child: Endpoint, tmp_path: Path) -> None:
    """Stopped 0.1 s into a check whose answer takes 0.4 s, for 0.5 s: the request is answered within the
    timeout once continued, yet the check, which looked at the process every heartbeat meanwhile, says
    stopped."""
    assert check(watch_of(child, tmp_path), child, 0.5) == "stopped"
