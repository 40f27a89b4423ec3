"""What ``lbt frontier`` found and what it writes: its settings, points and outcome, the points as delays
with intervals, the JSON object, the table, the lines under it and the directory (frontier.json,
frontier.md, frontier.png)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbtestbed.analysis.comparison.frontier import Measured, Step, describe
from lbtestbed.analysis.results.result import Result
from lbtestbed.experiment.sweep import cell
from lbtestbed.model.experiment import Experiment


@dataclass(frozen=True)
class Setting:
    """One point to run: a policy at one value of one of its knobs (or as the spec gives it)."""

    policy: str
    curve: str  # "power_of_d: JSQ(d)", or the policy's name when it declares no curve
    key: str | None = None  # the knob, a key of its [policy] table
    value: int | float | None = None
    overrides: tuple[str, ...] = ()  # what makes the point of the spec: --set overrides

    @property
    def knob(self) -> str:
        return "" if self.key is None else f"{self.key}={self.value:g}"

    @property
    def label(self) -> str:
        return f"{self.curve} {self.knob}" if self.key else self.curve


@dataclass(frozen=True)
class LeftOut:
    """A policy, or one point of it, that did not run: where (``everywhere``, or only on the ``cluster``)
    and why."""

    policy: str
    curve: str
    knob: str
    reason: str
    where: str = "everywhere"

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass
class FrontierPoint:
    setting: Setting
    simulation: Result
    theory: Result
    cluster: Result | None = None
    #: the simulation of the cluster run's own tasks and window, without its delays: what the cluster
    #: would measure if the network and the software cost nothing
    same_tasks: Result | None = None
    directory: str = ""  # the cluster run's report directory


@dataclass
class FrontierOutcome:
    exp: Experiment
    points: list[FrontierPoint]
    left_out: list[LeftOut]
    delay: str  # "mean_wait", or "mean_sojourn" when the mean service time is not one number
    mean_service: float | None
    steps: dict[str, dict[str, list[Step]]]  # source -> metric -> the frontier's steps
    cluster_run: dict[str, float] | None = None  # the cluster points' lengths and budget
    files: list[Path] = field(default_factory=list)
    directory: Path = Path()

    def to_json(self) -> dict[str, Any]:
        return outcome_json(self)


#: the delays drawn against messages: the left panel's (mean wait, or mean sojourn when the mean service
#: time is not one number) and the right one's
P99 = "sojourn_p99"
LABELS = {
    "mean_wait": "mean wait (model s)",
    "mean_sojourn": "mean sojourn (model s)",
    P99: "99th percentile of the sojourn (model s)",
}


def delay_of(result: Result, metric: str, service: float | None) -> dict[str, Any]:
    """``metric`` of ``result`` as {value, ci95}; the mean wait is the mean sojourn less ``service``."""
    if metric != "mean_wait":
        m = result.metrics[metric]
        return {"value": m.get("value"), "ci95": m.get("ci95")}
    m = result.metrics["mean_sojourn"]
    v = m.get("value")
    return {"value": None if v is None or service is None else v - service, "ci95": m.get("ci95")}


def measured(
    points: Sequence[FrontierPoint], source: str, metric: str, service: float | None
) -> list[Measured]:
    """The points of ``source`` (simulation, cluster, same_tasks or theory) that have both messages and
    ``metric``."""
    out = []
    for p in points:
        result = {
            "simulation": p.simulation,
            "cluster": p.cluster,
            "same_tasks": p.same_tasks,
            "theory": p.theory,
        }[source]
        if result is None:
            continue
        messages = result.metrics["messages_per_task"]
        delay = delay_of(result, metric, service)
        if messages.get("value") is None or delay["value"] is None:
            continue
        s = p.setting
        out.append(
            Measured(
                s.policy,
                s.curve,
                s.knob,
                float(messages["value"]),
                float(delay["value"]),
                delay["ci95"],
                messages.get("ci95"),
            )
        )
    return out


def _source_json(result: Result | None, delay: str, service: float | None) -> dict[str, Any] | None:
    if result is None:
        return None
    out = {k: delay_of(result, k, service) for k in ("messages_per_task", delay, "mean_sojourn", P99)}
    if result.source == "theory":
        out = {k: v["value"] for k, v in out.items()}
        out["regime"] = {k: result.metrics[k].get("regime") for k in ("mean_sojourn", P99)}
    return out


def outcome_json(done: FrontierOutcome) -> dict[str, Any]:
    """The object ``lbt frontier --json`` prints and frontier.json holds (docs/run.md, "The frontier")."""
    exp = done.exp
    points = []
    for p in done.points:
        s = p.setting
        points.append(
            {
                "policy": s.policy,
                "curve": s.curve,
                "key": s.key,
                "value": s.value,
                "overrides": list(s.overrides),
                "simulation": _source_json(p.simulation, done.delay, done.mean_service),
                "theory": _source_json(p.theory, done.delay, done.mean_service),
                "cluster": _source_json(p.cluster, done.delay, done.mean_service),
                "same_tasks": _source_json(p.same_tasks, done.delay, done.mean_service),
                "cluster_directory": p.directory or None,
            }
        )
    replications = done.points[0].simulation.context["settings"]["replications"]
    return {
        "spec": exp.source,
        "name": exp.name,
        "n": exp.n,
        "load": exp.workload.load,
        "delay": done.delay,
        "mean_service": done.mean_service,
        "replications": replications,
        "cluster_run": done.cluster_run,
        "points": points,
        "left_out": [o.to_json() for o in done.left_out],
        "frontier": {
            source: {m: [s.to_json() for s in steps] for m, steps in by_metric.items()}
            for source, by_metric in done.steps.items()
        },
        "directory": str(done.directory),
        "files": [f.name for f in done.files],
    }


#: the table's short names of the quantities
SHORT = {"messages_per_task": "msgs", "mean_wait": "mean wait", "mean_sojourn": "mean sojourn", P99: "p99"}


def rows(done: FrontierOutcome) -> list[list[str]]:
    """The table: one row per point, the simulation's values with their intervals, the theory's (marked
    where it is a limit) and, with a cluster, the cluster's."""
    keys = ("messages_per_task", done.delay, P99)
    header = ["policy", "knob", "messages/task", SHORT[done.delay], "p99 sojourn"]
    header += [f"theory {SHORT[k]}" for k in keys]
    cluster = any(p.cluster is not None for p in done.points)
    if cluster:
        header += [f"cluster {SHORT[k]}" for k in keys]
    out = [header]
    for p in done.points:
        row = [p.setting.curve, p.setting.knob or "-"]
        row += [cell(delay_of(p.simulation, k, done.mean_service)) for k in keys]
        row += [_theory_cell(p.theory, k, done.mean_service) for k in keys]
        if cluster:
            c = p.cluster
            row += ["-"] * 3 if c is None else [cell(delay_of(c, k, done.mean_service)) for k in keys]
        out.append(row)
    return out


def _theory_cell(theory: Result, metric: str, service: float | None) -> str:
    """The theory's value, "(limit)" after one that holds only as the nodes grow without bound."""
    value = delay_of(theory, metric, service)["value"]
    if value is None:
        return "-"
    regime = theory.metrics["mean_sojourn" if metric == "mean_wait" else metric].get("regime")
    return f"{value:.4g}" + (" (limit)" if regime == "limit" else "")


def summary_lines(done: FrontierOutcome) -> list[str]:
    """What the table does not say: the frontiers, step by step, and the points left out."""
    lines = []
    unit = " model s"
    for source, by_metric in done.steps.items():
        for metric, steps in by_metric.items():
            lines.append(f"frontier ({source}, {LABELS[metric].partition(' (')[0]}):")
            lines += [f"  {line}" for line in describe(steps, unit)]
    for o in done.left_out:
        where = "" if o.where == "everywhere" else f" ({o.where} only)"
        lines.append(f"left out{where}: {o.curve} {o.knob}".rstrip() + f": {o.reason}")
    if done.mean_service is not None:
        lines.append(f"mean wait = mean sojourn - mean service time ({done.mean_service:g} model s)")
    return lines


def write(directory: Path, done: FrontierOutcome) -> list[Path]:
    """frontier.json, frontier.md and frontier.png in ``directory``."""
    from lbtestbed.analysis.report.frontier import FrontierPanel, frontier
    from lbtestbed.analysis.report.run_report import markdown_table

    directory.mkdir(parents=True, exist_ok=True)
    sources = list(done.steps)
    panels = [
        [
            FrontierPanel(
                source,
                LABELS[metric],
                measured(done.points, source, metric, done.mean_service),
                measured(done.points, "theory", metric, done.mean_service),
                done.steps[source][metric],
                measured(done.points, "same_tasks", metric, done.mean_service) if source == "cluster" else [],
            )
            for metric in (done.delay, P99)
        ]
        for source in sources
    ]
    plot = frontier(directory / "frontier.png", plot_title(done), panels, replications=_replications(done))
    md = [
        f"# The frontier of `{done.exp.source}`",
        "",
        f"![frontier]({plot.name})",
        "",
        markdown_table(rows(done)),
        "",
        "Values are means with the half-width of their 95% interval; time in model seconds.",
        "",
        *(f"- {line}" for line in summary_lines(done)),
    ]
    (directory / "frontier.md").write_text("\n".join(md) + "\n")
    files = [directory / "frontier.json", directory / "frontier.md", plot]
    done.files = files
    (directory / "frontier.json").write_text(json.dumps(outcome_json(done), indent=1) + "\n")
    return files


def _replications(done: FrontierOutcome) -> int:
    return int(done.points[0].simulation.context["settings"]["replications"])


def plot_title(done: FrontierOutcome) -> str:
    """The plot's title: the spec, its nodes and load, the dispatchers when several."""
    exp = done.exp
    disciplines = "/".join(dict.fromkeys(c.discipline for c in exp.classes))
    text = f"{exp.name} ({exp.source}): {exp.n} {disciplines} nodes at load {exp.workload.load:g}"
    if exp.policy.dispatchers > 1:
        text += f", {exp.policy.dispatchers} dispatchers"
    return text + " · messages per task against delay"
