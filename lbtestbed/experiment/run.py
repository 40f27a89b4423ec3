"""``lbt run``: the checks before anything starts, then ``runner.run_experiment`` (cluster, load,
measurement, simulation, theory, report) on a cluster of its own or an existing one (docs/run.md).

This module imports the runner only when a run goes ahead, so that a spec the run cannot hold is refused
at once (``run_size_problem``, also for ``lbt sweep``'s points)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lbtestbed.experiment.errors import BadInput, Failed
from lbtestbed.experiment.run_record import is_run
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.model.reading import sent_tasks_problem

if TYPE_CHECKING:
    from lbtestbed.analysis.report.run_report import RunReport

Say = Callable[[str], None]


#: the shortest batch ``lbt run`` measures, in wall seconds: at each boundary it scrapes every process, which
#: takes some milliseconds, and a batch must be long against that
MIN_BATCH_WALL = 0.05
#: the longest run ``lbt run`` starts, in wall seconds (a week)
MAX_RUN_WALL = 7 * 86400.0


def run_size_problem(exp: Experiment) -> str | None:
    """Why ``lbt run`` could not hold the tasks it sends (the spec's warm-up, window and drain), or could
    not measure its batches on this machine, or None."""
    # lbt run's arrivals: warm-up, window, and a fifth of the window more on processor-sharing nodes
    # (experiment.runner.drain_arrivals); the larger of the two, without importing the runner
    horizon = exp.run.warmup + 1.2 * exp.run.duration
    return sent_tasks_problem(exp, horizon, "the run") or (
        None if exp.run.auto_time_scale else wall_problem(exp)
    )


def wall_problem(exp: Experiment) -> str | None:
    """Why the run's batches are too short or the run too long in wall seconds (its time scale resolved),
    or None."""
    run = exp.run
    batch = run.duration * run.time_scale / run.batches
    if batch < MIN_BATCH_WALL:
        most = int(run.duration * run.time_scale / MIN_BATCH_WALL)
        fix = f"at most {most} batches, or" if most >= 2 else "a longer duration or"
        return (
            f"{exp.source}: run.batches: {run.batches} batches of {1e3 * batch:.3g} ms wall each (duration x "
            f"time_scale / batches): at least {1e3 * MIN_BATCH_WALL:g} ms, as every boundary scrapes every "
            f"process; {fix} a larger run.time_scale"
        )
    wall = (run.warmup + run.duration) * run.time_scale
    if wall > MAX_RUN_WALL:
        return (
            f"{exp.source}: run.time_scale: warmup + duration = {run.warmup + run.duration:g} model s at "
            f"{run.time_scale:g} wall s each take {wall:.3g} wall s: at most {MAX_RUN_WALL:g} (a week)"
        )
    return None


def default_directory(prefix: str) -> Path:
    """``reports/<prefix>-<date>-<time>``: a report directory of its own for every run."""
    return Path("reports") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass(frozen=True)
class RunOptions:
    """Where ``lbt run`` runs and what it compares (its options, defaults as there)."""

    out: Path | None = None  # the report directory; None: default_directory
    endpoints: Path | None = None  # the cluster file of an existing cluster to run on
    node_processes: int | None = None
    prometheus: str | None = None  # read the counters from this Prometheus
    with_prometheus: bool = False  # start a Prometheus for the run and read them from it
    netns: bool = False
    bandwidth: str = ""
    simulate: bool = True  # False: compare with the theory only
    force: bool = False  # start even when the pre-flight estimate refuses


@dataclass(frozen=True)
class RunOutcome:
    report: RunReport | None  # the comparison, results.json's object (None: fewer than two batches)
    files: list[Path]  # what was written: report.md, results.json, the plots
    directory: Path
    interrupted: int = 0  # the signal that stopped the run early (0: it ran to its end)


def run(exp: Experiment, options: RunOptions, say: Say) -> RunOutcome:
    """Run ``exp`` and compare it with its simulation and its theory. BadInput before anything starts
    (the spec too large to send, the cluster given not running it, the machine too slow for it); Failed
    when a process, a scrape or Prometheus fails on the way."""
    problem = run_size_problem(exp)
    if problem:
        raise BadInput(problem)
    # here, not at the top: the checks above answer before numpy, aiohttp and the analysis are loaded
    from lbtestbed.experiment.preflight import at_cluster_scale, prepare
    from lbtestbed.experiment.runner import check_answering, existing_cluster, run_experiment
    from lbtestbed.transport.cluster_file import ClusterError

    record: dict[str, Any] = {}
    problem = output_problem(options.out, "--out") if options.out else None
    if problem:
        raise BadInput(problem)
    if options.endpoints:
        try:  # the cluster named must exist and run this experiment: checked before anything starts
            exp = at_cluster_scale(exp, options.endpoints)
            check_answering(existing_cluster(exp, options.endpoints), options.endpoints)
        except (ClusterError, SpecError) as e:
            raise BadInput(f"--endpoints: {e}") from e
    else:
        exp, record, refusal = prepare(exp, options.node_processes, options.force, say)
        if refusal:
            raise BadInput(refusal)
    problem = wall_problem(exp)  # the time scale resolved (auto, or the cluster's)
    if problem:
        raise BadInput(problem)
    directory = options.out or default_directory(exp.name)
    problem = output_problem(directory, "--out" if options.out else "the report directory", make=True)
    if problem:
        raise BadInput(problem)
    try:
        done = run_experiment(
            exp,
            directory,
            say,
            preflight=record,
            simulate=options.simulate,
            endpoints=options.endpoints,
            node_processes=options.node_processes,
            prometheus=options.prometheus,
            with_prometheus=options.with_prometheus,
            netns=options.netns,
            bandwidth=options.bandwidth,
        )
    except run_errors() as e:
        raise Failed(str(e)) from e
    except KeyboardInterrupt:
        if is_run(directory):  # stopped while the report was written: the run itself is kept
            say(f"the run is kept in {directory}: `lbt report {directory}` writes its report")
        raise
    return RunOutcome(done.report, done.files, directory, done.interrupted)


def output_problem(directory: Path, what: str, make: bool = False) -> str | None:
    """Why ``directory`` cannot take a run's files (one line), or None: it must be a directory, or not
    exist yet under one. ``make``: also make it and write a file there (removed at once), which finds what
    only a write tells (a read-only disk, a directory of the kernel's such as /proc)."""
    if directory.exists() and not directory.is_dir():
        return f"{what} {directory}: not a directory"
    above = next((p for p in directory.absolute().parents if p.exists()), Path("/"))
    if not above.is_dir():
        return f"{what} {directory}: {above} is not a directory"
    if not make:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".lbt-write-{os.getpid()}"
        with open(probe, "wb") as f:
            f.write(b"lbt")
        probe.unlink()
    except OSError as e:
        return f"{what} {directory}: cannot write there: {e.strerror or e}"
    return None


def run_errors() -> tuple[type[Exception], ...]:
    """What makes a cluster run fail without a bug: a process, a scrape, Prometheus, or the journal
    (a full disk)."""
    from lbtestbed.analysis.measurement.scrape import ScrapeError
    from lbtestbed.cluster.prometheus import PrometheusError
    from lbtestbed.loadgen.journal import JournalError
    from lbtestbed.transport.cluster_file import ClusterError

    return (ClusterError, ScrapeError, PrometheusError, JournalError)
