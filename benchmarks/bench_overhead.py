"""The transport-and-dispatch overhead of a task, against a bare aiohttp echo over loopback, in one run.

Two paths get the same open-loop Poisson load (R requests per wall second, absolute schedule, sojourn from
the intended send) in alternating rounds:

* **echo**: a plain aiohttp + uvloop server (its own process) that answers every POST at once: one loopback
  round trip, the floor of any request;
* **cluster**: ``lbt``'s generator, dispatcher (random policy) and node processes, on pool nodes (tasks do
  not queue) with tasks of 20 ms wall on average. Its overhead per task is the sojourn minus the stay at
  the node: two round trips (client to dispatcher, dispatcher to node), the node's timer and the
  dispatch. The legs of each task (docs/run.md, "Where the time goes") say where.

Reported: p50 and p99 of both in wall ms and their ratios, the p50/p99 of every leg, and the CPU time the
dispatcher and the node processes spent per completed task over the cluster rounds (user + system, from
``/proc/PID/stat``; the echo rounds in between leave them idle but for their health checks). Target (issue
14): overhead p50 <= 1 ms and p99 <= 3 ms at 1,000 tasks/s on a 2-core machine.

    .venv/bin/python benchmarks/bench_overhead.py [--rate 1000] [--seconds 5] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import uvloop

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.cluster.processes import free_ports
from lbtestbed.experiment.preflight import pools_spec
from lbtestbed.loadgen.openloop import drive, poisson_tasks
from lbtestbed.spec import load_spec
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
    """Round trips (s) from each intended send, on the same absolute schedule the generator keeps."""
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


def quantiles(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    return {"p50_ms": 1e3 * float(np.quantile(x, 0.5)), "p99_ms": 1e3 * float(np.quantile(x, 0.99))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rate", type=float, default=1000.0, help="requests per wall second (default 1000)")
    p.add_argument("--seconds", type=float, default=5.0, help="wall seconds per round and path (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of echo then cluster (default 3)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args()
    scale = TASK_WALL  # one model second (the mean task) lasts 20 ms
    with tempfile.TemporaryDirectory(prefix="lbt-overhead-") as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(pools_spec(args.rate, args.seconds, scale))
        exp = load_spec(spec)
        tasks = list(poisson_tasks(exp, exp.run.duration))
        times = [t * scale for t, _ in tasks]
        (port,) = free_ports(1)
        echo = subprocess.Popen([sys.executable, "-c", ECHO, str(port)], stdout=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            url = f"http://127.0.0.1:{port}"
            echo_rtt, overhead, legs = [], [], {}
            cpu = {"dispatcher": 0.0, "nodes": 0.0}
            completed = 0
            with Cluster(Path(tmp) / "cluster.json") as cluster:
                f = cluster.up(exp, node_processes=2)
                pids = {"dispatcher": [d.pid for d in f.dispatchers], "nodes": [h.pid for h in f.node_hosts]}
                for r in range(args.rounds):
                    print(f"round {r + 1}/{args.rounds}: echo, then the cluster", file=sys.stderr)
                    echo_rtt.append(uvloop.run(echo_round(url, times)))
                    before = {role: sum(map(cpu_seconds, ps)) for role, ps in pids.items()}
                    report = uvloop.run(drive([d.url for d in f.dispatchers], tasks, scale))
                    for role, ps in pids.items():
                        cpu[role] += sum(map(cpu_seconds, ps)) - before[role]
                    recs = report.records
                    completed += len(recs)
                    overhead.append(np.array([(x.sojourn - x.stay) * scale for x in recs]))
                    for name in ("late", "arrive", "decide", "forward", "notify", "reply"):
                        legs.setdefault(name, []).append(np.array([getattr(x, name) * scale for x in recs]))
        finally:
            echo.terminate()
            echo.wait()
    e, o = quantiles(np.concatenate(echo_rtt)), quantiles(np.concatenate(overhead))
    out = {
        "rate": args.rate,
        "task_ms": 1e3 * TASK_WALL,
        "echo_round_trip": e,
        "overhead": o,
        "ratio_p50": o["p50_ms"] / e["p50_ms"],
        "ratio_p99": o["p99_ms"] / e["p99_ms"],
        "legs": {k: quantiles(np.concatenate(v)) for k, v in legs.items()},
        "cpu_us_per_task": {role: 1e6 * seconds / max(1, completed) for role, seconds in cpu.items()},
        "target": {"p50_ms": 1.0, "p99_ms": 3.0},
        "meets_target": o["p50_ms"] <= 1.0 and o["p99_ms"] <= 3.0,
    }
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(f"at {args.rate:g}/s: echo round trip p50 {e['p50_ms']:.3f} ms, p99 {e['p99_ms']:.3f} ms")
    print(
        f"cluster overhead  p50 {o['p50_ms']:.3f} ms ({out['ratio_p50']:.2f} x echo), "
        f"p99 {o['p99_ms']:.3f} ms ({out['ratio_p99']:.2f} x echo); target p50 <= 1, p99 <= 3 ms: "
        f"{'met' if out['meets_target'] else 'not met'}"
    )
    for k, v in out["legs"].items():
        print(f"  {k:<8} p50 {v['p50_ms']:.3f} ms  p99 {v['p99_ms']:.3f} ms")
    per_task = out["cpu_us_per_task"]
    print(
        f"CPU per task: dispatcher {per_task['dispatcher']:.1f} µs, node processes {per_task['nodes']:.1f} µs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
