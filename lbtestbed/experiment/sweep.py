"""``lbt sweep``: a grid of experiments from one spec, one combined table and the trade-off plot.

``--set key=a,b,c`` gives a key several values; the grid is every combination, in the order given. Each
point is a full ``lbt run`` (cluster, simulation, theory, its own report directory) or, with
``--simulate-only``, a simulation beside the theory, the points on an executor (a local process pool, or a
Dask scheduler's workers on other machines: ``executor``). The combined table has one row per point; the plot
users ask for most sets messages per task against mean sojourn (or utility, for pools), one point per policy
and setting. ``run_sweep`` is what the command calls: every point checked before the first runs, then the
points, then the directory written.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbtestbed.analysis.report import plots
from lbtestbed.analysis.results.result import Result
from lbtestbed.experiment.errors import BadInput, Failed
from lbtestbed.experiment.executor import LOCAL, Executor, open_executor, run_each
from lbtestbed.experiment.preflight import prepare
from lbtestbed.experiment.progress import optional_progress
from lbtestbed.experiment.run import default_directory, output_problem, run_errors, run_size_problem
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.policies import CATALOG
from lbtestbed.spec import apply_overrides, parse_spec

Say = Callable[[str], None]
#: the columns of the combined table, in order
COLUMNS = (
    "mean_sojourn",
    "sojourn_p50",
    "sojourn_p99",
    "utility",
    "messages_per_task",
    *(learned.name for learned in CATALOG.learned()),
)


def split_values(text: str) -> list[str]:
    """``a,b,[1,2],{x=1,y=2}`` -> the top-level comma-separated values (brackets and quotes kept whole)."""
    out, depth, quote, start, escaped = [], 0, "", 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif quote:
            if ch == "\\" and quote == '"':  # TOML basic strings escape; literal ('...') strings do not
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [v.strip() for v in out]


def grid(overrides: Sequence[str]) -> list[list[str]]:
    """Every combination of the overrides' values, each as a list of ``key=value`` overrides."""
    axes = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise SpecError("--set", item, "an override reads key.path=value[,value...]")
        values = split_values(text)
        if any(not v for v in values):
            raise SpecError("--set", key, f"an empty value in {text!r}")
        axes.append([f"{key}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*axes)]


def varying(points: Sequence[Sequence[str]]) -> list[str]:
    """The keys that take more than one value over the grid."""
    keys: dict[str, set[str]] = {}
    for point in points:
        for item in point:
            k, _, v = item.partition("=")
            keys.setdefault(k, set()).add(v)
    return [k for k, vs in keys.items() if len(vs) > 1]


@dataclass
class Point:
    settings: dict[str, str]
    result: Result  # the cluster's, or the simulation's with --simulate-only
    theory: Result
    agrees: bool | None = None  # cluster runs only
    directory: str = ""
    extras: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "source": self.result.source,
            "agrees": self.agrees,
            "directory": self.directory,
            "metrics": {k: self.result.metrics[k] for k in COLUMNS},
            "theory": {k: self.theory.metrics[k] for k in COLUMNS},
        }


def simulate_point(exp: Experiment, replications: int = 1) -> tuple[Result, Result]:
    """One point's simulation (batch means, or ``replications`` independent replications run one after
    the other) and its theory: what a worker of the executor runs."""
    from lbtestbed.analysis.results.result import summarize
    from lbtestbed.analysis.simulator import simulate_once
    from lbtestbed.analysis.theory.predict import predict

    return summarize(exp, [simulate_once(exp, i) for i in range(replications)]), predict(exp)


def _settings(point: Sequence[str], keys: Sequence[str]) -> dict[str, str]:
    values = dict(item.partition("=")[::2] for item in point)
    return {k: values[k] for k in keys if k in values}  # a sweep's points have every key; others need not


def experiments(exp: Experiment, overrides: Sequence[str]) -> list[tuple[list[str], Experiment]]:
    """Every point of the grid over ``exp`` (its document as given, ``exp.raw``, with each point's
    overrides after its own) with its experiment; a bad point raises SpecError before anything runs."""
    return [(p, with_overrides(exp, p)) for p in grid(overrides)]


def with_overrides(exp: Experiment, overrides: Sequence[str]) -> Experiment:
    """``exp`` with ``overrides`` applied after its own (to its document as given, ``exp.raw``); SpecError
    when the result is not a valid spec."""
    data = apply_overrides(copy.deepcopy(dict(exp.raw)), overrides, exp.source)
    return dataclasses.replace(parse_spec(data, exp.source), overrides=(*exp.overrides, *overrides))


@dataclass(frozen=True)
class SweepOptions:
    """How ``lbt sweep`` runs its points (its options, defaults as there)."""

    simulate_only: bool = False  # a simulation beside the theory for each point, no cluster
    jobs: int = 2  # parallel simulations on the local pool
    executor: str = LOCAL  # or a Dask scheduler's address, tcp://HOST:PORT (simulate_only)
    node_processes: int | None = None
    force: bool = False  # run even points the pre-flight estimate refuses
    out: Path | None = None  # the sweep directory; None: default_directory
    quiet: bool = False  # no progress bar


@dataclass(frozen=True)
class SweepOutcome:
    points: list[Point]
    files: list[Path]  # sweep.json, sweep.md and the plots
    directory: Path


def run_sweep(exp: Experiment, overrides: Sequence[str], options: SweepOptions, say: Say) -> SweepOutcome:
    """The sweep of ``exp`` over the grid of ``overrides``, written to its directory. SpecError for a bad
    point and BadInput for one the machine or the run cannot hold, or an executor that cannot serve, all
    before the first point runs; Failed when a cluster run fails or the executor loses its workers."""
    points = experiments(exp, overrides)
    directory = options.out or default_directory(f"sweep-{exp.name}")
    what = "--out" if options.out else "the sweep directory"
    problem = output_problem(directory, what)
    if problem:
        raise BadInput(problem)
    if options.simulate_only:
        with open_executor(options.executor, min(options.jobs, len(points))) as executor:
            problem = output_problem(directory, what, make=True)
            if problem:
                raise BadInput(problem)
            with optional_progress(options.quiet, f"{exp.name}: sweep", len(points), "points") as bar:
                done = simulate_points(points, executor, say, None if bar is None else bar.update)
        return SweepOutcome(done, write(directory, exp.source, done), directory)
    if options.executor != LOCAL:
        raise BadInput(
            f"--executor {options.executor}: a sweep of cluster runs runs its points one by one on this "
            f"machine; the executor runs --simulate-only sweeps"
        )
    points = _checked(points, options, say)
    problem = output_problem(directory, what, make=True)
    if problem:
        raise BadInput(problem)
    with optional_progress(options.quiet, f"{exp.name}: sweep", len(points), "points") as bar:
        try:
            done = run_points(
                points,
                directory,
                say,
                progress=None if bar is None else bar.update,
                node_processes=options.node_processes,
            )
        except run_errors() as e:
            raise Failed(str(e)) from e
    return SweepOutcome(done, write(directory, exp.source, done), directory)


def _checked(
    points: Sequence[tuple[list[str], Experiment]], options: SweepOptions, say: Say
) -> list[tuple[list[str], Experiment]]:
    """Every point checked, and its time scale picked, before the first runs."""
    out = []
    for settings, point in points:
        resolved, _, refusal = prepare(point, options.node_processes, options.force, say)
        refusal = refusal or run_size_problem(point)
        if refusal:
            raise BadInput(f"sweep point {' '.join(settings)}: {refusal}")
        out.append((settings, resolved))
    return out


def _keys(points: Sequence[tuple[list[str], Experiment]]) -> list[str]:
    """The settings that name a point: the keys that vary, or every key of a grid of one point."""
    settings = [p for p, _ in points]
    return varying(settings) or [item.partition("=")[0] for item in settings[0]]


def simulate_points(
    points: Sequence[tuple[list[str], Experiment]],
    executor: Executor,
    say: Say,
    progress: Callable[[int], None] | None = None,
    *,
    replications: int = 1,
    labels: Sequence[str] | None = None,
) -> list[Point]:
    """Simulate every point of ``experiments(...)`` beside its theory on ``executor`` (batch means, or
    ``replications`` independent replications of each), the points in grid order; a line (naming the
    point by its ``labels``, or by its settings) and ``progress(k)`` as the k-th finishes (in the order
    they finish)."""
    keys = _keys(points)
    names = labels or [_label(_settings(p, keys)) for p, _ in points]

    def done(finished: int, i: int, _: tuple[Result, Result]) -> None:
        say(f"point {i + 1} simulated ({finished}/{len(points)} done): {names[i]}")
        if progress is not None:
            progress(finished)

    calls = [(exp, replications) for _, exp in points]
    results = run_each(executor, simulate_point, calls, done)
    return [
        Point(_settings(p, keys), result, theory)
        for (p, _), (result, theory) in zip(points, results, strict=True)
    ]


def run_points(
    points: Sequence[tuple[list[str], Experiment]],
    directory: Path,
    say: Say,
    progress: Callable[[int], None] | None = None,
    labels: Sequence[str] | None = None,
    **cluster_options: Any,
) -> list[Point]:
    """Run every point of ``experiments(...)`` on a cluster of this machine, one by one, each with its
    report in a directory of its own under ``directory`` (named by its ``labels``, or by its settings);
    ``progress(k)`` after the k-th is done. ``cluster_options`` go to ``runner.run_experiment``."""
    from lbtestbed.cluster.processes import Interrupted
    from lbtestbed.experiment.runner import run_experiment
    from lbtestbed.transport.cluster_file import ClusterError

    keys = _keys(points)
    names = labels or [_label(_settings(p, keys)) for p, _ in points]
    directory.mkdir(parents=True, exist_ok=True)
    out: list[Point] = []
    for i, ((p, exp), name) in enumerate(zip(points, names, strict=True), 1):
        words = name if labels else "-".join(p)
        sub = directory / (f"{i:02d}-" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", words)[:80])
        say(f"point {i}/{len(points)}: {name}")
        done = run_experiment(exp, sub, lambda line: say(f"  {line}"), **cluster_options)
        if done.interrupted:  # the point's partial report is written: the sweep ends there
            raise Interrupted(done.interrupted)
        rep = done.report
        if rep is None:
            raise ClusterError(f"point {i}: fewer than two batches to compare (see {sub / 'report.md'})")
        assert rep.theory is not None
        point = Point(_settings(p, keys), rep.cluster, rep.theory, rep.agrees, str(sub))
        if rep.simulation is not None:  # the simulation of the run's own tasks
            point.extras["simulation"] = rep.simulation
        out.append(point)
        if progress is not None:
            progress(len(out))
    return out


def _label(settings: dict[str, str]) -> str:
    """Short names (the last part of each key) unless two keys share one."""
    short = [k.rpartition(".")[2] for k in settings]
    names = short if len(set(short)) == len(short) else list(settings)
    return " ".join(f"{n}={v}" for n, v in zip(names, settings.values(), strict=True))


def cell(m: dict[str, Any]) -> str:
    """A metric's value with the half-width of its 95% interval, as the tables print it."""
    v, ci = m.get("value"), m.get("ci95")
    if v is None:
        return "-"
    if ci == 0:  # every batch (or replication) the same: no "± 0"
        return f"{v:.4g} (no spread)"
    return f"{v:.4g}" if ci is None else f"{v:.4g} ± {ci:.2g}"


def rows(points: Sequence[Point]) -> list[list[str]]:
    keys = list(points[0].settings)
    shown = [c for c in COLUMNS if any(p.result.metrics[c].get("value") is not None for p in points)]
    header = [*keys, *shown]
    if any(p.agrees is not None for p in points):
        header.append("verdict")
    out = [header]
    for p in points:
        row = [*p.settings.values(), *(cell(p.result.metrics[c]) for c in shown)]
        if p.agrees is not None:
            row.append("agrees" if p.agrees else "disagrees")
        out.append(row)
    return out


def write(directory: Path, spec: str, points: Sequence[Point]) -> list[Path]:
    from lbtestbed.analysis.report.run_report import markdown_table

    directory.mkdir(parents=True, exist_ok=True)
    # the policy is swept by its name, or whole (`--set 'policy={name="least_request"},{...}'`: variants)
    policy_key = "policy" if "policy" in points[0].settings else "policy.name"
    plot = plots.tradeoff(
        directory,
        [(p.settings, p.result) for p in points],
        policy_key=policy_key,
        label=_label,
    )
    settings = [(p.settings, p.result) for p in points]
    curves = [
        c
        for k in points[0].settings
        if k != policy_key and (c := plots.against(directory, settings, k, policy_key))
    ]
    doc = {"spec": spec, "points": [p.to_json() for p in points]}
    (directory / "sweep.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = [
        f"# Sweep of `{spec}` ({points[0].result.source})",
        "",
        markdown_table(rows(points)),
        "",
        "Values are means with the half-width of their 95% interval; time in model seconds.",
        "",
        f"![trade-off]({plot.name})",
        *(f"![{c.stem}]({c.name})" for c in curves),
    ]
    if any(p.directory for p in points):
        md += [
            "",
            "Reports of the points:",
            "",
            *(f"- [{Path(p.directory).name}]({Path(p.directory).name}/report.md)" for p in points),
        ]
    (directory / "sweep.md").write_text("\n".join(md) + "\n")
    return [directory / "sweep.json", directory / "sweep.md", plot, *curves]
