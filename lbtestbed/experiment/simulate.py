"""``lbt simulate``: one run of the simulator (batch means), or independent replications on an executor
(a local process pool, or a Dask scheduler's workers: ``executor``), summarized into the result object."""

from __future__ import annotations

from typing import IO

from lbtestbed.analysis.comparison.paired import batch_table
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result, summarize
from lbtestbed.analysis.simulator import simulate_once
from lbtestbed.analysis.simulator.records import simulate_with_records
from lbtestbed.experiment.errors import BadInput
from lbtestbed.experiment.executor import LOCAL, open_executor, run_each
from lbtestbed.experiment.progress import optional_progress
from lbtestbed.model.experiment import Experiment


def simulate(
    exp: Experiment,
    *,
    replications: int = 1,
    jobs: int = 1,
    executor: str = LOCAL,
    records: IO[str] | None = None,
    quiet: bool = False,
) -> Result:
    """The simulation's result: one run here when ``replications`` is 1 (its per-task ``records``
    written when given, and each metric's batch values in ``batch_values``), else that many replications
    on ``executor`` (``local``: at most ``jobs`` processes; or a Dask scheduler's address, BadInput when it
    cannot serve); progress on stderr unless ``quiet``."""
    if replications == 1:
        if executor != LOCAL:
            raise BadInput(
                f"--executor {executor}: one run (batch means) runs here; the executor runs --replications K"
            )
        raws = [_one_run(exp, records, quiet)]
    else:
        raws = _replications(exp, replications, executor, jobs, quiet)
    result = summarize(exp, raws)
    if replications == 1:  # each metric batch by batch, as results.json has them (batch means)
        result.extras["batch_values"] = batch_table(raws[0])
    return result


def _one_run(exp: Experiment, records: IO[str] | None, quiet: bool) -> RawRun:
    """One replication, its progress in model time; with ``records``, the pure-Python engine's general
    loop, recording every task."""
    with optional_progress(quiet, f"{exp.name}: simulated", 1.0, "of model time", rate=False) as bar:
        progress = None if bar is None else bar.update
        if records is not None:
            raw = simulate_with_records(exp, records, 0, progress)
        else:
            raw = simulate_once(exp, 0, progress)
        if bar is not None:
            bar.update(1.0)
    return raw


def _replications(exp: Experiment, k: int, executor: str, jobs: int, quiet: bool) -> list[RawRun]:
    """``k`` independent replications on ``executor``, in replication order; the progress counts them
    as they finish."""
    with (
        open_executor(executor, min(k, jobs)) as ex,
        optional_progress(quiet, f"{exp.name}: replications", k, "replications") as bar,
    ):
        done = None if bar is None else lambda finished, _i, _raw: bar.update(finished)
        return run_each(ex, simulate_once, [(exp, i) for i in range(k)], done)
