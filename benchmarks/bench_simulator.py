"""Simulator speed: lbtestbed's simulator against a SimPy model of the same system, in one run.

The system: ``nodes`` FCFS single servers of speed 1, Poisson arrivals at ``load * nodes`` per model second,
exponential work of mean 1, JSQ(2) dispatching (probe two distinct nodes uniformly at random, join the one
holding fewer tasks, ties uniform). Both simulators run it over the same model time horizon, the one the
lbtestbed simulator uses: ``warmup + duration`` model seconds, then on until every task that arrived in the
measured window has left. Both count model events the same way: one per arrival and one per completion.

The rounds are interleaved (lbtestbed first in even rounds, SimPy first in odd ones) so that a machine that
gets busier or quieter during the run affects both sides alike. The result is the median of each side's
events per wall second and their ratio; the absolute rates mean little on a shared machine, the ratio is
the number to track. Before reporting, the benchmark checks that both models measured the same system
(mean sojourn and mean tasks per node agree within ``--tolerance``), so that the two sides did equal work.

    .venv/bin/python benchmarks/bench_simulator.py            # table, about a minute
    .venv/bin/python benchmarks/bench_simulator.py --json     # one JSON object on stdout
    .venv/bin/python benchmarks/bench_simulator.py --profile  # cProfile of one lbtestbed run

See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import platform
import pstats
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass
from typing import Any

import simpy

from lbtestbed.analysis.simulator import Simulator
from lbtestbed.spec import Experiment, parse_spec

TARGET_RATIO = 3.0  # the project's goal: lbtestbed at least 3x SimPy's events per second


@dataclass
class Measured:
    """One timed run of one simulator."""

    side: str  # "lbtestbed" or "simpy"
    round: int
    seed: int
    events: int  # arrivals + completions processed
    wall_s: float  # time.perf_counter around building the model and running it
    model_time: float  # model time at the end of the run
    sojourn_sum: float  # over tasks that arrived in the measured window
    sojourn_count: int
    task_seconds: float  # integral of the number of tasks in the system over the measured window

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s


# ------------------------------------------------------------------------------------------- lbtestbed


def experiment(nodes: int, load: float, warmup: float, duration: float, seed: int) -> Experiment:
    """The benchmark system as an lbtestbed experiment, built from a spec dict like a TOML file."""
    spec = {
        "name": "bench-jsq2-fcfs",
        "seed": seed,
        "classes": [{"name": "node", "count": nodes, "discipline": "fcfs", "speed": 1}],
        "workload": {"load": load, "service": {"dist": "exponential", "mean": 1.0}},
        "policy": {"name": "power_of_d", "d": 2},
        "run": {"warmup": warmup, "duration": duration},
    }
    return parse_spec(spec, "<benchmark>")


def run_lbtestbed(nodes: int, load: float, warmup: float, duration: float, seed: int, rnd: int) -> Measured:
    exp = experiment(nodes, load, warmup, duration, seed)
    wall = time.perf_counter()
    sim = Simulator(exp)
    raw = sim.run()
    wall = time.perf_counter() - wall
    soj_num, soj_den = raw.ratios["mean_sojourn"]
    tasks_num, _ = raw.ratios["mean_tasks_per_node"]  # node task-seconds, batch by batch
    return Measured(
        "lbtestbed",
        rnd,
        seed,
        raw.events,
        wall,
        sim.now,
        float(soj_num.sum()),
        int(soj_den.sum()),
        float(tasks_num.sum()),
    )


# ----------------------------------------------------------------------------------------------- SimPy


def run_simpy_process(
    nodes: int, load: float, warmup: float, duration: float, seed: int, rnd: int
) -> Measured:
    """The SimPy model, one serving process per node.

    Each node is a process that takes tasks from its own FIFO queue (a deque of arrival times) and holds
    for each task's service time; when its queue is empty it sleeps on a wake-up event that the next arrival
    at the node triggers. The source process draws the Poisson arrivals and does the JSQ(2) choice. A task
    therefore costs two SimPy events (its arrival gap and its service hold) plus a wake-up when it finds its
    node idle; with ``simpy.Resource`` (``run_simpy_resource``) it also costs a process, a request, a
    release and the process's own start and end, which makes that form about three times slower.
    """
    wall = time.perf_counter()  # like the lbtestbed side, time building the model and running it
    env = simpy.Environment()
    rng = random.Random(seed)
    expo, rand = rng.expovariate, rng.random
    timeout = env.timeout
    t_start, t_end = warmup, warmup + duration
    queues: list[deque[float]] = [deque() for _ in range(nodes)]
    x = [0] * nodes  # tasks at each node, waiting or in service
    wake: list[simpy.Event | None] = [None] * nodes
    done = env.event()
    events = 0
    total = 0  # tasks in the system
    area = 0.0  # integral of total over [0, last]
    last = 0.0
    outstanding = 0  # tasks of the measured window still in the system
    soj_sum = 0.0
    soj_count = 0

    def server(k: int) -> Generator[simpy.Event, Any, None]:
        nonlocal events, total, area, last, outstanding, soj_sum, soj_count
        queue = queues[k]
        while True:
            if not queue:
                ev = wake[k] = env.event()
                yield ev
            yield timeout(expo(1.0))
            now = env.now
            arrived = queue.popleft()
            x[k] -= 1
            events += 1
            area += total * (now - last)
            last = now
            total -= 1
            if t_start <= arrived < t_end:
                soj_sum += now - arrived
                soj_count += 1
                outstanding -= 1
                if not outstanding and now >= t_end:
                    done.succeed()

    def source() -> Generator[simpy.Event, Any, None]:
        nonlocal events, total, area, last, outstanding
        rate = load * nodes
        n1 = nodes - 1
        while True:
            yield timeout(expo(rate))
            now = env.now
            a = int(rand() * nodes)
            b = int(rand() * n1)
            if b >= a:
                b += 1
            k = a if x[a] <= x[b] else b  # (a, b) is in random order, so the tie-break is uniform
            events += 1
            area += total * (now - last)
            last = now
            total += 1
            if t_start <= now < t_end:
                outstanding += 1
            x[k] += 1
            queues[k].append(now)
            ev = wake[k]
            if ev is not None:
                wake[k] = None
                ev.succeed()

    window: list[float] = []

    def observer() -> Generator[simpy.Event, Any, None]:
        for t in (t_start, t_end):
            yield timeout(t - env.now)
            window.append(area + total * (env.now - last))

    for k in range(nodes):
        env.process(server(k))
    env.process(source())
    env.process(observer())
    env.run(until=done)
    wall = time.perf_counter() - wall
    return Measured("simpy", rnd, seed, events, wall, env.now, soj_sum, soj_count, window[1] - window[0])


def run_simpy_resource(
    nodes: int, load: float, warmup: float, duration: float, seed: int, rnd: int
) -> Measured:
    """The textbook SimPy form: each node a ``simpy.Resource(capacity=1)``, each task a process."""
    wall = time.perf_counter()  # like the lbtestbed side, time building the model and running it
    env = simpy.Environment()
    rng = random.Random(seed)
    expo, rand = rng.expovariate, rng.random
    t_start, t_end = warmup, warmup + duration
    servers = [simpy.Resource(env, capacity=1) for _ in range(nodes)]
    x = [0] * nodes
    done = env.event()
    events = 0
    total = 0
    area = 0.0
    last = 0.0
    outstanding = 0
    soj_sum = 0.0
    soj_count = 0

    def task(k: int, arrived: float) -> Generator[simpy.Event, Any, None]:
        nonlocal events, total, area, last, outstanding, soj_sum, soj_count
        with servers[k].request() as req:
            yield req
            yield env.timeout(expo(1.0))
        now = env.now
        x[k] -= 1
        events += 1
        area += total * (now - last)
        last = now
        total -= 1
        if t_start <= arrived < t_end:
            soj_sum += now - arrived
            soj_count += 1
            outstanding -= 1
            if not outstanding and now >= t_end:
                done.succeed()

    def source() -> Generator[simpy.Event, Any, None]:
        nonlocal events, total, area, last, outstanding
        rate = load * nodes
        n1 = nodes - 1
        while True:
            yield env.timeout(expo(rate))
            now = env.now
            a = int(rand() * nodes)
            b = int(rand() * n1)
            if b >= a:
                b += 1
            k = a if x[a] <= x[b] else b
            events += 1
            area += total * (now - last)
            last = now
            total += 1
            if t_start <= now < t_end:
                outstanding += 1
            x[k] += 1
            env.process(task(k, now))

    window: list[float] = []

    def observer() -> Generator[simpy.Event, Any, None]:
        for t in (t_start, t_end):
            yield env.timeout(t - env.now)
            window.append(area + total * (env.now - last))

    env.process(source())
    env.process(observer())
    env.run(until=done)
    wall = time.perf_counter() - wall
    return Measured("simpy", rnd, seed, events, wall, env.now, soj_sum, soj_count, window[1] - window[0])


def run_simpy_store(nodes: int, load: float, warmup: float, duration: float, seed: int, rnd: int) -> Measured:
    """Each node a serving process that takes tasks from a ``simpy.Store``: SimPy's own queue object."""
    wall = time.perf_counter()  # like the lbtestbed side, time building the model and running it
    env = simpy.Environment()
    rng = random.Random(seed)
    expo, rand = rng.expovariate, rng.random
    timeout = env.timeout
    t_start, t_end = warmup, warmup + duration
    stores = [simpy.Store(env) for _ in range(nodes)]
    x = [0] * nodes
    done = env.event()
    events = 0
    total = 0
    area = 0.0
    last = 0.0
    outstanding = 0
    soj_sum = 0.0
    soj_count = 0

    def server(k: int) -> Generator[simpy.Event, Any, None]:
        nonlocal events, total, area, last, outstanding, soj_sum, soj_count
        get = stores[k].get
        while True:
            arrived = yield get()
            yield timeout(expo(1.0))
            now = env.now
            x[k] -= 1
            events += 1
            area += total * (now - last)
            last = now
            total -= 1
            if t_start <= arrived < t_end:
                soj_sum += now - arrived
                soj_count += 1
                outstanding -= 1
                if not outstanding and now >= t_end:
                    done.succeed()

    def source() -> Generator[simpy.Event, Any, None]:
        nonlocal events, total, area, last, outstanding
        rate = load * nodes
        n1 = nodes - 1
        while True:
            yield timeout(expo(rate))
            now = env.now
            a = int(rand() * nodes)
            b = int(rand() * n1)
            if b >= a:
                b += 1
            k = a if x[a] <= x[b] else b
            events += 1
            area += total * (now - last)
            last = now
            total += 1
            if t_start <= now < t_end:
                outstanding += 1
            x[k] += 1
            stores[k].put(now)

    window: list[float] = []

    def observer() -> Generator[simpy.Event, Any, None]:
        for t in (t_start, t_end):
            yield timeout(t - env.now)
            window.append(area + total * (env.now - last))

    for k in range(nodes):
        env.process(server(k))
    env.process(source())
    env.process(observer())
    env.run(until=done)
    wall = time.perf_counter() - wall
    return Measured("simpy", rnd, seed, events, wall, env.now, soj_sum, soj_count, window[1] - window[0])


SIMPY_MODELS: dict[str, Callable[[int, float, float, float, int, int], Measured]] = {
    "process": run_simpy_process,
    "resource": run_simpy_resource,
    "store": run_simpy_store,
}


# ------------------------------------------------------------------------------------------ comparison


def mean_field_sojourn(load: float, d: int = 2) -> float:
    """JSQ(d) mean sojourn as nodes go to infinity: sum_k load^((d^k - 1)/(d - 1)) / load."""
    return sum(load ** ((d**k - 1) // (d - 1)) for k in range(1, 64)) / load


def pooled(runs: list[Measured], nodes: int, duration: float) -> dict[str, float]:
    soj = sum(r.sojourn_sum for r in runs) / sum(r.sojourn_count for r in runs)
    tasks = sum(r.task_seconds for r in runs) / (len(runs) * nodes * duration)
    return {"mean_sojourn": soj, "mean_tasks_per_node": tasks}


def benchmark(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    simpy_run = SIMPY_MODELS[args.simpy_model]
    # one short untimed run of each side first, so that no timed run pays for first-use costs
    run_lbtestbed(args.nodes, args.load, 1.0, 4.0, args.seed, -1)
    simpy_run(args.nodes, args.load, 1.0, 4.0, args.seed, -1)
    runs: list[Measured] = []
    for rnd in range(args.rounds):
        seed = args.seed + rnd
        order = ("lbtestbed", "simpy") if rnd % 2 == 0 else ("simpy", "lbtestbed")
        for side in order:
            gc.collect()
            run = run_lbtestbed if side == "lbtestbed" else simpy_run
            m = run(args.nodes, args.load, args.warmup, args.duration, seed, rnd)
            runs.append(m)
            log(
                f"  round {rnd + 1}/{args.rounds} {side:<9} {m.events:>9,} events in {m.wall_s:6.2f} s "
                f"= {m.events_per_s:>9,.0f} events/s (model time {m.model_time:,.1f} s)"
            )
    lb = [r for r in runs if r.side == "lbtestbed"]
    sp = [r for r in runs if r.side == "simpy"]
    lb_rate = statistics.median(r.events_per_s for r in lb)
    sp_rate = statistics.median(r.events_per_s for r in sp)
    ratio = lb_rate / sp_rate
    per_round = [a.events_per_s / b.events_per_s for a, b in zip(lb, sp, strict=True)]
    stats_lb, stats_sp = pooled(lb, args.nodes, args.duration), pooled(sp, args.nodes, args.duration)
    agreement = {
        key: {
            "lbtestbed": stats_lb[key],
            "simpy": stats_sp[key],
            "relative_difference": stats_lb[key] / stats_sp[key] - 1.0,
        }
        for key in stats_lb
    }
    agree = all(abs(v["relative_difference"]) <= args.tolerance for v in agreement.values())
    return {
        "lbtestbed_events_per_s": lb_rate,
        "simpy_events_per_s": sp_rate,
        "ratio": ratio,
        "ratio_per_round": per_round,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "rounds": args.rounds,
        "simpy_model": args.simpy_model,
        "config": {
            "nodes": args.nodes,
            "load": args.load,
            "policy": "power_of_d d=2",
            "discipline": "fcfs",
            "service": "exponential mean 1",
            "warmup": args.warmup,
            "duration": args.duration,
            "seed": args.seed,
        },
        "agreement": agreement,
        "mean_field_sojourn": mean_field_sojourn(args.load),
        "models_agree": agree,
        "tolerance": args.tolerance,
        "runs": [{**asdict(r), "events_per_s": r.events_per_s} for r in runs],
        "python": platform.python_version(),
        "simpy_version": simpy.__version__,
    }


def print_table(res: dict[str, Any]) -> None:
    cfg = res["config"]
    print()
    print(
        f"JSQ(2), {cfg['nodes']} fcfs nodes, load {cfg['load']:g}, exponential service mean 1; "
        f"model time {cfg['warmup']:g} + {cfg['duration']:g} s + drain; {res['rounds']} rounds, "
        f"SimPy model: {res['simpy_model']}"
    )
    print()
    print(f"{'':<12}{'events/s (median)':>20}{'mean sojourn':>15}{'tasks/node':>13}")
    ag = res["agreement"]
    for side, key in (("lbtestbed", "lbtestbed_events_per_s"), ("SimPy", "simpy_events_per_s")):
        s = side.lower()
        print(
            f"{side:<12}{res[key]:>20,.0f}{ag['mean_sojourn'][s]:>15.4f}{ag['mean_tasks_per_node'][s]:>13.4f}"
        )
    print(f"{'mean field':<12}{'':>20}{res['mean_field_sojourn']:>15.4f}")
    print()
    per_round = ", ".join(f"{r:.2f}" for r in res["ratio_per_round"])
    verdict = "meets" if res["meets_target"] else "below"
    print(
        f"ratio lbtestbed / SimPy: {res['ratio']:.2f}x (per round: {per_round}); "
        f"target {res['target_ratio']:g}x: {verdict}"
    )
    diffs = ", ".join(f"{k} {100 * v['relative_difference']:+.2f}%" for k, v in ag.items())
    word = "agree" if res["models_agree"] else "DISAGREE"
    print(f"models {word} (tolerance {100 * res['tolerance']:g}%): {diffs}")


def profile(args: argparse.Namespace, top: int = 25) -> None:
    """cProfile one lbtestbed run and print the top functions by own time."""
    exp = experiment(args.nodes, args.load, args.warmup, args.duration, args.seed)
    prof = cProfile.Profile()
    prof.enable()
    raw = Simulator(exp).run()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    print(f"{raw.events:,} events in {raw.wall_seconds:.2f} s under cProfile")
    print(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=1000, help="number of fcfs nodes (default 1000)")
    p.add_argument("--load", type=float, default=0.9, help="offered load per node (default 0.9)")
    p.add_argument(
        "--duration",
        "--model-time",
        dest="duration",
        type=float,
        default=600.0,
        help="measured model seconds per run, after the warm-up (default 600)",
    )
    p.add_argument("--warmup", type=float, default=50.0, help="warm-up model seconds (default 50)")
    p.add_argument("--rounds", type=int, default=5, help="timed runs of each simulator (default 5)")
    p.add_argument("--seed", type=int, default=1, help="seed of round 1; round r uses seed + r - 1")
    p.add_argument(
        "--simpy-model",
        choices=sorted(SIMPY_MODELS),
        default="process",
        help="process: one serving process per node (default, the faster); resource: simpy.Resource",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="largest relative difference of mean sojourn and tasks per node between the models (0.05)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument(
        "--profile", action="store_true", help="only cProfile one lbtestbed run (top 25 by tottime)"
    )
    args = p.parse_args(argv)
    if args.nodes < 2 or args.rounds < 1 or not 0 < args.load < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("need --nodes >= 2, --rounds >= 1, 0 < --load < 1, --duration > 0, --warmup >= 0")
    if args.profile:
        profile(args)
        return 0

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    res = benchmark(args, log)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    if not res["models_agree"]:
        print("the two models measured different systems: the speed comparison is void", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
