"""Simulator speed: lbtestbed against SimPy models of the same system, and with the number of nodes.

The system: ``nodes`` FCFS single servers of speed 1, Poisson arrivals at ``load * nodes`` per model second,
exponential work of mean 1, JSQ(2) dispatching (probe two distinct nodes uniformly at random, join the one
holding fewer tasks, ties uniform). lbtestbed (its mypyc build and the pure-Python simulator) and SimPy (its
``process`` and ``resource`` forms) run it over the same model time horizon, the one the lbtestbed
simulator uses: ``warmup + duration`` model seconds, then on until every task that arrived in the measured
window has left. All count model events the same way: one per arrival and one per completion.

The rounds are interleaved (each side goes first in turn) so that a machine that gets busier or quieter
during the run affects every side alike. The result is the median of each side's events per wall second
and their ratios; the absolute rates mean little on a shared machine, the ratios are the numbers to track.
Before reporting, the benchmark checks that the models measured the same system (mean sojourn and mean
tasks per node agree within ``--tolerance``), so that the sides did equal work. Then it times the same
spec at 1 000, 10 000 and 100 000 nodes and runs a million nodes in a child process for its peak memory
(``simulator_scale.py``).

    .venv/bin/python benchmarks/bench_simulator.py            # table, about 10 minutes
    .venv/bin/python benchmarks/bench_simulator.py --json     # one JSON object on stdout
    .venv/bin/python benchmarks/bench_simulator.py --profile  # cProfile of one lbtestbed run
    .venv/bin/python benchmarks/bench_simulator.py --instructions  # instructions per event (valgrind)

See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import simpy
import simulator_scale  # beside this file

from lbtestbed.analysis.simulator import KERNELS, compiled
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.simulator.rates import unsupported
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import parse_spec

#: the project's goals for the mypyc build: at least 3x SimPy's hand-tuned model, 10x its textbook one
TARGETS = {"process": 3.0, "resource": 10.0}
TARGET_RATIO = TARGETS["process"]
#: --instructions: the warm-up and the two measured lengths whose difference gives the cost of an event
INSTR_WARMUP, INSTR_DURATIONS = 5.0, (2.0, 22.0)


@dataclass
class Measured:
    """One timed run of one simulator."""

    side: str  # "lbtestbed", "compiled" (lbtestbed's mypyc build) or "simpy"
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


def run_lbtestbed(
    nodes: int,
    load: float,
    warmup: float,
    duration: float,
    seed: int,
    rnd: int,
    side: str = "lbtestbed",
    simulator: Any = Simulator,
) -> Measured:
    """One timed run of lbtestbed's simulator: ``simulator`` is the pure-Python class or the compiled one."""
    exp = experiment(nodes, load, warmup, duration, seed)
    wall = time.perf_counter()
    sim = simulator(exp)
    raw = sim.run()
    wall = time.perf_counter() - wall
    soj_num, soj_den = raw.ratios["mean_sojourn"]
    tasks_num, _ = raw.ratios["mean_tasks_per_node"]  # node task-seconds, batch by batch
    return Measured(
        side,
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
    """lbtestbed's builds against SimPy's models, rounds interleaved (each side goes first in turn)."""
    runners: dict[str, Callable[[int, float, float, float, int, int], Measured]] = {}
    if not args.python_only:
        compiled_simulator = compiled.load().Simulator

        def run_compiled(
            nodes: int, load: float, warmup: float, duration: float, seed: int, rnd: int
        ) -> Measured:
            return run_lbtestbed(nodes, load, warmup, duration, seed, rnd, "compiled", compiled_simulator)

        runners["compiled"] = run_compiled
    runners["lbtestbed"] = run_lbtestbed
    models = list(SIMPY_MODELS) if args.simpy_model == "all" else args.simpy_model.split(",")
    for model in models:
        runners[f"simpy-{model}"] = SIMPY_MODELS[model]
    sides = list(runners)
    for (
        run
    ) in runners.values():  # one short untimed run of each side first: no timed run pays first-use costs
        run(args.nodes, args.load, 1.0, 4.0, args.seed, -1)
    runs: list[Measured] = []
    for rnd in range(args.rounds):
        seed = args.seed + rnd
        shift = rnd % len(sides)
        for side in sides[shift:] + sides[:shift]:
            gc.collect()
            m = runners[side](args.nodes, args.load, args.warmup, args.duration, seed, rnd)
            m.side = side
            runs.append(m)
            log(
                f"  round {rnd + 1}/{args.rounds} {side:<15} {m.events:>9,} events in {m.wall_s:6.2f} s "
                f"= {m.events_per_s:>9,.0f} events/s (model time {m.model_time:,.1f} s)"
            )
    by_side = {side: sorted((r for r in runs if r.side == side), key=lambda r: r.round) for side in sides}
    rate = {side: statistics.median(r.events_per_s for r in by_side[side]) for side in sides}
    ratios: dict[str, dict[str, Any]] = {}
    for ours in [s for s in sides if not s.startswith("simpy")]:
        for model in models:
            theirs = by_side[f"simpy-{model}"]
            ratio, target = (
                rate[ours] / rate[f"simpy-{model}"],
                TARGETS.get(model) if ours == "compiled" else None,
            )
            ratios[f"{ours}/{model}"] = {
                "ratio": ratio,
                "per_round": [
                    a.events_per_s / b.events_per_s for a, b in zip(by_side[ours], theirs, strict=True)
                ],
                "target": target,
                "meets_target": None if target is None else ratio >= target,
            }
    stats = {side: pooled(by_side[side], args.nodes, args.duration) for side in sides}
    reference = stats["lbtestbed"]
    agreement = {
        side: {key: stats[side][key] / reference[key] - 1.0 for key in reference}
        for side in sides
        if side.startswith("simpy")
    }
    agree = all(abs(d) <= args.tolerance for v in agreement.values() for d in v.values())
    res: dict[str, Any] = {
        "events_per_s": rate,
        "ratios": ratios,
        "rounds": args.rounds,
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
        "means": stats,
        "agreement": agreement,
        "mean_field_sojourn": mean_field_sojourn(args.load),
        "models_agree": agree,
        "tolerance": args.tolerance,
    }
    if "compiled" in by_side:
        # the same seeds give the same run, to the last bit: the compiled side did the very same work
        res["compiled_identical_to_python"] = all(
            (a.events, a.model_time, a.sojourn_sum, a.sojourn_count, a.task_seconds)
            == (b.events, b.model_time, b.sojourn_sum, b.sojourn_count, b.task_seconds)
            for a, b in zip(by_side["compiled"], by_side["lbtestbed"], strict=True)
        )
    res["runs"] = [{**asdict(r), "events_per_s": r.events_per_s} for r in runs]
    res["python"] = platform.python_version()
    res["simpy_version"] = simpy.__version__
    return res


NAMES = {"compiled": "lbtestbed (mypyc)", "lbtestbed": "lbtestbed (pure Python)"}


def print_table(res: dict[str, Any]) -> None:
    cfg = res["config"]
    print()
    print(
        f"JSQ(2), {cfg['nodes']} fcfs nodes, load {cfg['load']:g}, exponential service mean 1; "
        f"model time {cfg['warmup']:g} + {cfg['duration']:g} s + drain; {res['rounds']} rounds"
    )
    print()
    print(f"{'':<26}{'events/s (median)':>20}{'mean sojourn':>15}{'tasks/node':>13}")
    for side, rate in res["events_per_s"].items():
        m, name = res["means"][side], NAMES.get(side, "SimPy " + side[6:])
        print(f"{name:<26}{rate:>20,.0f}{m['mean_sojourn']:>15.4f}{m['mean_tasks_per_node']:>13.4f}")
    print(f"{'mean field':<26}{'':>20}{res['mean_field_sojourn']:>15.4f}")
    print()
    for key, r in res["ratios"].items():
        ours, model = key.split("/")
        per_round = ", ".join(f"{x:.2f}" for x in r["per_round"])
        target = "" if r["target"] is None else f"; target {r['target']:g}x: "
        target += "" if r["target"] is None else ("meets" if r["meets_target"] else "below")
        print(f"{NAMES[ours]} / SimPy {model}: {r['ratio']:.2f}x (per round: {per_round}){target}")
    if "compiled_identical_to_python" in res:
        same = "yes" if res["compiled_identical_to_python"] else "NO"
        print(f"compiled runs identical to the pure-Python runs: {same}")
    diffs = "; ".join(
        f"{side}: " + ", ".join(f"{k} {100 * v:+.2f}%" for k, v in d.items())
        for side, d in res["agreement"].items()
    )
    word = "agree" if res["models_agree"] else "DISAGREE"
    print(f"models {word} with lbtestbed (tolerance {100 * res['tolerance']:g}%): {diffs}")
    for scale in res.get("scaling", {}).values():
        print_scaling(scale)
    for big in res.get("million", {}).values():
        verdict = "within" if big["within_limit"] else "OVER"
        print(
            f"{big['nodes']:,} nodes, {big['policy']} ({big['simulator']}, {big['kernel']} kernel), "
            f"{big['model_seconds']:g} model s:"
            " "
            f"{big['events']:,} events at {big['events_per_s']:,.0f} events/s; "
            f"peak memory {big['peak_mb']:,.0f} MB ({verdict} {big['limit_mb']:,.0f} MB)"
        )


def print_scaling(scale: dict[str, Any]) -> None:
    cfg = scale["config"]
    rates = ", ".join(f"n={int(n):,}: {r:,.0f}" for n, r in scale["events_per_s"].items())
    print()
    print(
        f"scaling ({scale['simulator']}, {scale['kernel']} kernel, {cfg['warmup']:g} + {cfg['duration']:g} "
        f"model s, {cfg['rounds']} rounds): events/s {rates}"
    )
    verdict = "meets" if scale["meets_target"] else "below"
    print(
        f"  largest n / smallest n: {scale['ratio']:.2f}x (CPU time: {scale['cpu_ratio']:.2f}x); "
        f"target {scale['target']:g}x: {verdict}"
    )


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


def run_side(args: argparse.Namespace, side: str) -> Measured:
    """One untimed run of one side with the flags' settings (for --instructions)."""
    if side == "simpy":
        return SIMPY_MODELS[args.simpy_model](args.nodes, args.load, args.warmup, args.duration, args.seed, 0)
    simulator = compiled.load().Simulator if side == "compiled" else Simulator
    return run_lbtestbed(args.nodes, args.load, args.warmup, args.duration, args.seed, 0, side, simulator)


def instructions_per_event(args: argparse.Namespace, side: str) -> float:
    """Machine instructions per model event of one side, counted by valgrind's callgrind.

    The difference of a short and a long run of the same seed, divided by the difference of their events:
    what both runs share cancels (start-up, imports, building the model, the batch boundaries, the
    result), and what is left is the steady-state cost of an event. Unlike wall time it does not depend
    on what else the machine runs.
    """
    base = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--nodes", str(args.nodes)]
    base += ["--load", repr(args.load), "--warmup", repr(INSTR_WARMUP), "--seed", str(args.seed)]
    base += ["--simpy-model", args.simpy_model]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    # a first run outside the count, so that neither counted run compiles .pyc files
    subprocess.run([*base, "--duration", "1"], env=env, capture_output=True, check=True)
    counts = []
    for duration in INSTR_DURATIONS:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            *base,
            "--duration",
            repr(duration),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        found = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or found is None:
            lines = proc.stderr.strip().splitlines()
            raise SystemExit(
                f"bench_simulator: {side} under valgrind failed: {lines[-1] if lines else proc.returncode}"
            )
        counts.append((int(proc.stdout.split()[-1]), int(found.group(1))))
    (events1, instr1), (events2, instr2) = counts
    return (instr2 - instr1) / (events2 - events1)


def count_instructions(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    sides = ["lbtestbed", "simpy"] + ([] if args.python_only else ["compiled"])
    per_event: dict[str, float] = {}
    for side in sides:
        per_event[side] = instructions_per_event(args, side)
        log(f"  {side:<9} {per_event[side]:>9,.0f} instructions per event")
    return {
        "instructions_per_event": per_event,
        "ratio": per_event["simpy"] / per_event["lbtestbed"],
        **({} if args.python_only else {"compiled_ratio": per_event["simpy"] / per_event["compiled"]}),
        "target_ratio": TARGET_RATIO,
        "simpy_model": args.simpy_model,
        "config": {
            "nodes": args.nodes,
            "load": args.load,
            "warmup": INSTR_WARMUP,
            "durations": INSTR_DURATIONS,
        },
        "python": platform.python_version(),
        "simpy_version": simpy.__version__,
    }


def print_instructions(res: dict[str, Any]) -> None:
    cfg, per_event = res["config"], res["instructions_per_event"]
    print()
    print(
        f"JSQ(2), {cfg['nodes']} fcfs nodes, load {cfg['load']:g}; instructions per model event (valgrind "
        f"callgrind, runs of {cfg['durations'][1]:g} - {cfg['durations'][0]:g} model seconds), "
        f"SimPy model: {res['simpy_model']}"
    )
    print()
    names = {"lbtestbed": "lbtestbed", "simpy": "SimPy", "compiled": "  (mypyc)"}
    for side, value in per_event.items():
        ratio = f"{per_event['simpy'] / value:>10.2f}x" if side != "simpy" else ""
        print(f"{names[side]:<12}{value:>12,.0f}{ratio}")
    print()
    print(f"ratio lbtestbed / SimPy (fewer instructions per event is faster): {res['ratio']:.2f}x")
    if "compiled_ratio" in res:
        print(f"ratio lbtestbed (mypyc) / SimPy: {res['compiled_ratio']:.2f}x")


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
        default="process,resource",
        help="SimPy models to time, comma-separated, or all: process (one serving process per node, the "
        "faster), resource (simpy.Resource, the textbook form), store (default process,resource)",
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
    p.add_argument(
        "--python-only", action="store_true", help="time only the pure-Python simulator, not the mypyc build"
    )
    p.add_argument(
        "--scaling",
        default="1000,10000,100000",
        help="node counts of the scaling part, comma-separated; 'none' skips it (default 1000,10000,100000)",
    )
    p.add_argument(
        "--scaling-duration", type=float, default=20.0, help="its model seconds after 5 of warm-up"
    )
    p.add_argument("--scaling-rounds", type=int, default=2, help="its interleaved rounds (default 2)")
    p.add_argument(
        "--kernel",
        default="events,rates",
        help="the kernels of the scaling and million-node parts, comma-separated: events (the discrete-event "
        "kernel), rates (the rates kernel of Markovian specs) (default events,rates)",
    )
    p.add_argument(
        "--million",
        default="power_of_d",
        help="the million-node part's policy (power_of_d, jiq or jlmu); 'none' skips it (default power_of_d)",
    )
    p.add_argument("--million-nodes", type=int, default=1_000_000, help=argparse.SUPPRESS)
    p.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per model event under valgrind instead of timing (steady on a busy machine)",
    )
    p.add_argument(
        "--require-target",
        action="store_true",
        help="exit 1 when a ratio is below the target too (by default the exit status says whether the "
        "comparison is valid, not how fast: timings on a shared machine vary)",
    )
    p.add_argument("--child", choices=["lbtestbed", "simpy", "compiled"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.nodes < 2 or args.rounds < 1 or not 0 < args.load < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("need --nodes >= 2, --rounds >= 1, 0 < --load < 1, --duration > 0, --warmup >= 0")
    models = list(SIMPY_MODELS) if args.simpy_model == "all" else args.simpy_model.split(",")
    if not models or any(m not in SIMPY_MODELS for m in models):
        p.error(f"--simpy-model: give all or some of {', '.join(SIMPY_MODELS)}, comma-separated")
    try:
        counts = [] if args.scaling == "none" else sorted(int(float(x)) for x in args.scaling.split(","))
    except ValueError:
        p.error(f"--scaling: node counts, comma-separated, or none; got {args.scaling!r}")
    if args.million not in ("none", *simulator_scale.POLICIES):
        p.error(f"--million: one of none, {', '.join(simulator_scale.POLICIES)}")
    kernels = tuple(args.kernel.split(","))
    if not kernels or any(k not in KERNELS for k in kernels) or len(set(kernels)) < len(kernels):
        p.error(f"--kernel: some of {', '.join(KERNELS)}, comma-separated; got {args.kernel!r}")
    if args.profile:
        profile(args)
        return 0
    if args.child:  # one run for --instructions: print its events
        print(run_side(args, args.child).events)
        return 0
    if not args.python_only:
        try:
            compiled.load()
        except compiled.Unavailable as e:
            p.error(f"the mypyc build: {e} (or give --python-only)")

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    if args.instructions:
        if shutil.which("valgrind") is None:
            p.error("--instructions needs valgrind on PATH (Debian package valgrind)")
        args.simpy_model = models[0]
        counted = count_instructions(args, log)
        if args.json:
            print(json.dumps(counted, indent=2))
        else:
            print_instructions(counted)
        return 0

    res = benchmark(args, log)
    if counts:
        res["scaling"] = simulator_scale.scaling(
            counts, 5.0, args.scaling_duration, args.scaling_rounds, log, kernels
        )
    if args.million != "none":
        res["million"] = {}
        for k in kernels:
            why = k == "rates" and unsupported(simulator_scale.spec(2, 1.0, 1.0, args.million))
            if why:
                log(f"  {args.million} on the rates kernel: not run ({why})")
                continue
            res["million"][k] = simulator_scale.million(args.million, args.million_nodes, 2.0, 18.0, log, k)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    if not res["models_agree"]:
        print("the models measured different systems: the speed comparison is void", file=sys.stderr)
        return 1
    if res.get("compiled_identical_to_python") is False:
        print("the compiled simulator's runs differ from the pure-Python ones", file=sys.stderr)
        return 1
    below = [name for name, r in res["ratios"].items() if r["meets_target"] is False]
    below += [f"scaling ({k})" for k, scale in res.get("scaling", {}).items() if not scale["meets_target"]]
    below += [f"million ({k})" for k, big in res.get("million", {}).items() if not big["within_limit"]]
    if below:
        because = (
            "exit 1: --require-target" if args.require_target else "not an error without --require-target"
        )
        print(f"goals below: {', '.join(below)} ({because}; benchmarks/README.md)", file=sys.stderr)
    return 1 if below and args.require_target else 0


if __name__ == "__main__":
    sys.exit(main())
