"""The arguments of every ``lbt`` command: one parser builder per command, the options several share, and
the argument types that check a value where it is given (exit 2 naming the option)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any, NoReturn

from lbtestbed import __version__
from lbtestbed.cli import commands
from lbtestbed.cli.output import EXIT_BAD_INPUT
from lbtestbed.loadgen import TASK_DEADLINE

#: the subcommands of a parser (argparse's type for what add_subparsers returns)
Commands = argparse._SubParsersAction


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


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="lbt",
        description="lbtestbed: load-balancing policies from the literature, simulated, predicted, emulated.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_simulate, _predict, _cluster, _load, _run, _report, _sweep, _frontier, _spec):
        add(sub)
    return parser


def _simulate(sub: Commands) -> None:
    """``lbt simulate``."""
    sim = sub.add_parser(
        "simulate",
        help="run the discrete-event simulator on a spec",
        description="Simulate an experiment spec and print its metrics with 95% confidence intervals "
        "(batch means, or independent replications with --replications).",
    )
    sim.add_argument("spec", help="experiment spec (TOML), see docs/spec.md")
    sim.add_argument("--json", action="store_true", help="print the result object as JSON")
    _add_wide(sim)
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
        help="processes of the local pool for replications (default: the number of cores)",
    )
    _add_executor(sim, "the replications")
    sim.add_argument(
        "--records",
        metavar="FILE",
        help="also write one CSV row per task: arrival, dispatcher, routing time and rule, node, node "
        "arrival, service start, departure, sojourn, work, outcome (model seconds, exact; docs/spec.md, "
        "Per-task records); one replication only",
    )
    sim.add_argument(
        "--kernel",
        # analysis.simulator.KERNELS, spelled here: importing it would load the simulator at every lbt's start
        choices=("events", "rates"),
        default="events",
        help="events: the discrete-event kernel (default, any spec); rates: the rates kernel of a Markovian "
        "spec (exponential work, fcfs or ps nodes with one speed per class, one dispatcher, no delays, "
        "faults or speed changes), flat in the number of nodes (docs/simulator.md, The rates kernel)",
    )
    _add_overrides(sim)
    sim.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sim.set_defaults(func=commands.cmd_simulate)


def _predict(sub: Commands) -> None:
    """``lbt predict``."""
    pre = sub.add_parser(
        "predict",
        help="the stationary values theory predicts for a spec",
        description="Compute what the papers' formulas predict for an experiment spec: closed forms, fixed "
        "points and bounds, each with its formula and assumptions. Metrics no formula covers are null with a "
        "note saying why.",
    )
    pre.add_argument("spec", help="experiment spec (TOML), see docs/spec.md")
    pre.add_argument("--json", action="store_true", help="print the result object (source: theory) as JSON")
    _add_wide(pre)
    pre.add_argument(
        "--transient",
        action="store_true",
        help="also the JLMU fluid trajectory from an empty system and the warm-up it needs (pools)",
    )
    _add_overrides(pre)
    pre.set_defaults(func=commands.cmd_predict)


def _cluster(sub: Commands) -> None:
    """``lbt cluster up``, ``status`` and ``down``: each action with its own options only."""
    clu = sub.add_parser(
        "cluster",
        help="start, inspect or stop a local cluster of dispatcher and node processes",
        description="lbt cluster up SPEC starts dispatcher(s) and server-node processes on loopback, waits "
        "until all are healthy and writes the cluster file; status and down use that file. Each action "
        "has options of its own: lbt cluster up --help.",
    )
    actions = clu.add_subparsers(dest="action", required=True)
    _cluster_up(actions)
    status = actions.add_parser(
        "status",
        help="every process of the cluster and whether it answers",
        description="Every process of the cluster in the cluster file: role, index, URL, pid, and whether it "
        "is healthy, running but not answering, or DEAD. Exit code 0 when every process is healthy, 1 "
        "otherwise.",
    )
    _add_cluster_file(status)
    status.add_argument("--json", action="store_true", help="print the processes as JSON")
    status.set_defaults(func=commands.cmd_cluster_status)
    down = actions.add_parser(
        "down",
        help="stop the cluster",
        description="Stop every process of the cluster in the cluster file, its Prometheus server too "
        "(SIGTERM, then SIGKILL after a grace period), and remove what it set up (network namespaces, "
        "the cluster file).",
    )
    _add_cluster_file(down)
    down.set_defaults(func=commands.cmd_cluster_down)
    experiment = actions.add_parser(
        "experiment",
        help="write a spec's experiment into the cluster file of processes started by other means",
        description="Resolve SPEC (with its --set overrides) and write the experiment, whole, into the "
        "cluster file, as lbt cluster up does for the processes it starts: for a cluster whose processes "
        "Docker Compose or Kubernetes start from a file of their own (deploy/README.md). The rest of the "
        "file (its URLs, its nodes per host) stays; it must list as many dispatchers as the spec runs. "
        "Exit code 0, or 2 when the spec or the file does not fit.",
    )
    experiment.add_argument("spec", help="experiment spec (TOML)")
    _add_cluster_file(experiment)
    experiment.add_argument(
        "--spec-path", help="the spec's path as the processes name it, recorded in the file (default: kept)"
    )
    _add_overrides(experiment)
    experiment.set_defaults(func=commands.cmd_cluster_experiment)


def _cluster_up(actions: Commands) -> None:
    """``lbt cluster up``."""
    up = actions.add_parser(
        "up",
        help="start a cluster for a spec and write its cluster file",
        description="Start dispatcher(s) and server-node processes for SPEC on loopback, wait until all "
        "are healthy and write the cluster file that status, down, lbt load and lbt run --endpoints read.",
    )
    up.add_argument("spec", nargs="?", help="experiment spec (TOML), see docs/spec.md")
    _add_cluster_file(up)
    _add_processes(up)
    # the name this option had before lbt run's --node-processes: still accepted, no longer shown
    up.add_argument("--node-procs", dest="node_processes", type=at_least(1), help=argparse.SUPPRESS)
    up.add_argument(
        "--max-tasks",
        type=at_least(1),
        default=100_000,
        metavar="N",
        help="tasks a node holds before it refuses with 503 (default 100000)",
    )
    up.add_argument(
        "--with-prometheus",
        action="store_true",
        help="also start a Prometheus server that scrapes the cluster (needs the prometheus binary: "
        "make prometheus); down stops it",
    )
    up.add_argument(
        "--scrape-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="Prometheus scrape and rule interval (default 1; 0.1 to 10)",
    )
    up.add_argument(
        "--prometheus-port",
        type=int,
        default=None,
        metavar="PORT",
        help="Prometheus port on 127.0.0.1 (default: 9090, deploy/grafana's datasource, when it is free, "
        "else a free one)",
    )
    _add_overrides(up)
    _add_netns(up)
    _add_force(up)
    up.add_argument("--json", action="store_true", help="print the processes as JSON")
    up.add_argument("--foreground", action="store_true", help="stay until Ctrl-C, then stop the cluster")
    up.set_defaults(func=commands.cmd_cluster_up)


def _load(sub: Commands) -> None:
    """``lbt load``."""
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
    _add_load_tasks(load)
    _add_load_generator(load)
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
    load.set_defaults(func=commands.cmd_load)


def _add_load_tasks(load: argparse.ArgumentParser) -> None:
    """``lbt load``'s options for the tasks it sends: how many, from where, and how long each may take."""
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


def _add_load_generator(load: argparse.ArgumentParser) -> None:
    """``lbt load``'s options for the generator: its metrics, or locust instead of it."""
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


def _run(sub: Commands) -> None:
    """``lbt run``."""
    run = sub.add_parser(
        "run",
        help="run an experiment on a local cluster and compare it with the simulator and the theory",
        description="Start a cluster for the spec (or use --endpoints), drive it with the open-loop "
        "generator, measure the window [warmup, warmup + duration] batch by batch, stop the cluster, then "
        "simulate the same tasks and predict the same experiment. Writes a report directory (results.json, "
        'report.md, PNG plots) and prints the comparison with two answers (docs/run.md, "Two answers"): '
        "faithful (the cluster agrees with its twin on the same tasks, every leg of the task path within "
        "what the machine explains) and representative (the emulation's own delays moved no metric by more "
        "than run.tolerance). Exit code 0 when both hold, 1 when one does not or the run failed, 2 on bad "
        "input.",
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
    _add_wide(run)
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.set_defaults(func=commands.cmd_run)


def _report(sub: Commands) -> None:
    """``lbt report``."""
    rep = sub.add_parser(
        "report",
        help="write the report of a run's directory again, finished or not",
        description="Read what lbt run kept in its directory (the experiment, the trace, the journal of "
        "every task's fate, the counters at every boundary reached) and write its report again: "
        "report.md, results.json and the plots. A run stopped early or cut short (killed) is compared on "
        "the batches it measured and marked partial. Exit code 0 when every comparison that counts agrees, "
        "1 otherwise (also for a partial run), 2 when the directory holds no run.",
    )
    rep.add_argument("directory", help="a run's directory (lbt run --out)")
    rep.add_argument("--no-simulation", action="store_true", help="compare with the theory only")
    rep.add_argument("--json", action="store_true", help="print results.json's object instead of the table")
    rep.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _add_wide(rep)
    rep.set_defaults(func=commands.cmd_report)


def _sweep(sub: Commands) -> None:
    """``lbt sweep``."""
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
        "--jobs",
        type=at_least(1),
        default=os.cpu_count() or 1,
        metavar="J",
        help="processes of the local pool for --simulate-only (default: the number of cores)",
    )
    _add_executor(swp, "--simulate-only's points")
    _add_processes(swp)
    _add_force(swp)
    swp.add_argument("--json", action="store_true", help="print sweep.json's object instead of the table")
    _add_wide(swp)
    swp.add_argument("--quiet", action="store_true", help="no progress on stderr")
    swp.set_defaults(func=commands.cmd_sweep)


def _frontier(sub: Commands) -> None:
    """``lbt frontier``."""
    fr = sub.add_parser(
        "frontier",
        help="run every policy over its message knob and plot messages per task against delay",
        description="Every policy of the library (or those of --policies) runs on the spec over the "
        "values of its message knob (d for power_of_d, the probes per query of a probing policy, ...; "
        "a policy without one runs once), simulated with independent replications beside lbt "
        "predict's values and, with --cluster, also on a local cluster of this machine. Writes "
        "frontier.json, frontier.md and frontier.png (messages per task against mean wait and the 99th "
        "percentile of the sojourn, 95% intervals, the theory dashed, and the frontier: for each "
        "message budget the best measured point) and prints the table. A policy the spec cannot hold "
        "is left out with its reason. Exit code 0 when done, 1 when a cluster run failed, 2 on bad "
        "input.",
    )
    fr.add_argument("spec", help="experiment spec (TOML) with fcfs or ps nodes, see docs/spec.md")
    fr.add_argument(
        "--policies",
        type=policy_names,
        default=(),
        metavar="A,B,...",
        help="only these policies (names or aliases, comma-separated; default: every policy)",
    )
    fr.add_argument(
        "--replications",
        type=at_least(1),
        default=5,
        metavar="R",
        help="independent replications per point for the 95%% intervals (default 5; 1: batch means of one "
        "run)",
    )
    fr.add_argument(
        "--jobs",
        type=at_least(1),
        default=os.cpu_count() or 1,
        metavar="J",
        help="processes of the local pool for the simulations (default: the number of cores)",
    )
    _add_executor(fr, "the simulations")
    fr.add_argument(
        "--cluster",
        action="store_true",
        help="also run every point on a local cluster (lbt run without its simulation), with a warm-up "
        "and window cut to fit --cluster-minutes",
    )
    fr.add_argument(
        "--cluster-minutes",
        type=positive_minutes,
        default=9.0,
        metavar="M",
        help="wall-clock minutes for the cluster points together (default 9); each point's warm-up and "
        "window are chosen from it at the spec's time scale",
    )
    fr.add_argument(
        "--node-processes",
        type=at_least(1),
        default=None,
        metavar="P",
        help="server-node processes of each cluster; the nodes are split among them (default: one per core)",
    )
    _add_force(fr)
    _add_overrides(fr)
    fr.add_argument("--out", metavar="DIR", help="output directory (default reports/frontier-<name>-<time>)")
    fr.add_argument("--json", action="store_true", help="print frontier.json's object instead of the table")
    _add_wide(fr)
    fr.add_argument("--quiet", action="store_true", help="no progress on stderr")
    fr.set_defaults(func=commands.cmd_frontier)


def policy_names(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated policy names (checked against the catalog by the command)."""
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected policy names separated by commas, got {text!r}")
    return names


def positive_minutes(text: str) -> float:
    """An argparse type: a finite number of minutes > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of minutes, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of minutes, got {text}")
    return value


def executor(text: str) -> str:
    """An argparse type: ``local`` or a Dask scheduler's address (experiment.executor)."""
    from lbtestbed.experiment.executor import executor_address

    try:
        return executor_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_executor(parser: argparse.ArgumentParser, what: str) -> None:
    """``--executor``, the same for every command that runs independent simulations."""
    parser.add_argument(
        "--executor",
        type=executor,
        default="local",
        metavar="WHERE",
        help=f"where {what} run: local (a process pool of --jobs processes, the default) or the address of "
        "a Dask scheduler, tcp://HOST:PORT as dask scheduler prints it, whose workers (on any machines, "
        "each with this lbtestbed installed) run them with the same results (README, Sweeps on a cluster "
        "of machines)",
    )


def _spec(sub: Commands) -> None:
    """``lbt spec schema``."""
    spec = sub.add_parser(
        "spec",
        help="what a spec may hold: its JSON Schema",
        description="lbt spec schema prints the JSON Schema of an experiment spec, made of the spec "
        "reader's own table of keys and every policy's parameters, for editors that validate a TOML file "
        "as they type (docs/spec.md, 'The spec's JSON Schema').",
    )
    actions = spec.add_subparsers(dest="action", required=True)
    schema = actions.add_parser(
        "schema",
        help="print the JSON Schema of a spec",
        description="Print the JSON Schema (draft-07) of an experiment spec as TOML decodes it. "
        "docs/spec.schema.json holds the same; what depends on several values at once (stability, "
        "probes against nodes, a fault within the run) only the reader checks.",
    )
    schema.set_defaults(func=commands.cmd_spec_schema)


def _add_wide(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide",
        action="store_true",
        help="every column of the table at its full width; by default a table fits the terminal (100 "
        "columns when the output is not a terminal), leaving out the columns it names under it",
    )


def _add_cluster_file(parser: argparse.ArgumentParser) -> None:
    """``--file``, the same for every action of ``lbt cluster``."""
    parser.add_argument(
        "--file", default=".lbt/cluster.json", help="cluster file (default .lbt/cluster.json)"
    )


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
