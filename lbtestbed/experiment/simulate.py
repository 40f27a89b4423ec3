"""``lbt simulate``: one run of the simulator (batch means), or independent replications on an executor
(a local process pool, or a Dask scheduler's workers: ``executor``), summarized into the result object."""

from __future__ import annotations

from typing import IO

from lbtestbed.analysis.comparison.paired import batch_table
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result, summarize
from lbtestbed.analysis.simulator import KERNELS, simulate_once
from lbtestbed.analysis.simulator.rates import unsupported
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
    kernel: str = "events",
) -> Result:
    """The simulation's result: one run here when ``replications`` is 1 (its per-task ``records``
    written when given, and each metric's batch values in ``batch_values``), else that many replications
    on ``executor`` (``local``: at most ``jobs`` processes; or a Dask scheduler's address, BadInput when it
    cannot serve); progress on stderr unless ``quiet``. ``kernel``: the event kernel, or the rates kernel
    of a Markovian spec (BadInput for any other spec, and with ``records``)."""
    if kernel not in KERNELS:
        raise BadInput(f"kernel {kernel!r}: one of {', '.join(KERNELS)}")
    if kernel == "rates":
        why = unsupported(exp)
        if why is not None:
            raise BadInput(f'--kernel rates: {why} (docs/simulator.md, "The rates kernel")')
        if records is not None:
            raise BadInput("--kernel rates keeps no task objects: --records needs the event kernel")
    if replications == 1:
        if executor != LOCAL:
            raise BadInput(
                f"--executor {executor}: one run (batch means) runs here; the executor runs --replications K"
            )
        raws = [_one_run(exp, records, quiet, kernel)]
    else:
        raws = _replications(exp, replications, executor, jobs, quiet, kernel)
    result = summarize(exp, raws)
    result.extras["kernel"] = kernel
    if replications == 1:  # each metric batch by batch, as results.json has them (batch means)
        result.extras["batch_values"] = batch_table(raws[0])
    return result


def _one_run(exp: Experiment, records: IO[str] | None, quiet: bool, kernel: str) -> RawRun:
    """One replication, its progress in model time; with ``records``, the pure-Python engine's general
    loop, recording every task."""
    with optional_progress(quiet, f"{exp.name}: simulated", 1.0, "of model time", rate=False) as bar:
        progress = None if bar is None else bar.update
        if records is not None:
            raw = simulate_with_records(exp, records, 0, progress)
        else:
            raw = simulate_once(exp, 0, progress, kernel)
        if bar is not None:
            bar.update(1.0)
    return raw


def _replications(
    exp: Experiment, k: int, executor: str, jobs: int, quiet: bool, kernel: str
) -> list[RawRun]:
    """``k`` independent replications on ``executor``, in replication order; the progress counts them
    as they finish."""
    with (
        open_executor(executor, min(k, jobs)) as ex,
        optional_progress(quiet, f"{exp.name}: replications", k, "replications") as bar,
    ):
        done = None if bar is None else lambda finished, _i, _raw: bar.update(finished)
        return run_each(ex, simulate_once, [(exp, i, None, kernel) for i in range(k)], done)
