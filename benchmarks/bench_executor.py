"""What a point costs on a Dask cluster against the local process pool (issue 29, "Sweeps beyond one
machine").

On one machine a Dask cluster cannot be faster than the local pool: the same cores do the same work, and
every task also goes through the scheduler (a message to it, one to a worker, the result back, each
pickled). So the benchmark measures that overhead, per task, both sides in the same run and interleaved:

1. Opening the executor: a local pool of 2 processes, against a client of a running scheduler (connect,
   check it is a scheduler, wait for a worker, check the workers' lbtestbed version).
2. Empty points: ``simulate_once`` on an experiment of 2 nodes and 2 model seconds: the real payloads (the
   Experiment out, a RawRun back), next to no work. Wall seconds per point over N points.
3. Short real points: N simulations of the JIQ example shortened to ``--duration`` model seconds; the
   difference of the wall times divided by N is the overhead a point pays on Dask.

The Dask cluster is ``dask scheduler`` and two ``dask worker --nworkers 1 --nthreads 1`` on 127.0.0.1,
started and stopped by the script; the local pool has 2 processes, the same parallelism.

    .venv/bin/python benchmarks/bench_executor.py [--points 200] [--real 20] [--duration 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DASHBOARD = ("--dashboard-address", "127.0.0.1:0")  # its HTTP server (health, metrics) on loopback too


def start_cluster(directory: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    """A scheduler and two single-threaded workers on loopback; its address and the processes. They stay
    in this process's session: with the kernel's autogroup scheduling a session of their own would give
    them a CPU share of their own on a busy machine, and Dask would look faster than the local pool."""
    file = directory / "scheduler.json"
    log = (directory / "dask.log").open("wb")
    dask = str(BIN / "dask")
    scheduler = [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", *DASHBOARD]
    scheduler += ["--scheduler-file", str(file)]
    procs = [subprocess.Popen(scheduler, stdout=log, stderr=subprocess.STDOUT)]
    while True:
        try:
            address = json.loads(file.read_text())["address"]
            break
        except (FileNotFoundError, json.JSONDecodeError):  # not yet, or half written
            time.sleep(0.1)
    for i in range(2):
        worker = [dask, "worker", address, "--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1"]
        worker += ["--no-dashboard", *DASHBOARD]
        worker += ["--local-directory", str(directory / f"w{i}")]
        procs.insert(0, subprocess.Popen(worker, stdout=log, stderr=subprocess.STDOUT))
    from distributed import Client

    with Client(address, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=120)
    return address, procs


def stop_cluster(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (a nanny stops its worker), then SIGKILL to what did not stop."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait()


def tree(pid: int) -> set[int]:
    """A process and all its descendants."""
    return {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}


def cpu_seconds(pids: set[int]) -> float:
    """User and system CPU seconds of these processes so far."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(run: Callable[[], Any], pids: set[int]) -> tuple[float, float]:
    """Wall and CPU seconds (of ``pids``) that ``run()`` took."""
    wall, cpu = time.perf_counter(), cpu_seconds(pids)
    run()
    return time.perf_counter() - wall, cpu_seconds(pids) - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=200, help="empty points per round (default 200)")
    ap.add_argument("--real", type=int, default=20, help="short real points per round (default 20)")
    ap.add_argument("--duration", type=float, default=300.0, help="model seconds of a real point")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from lbtestbed.analysis.simulator import simulate_once
    from lbtestbed.experiment.executor import open_executor, run_each
    from lbtestbed.spec import load_spec

    jiq = ROOT / "examples" / "jiq.toml"
    empty = load_spec(jiq, ["classes[0].count=2", "run.warmup=0.5", "run.duration=2", "run.batches=2"])
    real = load_spec(jiq, ["run.warmup=20", f"run.duration={args.duration:g}"])
    empty_calls = [(empty, i) for i in range(args.points)]
    real_calls = [(real, i) for i in range(args.real)]

    rows: dict[str, dict[str, list[float]]] = {"local": {}, "dask": {}}
    with tempfile.TemporaryDirectory() as tmp:
        address, procs = start_cluster(Path(tmp))
        try:
            for _ in range(args.rounds):
                for side, where in (("local", "local"), ("dask", address)):
                    out = rows[side]
                    start = time.perf_counter()
                    with open_executor(where, 2) as ex:
                        out.setdefault("open", []).append(time.perf_counter() - start)
                        run_each(ex, simulate_once, empty_calls[:4])  # warm: the simulator imported
                        # this process with its pool's processes, or with the Dask cluster's
                        cluster = set().union(*(tree(p.pid) for p in procs))
                        pids = tree(os.getpid()) - cluster if side == "local" else {os.getpid()} | cluster
                        for key, calls in (("empty", empty_calls), ("real", real_calls)):
                            wall, cpu = measure(lambda ex=ex, c=calls: run_each(ex, simulate_once, c), pids)
                            out.setdefault(key, []).append(wall / len(calls))
                            out.setdefault(key + " cpu", []).append(cpu / len(calls))
        finally:
            stop_cluster(procs)
    report(rows, args)


def report(rows: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    def ms(side: str, key: str) -> float:
        return 1000 * statistics.median(rows[side][key])

    print(f"medians of {args.rounds} rounds, ms; local pool of 2 processes, Dask 2 workers x 1 thread")
    print(f"{'':44s} {'local':>9s} {'dask':>9s} {'dask - local':>13s}")
    for key, what in (
        ("open", "open the executor, wall"),
        ("empty", f"per empty point ({args.points}), wall"),
        ("empty cpu", "per empty point, CPU of all processes"),
        ("real", f"per real point ({args.real} of {args.duration:g} s), wall"),
        ("real cpu", "per real point, CPU of all processes"),
    ):
        a, b = ms("local", key), ms("dask", key)
        print(f"{what:44s} {a:9.2f} {b:9.2f} {b - a:+13.2f}")
    for side in ("local", "dask"):
        print(side, {k: [round(1000 * v, 2) for v in vs] for k, vs in rows[side].items()})


if __name__ == "__main__":
    main()
