"""The ``lbt`` commands: each reads its spec once, checks what only its arguments can get wrong, hands the
parsed Experiment to one function of the experiment layer and prints what that returns.

What is slow to import (aiohttp, the simulator, the cluster launcher, the analysis and its plots) is
imported inside a command, after its spec and arguments are checked, so that bad input answers (exit 2) at
once: the modules of the experiment layer that import them, and the tables that print a result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lbtestbed.analysis.results.provenance import stamped
from lbtestbed.analysis.results.text import Fit, terminal_width
from lbtestbed.cli.output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    error,
    note,
    print_json,
    say,
    stages,
)
from lbtestbed.experiment.errors import FULL_DISK, BadInput, disk_full
from lbtestbed.experiment.run import RunOptions, RunOutcome, run
from lbtestbed.loadgen import summary as summary_of
from lbtestbed.loadgen.locust_run import passthrough_problem
from lbtestbed.model.experiment import Experiment
from lbtestbed.spec import load_spec

if TYPE_CHECKING:
    from lbtestbed.transport.cluster_file import ClusterFile


def netns_problem(args: argparse.Namespace) -> str | None:
    """Why the ``--netns``/``--bandwidth`` options given cannot work together."""
    if args.bandwidth and not args.netns:
        return (
            f"--bandwidth {args.bandwidth}: a bandwidth limit needs --netns (loopback has no link to limit)"
        )
    return None


def cmd_simulate(args: argparse.Namespace) -> int:
    exp = load_spec(args.spec, args.set)  # a bad spec fails first, before the heavy imports
    records = _records_file(args)  # a path that cannot be written fails before the simulation
    if isinstance(records, str):
        return error(records)
    # here: the simulator and the analysis load only for a spec and a --records that can work
    from lbtestbed.analysis.results.tables import render
    from lbtestbed.experiment.simulate import simulate

    try:
        try:
            result = simulate(
                exp,
                replications=args.replications,
                jobs=args.jobs,
                executor=args.executor,
                records=records,
                quiet=args.quiet,
                kernel=args.kernel,
            )
        finally:
            if records is not None:
                records.close()
    except OSError as e:  # writing the records: a full disk (exit 1), or a file that takes no writes
        if e.errno in FULL_DISK:
            raise disk_full(e, f"--records {args.records}") from None
        raise BadInput(f"--records {args.records}: {e.strerror or e}") from None
    if args.json:
        print_json(stamped(result.to_json()))
    else:
        print(render(result, _fit(args)))
    return EXIT_OK


def _fit(args: argparse.Namespace) -> Fit:
    """What a table must fit: the terminal (100 columns when stdout is not one), or ``--wide``."""
    return Fit(terminal_width(), args.wide)


def _records_file(args: argparse.Namespace) -> IO[str] | str | None:
    """``--records FILE`` opened for writing (None without), or a one-line reason it cannot be."""
    if args.records is None:
        return None
    if args.replications > 1:
        return "--records: the records of one run; drop --replications"
    try:
        return open(args.records, "w", newline="")
    except OSError as e:
        return f"--records {args.records}: {e.strerror or e}"


def cmd_predict(args: argparse.Namespace) -> int:
    exp = load_spec(args.spec, args.set)
    # here: the theory and the analysis load only for a spec that loads
    from lbtestbed.analysis.results.tables import render, render_notes, render_transient
    from lbtestbed.experiment.predict import predict

    predicted = predict(exp, transient=args.transient)
    if args.json:
        print_json(stamped(predicted.result.to_json()))
        return EXIT_OK
    fit = _fit(args)
    print(render(predicted.result, fit))
    print(render_notes(predicted.result, fit))
    if predicted.transient is not None:
        print(render_transient(exp, predicted.result, predicted.transient))
    return EXIT_OK


def cmd_spec_schema(args: argparse.Namespace) -> int:
    from lbtestbed.spec import spec_schema

    print_json(spec_schema())
    return EXIT_OK


def cmd_cluster_up(args: argparse.Namespace) -> int:
    if args.spec is None:
        return error("lbt cluster up needs a SPEC")
    # a bad spec fails here, before any process starts (and before the launcher is imported)
    exp = load_spec(args.spec, args.set)
    problem = netns_problem(args)
    if problem:
        return error(problem)
    from lbtestbed.experiment.cluster_control import UpOptions, cluster_up  # the launcher: see above

    options = UpOptions(
        node_processes=args.node_processes,
        max_tasks=args.max_tasks,
        netns=args.netns,
        bandwidth=args.bandwidth or "",
        force=args.force,
        with_prometheus=args.with_prometheus,
        scrape_interval=args.scrape_interval,
        prometheus_port=args.prometheus_port,
    )
    started = cluster_up(exp, Path(args.file), options, say)
    if args.json:
        print_json({"file": str(started.cluster.path), "processes": started.processes})
    else:
        f = started.file
        nodes = sum(len(h.nodes) for h in f.node_hosts)
        print(
            f"cluster up: {len(f.dispatchers)} dispatcher(s), {nodes} nodes in {len(f.node_hosts)} "
            f"process(es); cluster file {started.cluster.path}"
        )
        what_by_role = {"dispatcher": "send tasks: POST /v1/tasks", "prometheus": "query: /api/v1/query"}
        for r in started.processes:
            _print_process(r, f"{r['nodes']} nodes" if r["role"] == "nodes" else what_by_role[r["role"]])
    if args.foreground:
        print("serving; Ctrl-C stops the cluster", file=sys.stderr)
        return EXIT_OK if started.serve(say) else EXIT_FAILED
    return EXIT_OK


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from lbtestbed.experiment.cluster_control import cluster_status  # the launcher, for this command only

    rows = cluster_status(Path(args.file))
    if args.json:
        print_json({"file": str(Path(args.file)), "processes": rows})
    else:
        for r in rows:
            _print_process(
                r, "healthy" if r["healthy"] else ("running, not answering" if r["alive"] else "DEAD")
            )
    return EXIT_OK if all(r["healthy"] for r in rows) else EXIT_FAILED


def cmd_cluster_down(args: argparse.Namespace) -> int:
    from lbtestbed.experiment.cluster_control import cluster_down  # the launcher, for this command only

    print(f"cluster down: stopped {cluster_down(Path(args.file))} process(es)")
    return EXIT_OK


def cmd_cluster_experiment(args: argparse.Namespace) -> int:
    from lbtestbed.experiment.cluster_control import write_experiment  # the launcher, for this command only

    exp = load_spec(args.spec, args.set)
    write_experiment(exp, Path(args.file), args.spec_path)
    print(f"{args.file}: experiment {exp.name} ({exp.policy.name}, n = {exp.n}) written")
    return EXIT_OK


def _print_process(r: dict[str, Any], what: str) -> None:
    print(f"  {r['role']:<10} {r['index']:>3}  {r['url']:<24} pid {r['pid']:<7} {what}")


def cmd_load(args: argparse.Namespace) -> int:
    # here: the cluster file's module brings aiohttp (transport.wire), which the checks before it need not
    from lbtestbed.transport.cluster_file import ClusterError, ClusterFile

    locust_only = [t.text for t in args.threshold if t.metric in summary_of.LOCUST_ONLY]
    if locust_only and not args.locust:
        return error(f"--threshold {locust_only[0]!r}: a locust metric; it needs --locust")
    cluster = None  # the cluster file: the dispatchers, and the experiment its processes run
    if not args.dispatcher or args.spec is None:
        try:
            cluster = ClusterFile.load(Path(args.cluster))
        except ClusterError as e:
            hint = "give --dispatcher URL" if args.spec is not None else "give a SPEC and --dispatcher URL"
            return error(f"{e}; {hint} or start one with lbt cluster up")
    problem = _load_options_problem(args)
    if problem:
        return error(problem)
    if args.spec is None:  # the cluster's own experiment, then the command line's overrides
        assert cluster is not None
        exp = cluster.experiment(args.set)
    else:
        exp = load_spec(args.spec, args.set)
    return _load(exp, args, cluster)


def _load_options_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``lbt load``'s options together, or None."""
    if args.locust_args and not args.locust:
        return f"{args.locust_args[0]!r} after --: options after -- go to locust; add --locust"
    if args.locust:
        problem = passthrough_problem(args.locust_args)
        if problem:
            return problem
    if args.locust_mode == "closed" and not args.locust:
        return "--locust-mode closed needs --locust (lbt load itself is an open loop)"
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port {args.metrics_port}: not a TCP port (0 picks a free one)"
    if args.locust_mode == "closed" and args.record:
        return "--record: a closed loop has no arrival times to record"
    return None


def _load(exp: Experiment, args: argparse.Namespace, cluster: ClusterFile | None) -> int:
    """``lbt load`` once its spec and options are checked: the load sent, its summary printed."""
    # here: the generator (numpy's tasks, aiohttp, uvloop) loads only once the spec and options are checked
    from lbtestbed.experiment.load import LoadOptions, Target, load

    if args.dispatcher:  # the URLs given, whatever a cluster file says
        target = Target(list(args.dispatcher), args.cluster)
    else:
        assert cluster is not None
        target = Target([d.url for d in cluster.dispatchers], args.cluster, cluster)
    options = LoadOptions(
        mode=args.locust_mode,
        schedule=args.schedule,
        duration=args.duration,
        replay=args.replay,
        users=args.locust_users,
        max_outstanding=args.max_outstanding,
        locust=args.locust,
        locust_args=args.locust_args,
        deadline=args.deadline,
        record=Path(args.record) if args.record else None,
        metrics_port=args.metrics_port,
        thresholds=args.threshold,
        quiet=args.quiet,
    )
    done = load(exp, target, options, say, note)
    summary, verdicts = done.summary, done.verdicts
    if args.json:
        print_json({**summary, "thresholds": verdicts} if verdicts else summary)
    else:
        print("\n".join(summary_of.lines(summary)))
        for verdict in verdicts:
            print(summary_of.describe(verdict))
        if summary["late_sends"] or summary["dropped"]:
            note(
                f"warning: the generator could not keep its schedule: {summary['late_sends']} late sends, "
                f"{summary['dropped']} dropped"
            )
        if done.plan.mode == "closed":
            note(
                f"note: a closed loop sends what the system lets it: {summary['sent']} tasks sent where an "
                f"open loop would send about {done.plan.expected():.0f}"
            )
    if summary.get("interrupted"):
        return EXIT_INTERRUPTED
    if verdicts:  # the thresholds alone decide, as k6's do
        return EXIT_OK if all(v["ok"] for v in verdicts) else EXIT_FAILED
    return EXIT_OK if summary["completed"] == summary["scheduled"] else EXIT_FAILED


def cmd_run(args: argparse.Namespace) -> int:
    exp = load_spec(args.spec, args.set)  # a bad spec fails before anything starts
    problem = netns_problem(args)
    if problem:
        return error(problem)
    options = RunOptions(
        out=Path(args.out) if args.out else None,
        endpoints=Path(args.endpoints) if args.endpoints else None,
        node_processes=args.node_processes,
        prometheus=args.prometheus,
        with_prometheus=args.with_prometheus,
        netns=args.netns,
        bandwidth=args.bandwidth or "",
        simulate=not args.no_simulation,
        force=args.force,
    )
    return _print_run(run(exp, options, stages(args.quiet)), args)


def _print_run(done: RunOutcome, args: argparse.Namespace) -> int:
    """What ``lbt run`` and ``lbt report`` print of a run's report; the exit code: 0 when it passed, 1
    when not (or nothing could be compared), 128 + N when signal N stopped the run."""
    if args.json:
        print(Path(done.directory / "results.json").read_text(), end="")
    elif done.report is None:
        print((done.directory / "report.md").read_text().split("\n\n")[1].strip("*"))
        print(f"report: {done.directory / 'report.md'} (results.json beside it)")
    else:
        from lbtestbed.analysis.report.run_report import partial_note, terminal  # loaded by the run already

        partial = partial_note(done.report.context)
        print(terminal(done.report, _fit(args)) + (f"\n{partial}" if partial else ""))
        beside = f"results.json and {len(done.files) - 2} plots beside it"
        print(f"report: {done.directory / 'report.md'} ({beside})")
    if done.interrupted:
        return 128 + done.interrupted
    return EXIT_OK if done.report is not None and done.report.passed else EXIT_FAILED


def cmd_report(args: argparse.Namespace) -> int:
    from lbtestbed.experiment.report_again import report_again

    done = report_again(Path(args.directory), stages(args.quiet), simulate=not args.no_simulation)
    code = _print_run(done, args)
    partial = done.report is None or done.report.context.get("partial")
    return EXIT_FAILED if done.interrupted or partial else code


def cmd_sweep(args: argparse.Namespace) -> int:
    exp = load_spec(args.spec)  # the file itself first; every point is checked before the first runs
    # here: the runner, the simulator and the plots load only for a spec that loads
    from lbtestbed.analysis.results.text import table
    from lbtestbed.experiment.sweep import SweepOptions, rows, run_sweep

    options = SweepOptions(
        simulate_only=args.simulate_only,
        jobs=args.jobs,
        executor=args.executor,
        node_processes=args.node_processes,
        force=args.force,
        out=Path(args.out) if args.out else None,
        quiet=args.quiet,
    )
    done = run_sweep(exp, args.set, options, stages(args.quiet))
    if args.json:
        print_json({"spec": args.spec, "points": [p.to_json() for p in done.points]})
    else:
        grid = rows(done.points)
        print(table(grid, _fit(args), wrap=grid[0]))
        beside = ", ".join(f.name for f in done.files if f.name != "sweep.md")
        print(f"sweep: {done.directory / 'sweep.md'} ({beside} beside it)")
    return EXIT_OK if all(p.agrees is not False for p in done.points) else EXIT_FAILED


def cmd_frontier(args: argparse.Namespace) -> int:
    exp = load_spec(args.spec, args.set)  # a bad spec fails before anything runs
    # here: the simulator, the runner and the plots load only for a spec that loads
    from lbtestbed.analysis.results.text import table
    from lbtestbed.experiment.frontier import FrontierOptions, run_frontier
    from lbtestbed.experiment.frontier_output import rows, summary_lines

    options = FrontierOptions(
        policies=args.policies,
        replications=args.replications,
        jobs=args.jobs,
        executor=args.executor,
        cluster=args.cluster,
        cluster_minutes=args.cluster_minutes,
        node_processes=args.node_processes,
        force=args.force,
        out=Path(args.out) if args.out else None,
        quiet=args.quiet,
    )
    done = run_frontier(exp, options, stages(args.quiet))
    if args.json:
        print_json(stamped(done.to_json()))
        return EXIT_OK
    grid = rows(done)
    print(table(grid, _fit(args), wrap=grid[0][:2], drop=[h for h in grid[0] if h.startswith("theory")]))
    for line in summary_lines(done):
        print(line)
    print(f"frontier: {done.directory / 'frontier.md'} (frontier.json and frontier.png beside it)")
    return EXIT_OK
