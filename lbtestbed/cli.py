"""``lbt``: the command line of lbtestbed.

Exit codes: 0 success, 1 the run failed, 2 bad input (spec or arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from lbtestbed.spec import SpecError, load_spec

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _progress(label: str) -> Any:
    if not sys.stderr.isatty():
        return None

    def show(fraction: float) -> None:
        sys.stderr.write(f"\r{label}: {100 * fraction:5.1f}% of model time")
        sys.stderr.flush()

    return show


def cmd_simulate(args: argparse.Namespace) -> int:
    from lbtestbed.analysis.result import summarize
    from lbtestbed.analysis.simulator import simulate_once
    from lbtestbed.analysis.tables import render

    exp = load_spec(args.spec, args.set)
    k = args.replications
    if k == 1:
        raws = [simulate_once(exp, 0, None if args.quiet else _progress(exp.name))]
    else:
        with ProcessPoolExecutor(max_workers=min(k, args.jobs)) as pool:
            futures = [pool.submit(simulate_once, exp, i) for i in range(k)]
            for done, _ in enumerate(as_completed(futures), 1):
                if not args.quiet:
                    print(f"{exp.name}: replication {done}/{k} done", file=sys.stderr)
            raws = [f.result() for f in futures]
    if not args.quiet and sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 60 + "\r")
    result = summarize(exp, raws)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render(result))
    return EXIT_OK


def cmd_predict(args: argparse.Namespace) -> int:
    from lbtestbed.analysis.tables import render, render_notes, render_transient
    from lbtestbed.analysis.theory import predict, transient_table

    exp = load_spec(args.spec, args.set)
    result = predict(exp)
    transient = None
    if args.transient:
        if {c.discipline for c in exp.classes} != {"pool"} or any(c.utility is None for c in exp.classes):
            print(
                f"lbt: error: {exp.source}: --transient needs pools with utilities (the JLMU fluid model)",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        horizon = max(2 * result.extras["bounds"]["warmup_needed"], exp.run.warmup)
        steps = 24
        transient = transient_table(exp, [horizon * k / steps for k in range(steps + 1)])
        result.extras["transient"] = transient
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    print(render(result))
    print(render_notes(result))
    if transient is not None:
        print(render_transient(exp, result, transient))
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lbtestbed.cluster import Cluster, ClusterError

    cluster = Cluster(Path(args.file))
    try:
        if args.action == "up":
            if args.spec is None:
                print("lbt: error: lbt cluster up needs a SPEC", file=sys.stderr)
                return EXIT_BAD_INPUT
            f = cluster.up(args.spec, args.set, args.dispatchers, args.node_procs, args.max_tasks)
            rows = cluster.status()
            if args.json:
                json.dump({"file": str(cluster.path), "processes": rows}, sys.stdout, indent=1)
                sys.stdout.write("\n")
            else:
                nodes = sum(len(h.nodes) for h in f.node_hosts)
                print(
                    f"cluster up: {len(f.dispatchers)} dispatcher(s), {nodes} nodes in {len(f.node_hosts)} "
                    f"process(es); cluster file {cluster.path}"
                )
                for r in rows:
                    what = f"{r['nodes']} nodes" if r["role"] == "nodes" else "send tasks: POST /v1/tasks"
                    print(f"  {r['role']:<10} {r['index']:>3}  {r['url']:<24} pid {r['pid']:<7} {what}")
            if args.foreground:
                print("serving; Ctrl-C stops the cluster", file=sys.stderr)
                try:
                    while all(r["alive"] for r in cluster.status()):
                        time.sleep(1.0)
                    print("lbt: a cluster process exited; stopping the rest", file=sys.stderr)
                    return EXIT_FAILED
                finally:
                    cluster.down()
            return EXIT_OK
        if args.action == "status":
            rows = cluster.status()
            if args.json:
                json.dump({"file": str(cluster.path), "processes": rows}, sys.stdout, indent=1)
                sys.stdout.write("\n")
            else:
                for r in rows:
                    state = (
                        "healthy" if r["healthy"] else ("running, not answering" if r["alive"] else "DEAD")
                    )
                    print(f"  {r['role']:<10} {r['index']:>3}  {r['url']:<24} pid {r['pid']:<7} {state}")
            return EXIT_OK if all(r["healthy"] for r in rows) else EXIT_FAILED
        stopped = cluster.down()
        print(f"cluster down: stopped {stopped} process(es)")
        return EXIT_OK
    except ClusterError as e:
        print(f"lbt: error: {e}", file=sys.stderr)
        return EXIT_FAILED


def cmd_load(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from lbtestbed.cluster import ClusterError, ClusterFile
    from lbtestbed.loadgen.openloop import drive, poisson_tasks, read_trace, write_trace

    exp = load_spec(args.spec, args.set)
    urls = list(args.dispatcher)
    if not urls:
        try:
            urls = [d.url for d in ClusterFile.load(Path(args.cluster)).dispatchers]
        except ClusterError as e:
            print(f"lbt: error: {e}; give --dispatcher URL or start one with lbt cluster up", file=sys.stderr)
            return EXIT_BAD_INPUT
    horizon = args.duration if args.duration is not None else exp.run.warmup + exp.run.duration
    try:
        tasks = read_trace(Path(args.replay)) if args.replay else list(poisson_tasks(exp, horizon))
    except (OSError, ValueError) as e:
        print(f"lbt: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.record:
        write_trace(Path(args.record), tasks)
    scale = exp.run.time_scale
    if not args.quiet:
        span = tasks[-1][0] * scale if tasks else 0.0
        print(
            f"{exp.name}: {len(tasks)} tasks over {span:.1f} s wall ({len(tasks) / max(span, 1e-9):.0f}/s) "
            f"to {len(urls)} dispatcher(s)",
            file=sys.stderr,
        )

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            sys.stderr.write(f"\r  sent {done}/{total}")
            sys.stderr.flush()

    report = asyncio.run(drive(urls, tasks, scale, args.max_outstanding, progress))
    if not args.quiet:
        sys.stderr.write("\n")
    summary = report.summary()
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for key, value in summary.items():
            shown = f"{value:.4g}" if isinstance(value, float) else value
            print(f"  {key:<16} {shown}")
        if report.late or report.outcomes["dropped"]:
            print(
                f"warning: the generator could not keep its schedule: {report.late} late sends, "
                f"{report.outcomes['dropped']} dropped",
                file=sys.stderr,
            )
    return EXIT_OK if report.outcomes["completed"] == len(tasks) else EXIT_FAILED


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    """``--set``, the same for every command that reads a spec."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec value, e.g. --set workload.load=0.8 --set classes[0].count=20",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lbt",
        description="lbtestbed: load-balancing policies from the literature, simulated, predicted, emulated.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "simulate",
        help="run the discrete-event simulator on a spec",
        description="Simulate an experiment spec and print its metrics with 95%% confidence intervals "
        "(batch means, or independent replications with --replications).",
    )
    sim.add_argument("spec", help="experiment spec (TOML), see docs/spec.md")
    sim.add_argument("--json", action="store_true", help="print the result object as JSON")
    sim.add_argument(
        "--replications",
        type=int,
        default=1,
        metavar="K",
        help="independent replications, run in parallel processes (default 1: batch means)",
    )
    sim.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="J",
        help="processes for replications (default: the number of cores)",
    )
    _add_overrides(sim)
    sim.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sim.set_defaults(func=cmd_simulate)

    pre = sub.add_parser(
        "predict",
        help="the stationary values theory predicts for a spec",
        description="Compute what the papers' formulas predict for an experiment spec: closed forms, fixed "
        "points and bounds, each with its formula and assumptions. Metrics no formula covers are null with a "
        "note saying why.",
    )
    pre.add_argument("spec", help="experiment spec (TOML), see docs/spec.md")
    pre.add_argument("--json", action="store_true", help="print the result object (source: theory) as JSON")
    pre.add_argument(
        "--transient",
        action="store_true",
        help="also the JLMU fluid trajectory from an empty system and the warm-up it needs (pools)",
    )
    _add_overrides(pre)
    pre.set_defaults(func=cmd_predict)

    clu = sub.add_parser(
        "cluster",
        help="start, inspect or stop a local cluster of dispatcher and node processes",
        description="lbt cluster up SPEC starts dispatcher(s) and server-node processes on loopback, waits "
        "until all are healthy and writes the cluster file; status and down use that file.",
    )
    clu.add_argument("action", choices=("up", "status", "down"))
    clu.add_argument("spec", nargs="?", help="experiment spec (TOML), for up")
    clu.add_argument("--file", default=".lbt/cluster.json", help="cluster file (default .lbt/cluster.json)")
    clu.add_argument(
        "--dispatchers", type=int, default=1, metavar="K", help="dispatchers side by side (default 1)"
    )
    clu.add_argument(
        "--node-procs",
        type=int,
        default=None,
        metavar="P",
        help="server-node processes; the nodes are split among them (default: 2 per core)",
    )
    clu.add_argument(
        "--max-tasks",
        type=int,
        default=100_000,
        metavar="N",
        help="tasks a node holds before it refuses with 503 (default 100000)",
    )
    _add_overrides(clu)
    clu.add_argument("--json", action="store_true", help="print the processes as JSON")
    clu.add_argument("--foreground", action="store_true", help="stay until Ctrl-C, then stop the cluster")
    clu.set_defaults(func=cmd_cluster)

    load = sub.add_parser(
        "load",
        help="drive a cluster with the spec's open-loop Poisson workload",
        description="Send the spec's tasks (Poisson arrivals, seeded work sizes: the simulator's tasks for "
        "the same seed) on an absolute schedule, never waiting for earlier tasks; sojourn is measured from "
        "each task's intended send time. Exit code 0 when every task completed, 1 otherwise.",
    )
    load.add_argument("spec", help="experiment spec (TOML)")
    load.add_argument(
        "--cluster", default=".lbt/cluster.json", help="cluster file to find the dispatchers in"
    )
    load.add_argument(
        "--dispatcher",
        action="append",
        default=[],
        metavar="URL",
        help="dispatcher base URL (repeatable); overrides --cluster",
    )
    load.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="model seconds of arrivals (default: the spec's warmup + duration)",
    )
    load.add_argument("--record", metavar="FILE", help="write the workload to a trace file")
    load.add_argument("--replay", metavar="FILE", help="send the tasks of a trace file instead")
    load.add_argument(
        "--max-outstanding",
        type=int,
        default=10_000,
        metavar="N",
        help="drop (and count) a task when N are outstanding (default 10000)",
    )
    _add_overrides(load)
    load.add_argument("--json", action="store_true", help="print the summary as JSON")
    load.add_argument("--quiet", action="store_true", help="no progress on stderr")
    load.set_defaults(func=cmd_load)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "replications", 1) < 1:
        parser.error("--replications must be at least 1")
    try:
        return int(args.func(args))
    except SpecError as e:
        print(f"lbt: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("lbt: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not bad input: say so in one line; LBT_DEBUG=1 shows the traceback
        if os.environ.get("LBT_DEBUG"):
            raise
        print(
            f"lbt: internal error: {type(e).__name__}: {e} (set LBT_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
