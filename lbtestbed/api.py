"""lbtestbed as a library: the commands of ``lbt`` as functions returning what the command prints
(docs/api.md walks through them).

    import lbtestbed as lbt

    exp = lbt.load("examples/jiq.toml", {"run.duration": 200})   # the spec, with overrides
    theory = lbt.predict(exp)       # lbt predict: a Result (source "theory")
    sim = lbt.simulate(exp)         # lbt simulate: a Result (source "simulation")
    print(lbt.table(sim))           # the table lbt simulate prints
    lbt.batch_frame(sim)            # pandas: each metric batch by batch
    report = lbt.run(exp)           # lbt run: a RunReport (cluster, twin, simulation, theory, verdicts)
    points = lbt.sweep(exp, {"workload.load": [0.5, 0.7]}, simulate_only=True)   # lbt sweep
    done = lbt.frontier(exp, policies=["jiq", "jsq"])   # lbt frontier: done.steps, the frontier

These names (``lbtestbed.__all__``) are the package's public interface: they keep their meaning from one
version to the next, and a change that breaks them says so in the version. What they return is the same
object the command line prints (``Result.to_json()`` is ``lbt simulate --json``'s object without its
stamp, ``RunReport.to_json()`` is results.json's), documented in docs/spec.md and docs/run.md with JSON
Schemas in docs/. Everything else in the package may change under a user's feet. The DataFrames need
pandas, which lbtestbed does not install (``pip install pandas``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lbtestbed.analysis.report.run_report import RunReport
from lbtestbed.analysis.results.result import Result
from lbtestbed.analysis.results.text import DEFAULT_WIDTH, Fit
from lbtestbed.experiment.sweep import Point
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reading import toml_value
from lbtestbed.spec import apply_overrides, load_spec, parse_spec, spec_schema

if TYPE_CHECKING:
    import pandas

    from lbtestbed.experiment.frontier_output import FrontierOutcome

__all__ = [
    "Experiment",
    "Point",
    "Result",
    "RunReport",
    "batch_frame",
    "frontier",
    "load",
    "predict",
    "run",
    "simulate",
    "spec_schema",
    "sweep",
    "table",
    "task_frame",
]

#: overrides as ``{"workload.load": 0.8}`` or as the command line's ``["workload.load=0.8"]``
Overrides = Mapping[str, Any] | Iterable[str] | None


def _overrides(overrides: Overrides) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={toml_value(v)}" for k, v in overrides.items()]
    return list(overrides)


def load(spec: str | Path | Mapping[str, Any], overrides: Overrides = None) -> Experiment:
    """The experiment of a spec file (or of a spec document already decoded, a ``dict``), with
    ``overrides`` applied as ``--set`` applies them. ``SpecError`` (one line: the file, the key, what is
    wrong) on a bad spec."""
    given = _overrides(overrides)
    if isinstance(spec, Mapping):
        data = apply_overrides(copy.deepcopy(dict(spec)), given, "<document>")
        return parse_spec(data, "<document>")
    return load_spec(spec, given)


def predict(exp: Experiment, *, transient: bool = False) -> Result:
    """``lbt predict``: what the theory says of ``exp``, each value with its regime and note; with
    ``transient``, the JLMU fluid trajectory from empty in ``extras["transient"]``."""
    from lbtestbed.experiment.predict import predict as predicted

    return predicted(exp, transient=transient).result


def simulate(
    exp: Experiment,
    *,
    replications: int = 1,
    jobs: int = 1,
    records: str | Path | None = None,
    progress: bool = False,
    kernel: str = "events",
) -> Result:
    """``lbt simulate``: the simulation of ``exp`` with a 95 % interval on every metric (batch means; with
    ``replications`` above 1, that many independent runs in ``jobs`` processes); ``records``: a CSV file
    to write every task's times to (``task_frame`` reads it); ``progress``: a bar on stderr; ``kernel``:
    ``"events"`` or, for a Markovian spec, ``"rates"`` (docs/simulator.md, "The rates kernel")."""
    from lbtestbed.experiment.simulate import simulate as simulated

    if records is None:
        return simulated(exp, replications=replications, jobs=jobs, quiet=not progress, kernel=kernel)
    with open(records, "w", newline="") as f:
        return simulated(
            exp, replications=replications, jobs=jobs, records=f, quiet=not progress, kernel=kernel
        )


def run(
    exp: Experiment,
    *,
    out: str | Path | None = None,
    node_processes: int | None = None,
    with_prometheus: bool = False,
    simulate: bool = True,
    force: bool = False,
    progress: bool = False,
) -> RunReport:
    """``lbt run``: a local cluster runs ``exp`` and is compared with its twin, the simulation and the
    theory; the report directory (``out``, default ``reports/<name>-<time>``) holds report.md,
    results.json, tasks.csv and the plots. ``report.passed`` is the command's exit code 0; ``table``
    gives its table. ``BadInput`` before anything starts when the machine cannot carry the spec (``force``
    runs it anyway), ``Failed`` when a process fails or fewer than two batches could be compared."""
    from lbtestbed.experiment.run import RunOptions
    from lbtestbed.experiment.run import run as ran

    options = RunOptions(
        out=None if out is None else Path(out),
        node_processes=node_processes,
        with_prometheus=with_prometheus,
        simulate=simulate,
        force=force,
    )
    done = ran(exp, options, _say(progress))
    if done.report is None:  # stopped before two batches could be compared: report.md says what was kept
        from lbtestbed.experiment.errors import Failed

        raise Failed(f"{exp.name}: fewer than two batches to compare; see {done.directory / 'report.md'}")
    return done.report


def sweep(
    exp: Experiment,
    grid: Mapping[str, Sequence[Any]],
    *,
    simulate_only: bool = False,
    jobs: int = 1,
    out: str | Path | None = None,
    node_processes: int | None = None,
    progress: bool = False,
) -> list[Point]:
    """``lbt sweep``: ``exp`` at every combination of the values of ``grid`` (``{"policy.name": ["jiq",
    "jsq"], "workload.load": [0.5, 0.9]}``), each a cluster run or with ``simulate_only`` a simulation
    beside the theory; the sweep's directory (``out``) holds sweep.md, sweep.json and the plots."""
    from lbtestbed.experiment.sweep import SweepOptions, run_sweep

    overrides = [f"{k}=" + ",".join(toml_value(v) for v in values) for k, values in grid.items()]
    options = SweepOptions(
        simulate_only=simulate_only,
        jobs=jobs,
        node_processes=node_processes,
        out=None if out is None else Path(out),
        quiet=not progress,
    )
    return run_sweep(exp, overrides, options, _say(progress)).points


def frontier(
    exp: Experiment,
    *,
    policies: Sequence[str] = (),
    replications: int = 5,
    jobs: int = 1,
    cluster: bool = False,
    cluster_minutes: float = 9.0,
    out: str | Path | None = None,
    progress: bool = False,
) -> FrontierOutcome:
    """``lbt frontier``: every policy (or those named) over its message knob on ``exp``, simulated with
    ``replications`` each and with ``cluster`` also on a local cluster within ``cluster_minutes``; its
    directory (``out``) holds frontier.md, frontier.json and frontier.png. What it returns has the points,
    the policies left out and ``steps[source][metric]``, the frontier; ``to_json()`` is the command's
    ``--json`` object."""
    from lbtestbed.experiment.frontier import FrontierOptions, run_frontier

    options = FrontierOptions(
        policies=tuple(policies),
        replications=replications,
        jobs=jobs,
        cluster=cluster,
        cluster_minutes=cluster_minutes,
        out=None if out is None else Path(out),
        quiet=not progress,
    )
    return run_frontier(exp, options, _say(progress))


def table(x: Result | RunReport, *, width: int = DEFAULT_WIDTH, wide: bool = False) -> str:
    """The table the command prints of ``x``: ``lbt predict``'s or ``lbt simulate``'s of a Result (with
    the theory's notes), ``lbt run``'s of a RunReport, ``width`` characters wide (``wide``: every column
    at its full width)."""
    from lbtestbed.analysis.report.run_report import terminal
    from lbtestbed.analysis.results.tables import render, render_notes

    fit = Fit(width, wide)
    if isinstance(x, RunReport):
        return terminal(x, fit)
    text = render(x, fit)
    return f"{text}\n{render_notes(x, fit)}" if x.source == "theory" else text


def _say(progress: bool) -> Any:
    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr)

    return say


# ------------------------------------------------------------------------------------------- pandas


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("the DataFrames of lbtestbed need pandas: pip install pandas") from None
    return pandas


def batch_frame(x: Result | RunReport) -> pandas.DataFrame:
    """Each metric batch by batch: one row per batch (its position in the measured window), one column
    per metric. For a run, the cluster's, the twin's and the simulation's side by side (columns
    ``(source, metric)``), over the batches the report compares. A result of independent replications
    has no batches (ValueError)."""
    pd = _pandas()
    if isinstance(x, RunReport):
        sources = [r for r in (x.cluster, x.twin, x.simulation) if r is not None]
        return pd.concat({r.source: batch_frame(r) for r in sources}, axis=1)
    table = x.extras.get("batch_values")
    if table is None:
        raise ValueError(f"the {x.source} result has no batch values (independent replications, or theory)")
    frame = pd.DataFrame(table["values"], index=pd.Index(table["batches"], name="batch"))
    return frame.dropna(axis=1, how="all")  # the metrics the spec does not have


def task_frame(x: RunReport | str | Path) -> pandas.DataFrame:
    """Every task, one row each: the tasks.csv of a run's report directory (its legs, docs/run.md), or a
    simulation's records (``simulate(..., records=FILE)``, docs/spec.md "Per-task records")."""
    pd = _pandas()
    path = Path(x.context["directory"]) / "tasks.csv" if isinstance(x, RunReport) else Path(x)
    return pd.read_csv(path)
