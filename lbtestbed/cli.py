"""``lbt``: the command line of lbtestbed.

Exit codes: 0 success, 1 the run failed, 2 bad input (spec or arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, NoReturn

from lbtestbed import __version__
from lbtestbed.loadgen import TASK_DEADLINE
from lbtestbed.model.spec import Experiment, SpecError, load_spec

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (exit 2): what is wrong and where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return integer


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def threshold(text: str) -> Any:
    """An argparse type: a ``lbt load`` threshold (loadgen.summary.Threshold)."""
    from lbtestbed.loadgen.summary import parse_threshold

    try:
        return parse_threshold(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def summary_metrics() -> str:
    from lbtestbed.loadgen.summary import help_text

    return help_text()


def netns_problem(args: argparse.Namespace) -> str | None:
    """Why the ``--netns``/``--bandwidth`` options given cannot work together."""
    if args.bandwidth and not args.netns:
        return (
            f"--bandwidth {args.bandwidth}: a bandwidth limit needs --netns (loopback has no link to limit)"
        )
    return None


def preflight(
    exp: Experiment, args: argparse.Namespace, say: Callable[[str], None]
) -> tuple[Experiment, dict[str, Any], str | None]:
    """Resolve ``time_scale = "auto"`` and judge what the spec asks of this machine, before anything
    starts: (the experiment to run, what the report records, a refusal or None)."""
    from lbtestbed.experiment import preflight as pf

    cal = pf.load_calibration(say)
    processes = getattr(args, "node_processes", None)
    record: dict[str, Any] = {"calibration": cal.to_json()}
    if exp.run.auto_time_scale:
        scale, why = pf.auto_time_scale(exp, cal, processes)
        exp = pf.resolve(exp, scale)
        record["time_scale"] = {"auto": True, "picked": scale, "why": why}
        say(why)
    est = pf.estimate(exp, cal, None, processes)
    level, line = pf.judge(est, cal)
    record["estimate"] = {**est.to_json(), "level": level, "why": line}
    if level == "refuse" and not getattr(args, "force", False):
        hint = 'raise run.time_scale (time_scale = "auto" picks one) or pass --force'
        return exp, record, f"{exp.source}: {line}; {hint}"
    if level != "ok":
        say(f"warning: {line}")
    return exp, record, None


def run_size_problem(exp: Experiment) -> str | None:
    """Why ``lbt run`` could not hold the tasks it sends (the spec's warm-up, window and drain), or None."""
    from lbtestbed.model.spec import sent_tasks_problem

    # lbt run's arrivals: warm-up, window, and a fifth of the window more on processor-sharing nodes
    # (experiment.runner.drain_arrivals); the larger of the two, without importing the runner
    horizon = exp.run.warmup + 1.2 * exp.run.duration
    return sent_tasks_problem(exp, horizon, "the run")


def _say(line: str) -> None:
    print(f"lbt: {line}", file=sys.stderr)


def _bad_input(message: str) -> int:
    print(f"lbt: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _records_file(args: argparse.Namespace) -> Any:
    """``--records FILE`` opened for writing (None without), or a one-line reason it cannot be."""
    if args.records is None:
        return None
    if args.replications > 1:
        return "--records: the records of one run; drop --replications"
    try:
        return open(args.records, "w", newline="")
    except OSError as e:
        return f"--records {args.records}: {e.strerror or e}"


def cmd_simulate(args: argparse.Namespace) -> int:
    exp = load_spec(args.spec, args.set)  # a bad spec fails first, before the heavy imports
    records = _records_file(args)  # a path that cannot be written fails before the simulation
    if isinstance(records, str):
        return _bad_input(records)
    try:
        return _simulate(exp, args, records)
    finally:
        if records is not None:
            records.close()


def _simulate(exp: Experiment, args: argparse.Namespace, records: Any) -> int:

    from lbtestbed.analysis.results.result import summarize
    from lbtestbed.analysis.results.tables import render
    from lbtestbed.analysis.simulator import simulate_once
    from lbtestbed.experiment.progress import Progress

    k = args.replications
    if k == 1:
        bar = None if args.quiet else Progress(f"{exp.name}: simulated", 1.0, "of model time", rate=False)
        try:
            if records is not None:  # the pure-Python engine's general loop, recording every task
                from lbtestbed.analysis.simulator.records import simulate_with_records

                raws = [simulate_with_records(exp, records, 0, None if bar is None else bar.update)]
            else:
                raws = [simulate_once(exp, 0, None if bar is None else bar.update)]
            if bar is not None:
                bar.update(1.0)
        finally:
            if bar is not None:
                bar.close()
    else:
        bar = None if args.quiet else Progress(f"{exp.name}: replications", k, "replications")
        try:
            with ProcessPoolExecutor(max_workers=min(k, args.jobs)) as pool:
                futures = [pool.submit(simulate_once, exp, i) for i in range(k)]
                for done, _ in enumerate(as_completed(futures), 1):
                    if bar is not None:
                        bar.update(done)
                raws = [f.result() for f in futures]
        finally:
            if bar is not None:
                bar.close()
    result = summarize(exp, raws)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render(result))
    return EXIT_OK


def cmd_predict(args: argparse.Namespace) -> int:
    exp = load_spec(args.spec, args.set)

    from lbtestbed.analysis.results.tables import render, render_notes, render_transient
    from lbtestbed.analysis.theory import predict, transient_table

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


def _prometheus_problem(args: argparse.Namespace) -> tuple[int, str] | None:
    """Why ``--with-prometheus`` cannot work (exit code, message), checked before any process starts."""
    from lbtestbed.cluster.prometheus import MAX_INTERVAL, MIN_INTERVAL, PrometheusError, prometheus_binary

    if not MIN_INTERVAL <= args.scrape_interval <= MAX_INTERVAL:
        limits = f"between {MIN_INTERVAL:g} and {MAX_INTERVAL:g} s"
        return EXIT_BAD_INPUT, f"--scrape-interval {args.scrape_interval:g}: must be {limits}"
    if args.prometheus_port is not None and not 1 <= args.prometheus_port <= 65535:
        return EXIT_BAD_INPUT, f"--prometheus-port {args.prometheus_port}: not a TCP port"
    try:
        prometheus_binary()
    except PrometheusError as e:
        return EXIT_FAILED, str(e)
    return None


def cmd_cluster(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.action == "up" and args.spec is None:
        return _bad_input("lbt cluster up needs a SPEC")
    # a bad spec fails here, before any process starts (and before the launcher is imported)
    exp = load_spec(args.spec, args.set) if args.action == "up" else None

    from lbtestbed.cluster.launcher import Cluster
    from lbtestbed.cluster.prometheus import GRAFANA_PORT
    from lbtestbed.transport.cluster_file import ClusterError

    cluster = Cluster(Path(args.file))
    try:
        if exp is not None:
            problem = netns_problem(args)
            if problem:
                return _bad_input(problem)
            exp, _, refusal = preflight(exp, args, lambda line: print(f"lbt: {line}", file=sys.stderr))
            if refusal:
                return _bad_input(refusal)
            if args.with_prometheus:
                prometheus = _prometheus_problem(args)
                if prometheus:
                    print(f"lbt: error: {prometheus[1]}", file=sys.stderr)
                    return prometheus[0]
            f = cluster.up(
                exp,
                args.node_processes,
                args.max_tasks,
                netns=args.netns,
                bandwidth=args.bandwidth or "",
            )
            if args.with_prometheus:
                try:
                    cluster.start_prometheus(args.scrape_interval, args.prometheus_port, prefer=GRAFANA_PORT)
                except ClusterError:
                    cluster.down()  # all or nothing: the user asked for both
                    raise
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
                what_by_role = {
                    "dispatcher": "send tasks: POST /v1/tasks",
                    "prometheus": "query: /api/v1/query",
                }
                for r in rows:
                    what = f"{r['nodes']} nodes" if r["role"] == "nodes" else what_by_role[r["role"]]
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
    from pathlib import Path

    from lbtestbed.experiment.preflight import at_cluster_scale
    from lbtestbed.loadgen import summary as summary_of
    from lbtestbed.loadgen.openloop import run_load, write_trace
    from lbtestbed.loadgen.plan import build_plan
    from lbtestbed.loadgen.summary import LOCUST_ONLY
    from lbtestbed.transport.cluster_file import ClusterError, ClusterFile, spec_difference

    locust_only = [t.text for t in args.threshold if t.metric in LOCUST_ONLY]
    if locust_only and not args.locust:
        return _bad_input(f"--threshold {locust_only[0]!r}: a locust metric; it needs --locust")
    urls = list(args.dispatcher)
    cluster = None  # the cluster file: the dispatchers, and the experiment its processes run
    if not urls or args.spec is None:
        try:
            cluster = ClusterFile.load(Path(args.cluster))
        except ClusterError as e:
            hint = "give --dispatcher URL" if args.spec is not None else "give a SPEC and --dispatcher URL"
            return _bad_input(f"{e}; {hint} or start one with lbt cluster up")
        urls = urls or [d.url for d in cluster.dispatchers]
    if args.locust_args and not args.locust:
        return _bad_input(f"{args.locust_args[0]!r} after --: options after -- go to locust; add --locust")
    if args.locust:
        from lbtestbed.loadgen.locust_run import passthrough_problem

        problem = passthrough_problem(args.locust_args)
        if problem:
            return _bad_input(problem)
    if args.locust_mode == "closed" and not args.locust:
        print(
            "lbt: error: --locust-mode closed needs --locust (lbt load itself is an open loop)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        return _bad_input(f"--metrics-port {args.metrics_port}: not a TCP port (0 picks a free one)")
    if args.locust_mode == "closed" and args.record:
        print("lbt: error: --record: a closed loop has no arrival times to record", file=sys.stderr)
        return EXIT_BAD_INPUT
    options = {
        "mode": args.locust_mode,
        "schedule": args.schedule,
        "duration": args.duration,
        "replay": args.replay,
        "users": args.locust_users,
        "max_outstanding": args.max_outstanding,
    }
    try:
        if args.spec is None:  # the cluster's own spec and overrides, then the command line's
            assert cluster is not None
            exp = load_spec(cluster.spec, [*cluster.overrides, *args.set])
        else:
            exp = load_spec(args.spec, args.set)
        try:  # "auto": the scale the cluster was started with (lbt cluster up picked it)
            exp = at_cluster_scale(exp, Path(args.cluster))
        except ClusterError:
            return _bad_input(
                f'{exp.source}: run.time_scale = "auto" needs the cluster that picked it (--cluster) '
                "or a number: --set run.time_scale=X"
            )
        if cluster is not None and not args.dispatcher:  # the spec must be the one the cluster runs
            problem = spec_difference(exp, cluster.experiment())
            if problem:
                return _bad_input(f"{exp.source} against the cluster of {args.cluster}: {problem}")
        plan = build_plan(exp, dispatchers=urls, **options)
    except (OSError, ValueError) as e:
        print(f"lbt: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    exp, tasks = plan.exp, plan.tasks
    from lbtestbed.model.conditions import speed_varies

    if varies := speed_varies(exp):
        print(
            f"lbt: warning: {varies}, but lbt load does not set the run's clock: the node hosts do not apply "
            "speed schedules or antagonists to this load (lbt run does)",
            file=sys.stderr,
        )
    if args.record:
        write_trace(Path(args.record), tasks)
    if not args.quiet:
        span = plan.span
        how = f"locust, {plan.mode} loop" if args.locust else "open loop"
        print(
            f"{exp.name}: {len(tasks)} tasks over {span:.1f} s wall ({len(tasks) / max(span, 1e-9):.0f}/s) "
            f"to {len(urls)} dispatcher(s), {how}",
            file=sys.stderr,
        )
    if args.locust:
        from lbtestbed.loadgen.locust_run import LocustError, run_locust

        try:
            # locust's processes read the experiment from its file and overrides (its time scale resolved)
            summary = run_locust(
                exp.source,
                exp.overrides,
                urls,
                timeout=plan.hard_limit + 60,
                quiet=args.quiet,
                # --metrics-port: the locustfile serves the same series (not registered with a Prometheus)
                extra=[
                    *(["--lbt-metrics-port", str(args.metrics_port)] * (args.metrics_port is not None)),
                    *args.locust_args,
                ],
                **options,
            )
        except LocustError as e:
            print(f"lbt: error: {e}", file=sys.stderr)
            return EXIT_FAILED
    else:
        from lbtestbed.cluster.prometheus import config_dir, serve_generator
        from lbtestbed.experiment.progress import Progress
        from lbtestbed.loadgen.openloop import LoadReport

        report = LoadReport(scheduled=len(tasks))  # from the first scrape on
        # the cluster's Prometheus (lbt cluster up --with-prometheus) scrapes the generator; with
        # --dispatcher there is no cluster to join
        joins = cluster is not None and cluster.prometheus_url and not args.dispatcher
        scraped_by = config_dir(Path(args.cluster)) if joins else None
        with contextlib.ExitStack() as serving:
            try:
                serving.enter_context(serve_generator(report, exp, args.metrics_port, scraped_by, _say))
            except OSError as e:  # the port is taken, or not ours to bind
                print(f"lbt: error: --metrics-port {args.metrics_port}: {e.strerror or e}", file=sys.stderr)
                return EXIT_FAILED
            bar = None if args.quiet else Progress(f"{exp.name}: sent", len(tasks), "tasks")
            try:
                run_load(
                    urls,
                    tasks,
                    exp.run.time_scale,
                    args.max_outstanding,
                    None if bar is None else lambda done, total: bar.update(done),
                    deadline=args.deadline,
                    report=report,
                )
                if bar is not None:  # the tasks the schedule went through (it reports once a second)
                    bar.update(report.scheduled - report.outcomes["unsent"])
                summary = report.summary()
            finally:
                if bar is not None:
                    bar.close()
        if summary["interrupted"]:
            print(
                f"lbt: interrupted: {summary['sent']} of {summary['scheduled']} tasks sent so far, "
                f"{summary['completed']} completed; the summary of what was done:",
                file=sys.stderr,
            )
    verdicts = summary_of.verdicts(args.threshold, summary)
    if args.json:
        json.dump({**summary, "thresholds": verdicts} if verdicts else summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print("\n".join(summary_of.lines(summary)))
        for verdict in verdicts:
            print(summary_of.describe(verdict))
        if summary["late_sends"] or summary["dropped"]:
            print(
                f"warning: the generator could not keep its schedule: {summary['late_sends']} late sends, "
                f"{summary['dropped']} dropped",
                file=sys.stderr,
            )
        if plan.mode == "closed":
            print(
                f"note: a closed loop sends what the system lets it: {summary['sent']} tasks sent where an "
                f"open loop would send about {plan.expected():.0f}",
                file=sys.stderr,
            )
    if summary.get("interrupted"):
        return EXIT_INTERRUPTED
    if verdicts:  # the thresholds alone decide, as k6's do
        return EXIT_OK if all(v["ok"] for v in verdicts) else EXIT_FAILED
    return EXIT_OK if summary["completed"] == summary["scheduled"] else EXIT_FAILED


def _stages(quiet: bool) -> Any:
    """Progress lines for long commands (run, sweep): seconds since the start, then what happens now."""
    started = time.monotonic()

    def say(line: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    return say


def _run_errors() -> tuple[type[Exception], ...]:
    """What makes a cluster run fail without a bug: a process, a scrape or Prometheus (exit 1, one line)."""
    from lbtestbed.analysis.measurement.scrape import ScrapeError
    from lbtestbed.cluster.prometheus import PrometheusError
    from lbtestbed.transport.cluster_file import ClusterError

    return (ClusterError, ScrapeError, PrometheusError)


def cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    exp = load_spec(args.spec, args.set)  # a bad spec fails before anything starts
    problem = netns_problem(args) or run_size_problem(exp)
    if problem:
        return _bad_input(problem)

    from lbtestbed.analysis.report.run_report import terminal
    from lbtestbed.experiment.preflight import at_cluster_scale
    from lbtestbed.experiment.runner import existing_cluster, run_experiment
    from lbtestbed.transport.cluster_file import ClusterError

    say = _stages(args.quiet)
    record: dict[str, Any] = {}
    if args.endpoints:
        try:  # the cluster named must exist and run this experiment: checked before anything starts
            exp = at_cluster_scale(exp, Path(args.endpoints))
            existing_cluster(exp, Path(args.endpoints))
        except (ClusterError, SpecError) as e:
            return _bad_input(f"--endpoints: {e}")
    else:
        exp, record, refusal = preflight(exp, args, say)
        if refusal:
            return _bad_input(refusal)
    directory = (
        Path(args.out) if args.out else Path("reports") / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    try:
        rep, files = run_experiment(
            exp,
            directory,
            say,
            preflight=record,
            simulate=not args.no_simulation,
            endpoints=Path(args.endpoints) if args.endpoints else None,
            node_processes=args.node_processes,
            prometheus=args.prometheus,
            with_prometheus=args.with_prometheus,
            netns=args.netns,
            bandwidth=args.bandwidth or "",
        )
    except _run_errors() as e:
        print(f"lbt: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        json.dump(rep.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(terminal(rep))
        print(f"report: {directory / 'report.md'} (results.json and {len(files) - 2} plots beside it)")
    return EXIT_OK if rep.agrees else EXIT_FAILED


def cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lbtestbed.analysis.report.run_report import table
    from lbtestbed.experiment.sweep import experiments, rows, sweep, write

    exp = load_spec(args.spec)  # the file itself first; every point is checked before the first runs
    grid = experiments(exp, args.set)
    say = _stages(args.quiet)
    if not args.simulate_only:  # every point is checked (and its time scale picked) before the first runs
        for i, (settings, point) in enumerate(grid):
            resolved, _, refusal = preflight(point, args, say)
            refusal = refusal or run_size_problem(point)
            if refusal:
                return _bad_input(f"sweep point {' '.join(settings)}: {refusal}")
            grid[i] = (settings, resolved)
    directory = (
        Path(args.out) if args.out else Path("reports") / f"sweep-{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    from lbtestbed.experiment.progress import Progress

    bar = None if args.quiet else Progress(f"{exp.name}: sweep", len(grid), "points")
    try:
        points = sweep(
            grid,
            directory,
            say,
            simulate_only=args.simulate_only,
            jobs=args.jobs,
            progress=None if bar is None else bar.update,
            node_processes=args.node_processes,
        )
    except _run_errors() as e:
        print(f"lbt: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if bar is not None:
            bar.close()
    files = write(directory, args.spec, points)
    if args.json:
        json.dump({"spec": args.spec, "points": [p.to_json() for p in points]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(table(rows(points)))
        beside = ", ".join(f.name for f in files if f.name != "sweep.md")
        print(f"sweep: {directory / 'sweep.md'} ({beside} beside it)")
    return EXIT_OK if all(p.agrees is not False for p in points) else EXIT_FAILED


def _add_netns(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--netns",
        action="store_true",
        help="every node process in its own network namespace on a bridge, so that traffic crosses real "
        "interfaces (root and iproute2; removed again by down, also after a crash)",
    )
    parser.add_argument(
        "--bandwidth",
        metavar="RATE",
        help="with --netns: limit every node's link to this tc rate in both directions, e.g. 100mbit",
    )


def _add_force(parser: argparse.ArgumentParser) -> None:
    """``--force``, the same for every command that starts a cluster."""
    parser.add_argument(
        "--force",
        action="store_true",
        help="go on even when the pre-flight estimate says the spec would saturate this machine "
        "(docs/run.md, Before it starts)",
    )


def _add_processes(parser: argparse.ArgumentParser) -> None:
    """``--dispatchers`` and ``--node-processes``, the same for every command that starts a cluster."""
    parser.add_argument(
        "--dispatchers",
        type=at_least(1),
        default=None,
        metavar="K",
        help="dispatchers side by side: the same as --set policy.dispatchers=K (default: the spec's)",
    )
    parser.add_argument(
        "--node-processes",
        type=at_least(1),
        default=None,
        metavar="P",
        help="server-node processes; the nodes are split among them (default: one per core)",
    )


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
    parser = Parser(
        prog="lbt",
        description="lbtestbed: load-balancing policies from the literature, simulated, predicted, emulated.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "simulate",
        help="run the discrete-event simulator on a spec",
        description="Simulate an experiment spec and print its metrics with 95% confidence intervals "
        "(batch means, or independent replications with --replications).",
    )
    sim.add_argument("spec", help="experiment spec (TOML), see docs/spec.md")
    sim.add_argument("--json", action="store_true", help="print the result object as JSON")
    sim.add_argument(
        "--replications",
        type=at_least(1),
        default=1,
        metavar="K",
        help="independent replications, run in parallel processes (default 1: batch means)",
    )
    sim.add_argument(
        "--jobs",
        type=at_least(1),
        default=os.cpu_count() or 1,
        metavar="J",
        help="processes for replications (default: the number of cores)",
    )
    sim.add_argument(
        "--records",
        metavar="FILE",
        help="also write one CSV row per task: arrival, dispatcher, routing time and rule, node, node "
        "arrival, service start, departure, sojourn, work, outcome (model seconds, exact; docs/spec.md, "
        "Per-task records); one replication only",
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
    _add_processes(clu)
    # the name this option had before lbt run's --node-processes: still accepted, no longer shown
    clu.add_argument("--node-procs", dest="node_processes", type=at_least(1), help=argparse.SUPPRESS)
    clu.add_argument(
        "--max-tasks",
        type=at_least(1),
        default=100_000,
        metavar="N",
        help="tasks a node holds before it refuses with 503 (default 100000)",
    )
    clu.add_argument(
        "--with-prometheus",
        action="store_true",
        help="also start a Prometheus server that scrapes the cluster (needs the prometheus binary: "
        "make prometheus); down stops it",
    )
    clu.add_argument(
        "--scrape-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="Prometheus scrape and rule interval (default 1; 0.1 to 10)",
    )
    clu.add_argument(
        "--prometheus-port",
        type=int,
        default=None,
        metavar="PORT",
        help="Prometheus port on 127.0.0.1 (default: 9090, deploy/grafana's datasource, when it is free, "
        "else a free one)",
    )
    _add_overrides(clu)
    _add_netns(clu)
    _add_force(clu)
    clu.add_argument("--json", action="store_true", help="print the processes as JSON")
    clu.add_argument("--foreground", action="store_true", help="stay until Ctrl-C, then stop the cluster")
    clu.set_defaults(func=cmd_cluster)

    load = sub.add_parser(
        "load",
        help="drive a cluster with the spec's open-loop Poisson workload",
        description="Send the spec's tasks (Poisson arrivals, seeded work sizes: the simulator's tasks for "
        "the same seed) on an absolute schedule, never waiting for earlier tasks; sojourn is measured from "
        "each task's intended send time. --schedule changes the rate over time; --locust sends the same "
        "tasks from locust instead (docs/load.md); with --locust, options after -- go to locust as they "
        "are: lbt load SPEC --locust -- --csv out --html report.html. Exit code 0 when every task "
        "completed, 1 otherwise; with --threshold, 0 when every threshold holds and 1 when one fails; 2 "
        "for bad input.",
    )
    load.add_argument(
        "spec",
        nargs="?",
        help="experiment spec (TOML); default: the cluster's own (the spec and overrides its cluster file "
        "records). A spec given must be the cluster's: its node classes and speeds, policy, time scale and "
        "network are checked against the cluster file (exit 2 naming the first difference); its workload, "
        "seed and length are the load's own",
    )
    load.add_argument(
        "--cluster",
        default=".lbt/cluster.json",
        help="cluster file to find the dispatchers (and the cluster's spec) in (default .lbt/cluster.json)",
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
        type=at_least(1),
        default=10_000,
        metavar="N",
        help="drop (and count) a task when N are outstanding (default 10000)",
    )
    load.add_argument(
        "--deadline",
        type=positive_seconds,
        default=TASK_DEADLINE,
        metavar="SECONDS",
        help=f"wall seconds a task may take from its send to its answer; later ones are given up and "
        f"counted as expired, so the run ends within its schedule plus this (default {TASK_DEADLINE:g})",
    )
    load.add_argument(
        "--schedule",
        metavar="TEXT",
        help="rate schedule over model time instead of the spec's constant rate: steps DURATION@MULT and "
        "ramps DURATION@MULT->MULT, MULT times the spec's rate, e.g. '60@1, 30@1->2, 60@2' (docs/load.md)",
    )
    load.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the generator's Prometheus metrics on 127.0.0.1:PORT/metrics while it runs (0: a free "
        "port, printed). Default: a free port when the cluster was started with --with-prometheus, which "
        "then scrapes it; no server otherwise (docs/load.md, Monitoring the generator)",
    )
    load.add_argument(
        "--locust",
        action="store_true",
        help="send the tasks from locust, headless; locust options of your own go after -- (docs/load.md)",
    )
    load.add_argument(
        "--locust-mode",
        choices=("open", "closed"),
        default="open",
        help="with --locust: open (Poisson, the default) or closed (users that wait for each reply)",
    )
    load.add_argument(
        "--locust-users",
        type=at_least(1),
        default=20,
        metavar="N",
        help="with --locust-mode closed: users at the spec's rate (default 20)",
    )
    load.add_argument(
        "--threshold",
        action="append",
        default=[],
        type=threshold,
        metavar="NAME<OP>NUMBER",
        help="a pass/fail criterion on the summary, in its units, as k6 thresholds: 'sojourn_p99<5' "
        "(model s), 'late_sends==0'; OP is < <= > >= == !=; repeatable. With thresholds, the exit code is 1 "
        "when one fails (or has no value) and 0 when all hold, whatever else happened; without, 1 when a "
        "task did not complete (the same as --threshold incomplete==0). NAME: " + summary_metrics(),
    )
    _add_overrides(load)
    load.add_argument("--json", action="store_true", help="print the summary as JSON")
    load.add_argument("--quiet", action="store_true", help="no progress on stderr")
    load.set_defaults(func=cmd_load)

    run = sub.add_parser(
        "run",
        help="run an experiment on a local cluster and compare it with the simulator and the theory",
        description="Start a cluster for the spec (or use --endpoints), drive it with the open-loop "
        "generator, measure the window [warmup, warmup + duration] batch by batch, stop the cluster, then "
        "simulate the same tasks and predict the same experiment. Writes a report directory (results.json, "
        "report.md, PNG plots) and prints the comparison. Exit code 0 when every comparison that counts "
        "agrees, 1 when one disagrees or the run failed, 2 on bad input.",
    )
    run.add_argument("spec", help="experiment spec (TOML), see docs/spec.md")
    run.add_argument("--out", metavar="DIR", help="report directory (default reports/<name>-<date>-<time>)")
    run.add_argument(
        "--endpoints",
        metavar="FILE",
        help="run on an existing cluster described by this cluster file instead of starting one",
    )
    _add_processes(run)
    metrics = run.add_mutually_exclusive_group()
    metrics.add_argument(
        "--prometheus",
        metavar="URL",
        help="read the counters from this Prometheus server (it must scrape the cluster)",
    )
    metrics.add_argument(
        "--with-prometheus",
        action="store_true",
        help="start a Prometheus server for the run and read the counters from it (default: scrape "
        "every process's /metrics directly)",
    )
    _add_netns(run)
    run.add_argument("--no-simulation", action="store_true", help="compare with the theory only")
    _add_force(run)
    _add_overrides(run)
    run.add_argument("--json", action="store_true", help="print results.json's object instead of the table")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.set_defaults(func=cmd_run)

    swp = sub.add_parser(
        "sweep",
        help="run a grid of experiments (policies x loads x ...) and plot messages against performance",
        description="Every combination of the --set values (comma-separated: --set policy.name=jiq,"
        "power_of_d --set workload.load=0.5,0.9) runs as an `lbt run` on a cluster, or as a simulation with "
        "--simulate-only. Writes sweep.json, sweep.md, tradeoff.png (messages per task against mean "
        "sojourn, or utility for pools) and, for each numeric setting swept (policy.dispatchers, a load), "
        "a plot of mean sojourn against it, and prints the combined table. Exit code 0 when every "
        "cluster run agrees, 1 otherwise, 2 on bad input.",
    )
    swp.add_argument("spec", help="experiment spec (TOML), see docs/spec.md")
    swp.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=V1[,V2...]",
        help="a spec key and its values; the grid is every combination (values are TOML; brackets and "
        "quotes keep commas inside a value)",
    )
    swp.add_argument("--simulate-only", action="store_true", help="simulate each point, no cluster")
    swp.add_argument("--out", metavar="DIR", help="sweep directory (default reports/sweep-<name>-<time>)")
    swp.add_argument(
        "--jobs", type=at_least(1), default=os.cpu_count() or 1, metavar="J", help="parallel simulations"
    )
    _add_processes(swp)
    _add_force(swp)
    swp.add_argument("--json", action="store_true", help="print sweep.json's object instead of the table")
    swp.add_argument("--quiet", action="store_true", help="no progress on stderr")
    swp.set_defaults(func=cmd_sweep)
    return parser


def _interrupted(sig: int, frame: object) -> None:
    from lbtestbed.cluster.processes import Interrupted

    raise Interrupted(sig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # lbt load --locust ... -- ARGS: ARGS go to locust as they are
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.locust_args = passthrough
    if passthrough and args.command != "load":
        return _bad_input(f"{passthrough[0]!r} after --: only lbt load --locust takes options after --")
    if threading.current_thread() is threading.main_thread():
        # SIGTERM and SIGHUP end a command as Ctrl-C does: what it started (a cluster) is stopped on the way
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupted)
    if getattr(args, "dispatchers", None) is not None:  # an override of the spec's key, after the others
        args.set = [*args.set, f"policy.dispatchers={args.dispatchers}"]
    try:
        return int(args.func(args))
    except SpecError as e:
        print(f"lbt: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader went away (lbt ... | head): stop quietly, as a shell's commands do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that flushing stdout at exit does not raise again
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as e:
        sig = getattr(e, "signal", signal.SIGINT)
        print(f"lbt: interrupted ({signal.Signals(sig).name})", file=sys.stderr)
        return 128 + sig
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
