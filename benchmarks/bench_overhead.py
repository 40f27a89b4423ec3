"""The transport-and-dispatch overhead of a task, against a bare aiohttp echo over loopback, in one run.

Two paths get the same open-loop Poisson load (R requests per wall second, absolute schedule, sojourn from
the intended send) in alternating rounds:

* **echo**: a plain aiohttp + uvloop server (its own process) that answers every POST at once: one loopback
  round trip, the floor of any request, sent from this process on the same schedule and in the same way
  as the generator sends tasks (``echo_round``); and the same echo sent as this benchmark sent it before
  (``spinning_echo_round``: a client that spins through the loop to each intended instant), the baseline
  issue 26's targets were set against;
* **cluster**: ``lbt``'s generator, dispatcher (random policy) and node processes, on pool nodes (tasks do
  not queue) with tasks of 20 ms wall on average. Its overhead per task is the sojourn minus the stay at
  the node: two round trips (client to dispatcher, dispatcher to node), the node's timer and the
  dispatch. The legs of each task (docs/run.md, "Where the time goes") say where.

Reported, per round and as medians (ranges) over the rounds: p50 and p99 of both in wall ms and their
ratios (each round's overhead over the echo of the same round), the p50 of every leg, the load average,
and the CPU time per completed task of the generator (this process, over the cluster round), the
dispatcher and the node processes (user + system, from ``/proc/PID/stat``; the echo rounds in between
leave them idle but for their health checks) and of all of them; and, over the echo rounds, the CPU per
request of the echo's client (this process: what a bare client costs), of the echo's server and of the
idle cluster (heartbeats, timers). Targets (issue 26): at 2,000 tasks/s, overhead p50 <= 1.5 x and
p99 <= 3 x the echo's, CPU per task over all processes <= 150 µs.

    .venv/bin/python benchmarks/bench_overhead.py [--rate 2000] [--seconds 5] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.cluster.processes import free_ports
from lbtestbed.experiment.preflight import pools_spec
from lbtestbed.loadgen.openloop import LoadReport, drive, poisson_tasks
from lbtestbed.spec import load_spec
from lbtestbed.transport.alarm import Alarm
from lbtestbed.transport.http import HttpPool

ECHO = """
import sys, uvloop
from aiohttp import web
async def echo(request):
    await request.read()
    return web.json_response({"ok": True})
app = web.Application()
app.router.add_post("/echo", echo)
loop = uvloop.new_event_loop()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None, loop=loop)
"""


TASK_WALL = 0.02  # seconds: the mean task
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / CLK_TCK


async def echo_round(url: str, times: list[float]) -> np.ndarray:
    """Round trips (s) from each intended send, on the same absolute schedule, sent the same way as the
    generator sends (an ``Alarm`` at each intended instant, ``HttpPool.request``, a done callback)."""
    loop = asyncio.get_running_loop()
    pool, alarm = HttpPool(url), Alarm(loop)
    out = np.full(len(times), np.nan)
    start = time.monotonic() + 0.05
    left = len(times)
    sent = 0
    all_done = loop.create_future()

    def answered(i: int, intended: float, answer: asyncio.Future[tuple[int, bytes]]) -> None:
        nonlocal left
        if not answer.cancelled() and answer.exception() is None:
            out[i] = time.monotonic() - intended
        left -= 1
        if not left and not all_done.done():
            all_done.set_result(None)

    def tick() -> None:
        nonlocal sent
        now = time.monotonic()
        while sent < len(times):
            intended = start + times[sent]
            if now < intended:
                alarm.at(intended, tick)
                return
            if hasattr(pool, "request"):
                answer = pool.request("/echo", b'{"work": 1.0}')
            else:  # a tree before HttpPool.request (measuring an older version)
                answer = asyncio.ensure_future(pool.post("/echo", b'{"work": 1.0}'))
            answer.add_done_callback(functools.partial(answered, sent, intended))
            sent += 1
            now = time.monotonic()

    tick()
    await all_done
    alarm.close()
    pool.close()
    return out


async def spinning_echo_round(url: str, times: list[float]) -> np.ndarray:
    """The echo as this benchmark sent it before the generator's alarm (issue 26's targets were set against
    it): waiting for each intended instant on the loop's millisecond timers, which spins through the loop
    (about 30 turns per request at 2,000 a second), and a task per request. The spinning client's own
    lateness and CPU count in its round trips."""
    pool = HttpPool(url)
    out = np.full(len(times), np.nan)

    async def one(i: int, intended: float) -> None:
        await pool.post("/echo", b'{"work": 1.0}')
        out[i] = time.monotonic() - intended

    start = time.monotonic() + 0.05
    pending = set()
    for i, t in enumerate(times):
        intended = start + t
        while (now := time.monotonic()) < intended:
            await asyncio.sleep(intended - now)
        task = asyncio.ensure_future(one(i, intended))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    pool.close()
    return out


async def _drive(urls: list[str], tasks: list[tuple[float, float]], scale: float, report: LoadReport) -> None:
    """``drive`` returning nothing: Python 3.11's runner formats its main task's result when it ends (0.1 s
    for a report of 10,000 tasks, which would count in the generator's CPU)."""
    await drive(urls, tasks, scale, report=report)


def quantiles(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    return {"p50_ms": 1e3 * float(np.quantile(x, 0.5)), "p99_ms": 1e3 * float(np.quantile(x, 0.99))}


def spread(values: list[float]) -> dict[str, float]:
    """Median, least and largest of the rounds' values."""
    return {"median": float(np.median(values)), "min": min(values), "max": max(values)}


def start_profilers(pids: dict[str, list[int]], seconds: float, out: Path) -> list[subprocess.Popen[bytes]]:
    """``perf record`` (where the CPU goes, kernel included, by library and symbol) and ``py-spy record``
    (the Python functions) on every process for ``seconds``."""
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for role, ps in {"generator": [os.getpid()], **pids}.items():
        for i, pid in enumerate(ps):
            name = f"{role}-{i}"
            perf = ["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", str(out / f"{name}.perf.data")]
            procs.append(subprocess.Popen([*perf, "--", "sleep", str(seconds)], stderr=subprocess.DEVNULL))
            spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking"]
            spy += ["-r", "200", "-d", str(int(seconds)), "-f", "raw", "-p", str(pid)]
            procs.append(
                subprocess.Popen([*spy, "-o", str(out / f"{name}.pyspy.txt")], stdout=subprocess.DEVNULL)
            )
    time.sleep(0.5)  # both attached before the round starts
    return procs


def run_rounds(
    echo_pid: int,
    url: str,
    exp: Any,
    tasks: list[tuple[float, float]],
    rounds: int,
    tmp: str,
    profile: Path | None = None,
) -> list[dict]:
    """``rounds`` rounds of the echo then the cluster; each round's quantiles, legs and CPU per task; with
    ``profile``, the last cluster round's processes profiled into that directory."""
    scale = exp.run.time_scale
    times = [t * scale for t, _ in tasks]
    out = []
    with Cluster(Path(tmp) / "cluster.json") as cluster:
        f = cluster.up(exp, node_processes=2)
        pids = {"dispatcher": [d.pid for d in f.dispatchers], "nodes": [h.pid for h in f.node_hosts]}
        for r in range(rounds):
            print(f"round {r + 1}/{rounds}: echo, then the cluster", file=sys.stderr)
            cluster_cpu = sum(cpu_seconds(pid) for ps in pids.values() for pid in ps)
            server_cpu, own = cpu_seconds(echo_pid), time.process_time()
            echo = uvloop.run(echo_round(url, times))
            echo_cpu = {  # this client's, the echo server's, and the idle cluster's meanwhile (heartbeats)
                "client": 1e6 * (time.process_time() - own) / len(times),
                "server": 1e6 * (cpu_seconds(echo_pid) - server_cpu) / len(times),
                "cluster_idle": 1e6
                * (sum(cpu_seconds(p) for ps in pids.values() for p in ps) - cluster_cpu)
                / len(times),
            }
            spinning = uvloop.run(spinning_echo_round(url, times))
            profilers = []
            if profile is not None and r == rounds - 1:
                profilers = start_profilers(pids, times[-1] + 0.5, profile)
            before = {role: sum(map(cpu_seconds, ps)) for role, ps in pids.items()}
            own = time.process_time()  # the generator is this process
            report = LoadReport()
            uvloop.run(_drive([d.url for d in f.dispatchers], tasks, scale, report))
            for proc in profilers:
                proc.wait()
            cpu = {"generator": time.process_time() - own}
            cpu.update({role: sum(map(cpu_seconds, ps)) - before[role] for role, ps in pids.items()})
            recs = report.records
            done = max(1, len(recs))
            overhead = np.array([(x.sojourn - x.stay) * scale for x in recs])
            legs = {
                name: quantiles(np.array([getattr(x, name) * scale for x in recs]))
                for name in ("late", "arrive", "decide", "forward", "notify", "reply")
            }
            cpu_us = {role: 1e6 * seconds / done for role, seconds in cpu.items()}
            cpu_us["all"] = sum(cpu_us.values())
            out.append(
                {
                    "echo": quantiles(echo),
                    "echo_spinning": quantiles(spinning),
                    "overhead": quantiles(overhead),
                    "legs": legs,
                    "cpu_us_per_task": cpu_us,
                    "echo_cpu_us_per_request": echo_cpu,
                    "completed": len(recs),
                    "scheduled": len(tasks),
                    "loadavg": os.getloadavg()[0],
                }
            )
    return out


def summary(rate: float, rounds: list[dict]) -> dict[str, Any]:
    """Medians and ranges over the rounds; ratios are each round's overhead over its own echo."""

    def over(get: Any) -> dict[str, float]:
        return spread([get(r) for r in rounds])

    out: dict[str, Any] = {"rate": rate, "task_ms": 1e3 * TASK_WALL, "rounds": rounds}
    for q in ("p50_ms", "p99_ms"):
        out[f"echo_{q}"] = over(lambda r, q=q: r["echo"][q])
        out[f"echo_spinning_{q}"] = over(lambda r, q=q: r["echo_spinning"][q])
        out[f"overhead_{q}"] = over(lambda r, q=q: r["overhead"][q])
        out[f"ratio_{q[:3]}"] = over(lambda r, q=q: r["overhead"][q] / r["echo"][q])
        out[f"ratio_spinning_{q[:3]}"] = over(lambda r, q=q: r["overhead"][q] / r["echo_spinning"][q])
    out["legs_p50_ms"] = {k: over(lambda r, k=k: r["legs"][k]["p50_ms"]) for k in rounds[0]["legs"]}
    out["cpu_us_per_task"] = {
        k: over(lambda r, k=k: r["cpu_us_per_task"][k]) for k in rounds[0]["cpu_us_per_task"]
    }
    out["echo_cpu_us_per_request"] = {
        k: over(lambda r, k=k: r["echo_cpu_us_per_request"][k]) for k in rounds[0]["echo_cpu_us_per_request"]
    }
    out["loadavg"] = over(lambda r: r["loadavg"])
    out["target"] = {"ratio_p50": 1.5, "ratio_p99": 3.0, "cpu_us_per_task": 150.0}
    out["meets_target"] = (
        out["ratio_p50"]["median"] <= 1.5
        and out["ratio_p99"]["median"] <= 3.0
        and out["cpu_us_per_task"]["all"]["median"] <= 150.0
    )
    return out


def _fmt(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rate", type=float, default=2000.0, help="requests per wall second (default 2000)")
    p.add_argument("--seconds", type=float, default=5.0, help="wall seconds per round and path (default 5)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of echo then cluster (default 5)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument(
        "--profile", metavar="DIR", type=Path, help="perf and py-spy profiles of the last cluster round"
    )
    args = p.parse_args()
    scale = TASK_WALL  # one model second (the mean task) lasts 20 ms
    with tempfile.TemporaryDirectory(prefix="lbt-overhead-") as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(pools_spec(args.rate, args.seconds, scale))
        exp = load_spec(spec)
        tasks = list(poisson_tasks(exp, exp.run.duration))
        (port,) = free_ports(1)
        echo = subprocess.Popen([sys.executable, "-c", ECHO, str(port)], stdout=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            url = f"http://127.0.0.1:{port}"
            rounds = run_rounds(echo.pid, url, exp, tasks, args.rounds, tmp, args.profile)
        finally:
            echo.terminate()
            echo.wait()
    out = summary(args.rate, rounds)
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(
        f"at {args.rate:g}/s, {args.rounds} rounds, medians (ranges); load average {_fmt(out['loadavg'], 1)}"
    )
    print(f"echo round trip   p50 {_fmt(out['echo_p50_ms'])} ms, p99 {_fmt(out['echo_p99_ms'])} ms")
    print(f"cluster overhead  p50 {_fmt(out['overhead_p50_ms'])} ms, p99 {_fmt(out['overhead_p99_ms'])} ms")
    print(
        f"ratio to the echo p50 {_fmt(out['ratio_p50'])} (target <= 1.5), p99 {_fmt(out['ratio_p99'])} (<= 3)"
    )
    print(
        f"the echo sent as before (spinning client): p50 {_fmt(out['echo_spinning_p50_ms'])} ms, "
        f"p99 {_fmt(out['echo_spinning_p99_ms'])} ms; ratios p50 {_fmt(out['ratio_spinning_p50'])}, "
        f"p99 {_fmt(out['ratio_spinning_p99'])}"
    )
    for k, v in out["legs_p50_ms"].items():
        print(f"  {k:<8} p50 {_fmt(v, 3)} ms")
    cpu = out["cpu_us_per_task"]
    print(
        "CPU per task (µs): "
        + ", ".join(f"{k} {_fmt(v, 0)}" for k, v in cpu.items())
        + " (target all <= 150)"
    )
    echo_cpu = out["echo_cpu_us_per_request"]
    print(
        f"during the echo rounds, CPU per request: the echo's client {_fmt(echo_cpu['client'], 0)} µs, "
        f"its server {_fmt(echo_cpu['server'], 0)} µs, "
        f"the idle cluster {_fmt(echo_cpu['cluster_idle'], 0)} µs"
    )
    print(f"targets: {'met' if out['meets_target'] else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
