"""What the machine itself costs during a run: a bare probe process beside the cluster.

The probe (``python -m lbtestbed.experiment.machine PORT``) runs the same kind of stack as a cluster process
(uvloop, an aiohttp server on loopback) with nothing to do: it answers ``POST /echo`` at once and, all the
time, sleeps 10 ms and records how late its timer fired. ``lbt run`` sends it a few echoes a second over the
measured window, as the generator sends tasks, and reads its timer samples afterwards; the round trips and
the lateness are what one hop and one timer wake-up cost on this machine at that moment
(``analysis.measurement.legs``). The probe's load (tens of requests a second) is negligible.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator

import orjson

from lbtestbed.analysis.measurement.legs import MachineCost
from lbtestbed.cluster.processes import free_ports
from lbtestbed.transport.alarm import Alarm
from lbtestbed.transport.http import HttpPool

#: echoes per wall second over the window
RATE = 20.0
#: the probe's timer period, wall seconds
TICK = 0.01
#: timer samples the probe keeps (about 3 minutes of them)
KEPT = 20_000


class Probe:
    """A running probe process and the round trips measured against it."""

    def __init__(self, port: int, process: subprocess.Popen[bytes]) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.process = process
        self.pool = HttpPool(self.url)
        self.round_trips: list[tuple[float, float]] = []  # (monotonic instant, wall seconds)

    async def ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, TimeoutError):
                await self.pool.post("/echo", b"{}", timeout=1.0)
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the machine probe did not start (exit {self.process.poll()})")
            await asyncio.sleep(0.05)

    async def ping(self, until: float) -> None:
        """Echoes at RATE until the monotonic instant ``until`` (one at a time, as a light client)."""
        while (now := time.monotonic()) < until:
            with contextlib.suppress(OSError, TimeoutError):
                await self.pool.post("/echo", b'{"work": 1.0}', timeout=5.0)
                self.round_trips.append((now, time.monotonic() - now))
            await asyncio.sleep(max(0.0, now + 1.0 / RATE - time.monotonic()))

    async def cost(self, start: float, end: float) -> MachineCost:
        """What the machine cost the probe between the monotonic instants ``start`` and ``end``."""
        late: list[float] = []
        with contextlib.suppress(OSError, TimeoutError, ValueError):
            _, raw = await self.pool.post("/lateness", b"{}", timeout=5.0)
            late = [x for t, x in orjson.loads(raw) if start <= t <= end]
        trips = [x for t, x in self.round_trips if start <= t <= end]
        return MachineCost(trips, late)


@contextlib.asynccontextmanager
async def started() -> AsyncIterator[Probe]:
    """A probe process for the duration of the block; it is stopped (and waited for) whatever happens."""
    (port,) = free_ports(1)
    process = subprocess.Popen(
        [sys.executable, "-m", "lbtestbed.experiment.machine", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probe = Probe(port, process)
    try:
        await probe.ready()
        yield probe
    finally:
        probe.pool.close()
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ------------------------------------------------------------------------------------ the probe itself


def _stamp(fired: asyncio.Future[float]) -> None:
    """The instant the probe's timer fired."""
    if not fired.done():
        fired.set_result(time.monotonic())


def serve(port: int) -> None:
    """The probe process: an echo and a timer that measures its own lateness, until SIGTERM."""
    import uvloop
    from aiohttp import web

    samples: deque[tuple[float, float]] = deque(maxlen=KEPT)

    async def echo(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b'{"ok": true}', content_type="application/json")

    async def lateness(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=orjson.dumps(list(samples)), content_type="application/json")

    async def tick() -> None:
        # a timer armed as a node host arms its completion timers (server_node.host: an Alarm at the
        # target instant), at targets spread over the millisecond as tasks' completions are
        loop = asyncio.get_running_loop()
        alarm = Alarm(loop)
        rng = random.Random(1)
        while True:
            due = time.monotonic() + TICK * (0.5 + rng.random())
            fired: asyncio.Future[float] = loop.create_future()
            alarm.at(due, _stamp, fired)
            now = await fired
            samples.append((now, max(0.0, now - due)))

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/echo", echo)
        app.router.add_post("/lateness", lateness)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await tick()

    uvloop.run(main())


if __name__ == "__main__":
    serve(int(sys.argv[1]))
