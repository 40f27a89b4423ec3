"""``lbt load``: the spec's tasks sent to a running cluster, open loop (``loadgen.openloop``) or from locust
(``loadgen.locust_run``), and the summary of what happened to them (docs/load.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtestbed.cluster.prometheus import config_dir, serve_generator
from lbtestbed.experiment.errors import FULL_DISK, BadInput, Failed, disk_full
from lbtestbed.experiment.preflight import at_cluster_scale
from lbtestbed.experiment.progress import optional_progress
from lbtestbed.loadgen import TASK_DEADLINE
from lbtestbed.loadgen import summary as summary_of
from lbtestbed.loadgen.locust_run import LocustError, run_locust
from lbtestbed.loadgen.openloop import LoadReport, run_load, write_trace
from lbtestbed.loadgen.plan import Plan, build_plan
from lbtestbed.loadgen.summary import Threshold
from lbtestbed.model.conditions import speed_varies
from lbtestbed.model.experiment import Experiment
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile, spec_difference

Say = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """Where the tasks go."""

    dispatchers: Sequence[str]  # base URLs, one per dispatcher of the spec
    cluster_file: str  # the cluster file as given (--cluster): the time scale "auto" picked there
    #: the cluster the tasks go to, when its file named the dispatchers: the spec must be the one its
    #: processes run, and its Prometheus (if any) scrapes the generator. None: dispatchers given by URL
    cluster: ClusterFile | None = None


@dataclass(frozen=True)
class LoadOptions:
    """How the tasks are chosen and sent (``lbt load``'s options, defaults as there)."""

    # the plan's, as build_plan and the locustfile take them
    mode: str = "open"  # locust: open or closed loop
    schedule: str | None = None
    duration: float | None = None
    replay: str | None = None
    users: int = 20  # closed loop
    max_outstanding: int = 10_000
    # how they are sent
    locust: bool = False
    locust_args: Sequence[str] = ()  # passed to locust as they are
    deadline: float = TASK_DEADLINE
    record: Path | None = None  # write the workload to this trace file first
    metrics_port: int | None = None
    thresholds: Sequence[Threshold] = ()
    quiet: bool = False  # no progress on stderr

    def plan(self) -> dict[str, Any]:
        """The options both generators build their plan from."""
        return {
            "mode": self.mode,
            "schedule": self.schedule,
            "duration": self.duration,
            "replay": self.replay,
            "users": self.users,
            "max_outstanding": self.max_outstanding,
        }


@dataclass(frozen=True)
class LoadOutcome:
    plan: Plan  # what was to be sent (its experiment with the time scale resolved)
    summary: dict[str, Any]  # loadgen.summary's keys; "interrupted" when Ctrl-C ended it early
    verdicts: list[dict[str, Any]]  # each threshold and whether it held


def load(exp: Experiment, target: Target, options: LoadOptions, say: Say, note: Say) -> LoadOutcome:
    """Send ``exp``'s tasks to ``target`` and summarize what happened to them. ``say`` tells the user
    what they should know (a warning, an interruption), ``note`` the plan's line (unless quiet).
    BadInput before anything is sent when the spec, the schedule or the trace cannot work; Failed when
    locust or the metrics server cannot run."""
    plan = _plan(exp, target, options)
    exp, tasks = plan.exp, plan.tasks
    if varies := speed_varies(exp):
        say(
            f"warning: {varies}, but lbt load does not set the run's clock: the node hosts do not apply "
            "speed schedules or antagonists to this load (lbt run does)"
        )
    if options.record is not None:
        try:
            write_trace(options.record, tasks)
        except OSError as e:  # a full disk is a failure; a path that cannot be written, bad input
            if e.errno in FULL_DISK:
                raise disk_full(e, f"--record {options.record}") from None
            raise BadInput(f"--record {options.record}: {e.strerror or e}") from None
    if not options.quiet:
        span, n = plan.span, len(target.dispatchers)
        how = f"locust, {plan.mode} loop" if options.locust else "open loop"
        note(
            f"{exp.name}: {len(tasks)} tasks over {span:.1f} s wall ({len(tasks) / max(span, 1e-9):.0f}/s) "
            f"to {n} dispatcher(s), {how}"
        )
    summary = _by_locust(plan, target, options) if options.locust else _open_loop(plan, target, options, say)
    return LoadOutcome(plan, summary, summary_of.verdicts(list(options.thresholds), summary))


def _plan(exp: Experiment, target: Target, options: LoadOptions) -> Plan:
    """The tasks to send; BadInput when the spec is not the cluster's or the plan cannot be built."""
    try:
        try:  # "auto": the scale the cluster was started with (lbt cluster up picked it)
            exp = at_cluster_scale(exp, Path(target.cluster_file))
        except ClusterError:
            raise BadInput(
                f'{exp.source}: run.time_scale = "auto" needs the cluster that picked it (--cluster) '
                "or a number: --set run.time_scale=X"
            ) from None
        if target.cluster is not None:  # the spec must be the one the cluster runs
            problem = spec_difference(exp, target.cluster.experiment())
            if problem:
                raise BadInput(f"{exp.source} against the cluster of {target.cluster_file}: {problem}")
        return build_plan(exp, dispatchers=target.dispatchers, **options.plan())
    except (OSError, ValueError) as e:  # a schedule, a trace, a spec that does not fit the dispatchers
        raise BadInput(str(e)) from e


def _by_locust(plan: Plan, target: Target, options: LoadOptions) -> dict[str, Any]:
    """The tasks sent from locust, headless in a child process: its summary."""
    port = options.metrics_port
    try:
        return run_locust(
            plan.exp,
            target.dispatchers,
            timeout=plan.hard_limit + 60,
            quiet=options.quiet,
            # --metrics-port: the locustfile serves the same series (not registered with a Prometheus)
            extra=[*(["--lbt-metrics-port", str(port)] * (port is not None)), *options.locust_args],
            **options.plan(),
        )
    except LocustError as e:
        raise Failed(str(e)) from e


def _open_loop(plan: Plan, target: Target, options: LoadOptions, say: Say) -> dict[str, Any]:
    """The tasks sent by the open-loop generator, its metrics served while it runs: its summary."""
    exp, tasks = plan.exp, plan.tasks
    report = LoadReport(scheduled=len(tasks))  # from the first scrape on
    # the cluster's Prometheus (lbt cluster up --with-prometheus) scrapes the generator; with
    # --dispatcher there is no cluster to join
    joins = target.cluster is not None and target.cluster.prometheus_url
    scraped_by = config_dir(Path(target.cluster_file)) if joins else None
    with contextlib.ExitStack() as serving:
        try:
            serving.enter_context(serve_generator(report, exp, options.metrics_port, scraped_by, say))
        except OSError as e:  # the port is taken, or not ours to bind
            raise Failed(f"--metrics-port {options.metrics_port}: {e.strerror or e}") from e
        with optional_progress(options.quiet, f"{exp.name}: sent", len(tasks), "tasks") as bar:
            run_load(
                target.dispatchers,
                tasks,
                exp.run.time_scale,
                options.max_outstanding,
                None if bar is None else lambda done, total: bar.update(done),
                deadline=options.deadline,
                report=report,
            )
            if bar is not None:  # the tasks the schedule went through (it reports once a second)
                bar.update(report.scheduled - report.outcomes["unsent"])
            summary = report.summary()
    if summary["interrupted"]:
        say(
            f"interrupted: {summary['sent']} of {summary['scheduled']} tasks sent so far, "
            f"{summary['completed']} completed; the summary of what was done:"
        )
    return summary
