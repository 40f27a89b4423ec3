"""The report of ``lbt run``: ``results.json``, ``report.md`` and the plots, written to one directory.

``results.json`` holds the shared result object of each source (cluster, simulation, theory), the verdicts
and the run's context; ``report.md`` opens with the comparison table. The same table is printed on the
terminal.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbtestbed.analysis.comparison.compare import SCALARS, Verdict, compare, run_agrees
from lbtestbed.analysis.report import plots
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result
from lbtestbed.model.spec import Experiment

UNITS = {
    "mean_sojourn": "model s",
    "sojourn_p50": "model s",
    "sojourn_p99": "model s",
    "mean_tasks_per_node": "tasks",
    "tasks_in_system": "tasks",
    "utility": "per node",
    "wait_probability": "",
    "idle_capacity": "speed units",
    "idle_nodes": "nodes",
    "messages_per_task": "msgs/task",
    "slta_r": "index",
}


@dataclass
class RunReport:
    exp: Experiment
    cluster: Result
    simulation: Result | None
    theory: Result | None
    verdicts: list[Verdict]
    context: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return run_agrees(self.verdicts)

    def verdict(self, metric: str, reference: str = "simulation") -> Verdict | None:
        return next((v for v in self.verdicts if v.metric == metric and v.reference == reference), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.exp.name,
            "policy": self.exp.policy.name,
            "agrees": self.agrees,
            "results": {
                r.source: r.to_json() for r in (self.cluster, self.simulation, self.theory) if r is not None
            },
            "comparison": [v.to_json() for v in self.verdicts],
            "warnings": self.warnings,
            **self.context,
        }


def build(
    exp: Experiment,
    cluster: Result,
    simulation: Result | None,
    theory: Result | None,
    context: dict[str, Any],
    warnings: Sequence[str] = (),
) -> RunReport:
    return RunReport(
        exp, cluster, simulation, theory, compare(cluster, simulation, theory), context, list(warnings)
    )


def _num(v: float | None, ci: float | None = None) -> str:
    if v is None:
        return "-"
    text = f"{v:.5g}"
    return text if ci is None else f"{text} ± {ci:.2g}"


def comparison_rows(rep: RunReport) -> list[list[str]]:
    """One row per metric: cluster, simulation and its verdict, theory and its verdict."""
    rows = [["metric", "unit", "cluster", "simulation", "verdict", "theory", "verdict"]]
    metrics = [*SCALARS, *(f"occupancy_tail[{c.name}]" for c in rep.exp.classes)]
    for metric in metrics:
        s, t = rep.verdict(metric, "simulation"), rep.verdict(metric, "theory")
        if metric in SCALARS:
            m = rep.cluster.metrics[metric]
            cluster = _num(m.get("value"), m.get("ci95"))
        else:
            v = s or t
            if v is None or v.measured is None:
                cluster = "see plot"
            else:
                cluster = f"{_num(v.measured, v.measured_ci95)} at j={v.worst_j}"
        if cluster == "-" and (s is None or s.expected is None) and (t is None or t.expected is None):
            continue
        cells = [metric, UNITS.get(metric, "fraction")]
        cells.append(cluster)
        for v in (s, t):
            if v is None:
                cells += ["-", "-"]
                continue
            word = v.word if v.counts or v.agrees is None else f"({v.word}, limit)"
            where = (
                f" at j={v.worst_j}" if v.worst_j is not None and v.worst_j != (s or t or v).worst_j else ""
            )
            cells += [_num(v.expected, v.expected_ci95) + where, word]
        rows.append(cells)
    return rows


def table(rows: list[list[str]], markdown: bool = False) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    lines = ["  ".join(c.ljust(w) for c, w in zip(rows[0], widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows[1:]]
    return "\n".join(lines)


def headline(rep: RunReport) -> str:
    bad = [v for v in rep.verdicts if v.counts and v.agrees is False]
    if not any(v.counts and v.agrees is not None for v in rep.verdicts):
        return "NOTHING TO COMPARE: no metric has a reference that counts (no simulation, limit theory only)"
    if not bad:
        n = sum(1 for v in rep.verdicts if v.counts and v.agrees)
        return f"AGREES: all {n} comparisons that count agree within their combined 95% intervals"
    listed = ", ".join(
        f"{v.metric} vs {v.reference} ({v.word.partition(' ')[2].strip('()') or '-'})" for v in bad
    )
    return f"DISAGREES: {listed}"


def terminal(rep: RunReport) -> str:
    e = rep.exp
    lines = [
        f"{e.name}  policy={e.policy.name}  n={e.n}  load={e.workload.load:.4g}  "
        f"time_scale={e.run.time_scale:g}",
        "",
        table(comparison_rows(rep)),
        "",
        headline(rep),
    ]
    return "\n".join(lines)


def _messages_table(rep: RunReport) -> str:
    sources = [r for r in (rep.cluster, rep.simulation) if r is not None]
    kinds = list(rep.cluster.metrics["messages_per_task"].get("by_kind") or {})
    if not kinds:
        return "This policy sends no state messages."
    rows = [["kind", *(r.source for r in sources)]]
    for k in kinds:
        cells = [k]
        for r in sources:
            m = r.metrics["messages_per_task"]
            cells.append(_num(m["by_kind"].get(k), (m.get("by_kind_ci95") or {}).get(k)))
        rows.append(cells)
    return table(rows, markdown=True)


def _faults_section(rep: RunReport) -> list[str]:
    """What the injector did, when the dispatchers noticed, and what the run excluded."""
    faults = rep.cluster.extras.get("faults")
    if not faults:
        return []
    e = rep.exp
    rows = [["fault", "target", "start", "end", "marked down", "back up", "note"]]
    by_fault: dict[int, dict[str, Any]] = {}
    for a in faults["actions"]:
        entry = by_fault.setdefault(a["fault"], {"target": a["target"], "nodes": a.get("nodes") or []})
        entry[a["action"]] = a
    for i, f in sorted(by_fault.items()):
        start = f.get("start", {}).get("model_time")
        end = f.get("end", {}).get("model_time")
        nodes = set(f["nodes"])
        down = up = "-"
        if nodes and start is not None:
            hits = [
                ev
                for ev in faults["health_events"]
                if nodes & set(range(ev["nodes"][0], ev["nodes"][-1] + 1)) and ev["model_time"] >= start
            ]
            d = next((ev for ev in hits if ev["to"] == "down"), None)
            after = [ev for ev in hits if ev["to"] == "up" and end is not None and ev["model_time"] >= end]
            u = after[0] if after else None
            down = f"{d['model_time']:.4g} (+{d['model_time'] - start:.3g})" if d else "not noticed"
            up = f"{u['model_time']:.4g} (+{u['model_time'] - end:.3g})" if u and end is not None else "-"
        ends = (f.get("start", {}), f.get("end", {}))
        errors = "; ".join(x["error"] for x in ends if x.get("error"))
        rows.append(
            [
                str(i),
                f["target"],
                _num(start),
                _num(end),
                down,
                up,
                errors,
            ]
        )
    load = rep.cluster.extras.get("load", {})
    excluded = faults["batches_excluded"]
    return [
        "## Faults",
        "",
        table(rows, markdown=True),
        "",
        f"Times in model seconds from the start of the load; in brackets the delay after the fault began "
        f"or ended (heartbeat every {e.health.heartbeat:g} s wall, timeout {e.health.timeout:g} s wall "
        f"= {e.health.timeout / e.run.time_scale:.3g} model s). Every task is accounted for: "
        f"{load.get('sent', 0)} sent = {load.get('completed', 0)} completed + {load.get('refused', 0)} "
        f"refused + {load.get('lost', 0)} lost with a node + {load.get('failed', 0)} lost with a dispatcher "
        f"or unreachable + {load.get('dropped', 0)} dropped by the generator. Batches "
        f"{', '.join(map(str, excluded)) or 'none'} of {e.run.batches} overlap a fault or the warm-up after "
        f"it and are left out of the comparison (docs/faults.md).",
        "",
    ]


def markdown(rep: RunReport, images: Sequence[Path]) -> str:
    e, c = rep.exp, rep.cluster
    load = c.extras.get("load", {})
    out = [
        f"# {e.name}: {e.policy.name} on a {e.n}-node cluster",
        "",
        f"**{headline(rep)}**",
        "",
        table(comparison_rows(rep), markdown=True),
        "",
        "Cluster and simulation saw the same tasks (same seed; the workload is in `trace.csv`). A verdict "
        "says whether the two values lie within their combined 95% interval, otherwise how many combined "
        "standard errors apart they are. Theory values that hold only as n grows are marked *limit* and do "
        "not decide the verdict. Occupancy tails are compared point by point at the family-wise 95% level.",
        "",
    ]
    if rep.warnings:
        out += ["## Warnings", "", *(f"- {w}" for w in rep.warnings), ""]
    out += _faults_section(rep)
    out += ["## Messages per task by kind", "", _messages_table(rep), ""]
    overhead = c.extras.get("network_overhead", {})
    out += [
        "## The run",
        "",
        f"- spec: `{e.source}`; seed {e.seed}; warm-up {e.run.warmup:g}, measured {e.run.duration:g} model s "
        f"in {e.run.batches} batches; time_scale {e.run.time_scale:g} wall s per model s",
        f"- metrics read by: {rep.context.get('metrics_source', 'scrape')}",
        f"- load: {load.get('sent', '-')} tasks sent, {load.get('completed', '-')} completed, "
        f"{load.get('refused', 0)} refused, {load.get('lost', 0)} lost, {load.get('dropped', 0)} dropped; "
        f"{load.get('late_sends', 0)} late sends (lateness p99 {_num(load.get('lateness_p99_ms'))} ms)",
        f"- network and dispatch overhead per task (client sojourn minus time at the node): "
        f"{_num(overhead.get('value'), overhead.get('ci95'))} model s",
        f"- written {datetime.datetime.now().isoformat(timespec='seconds')}",
        "",
        "## Plots",
        "",
    ]
    out += [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(out) + "\n"


def write(
    directory: Path,
    rep: RunReport,
    raws: dict[str, RawRun],
    r_series: Sequence[tuple[float, float]],
    timeline: tuple[Sequence[tuple[float, int]], Sequence[tuple[float, str, int]]] | None = None,
) -> list[Path]:
    """Write results.json, the plots and report.md; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    results = [r for r in (rep.cluster, rep.simulation, rep.theory) if r is not None]
    e = rep.exp
    images: list[Path | None] = [
        plots.occupancy_tail(directory, results),
        plots.over_time(directory, e.run.warmup, e.run.duration, raws, rep.theory, e.run.batches),
    ]
    faults = rep.cluster.extras.get("faults")
    if faults and timeline is not None:
        completed, failures = timeline
        images.append(
            plots.fault_timeline(
                directory,
                e.run.warmup + e.run.duration,
                completed,
                failures,
                faults["actions"],
                faults["health_events"],
            )
        )
    if e.policy.name == "slta":
        images.append(plots.slta_r(directory, r_series, raws.get("simulation"), rep.theory))
    images.append(plots.messages(directory, results))
    sojourns = {src: [x for b in raw.sojourns for x in b] for src, raw in raws.items()}
    images.append(plots.sojourn(directory, sojourns, rep.theory))
    shown = [p for p in images if p is not None]
    (directory / "results.json").write_text(json.dumps(rep.to_json(), indent=1) + "\n")
    (directory / "report.md").write_text(markdown(rep, shown))
    return [directory / "results.json", directory / "report.md", *shown]
