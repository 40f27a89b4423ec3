"""The lean HTTP/1.1 server (lbtestbed/transport/lean_http.py) against a bare asyncio.Protocol echo and an
aiohttp echo, in one run (issue 26).

Every server is an echo in a process of its own on uvloop, answering ``{"ok": true}`` to each POST:

* **protocol**: a bare ``asyncio.Protocol`` that finds the head's end and Content-Length and writes a fixed
  answer: the floor of any HTTP server in Python;
* **aiohttp**: a ``web.Application`` with one route, as the cluster's processes serve today;
* **lean**: ``LeanServer`` with one route whose handler is a coroutine (as the task handlers are: the
  server runs each as an asyncio task);
* **lean-signed**: the same route for peers only: the client signs each request and checks each answer's
  signature (``transport.signing``), as between dispatcher and node.

and two chains of two processes, a task's two hops without the dispatch: **chain-aiohttp**, an aiohttp
forwarder that posts each request, signed, through ``HttpPool`` to an aiohttp echo behind ``wire.signed``
(as dispatcher and node host serve today), and **chain-lean**, the same with lean servers.

They get the same open-loop Poisson load (R requests per wall second on an absolute schedule, round trip
from the intended send, the project's ``HttpPool`` client, as ``bench_overhead.py``) in interleaved rounds,
so that a busy moment of the machine falls on every server alike. Reported per server: p50 and p99 of the
round trip, the server processes' CPU per request (user + system, from /proc through psutil, over each
round), the client process's (the generator and its ``HttpPool``), and the ratios to the protocol echo's.

    .venv/bin/python benchmarks/bench_lean_server.py [--rate 2000] [--seconds 5] [--rounds 3] [--json]
    .venv/bin/python benchmarks/bench_lean_server.py --profile lean-signed   # cProfile of the server
    .venv/bin/python benchmarks/bench_lean_server.py --instructions   # per request, under valgrind
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import uvloop

from lbtestbed.cluster.processes import free_ports
from lbtestbed.transport.http import HttpPool
from lbtestbed.transport.signing import Signer

KINDS = ("protocol", "aiohttp", "lean", "lean-signed", "chain-aiohttp", "chain-lean")
#: a chain: a forwarder in front of a signed echo, two processes (a task's two hops, without the dispatch)
CHAINS = {"chain-aiohttp": ("aiohttp-signed", "fwd-aiohttp"), "chain-lean": ("lean-signed", "fwd-lean")}
KEY = "k" * 32
BODY = b'{"work": 1.0, "origin": 0}'
ANSWER = b'{"ok": true}'

# ============================================================================================ the servers


class _Echo(asyncio.Protocol):
    """The bare echo: what any HTTP server must do at least (find the head's end, read the body's length)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            at = buf.find(b"Content-Length: ", 0, end)
            length = int(buf[at + 16 : buf.find(b"\r\n", at)]) if at >= 0 else 0
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length :]
            self.transport.write(  # type: ignore[attr-defined]
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(ANSWER), ANSWER)
            )
        self.buffer = buf


async def _serve(kind: str, port: int, target: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if kind == "protocol":
        server = await loop.create_server(_Echo, "127.0.0.1", port, backlog=4096)
        await stop.wait()
        server.close()
    elif kind in ("aiohttp", "aiohttp-signed", "fwd-aiohttp"):
        await _serve_aiohttp(kind, port, target, stop)
    else:
        await _serve_lean(kind, port, target, stop)


async def _serve_aiohttp(kind: str, port: int, target: str, stop: asyncio.Event) -> None:
    from aiohttp import web

    from lbtestbed.transport import wire
    from lbtestbed.transport.signing import Verifier

    pool = HttpPool(target, signer=Signer(KEY)) if target else None

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        if pool is None:
            return web.Response(body=ANSWER, content_type="application/json")
        status, answer = await pool.post("/echo", body, timeout=10.0)
        return web.Response(status=status, body=answer, content_type="application/json")

    app = web.Application()
    verifier = Verifier(KEY, f"http://127.0.0.1:{port}")
    app.router.add_post("/echo", wire.signed(verifier, echo) if kind == "aiohttp-signed" else echo)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    await stop.wait()
    await runner.cleanup()


async def _serve_lean(kind: str, port: int, target: str, stop: asyncio.Event) -> None:
    from lbtestbed.transport.lean_http import LeanServer, Request, Response, Routes
    from lbtestbed.transport.signing import Verifier

    pool = HttpPool(target, signer=Signer(KEY)) if target else None

    async def echo(request: Request) -> Response:
        if pool is None:
            return Response(200, ANSWER)
        status, answer = await pool.post("/echo", request.body, timeout=10.0)
        return Response(status, answer)

    routes = Routes()
    verifier = Verifier(KEY, f"http://127.0.0.1:{port}") if kind == "lean-signed" else None
    routes.post("/echo", echo, verifier=verifier)
    lean = LeanServer(routes)
    await lean.start("127.0.0.1", port)
    await stop.wait()
    await lean.close()


def serve(kind: str, port: int, target: str, profile: str | None) -> None:
    """The server process (``--serve KIND PORT [TARGET]``: a forwarder's is the URL it forwards to); with
    ``profile`` it writes cProfile stats there."""
    if profile is None:
        uvloop.run(_serve(kind, port, target))
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    uvloop.run(_serve(kind, port, target))
    profiler.disable()
    profiler.dump_stats(profile)


# ============================================================================================ the load


def poisson_times(rate: float, seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, int(rate * seconds * 1.5) + 100)
    times = np.cumsum(gaps)
    return times[times < seconds]


async def load_round(url: str, times: np.ndarray, signed: bool) -> np.ndarray:
    """Round trips (s) of POSTs sent on the absolute schedule ``times``, each from its intended send."""
    pool = HttpPool(url, signer=Signer(KEY) if signed else None)
    out = np.full(len(times), np.nan)

    async def one(i: int, intended: float) -> None:
        status, body = await pool.post("/echo", BODY, timeout=10.0)
        if status == 200 and body == ANSWER:
            out[i] = time.monotonic() - intended

    start = time.monotonic() + 0.05
    pending: set[asyncio.Future[None]] = set()
    for i, t in enumerate(times):
        intended = start + float(t)
        while (now := time.monotonic()) < intended:
            await asyncio.sleep(intended - now)
        task = asyncio.ensure_future(one(i, intended))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    pool.close()
    return out


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


Servers = dict[str, tuple[list[subprocess.Popen[bytes]], str]]


def start_servers(kinds: list[str], profile_dir: str | None = None) -> Servers:
    """Each kind's processes (two for a chain: its signed echo, then the forwarder) and the URL to load."""
    parts = [p for k in kinds for p in CHAINS.get(k, (k,))]
    ports = iter(free_ports(len(parts)))
    servers: Servers = {}
    for kind in kinds:
        procs: list[subprocess.Popen[bytes]] = []
        url = ""
        for part in CHAINS.get(kind, (kind,)):
            port = next(ports)
            args = [sys.executable, __file__, "--serve", part, str(port), url]
            if profile_dir is not None:
                args += ["--profile-out", os.path.join(profile_dir, f"{part}.prof")]
            procs.append(subprocess.Popen(args))
            url = f"http://127.0.0.1:{port}"
            _wait_listening(url)
        servers[kind] = (procs, url)
    return servers


def _wait_listening(url: str) -> None:
    import socket

    host, port = url.rsplit("//", 1)[1].split(":")
    for _ in range(200):
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"server at {url} did not start")


def stop_servers(servers: Servers) -> None:
    procs = [p for ps, _ in servers.values() for p in ps]
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def quantiles(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    return {"p50_ms": 1e3 * float(np.quantile(x, 0.5)), "p99_ms": 1e3 * float(np.quantile(x, 0.99))}


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Interleaved rounds over every kind; per kind the round trips, its servers' CPU per request and the
    client's (this process: the generator and HttpPool, signing where the kind's first hop is signed)."""
    kinds = list(args.kinds)
    servers = start_servers(kinds)
    rtts: dict[str, list[np.ndarray]] = {k: [] for k in kinds}
    cpu: dict[str, list[tuple[float, float, int]]] = {k: [] for k in kinds}
    me = psutil.Process()
    try:
        procs = {k: [psutil.Process(p.pid) for p in ps] for k, (ps, _) in servers.items()}
        for k, (_, url) in servers.items():  # warm-up: connections made, code paths hot
            uvloop.run(load_round(url, poisson_times(args.rate, 0.5, 0), k == "lean-signed"))
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}: {', '.join(kinds)}", file=sys.stderr)
            times = poisson_times(args.rate, args.seconds, args.seed + r)
            for k in kinds if r % 2 == 0 else reversed(kinds):
                before, client = sum(map(cpu_seconds, procs[k])), cpu_seconds(me)
                out = uvloop.run(load_round(servers[k][1], times, k == "lean-signed"))
                used = sum(map(cpu_seconds, procs[k])) - before
                cpu[k].append((used, cpu_seconds(me) - client, int(np.isfinite(out).sum())))
                rtts[k].append(out)
    finally:
        stop_servers(servers)
    results = {}
    for k in kinds:
        all_rtt = np.concatenate(rtts[k])
        seconds, client, answered = map(sum, zip(*cpu[k], strict=True))
        results[k] = {
            **quantiles(all_rtt),
            "cpu_us": 1e6 * seconds / max(1, answered),
            "client_cpu_us": 1e6 * client / max(1, answered),
            "failed": int(len(all_rtt) - np.isfinite(all_rtt).sum()),
        }
    base = results.get("protocol")
    if base is not None:
        for v in results.values():
            v["ratio_p50"] = v["p50_ms"] / base["p50_ms"]
            v["ratio_p99"] = v["p99_ms"] / base["p99_ms"]
            v["ratio_cpu"] = v["cpu_us"] / base["cpu_us"]
    return results


# ==================================================================== instructions, whatever the machine does


class _FakeTransport:
    """Takes a server's answers without a socket: what is left of a request's cost is the server's code."""

    def __init__(self) -> None:
        self.answers = 0

    def write(self, data: bytes) -> None:
        self.answers += 1

    def writelines(self, lines: list[bytes]) -> None:
        self.answers += 1

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


async def _feed(kind: str, count: int, feed: bool) -> None:
    """Make ``count`` requests of ``kind`` (signed for lean-signed) and, if ``feed``, give each to a server
    protocol on a fake transport, letting the loop turn a few times after each (``--feed``)."""
    from aiohttp import web

    from lbtestbed.transport.lean_http import LeanServer, Request, Response, Routes
    from lbtestbed.transport.signing import Verifier

    async def lean_echo(request: Request) -> Response:
        return Response(200, ANSWER)

    async def aiohttp_echo(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    runner = None
    if kind == "protocol":
        protocol: asyncio.Protocol = _Echo()
    elif kind == "aiohttp":
        app = web.Application()
        app.router.add_post("/echo", aiohttp_echo)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        assert runner.server is not None
        protocol = runner.server()
    else:
        routes = Routes()
        verifier = Verifier(KEY, "http://127.0.0.1:8000") if kind == "lean-signed" else None
        routes.post("/echo", lean_echo, verifier=verifier)
        protocol = LeanServer(routes)()
    transport = _FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    signer = Signer(KEY)
    for _ in range(count):
        auth = b""
        if kind == "lean-signed":
            value, _ = signer.sign(b"POST", b"127.0.0.1:8000", b"/echo", BODY)
            auth = b"Authorization: %s\r\n" % value
        head = b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
        data = head + b"%sContent-Length: %d\r\n\r\n%s" % (auth, len(BODY), BODY)
        if feed:
            protocol.data_received(data)
        for _ in range(4):
            await asyncio.sleep(0)
    assert transport.answers == (count if feed else 0), transport.answers
    protocol.connection_lost(None)
    if runner is not None:
        await runner.cleanup()


def instructions(kinds: list[str], count: int) -> dict[str, float]:
    """Machine instructions per request of each server's code (valgrind's callgrind): a run that feeds
    ``count`` requests less one that makes them only, divided by ``count``. No socket, no kernel: what the
    server's own code costs, the same on a busy machine as on a quiet one."""
    out = {}
    for kind in kinds:
        totals = []
        for feed in (0, 1):
            command = [sys.executable, __file__, "--feed", kind, str(count), str(feed)]
            proc = subprocess.run(
                ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )
            found = re.search(r"Collected : (\d+)", proc.stderr)
            if proc.returncode != 0 or found is None:
                raise SystemExit(f"callgrind failed for {kind}: {proc.stderr[-500:]}")
            totals.append(int(found.group(1)))
        out[kind] = (totals[1] - totals[0]) / count
        print(f"{kind}: {out[kind]:.0f} instructions per request", file=sys.stderr)
    return out


def profile(args: argparse.Namespace) -> None:
    import pstats

    with tempfile.TemporaryDirectory(prefix="lbt-lean-profile-") as tmp:
        servers = start_servers([args.profile], tmp)
        try:
            times = poisson_times(args.rate, args.seconds, args.seed)
            uvloop.run(load_round(servers[args.profile][1], times, args.profile == "lean-signed"))
        finally:
            stop_servers(servers)
        stats = pstats.Stats(str(Path(tmp) / f"{args.profile}.prof"))
        stats.sort_stats("tottime").print_stats(25)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rate", type=float, default=2000.0, help="requests per wall second (default 2000)")
    p.add_argument("--seconds", type=float, default=5.0, help="wall seconds per round and server (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every server (default 3)")
    p.add_argument("--seed", type=int, default=1, help="round r's schedule uses seed + r (default 1)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="the servers to compare")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--profile", choices=KINDS[1:4], help="no comparison: cProfile one server under the load")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="no load: instructions per request of each server's code, under valgrind (a few minutes)",
    )
    p.add_argument("--serve", nargs=3, metavar=("KIND", "PORT", "TARGET"), help=argparse.SUPPRESS)
    p.add_argument("--feed", nargs=3, metavar=("KIND", "COUNT", "FEED"), help=argparse.SUPPRESS)
    p.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), args.serve[2], args.profile_out)
        return 0
    if args.feed:
        uvloop.run(_feed(args.feed[0], int(args.feed[1]), args.feed[2] == "1"))
        return 0
    if args.profile:
        profile(args)
        return 0
    if args.instructions:
        counts = instructions([k for k in args.kinds if k not in CHAINS], 2000)
        base = counts.get("protocol")
        if args.json:
            json.dump({"instructions_per_request": counts}, sys.stdout, indent=1)
            sys.stdout.write("\n")
            return 0
        for k, v in counts.items():
            ratio = f"  ({v / base:.2f} x protocol)" if base else ""
            print(f"{k:<12} {v:9.0f} instructions per request{ratio}")
        return 0
    results = measure(args)
    if args.json:
        json.dump({"rate": args.rate, "servers": results}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(f"at {args.rate:g} requests/s, {args.rounds} x {args.seconds:g} s per server:")
    print(
        f"{'server':<14} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11} {'client us':>10}"
        "   ratios to protocol (p50, p99, CPU)"
    )
    for k, v in results.items():
        ratios = (
            f"{v['ratio_p50']:.2f}, {v['ratio_p99']:.2f}, {v['ratio_cpu']:.2f}" if "ratio_p50" in v else "-"
        )
        failed = f"  ({v['failed']} failed)" if v["failed"] else ""
        print(
            f"{k:<14} {v['p50_ms']:8.3f} {v['p99_ms']:8.3f} {v['cpu_us']:11.1f} {v['client_cpu_us']:10.1f}"
            f"   {ratios}{failed}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
