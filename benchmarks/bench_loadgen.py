"""The highest rate one load-generator process holds: lbt load and locust, against a sink and a cluster.

Targets: the sink (benchmarks/sink.py, which completes every task at once, so the generator alone is
measured) and a random-policy cluster of 8 pools in 2 node processes (lbtestbed.cluster.launcher.Cluster;
tasks last
10 ms of wall time on average, so the cluster shares the machine's 2 cores with the generator). Generators:
``lbt load`` (the built-in open loop) and ``lbt load --locust`` (the locustfile's open loop). Every trial is
a real ``lbt load`` process sending the spec's Poisson tasks for --seconds at one rate. A rate is *held*
when the p99 of the sends' lateness is under 2 ms, nothing was dropped and every task completed.

The search: from --start, multiply the rate by 1.5 while it is held, then bisect between the last held and
the first lost rate until they are within 10 %. The machine is shared: before each trial the benchmark waits
(up to a minute) until other work uses less than a quarter of the CPU, a trial that fails is run once more,
and the rate counts as held if either run held it (best of two). The table says how many trials ran and how
busy the machine was.

    .venv/bin/python benchmarks/bench_loadgen.py                  # table, about 5 minutes
    .venv/bin/python benchmarks/bench_loadgen.py --json
    .venv/bin/python benchmarks/bench_loadgen.py --targets sink --generators lbt --seconds 3

Target (issue 5): lbt load holds at least 3,000 tasks per second against the sink.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.cluster.processes import free_ports
from lbtestbed.experiment.preflight import pools_spec
from lbtestbed.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
P99_LIMIT_MS = 2.0
TARGET_RATE = 3000.0  # tasks per second against the sink
GROWTH = 1.5
PRECISION = 1.1  # bisect until the first lost rate is within 10 % of the last held one
QUIET_LIMIT = 0.25  # a trial starts when other work uses less than a quarter of the machine's CPU ...
QUIET_PATIENCE = 60.0  # ... or after this many seconds of waiting for that

#: wall seconds per model second: the sink ignores the works; the cluster's tasks last 10 ms on average
SCALES = {"sink": 1.0, "cluster": 0.01}


@dataclass
class Search:
    target: str
    generator: str
    held: float = 0.0  # highest rate held, tasks per wall second
    lost: float | None = None  # lowest rate lost above it
    p99_ms: float | None = None  # p99 lateness at the rate held
    trials: list[dict[str, Any]] = field(default_factory=list)


def trial(
    spec: Path, url: str, scale: float, rate: float, *, seconds: float, generator: str
) -> dict[str, Any]:
    """One ``lbt load`` process at ``rate`` tasks per wall second for ``seconds``; its summary."""
    cmd = [
        sys.executable, "-m", "lbtestbed.cli", "load", str(spec), "--dispatcher", url, "--json", "--quiet",
        "--set", f"workload.arrival_rate={rate * scale!r}", "--duration", repr(seconds / scale),
    ]  # fmt: skip
    if generator == "locust":
        cmd.append("--locust")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180, check=False)
    try:
        summary: dict[str, Any] = json.loads(out.stdout)
    except ValueError:
        tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"rate": rate, "held": False, "error": tail[0]}
    held = (
        summary["lateness_p99_ms"] < P99_LIMIT_MS
        and summary["dropped"] == 0
        and summary["completed"] == summary["scheduled"]
    )
    keep = (
        "scheduled",
        "completed",
        "dropped",
        "late_sends",
        "lateness_p50_ms",
        "lateness_p99_ms",
        "rate_sent",
    )
    return {"rate": rate, "held": held, **{k: summary[k] for k in keep}}


def search(
    target: str,
    generator: str,
    run: Callable[[float], dict[str, Any]],
    start: float,
    log: Callable[[str], None],
) -> Search:
    s = Search(target, generator)

    def holds(rate: float) -> bool:
        for _ in range(2):  # best of two: a neighbour's burst on the shared machine can spoil one run
            busy = wait_quiet()
            t = run(rate)
            t["others_busy"] = busy
            s.trials.append(t)
            p99 = t.get("lateness_p99_ms")
            shown = f"p99 {p99:.2f} ms" if p99 is not None else t.get("error", "")
            log(f"  {target:<8} {generator:<7} {rate:9.0f}/s  {'held' if t['held'] else 'lost'}  {shown}")
            if t["held"]:
                if rate >= s.held:
                    s.held, s.p99_ms = rate, p99
                return True
        return False

    rate = start
    if holds(rate):
        while holds(rate * GROWTH):
            rate *= GROWTH
        lo, hi = rate, rate * GROWTH
    else:
        hi = rate
        while not holds(rate / GROWTH):
            rate /= GROWTH
            hi = rate
            if rate < start / 16:  # nothing held: the machine is too busy to say anything
                s.lost = hi
                return s
        lo = rate / GROWTH
    while hi / lo > PRECISION:
        mid = (lo * hi) ** 0.5
        if holds(mid):
            lo = mid
        else:
            hi = mid
    s.lost = hi
    return s


def busy_fraction(interval: float = 0.5) -> float | None:
    """Fraction of the machine's CPU time that was busy over ``interval`` (/proc/stat); None elsewhere."""

    def sample() -> tuple[int, int]:
        values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return values[3] + values[4], sum(values)  # idle + iowait, all

    try:
        idle0, all0 = sample()
        time.sleep(interval)
        idle1, all1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle1 - idle0) / max(all1 - all0, 1)


def wait_quiet(limit: float = QUIET_LIMIT, patience: float = QUIET_PATIENCE) -> float | None:
    """Wait (at most ``patience`` seconds) until others use less than ``limit`` of the CPU; the last reading.

    The benchmark's own processes are idle between trials, so what is busy then is someone else's work.
    """
    deadline = time.monotonic() + patience
    while True:
        busy = busy_fraction()
        if busy is None or busy < limit or time.monotonic() > deadline:
            return busy
        time.sleep(1.0)


def wait_healthy(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v1/health", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.05)


@contextmanager
def target_url(target: str, workdir: Path, spec: Path) -> Iterator[str]:
    """The sink in a process of its own, or a random-policy cluster; its (first dispatcher's) URL."""
    if target == "sink":
        port = free_ports(1)[0]
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "sink.py"), "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url)
            yield url
        finally:
            proc.terminate()
            proc.wait(10)
    else:
        with Cluster(workdir / "cluster.json") as cluster:
            f = cluster.up(load_spec(spec), node_processes=2)
            yield f.dispatchers[0].url


def benchmark(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    load_before = os.getloadavg()
    results: list[Search] = []
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp:
        for target in args.targets:
            spec = Path(tmp) / f"{target}.toml"
            spec.write_text(pools_spec(1.0, 1.0, SCALES[target]))  # each trial sets its rate and length
            with target_url(target, Path(tmp), spec) as url:
                for generator in args.generators:
                    start = args.start if generator == "lbt" else args.start / 4

                    run = partial(trial, spec, url, SCALES[target], seconds=args.seconds, generator=generator)
                    results.append(search(target, generator, run, start, log))
    rates = {(r.target, r.generator): r.held for r in results}
    ratios = {
        t: rates[(t, "lbt")] / rates[(t, "locust")]
        for t in args.targets
        if rates.get((t, "locust")) and (t, "lbt") in rates
    }
    sink = rates.get(("sink", "lbt"))
    return {
        "p99_limit_ms": P99_LIMIT_MS,
        "seconds_per_trial": args.seconds,
        "results": [asdict(r) for r in results],
        "ratio_lbt_over_locust": ratios,
        "target_rate": TARGET_RATE,
        "meets_target": None if sink is None else sink >= TARGET_RATE,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def print_table(res: dict[str, Any]) -> None:
    names = {"lbt": "lbt load", "locust": "locust"}
    print(
        f"{'target':<9} {'generator':<10} {'held/s':>8} {'lost/s':>8} {'p99 ms':>7} {'trials':>6} "
        f"{'others busy':>11}"
    )
    for r in res["results"]:
        lost = f"{r['lost']:8.0f}" if r["lost"] else f"{'-':>8}"
        p99 = f"{r['p99_ms']:7.2f}" if r["p99_ms"] is not None else f"{'-':>7}"
        name = names[r["generator"]]
        busy = [t["others_busy"] for t in r["trials"] if t.get("others_busy") is not None]
        shown = f"{100 * statistics.median(busy):10.0f}%" if busy else f"{'-':>11}"
        print(f"{r['target']:<9} {name:<10} {r['held']:8.0f} {lost} {p99} {len(r['trials']):6d} {shown}")
    for t, ratio in res["ratio_lbt_over_locust"].items():
        print(f"ratio lbt load / locust against the {t}: {ratio:.1f}x")
    if res["meets_target"] is not None:
        verdict = "met" if res["meets_target"] else "NOT met"
        print(f"target: lbt load holds >= {res['target_rate']:.0f} tasks/s against the sink: {verdict}")
    before, after = res["loadavg_before"][0], res["loadavg_after"][0]
    print(f"load average {before:.2f} before, {after:.2f} after, on {res['cpus']} cores")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="wall seconds of sends per trial (default 4)"
    )
    parser.add_argument(
        "--start", type=float, default=1000.0, help="first rate tried for lbt load (locust: 1/4)"
    )
    parser.add_argument("--targets", default="sink,cluster", help="sink, cluster or both (default both)")
    parser.add_argument("--generators", default="lbt,locust", help="lbt, locust or both (default both)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    args.targets = [t for t in args.targets.split(",") if t]
    args.generators = [g for g in args.generators.split(",") if g]
    bad = [t for t in args.targets if t not in SCALES] + [
        g for g in args.generators if g not in ("lbt", "locust")
    ]
    if bad or args.seconds <= 0 or args.start <= 0:
        parser.error(
            f"unknown target or generator {bad}" if bad else "--seconds and --start must be positive"
        )
    res = benchmark(args, lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
