"""How the simulator's speed and memory go with the number of nodes (``bench_simulator.py``'s second and third
parts; benchmarks/README.md).

* ``scaling``: the same spec (JSQ(2) over FCFS nodes at load 0.9, the same warm-up, duration and batches)
  at several node counts, in interleaved rounds; the events per second at the largest count against
  those at the smallest, for each kernel asked for (the event kernel, the rates kernel: both in the same
  rounds). A simulator whose cost per event grows with n (a heap of n completions, lists by node, per-node
  objects scattered through memory, work over all nodes at every batch boundary) shows it here.
* ``million``: a million nodes for 20 model seconds in a child process of its own, whose peak resident
  memory the operating system reports when it exits (``getrusage(RUSAGE_CHILDREN)``).

Both run the simulator ``simulate_once`` runs: the mypyc build when it is there (``LBT_SIMULATOR``). The
rates kernel counts the same events as the event kernel (an arrival, a completion); it runs no drain (its
FCFS sojourns are drawn on arrival: docs/simulator.md), so it has fewer of them per run.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lbtestbed.analysis.simulator import compiled
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.simulator.rates import RatesSimulator
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import parse_spec

FLAT_TARGET = 0.7  # events/s at the largest n at least 0.7 x those at the smallest
MEMORY_LIMIT_MB = 2048.0  # a million nodes in under 2 GB

#: specs for the million-node runs: JSQ(d), JIQ (FCFS at load 0.9) and JLMU (its pools, at rho 2)
POLICIES: dict[str, dict[str, Any]] = {
    "power_of_d": {"policy": {"name": "power_of_d", "d": 2}},
    "jiq": {"policy": {"name": "jiq"}},
    "jlmu": {
        "policy": {"name": "jlmu"},
        "classes": [
            {"name": "small", "fraction": 0.5, "discipline": "pool", "utility": {"kind": "xlog", "r": 4}},
            {"name": "large", "fraction": 0.5, "discipline": "pool", "utility": {"kind": "xlog", "r": 6}},
        ],
        "workload": {"load": 2.0},
    },
}


def spec(nodes: int, warmup: float, duration: float, policy: str = "power_of_d", seed: int = 1) -> Experiment:
    """``policy``'s spec (``POLICIES``) over ``nodes`` nodes."""
    extra = dict(POLICIES[policy])
    classes = extra.pop("classes", [{"name": "node", "fraction": 1.0, "discipline": "fcfs"}])
    counts = [int(nodes * c["fraction"]) for c in classes]
    counts[0] += nodes - sum(counts)
    data = {
        "name": f"scale-{policy}-{nodes}",
        "seed": seed,
        "classes": [
            {k: v for k, v in c.items() if k != "fraction"} | {"count": n}
            for c, n in zip(classes, counts, strict=True)
        ],
        "workload": {"load": 0.9, "service": {"dist": "exponential", "mean": 1.0}},
        "run": {"warmup": warmup, "duration": duration},
    } | extra
    return parse_spec(data, "<benchmark>")


def simulator(kernel: str = "events") -> tuple[str, Callable[[Experiment], Any]]:
    """The simulator ``simulate_once`` would run on ``kernel``, and its name."""
    if compiled.selected():
        try:
            return "mypyc", compiled.kernel_class(compiled.load(), kernel)
        except compiled.Unavailable as e:
            print(f"bench_simulator: compiled simulator: {e}; timing pure Python", file=sys.stderr)
    return "pure Python", RatesSimulator if kernel == "rates" else Simulator


def one_run(exp: Experiment, make: Callable[[Experiment], Any]) -> dict[str, float]:
    """Build and run ``exp``: its events, and wall and CPU seconds. The garbage of the runs before is
    collected first, untimed: the event kernel's simulator holds reference cycles (its delays point back
    at it), so a run left behind would otherwise be walked by a full collection during the next one."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    raw = make(exp).run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"events": raw.events, "wall_s": wall, "cpu_s": cpu, "events_per_s": raw.events / wall}


def repeated(
    n: int, times: int, warmup: float, duration: float, make: Callable[[Experiment], Any]
) -> dict[str, float]:
    """``times`` runs of the spec over ``n`` nodes (seeds 1, 2, ...), summed."""
    ms = [one_run(spec(n, warmup, duration, seed=i + 1), make) for i in range(times)]
    total = {key: sum(m[key] for m in ms) for key in ("events", "wall_s", "cpu_s")}
    return {**total, "runs": times, "events_per_s": total["events"] / total["wall_s"]}


def scaling(
    counts: list[int],
    warmup: float,
    duration: float,
    rounds: int,
    log: Callable[[str], None],
    kernels: tuple[str, ...] = ("events",),
) -> dict[str, dict[str, Any]]:
    """Per kernel, events per second of the same spec at each node count, interleaved: round r runs the
    counts in turn from a different first one, each count on every kernel in turn, so that drift in the
    machine's load hits every count and kernel alike. A count n runs largest / n times (other seeds), so
    that every count is timed over as many events."""
    made = {k: simulator(k) for k in kernels}
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(k, n): [] for k in kernels for n in counts}
    for r in range(rounds):
        shift = r % len(counts)
        for n in counts[shift:] + counts[:shift]:
            for kernel in kernels[r % len(kernels) :] + kernels[: r % len(kernels)]:
                m = repeated(n, max(1, counts[-1] // n), warmup, duration, made[kernel][1])
                runs[kernel, n].append(m)
                log(
                    f"  scaling round {r + 1}/{rounds} {kernel:>6} n={n:>7,}: {m['runs']:>3.0f} runs, "
                    f"{m['events']:>10,.0f} events in {m['wall_s']:6.2f} s = "
                    f"{m['events_per_s']:>9,.0f} events/s"
                )
    return {
        k: _scaled(made[k][0], k, {n: runs[k, n] for n in counts}, warmup, duration, rounds) for k in kernels
    }


def _scaled(
    name: str,
    kernel: str,
    runs: dict[int, list[dict[str, float]]],
    warmup: float,
    duration: float,
    rounds: int,
) -> dict[str, Any]:
    """One kernel's scaling figures: the median rate at each count, and the largest count's against the
    smallest's."""
    counts = sorted(runs)
    rate = {n: statistics.median(m["events_per_s"] for m in runs[n]) for n in counts}
    cpu_rate = {n: statistics.median(m["events"] / m["cpu_s"] for m in runs[n]) for n in counts}
    lo, hi = counts[0], counts[-1]
    return {
        "simulator": name,
        "kernel": kernel,
        "config": {
            "warmup": warmup,
            "duration": duration,
            "rounds": rounds,
            "spec": "JSQ(2), FCFS, load 0.9",
        },
        "events_per_s": {str(n): rate[n] for n in counts},
        "events_per_cpu_s": {str(n): cpu_rate[n] for n in counts},
        "ratio": rate[hi] / rate[lo],
        "cpu_ratio": cpu_rate[hi] / cpu_rate[lo],
        "target": FLAT_TARGET,
        "meets_target": rate[hi] / rate[lo] >= FLAT_TARGET,
        "runs": {str(n): runs[n] for n in counts},
    }


def million(
    policy: str,
    nodes: int,
    warmup: float,
    duration: float,
    log: Callable[[str], None],
    kernel: str = "events",
) -> dict[str, Any]:
    """One run of ``policy`` over ``nodes`` nodes on ``kernel`` in a child process: its speed and peak
    memory."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    here = str(Path(__file__).resolve())
    cmd = [sys.executable, here, policy, str(nodes), repr(warmup), repr(duration), kernel]
    log(f"  {policy} over {nodes:,} nodes on the {kernel} kernel, {warmup + duration:g} model seconds ...")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # numpy's idle BLAS threads take CPU from it
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise SystemExit(
            f"bench_simulator: the {nodes:,}-node run failed: {lines[-1] if lines else proc.returncode}"
        )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result: dict[str, Any] = json.loads(proc.stdout)
    if peak <= before:  # a child before used more: this one's peak is not known exactly
        result["peak_mb_at_most"] = before / 1024
    result["peak_mb"] = peak / 1024  # Linux reports kilobytes
    result["limit_mb"] = MEMORY_LIMIT_MB
    result["within_limit"] = result["peak_mb"] < MEMORY_LIMIT_MB
    return result


def _child(argv: list[str]) -> None:
    """The child of ``million``: one run, its figures as one JSON object on stdout."""
    policy, nodes, warmup, duration, kernel = argv[0], int(argv[1]), float(argv[2]), float(argv[3]), argv[4]
    name, make = simulator(kernel)
    exp = spec(nodes, warmup, duration, policy)
    built = time.perf_counter()
    sim = make(exp)
    built = time.perf_counter() - built
    m = one_run(exp, lambda _: sim)
    print(
        json.dumps(
            {
                "policy": policy,
                "nodes": nodes,
                "model_seconds": warmup + duration,
                "simulator": name,
                "kernel": kernel,
                "build_s": built,
                **m,
            }
        )
    )


if __name__ == "__main__":
    _child(sys.argv[1:])
