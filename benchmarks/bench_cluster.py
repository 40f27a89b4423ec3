"""Dispatcher throughput and added latency against a plain aiohttp forwarder, on the same nodes, in one run.

For each policy a cluster comes up (node processes and the policy's dispatcher) and a plain forwarder
(benchmarks/plain_forwarder.py) is started in front of the same node processes. A closed-loop client with C
concurrent requests then drives, in turn: the nodes directly (the latency floor), the plain forwarder, and
the dispatcher, for S seconds each, alternating rounds. Tasks take 20 ms on pool nodes (infinite servers), so
the nodes are never the bottleneck and what is measured is the forwarding path. The report gives tasks per
second and the p50/p99 latency each path adds over the direct one, as ratios to the plain forwarder.

    .venv/bin/python benchmarks/bench_cluster.py [--nodes 8] [--seconds 4] [--rounds 2] [--json]

Target (issue 4): at least 0.85 of the forwarder's throughput for random, least_request, jiq, jlmu and slta;
power_of_d pays its probes (2d requests per task).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import uvloop

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.cluster.processes import free_ports
from lbtestbed.spec import load_spec
from lbtestbed.transport.signing import Signer

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("random", "least_request", "jiq", "jlmu", "slta", "power_of_d")

SPEC = """
name = "bench-cluster"
seed = 1
[[classes]]
name = "a"
count = {half}
discipline = "pool"
utility = {{ kind = "xlog", r = 1000 }}
[[classes]]
name = "b"
count = {other}
discipline = "pool"
utility = {{ kind = "xlog", r = 2000 }}
[workload]
load = 1.0
service = {{ dist = "deterministic", mean = 1.0 }}
[policy]
{policy}
[run]
warmup = 1.0
duration = 10.0
time_scale = 0.02
"""


def policy_table(name: str, n: int) -> str:
    if name == "slta":
        return f'name = "slta"\nbeta = {max(0.25, 2 / n)}'
    if name in ("power_of_d", "least_request"):
        return f'name = "{name}"\nd = 2'
    return f'name = "{name}"'


async def closed_loop(
    urls: list[str], seconds: float, concurrency: int, token: str
) -> tuple[float, np.ndarray]:
    """Tasks per second and latencies (s) of ``concurrency`` workers posting back to back to ``urls``."""
    latencies: list[float] = []
    rng = random.Random(7)
    stop = time.monotonic() + seconds
    signer = Signer(token)  # the direct path to the nodes signs as a dispatcher does (docs/protocol.md)
    body = b'{"work": 1.0}'
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            while time.monotonic() < stop:
                t = time.monotonic()
                url = rng.choice(urls)
                headers = {"Content-Type": "application/json"}
                if "/v1/nodes/" in url:
                    headers |= signer.headers("POST", url, body)[0]
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{resp.status} from {resp.url}")
                latencies.append(time.monotonic() - t)

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - start
    return len(latencies) / elapsed, np.array(latencies)


def wait_healthy(url: str, timeout: float = 20.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v1/health", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def bench_policy(policy: str, n: int, seconds: float, rounds: int, concurrency: int, workdir: Path) -> dict:
    spec = workdir / f"{policy}.toml"
    spec.write_text(SPEC.format(half=n // 2, other=n - n // 2, policy=policy_table(policy, n)))
    with Cluster(workdir / f"{policy}.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=2)
        nodes = f.node_urls()
        port = free_ports(1)[0]
        fwd = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "plain_forwarder.py"),
                "--port",
                str(port),
                *[arg for u in nodes for arg in ("--node", u)],
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "LBT_TOKEN": f.token},
        )
        try:
            forwarder = f"http://127.0.0.1:{port}"
            wait_healthy(forwarder)
            paths = {
                "direct": [f"{u}/tasks" for u in nodes],
                "forwarder": [f"{forwarder}/v1/tasks"],
                "dispatcher": [f"{f.dispatchers[0].url}/v1/tasks"],
            }
            rates: dict[str, list[float]] = {k: [] for k in paths}
            lats: dict[str, list[np.ndarray]] = {k: [] for k in paths}
            for r in range(rounds):
                order = list(paths) if r % 2 == 0 else list(reversed(paths))
                for name in order:
                    rate, lat = uvloop.run(closed_loop(paths[name], seconds, concurrency, f.token))
                    rates[name].append(rate)
                    lats[name].append(lat)
        finally:
            fwd.terminate()
            fwd.wait(5)
    out: dict = {"policy": policy}
    q = {
        name: (np.quantile(np.concatenate(lats[name]), 0.5), np.quantile(np.concatenate(lats[name]), 0.99))
        for name in paths
    }
    for name in paths:
        out[f"{name}_tasks_per_s"] = statistics.median(rates[name])
    for name in ("forwarder", "dispatcher"):
        out[f"{name}_added_p50_ms"] = 1e3 * (q[name][0] - q["direct"][0])
        out[f"{name}_added_p99_ms"] = 1e3 * (q[name][1] - q["direct"][1])
    out["throughput_ratio"] = out["dispatcher_tasks_per_s"] / out["forwarder_tasks_per_s"]
    out["added_p50_ratio"] = out["dispatcher_added_p50_ms"] / max(out["forwarder_added_p50_ms"], 1e-9)
    out["added_p99_ratio"] = out["dispatcher_added_p99_ms"] / max(out["forwarder_added_p99_ms"], 1e-9)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per path and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policies.split(","):
            print(f"{policy} ...", file=sys.stderr)
            rows.append(
                bench_policy(policy, args.nodes, args.seconds, args.rounds, args.concurrency, Path(tmp))
            )
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print(
        f"{'policy':<14} {'direct/s':>9} {'fwd/s':>8} {'disp/s':>8} {'ratio':>6} "
        f"{'fwd +p50':>9} {'disp +p50':>10} {'fwd +p99':>9} {'disp +p99':>10}  (added latency, ms)"
    )
    for r in rows:
        print(
            f"{r['policy']:<14} {r['direct_tasks_per_s']:9.0f} {r['forwarder_tasks_per_s']:8.0f} "
            f"{r['dispatcher_tasks_per_s']:8.0f} {r['throughput_ratio']:6.2f} "
            f"{r['forwarder_added_p50_ms']:9.2f} {r['dispatcher_added_p50_ms']:10.2f} "
            f"{r['forwarder_added_p99_ms']:9.2f} {r['dispatcher_added_p99_ms']:10.2f}"
        )


if __name__ == "__main__":
    main()
