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


def run_size_problem(exp: Experiment) -> str | None:
    """Why ``lbt run`` could not hold the tasks it sends (the spec's warm-up, window and drain), or None."""
    # lbt run's arrivals: warm-up, window, and a fifth of the window more on processor-sharing nodes
    # (experiment.runner.drain_arrivals); the larger of the two, without importing the runner
    horizon = exp.run.warmup + 1.2 * exp.run.duration
    return sent_tasks_problem(exp, horizon, "the run")


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
    from lbtestbed.experiment.runner import existing_cluster, run_experiment
    from lbtestbed.transport.cluster_file import ClusterError

    record: dict[str, Any] = {}
    if options.endpoints:
        try:  # the cluster named must exist and run this experiment: checked before anything starts
            exp = at_cluster_scale(exp, options.endpoints)
            existing_cluster(exp, options.endpoints)
        except (ClusterError, SpecError) as e:
            raise BadInput(f"--endpoints: {e}") from e
    else:
        exp, record, refusal = prepare(exp, options.node_processes, options.force, say)
        if refusal:
            raise BadInput(refusal)
    directory = options.out or default_directory(exp.name)
    problem = output_problem(directory, "--out" if options.out else "the report directory")
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


def output_problem(directory: Path, what: str) -> str | None:
    """Why ``directory`` cannot take a run's files (one line), or None: it is made if missing and a file
    is written there and removed, before anything starts."""
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
