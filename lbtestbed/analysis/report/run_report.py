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

from lbtestbed.analysis.comparison import paired
from lbtestbed.analysis.comparison.compare import (
    SCALARS,
    Side,
    Verdict,
    compare,
    fixed_by_twin,
    holm,
    run_agrees,
)
from lbtestbed.analysis.comparison.representative import Representative, judge
from lbtestbed.analysis.measurement.legs import FACTOR, LegCheck
from lbtestbed.analysis.report import plots
from lbtestbed.analysis.results.provenance import stamped
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.regime import describe
from lbtestbed.analysis.results.result import Result
from lbtestbed.analysis.results.text import Fit, paragraph, table
from lbtestbed.model.conditions import speed_varies
from lbtestbed.model.experiment import Experiment
from lbtestbed.policies import CATALOG, policy_of

UNITS = {
    "mean_sojourn": "model s",
    "sojourn_p50": "model s",
    "sojourn_p99": "model s",
    "mean_tasks_per_node": "tasks",
    "tasks_in_system": "tasks",
    "utility": "per node",
    "wait_probability": "probability",
    "idle_capacity": "speed units",
    "idle_nodes": "nodes",
    "messages_per_task": "msgs/task",
    **{learned.name: learned.unit for learned in CATALOG.learned()},
}
#: the unit of every occupancy_tail[<class>] row: a fraction of the class's nodes
TAIL_UNIT = "fraction"


@dataclass
class RunReport:
    exp: Experiment
    cluster: Result
    simulation: Result | None
    theory: Result | None
    verdicts: list[Verdict]
    context: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    twin: Result | None = None  # the simulation of the system that ran (the cluster's measured delays)
    # the second answer: whether the emulation's delays moved the policy's numbers beyond the tolerance
    representative: Representative | None = None
    # each leg of the task path against what the machine cost meanwhile (None: no probe samples)
    legs: LegCheck | None = None

    @property
    def agrees(self) -> bool:
        """The comparisons that decide agree."""
        return run_agrees(self.verdicts)

    @property
    def faithful(self) -> bool:
        """The first answer: the comparisons that decide agree, and every leg is within what the machine
        explains."""
        return self.agrees and (self.legs is None or self.legs.explained)

    @property
    def passed(self) -> bool:
        """Both answers hold: faithful, and representative unless that was not judged (no twin, no
        simulation, or ``run.tolerance = "off"``): the run's exit code is 0 only then."""
        return self.faithful and (self.representative is None or self.representative.holds is not False)

    def verdict(self, metric: str, reference: str = "simulation", subject: str = "cluster") -> Verdict | None:
        return next(
            (
                v
                for v in self.verdicts
                if v.metric == metric and v.reference == reference and v.subject == subject
            ),
            None,
        )

    def to_json(self) -> dict[str, Any]:
        """``results.json``'s object (docs/results.schema.json), opening with its schema's version and
        the lbtestbed that wrote it (``provenance``)."""
        sources = (self.cluster, self.twin, self.simulation, self.theory)
        return stamped(
            {
                "name": self.exp.name,
                "policy": self.exp.policy.name,
                "agrees": self.agrees,
                "faithful": self.faithful,
                "passed": self.passed,
                "legs": None if self.legs is None else self.legs.to_json(),
                "representative": None if self.representative is None else self.representative.to_json(),
                "results": {r.source: r.to_json() for r in sources if r is not None},
                "comparison": [v.to_json() for v in self.verdicts],
                "warnings": self.warnings,
                **self.context,
            }
        )


def build(
    exp: Experiment,
    cluster: Side,
    simulation: Side | None,
    theory: Result | None,
    context: dict[str, Any],
    warnings: Sequence[str] = (),
    twin: Side | None = None,
    legs: LegCheck | None = None,
) -> RunReport:
    """The verdicts of a run. With a twin, cluster against twin (paired) decides, and so do the theory's
    exact and finite-n values against the zero-delay simulation; cluster and twin against the simulation
    say what the network and the software cost the policy. Without a twin, the cluster against the
    simulation (paired) and against the theory's exact and finite-n values decides. Limit values never
    decide (docs/theory.md, "Regimes: what each value is")."""
    for side in (cluster, twin, simulation):
        if side is not None and side.raw is not None:
            side.result.extras["batch_values"] = paired.batch_table(side.raw)
    verdicts: list[Verdict] = []
    # batches alike in law (constant speeds, no faults: a system recovering from one is not like itself
    # elsewhere, its settling aside), so that a batch that stands apart is looked for
    alike = speed_varies(exp) is None and not exp.faults
    if twin is not None:
        fixed = fixed_by_twin(exp, cluster.raw, twin.raw)
        verdicts += compare(cluster, twin, counts=True, alike=alike, fixed=fixed)
    if simulation is not None:
        verdicts += compare(cluster, simulation, counts=twin is None, alike=alike)
        if twin is not None:
            verdicts += compare(twin, simulation, counts=False, alike=alike)
    if theory is not None:
        if twin is not None and simulation is not None:
            # the theory models the system without delays: the zero-delay simulation is what its exact and
            # finite-n values decide on; the cluster, whose delays cost the policy, sees it for information
            verdicts += compare(simulation, Side(theory), counts=True)
            verdicts += compare(cluster, Side(theory), counts=False)
        else:
            verdicts += compare(cluster, Side(theory), counts=True)
    holm(verdicts)
    judged = twin is not None and simulation is not None
    return RunReport(
        exp,
        cluster.result,
        simulation.result if simulation else None,
        theory,
        verdicts,
        context,
        list(warnings),
        twin.result if twin else None,
        judge(verdicts, exp.run.tolerance, exp.run.time_scale) if judged else None,
        legs,
    )


def _num(v: float | None, ci: float | None = None) -> str:
    """A value with its 95% interval; a zero-width interval (every batch gave the same value) says so
    rather than print ``± 0``."""
    if v is None:
        return "-"
    text = f"{v:.5g}"
    if ci is None:
        return text
    return f"{text} (every batch)" if ci == 0 else f"{text} ± {ci:.2g}"


def _gap(v: Verdict | None) -> str:
    """A paired verdict's gap: relative on the log scale, else the difference, with its interval."""
    if v is None or v.agrees is None:
        return "-"
    if v.difference == 0 and not v.difference_ci95 and not v.relative_ci95:
        return "0 (every batch)"
    if v.relative is not None:
        if v.relative_ci95 == 0:
            return f"{100 * v.relative:+.2g}% (every batch)"
        ci = "" if v.relative_ci95 is None else f" ± {100 * v.relative_ci95:.2g}%"
        return f"{100 * v.relative:+.2g}%{ci}"
    if v.difference is None:
        return "-"
    if v.difference_ci95 == 0:
        return f"{v.difference:+.3g} (every batch)"
    ci = "" if v.difference_ci95 is None else f" ± {v.difference_ci95:.2g}"
    return f"{v.difference:+.3g}{ci}"


def _word(v: Verdict | None) -> str:
    if v is None:
        return "-"
    if v.by_construction and v.agrees is not None:
        return f"({v.word}, by construction)"
    return v.word if v.counts or v.agrees is None else f"({v.word})"


def _theory_word(v: Verdict | None) -> str:
    if v is None:
        return "-"
    word = v.word if v.counts or v.agrees is None else f"({v.word}, info)"
    if "limit" in v.why and v.agrees is not None:
        word = f"({v.word}, limit)"
    return word


def _at(v: Verdict | None, j: int | None, cell: str) -> str:
    """A tail verdict's cell in the row of level j: its own where its worst point is at j, else where to
    look (every verdict of a tail is shown once, in the row of its worst level)."""
    if v is None or j is None or v.worst_j is None or v.worst_j == j:
        return cell
    return f"see j={v.worst_j}"


def _ranges(positions: Sequence[int]) -> str:
    """Window positions as ranges: ``0-2, 5, 9-11``."""
    out: list[str] = []
    for p in sorted(positions):
        if out and out[-1].rpartition("-")[2] == str(p - 1):
            out[-1] = f"{out[-1].partition('-')[0]}-{p}"
        else:
            out.append(str(p))
    return ", ".join(out)


def batch_cell(verdicts: Sequence[Verdict | None], window: int) -> str:
    """The batches a row's comparisons are over, ``7 of 20``; where they differ (they should not: every
    source is cut to the cluster's batches), each set's size."""
    sets = dict.fromkeys(
        tuple(v.batches) for v in verdicts if v is not None and v.batches is not None and v.agrees is not None
    )
    return " / ".join(f"{len(b)} of {window}" for b in sets) or "-"


def batch_note(rep: RunReport) -> str | None:
    """Which batches the rows are over, and why the others are left out; None when every row is over the
    whole window."""
    info = rep.cluster.extras.get("batches")
    if not info or len(info["kept"]) == info["window"]:
        return None
    kept, window = info["kept"], info["window"]
    why = []
    if info["faults"]:
        why.append(f"{len(info['faults'])} touched by a fault or its settling ({_ranges(info['faults'])})")
    if info["unanswered"]:
        why.append(
            f"{len(info['unanswered'])} with a scrape unanswered at an end ({_ranges(info['unanswered'])})"
        )
    return (
        f"Every column of every row is over the same {len(kept)} of {window} batches ({_ranges(kept)}); "
        f"{window - len(kept)} left out: {', '.join(why)}."
    )


def comparison_rows(rep: RunReport) -> list[list[str]]:
    """One row per metric. With a twin: cluster, twin, the paired gap and its verdict, the simulation and
    the network's cost (twin against simulation), theory. Without: cluster, simulation, verdict, theory.
    An occupancy tail is compared at every level and shown at the worst one, ``occupancy_tail[c] at j=J``,
    every source's value at that J: one row per distinct worst level of its comparisons, each verdict in
    the row of its own. Where the run left batches out (faults), a ``batches`` column says how many of
    the window's every row is over (``batch_note`` says which)."""
    rows = _all_rows(rep)
    if batch_note(rep) is None and not any("/" in r[2] for r in rows[1:]):
        rows = [r[:2] + r[3:] for r in rows]  # the whole window everywhere: nothing to say per row
    return rows


def _window(rep: RunReport) -> int:
    """The batches of the measured window."""
    info = rep.cluster.extras.get("batches")
    return int(info["window"]) if info else rep.exp.run.batches


def _all_rows(rep: RunReport) -> list[list[str]]:
    twin = rep.twin is not None
    if twin:
        head = ["metric", "unit", "batches", "cluster", "twin", "cluster-twin", "verdict", "simulation"]
        head.append("net cost")
    else:
        head = ["metric", "unit", "batches", "cluster", "simulation", "cluster-sim", "verdict"]
    rows = [[*head, "theory", "sim vs theory" if twin else "verdict"]]
    metrics = [*SCALARS, *(f"occupancy_tail[{c.name}]" for c in rep.exp.classes)]
    for metric in metrics:
        main = rep.verdict(metric, "twin" if twin else "simulation")
        cost = rep.verdict(metric, "simulation", "twin") if twin else None
        sim = rep.verdict(metric, "simulation")
        theory = (rep.verdict(metric, "theory", "simulation") if twin else None) or rep.verdict(
            metric, "theory"
        )
        known = [v for v in (main, sim, theory) if v is not None]
        tail = metric.startswith("occupancy_tail[")
        levels: list[int | None] = [None]
        if tail:
            shown = [v.worst_j for v in (main, theory) if v is not None and v.worst_j is not None]
            levels = list(dict.fromkeys(shown)) or [None]
        for j in levels:
            # the net cost (information only) is shown in its level's row, or with its level in the first
            cost_cell = _at(cost, j, _gap(cost))
            if cost is not None and cost.agrees is not None and cost.worst_j not in levels:
                cost_cell = f"{_gap(cost)} at j={cost.worst_j}" if j == levels[0] else f"see j={levels[0]}"
            cluster = _value(rep.cluster, metric, j)
            if tail and j is None:
                cluster = "see plot"
            if cluster in ("-", "see plot") and not any(v.expected is not None for v in known):
                continue
            label = metric if j is None else f"{metric} at j={j}"
            batches = batch_cell((main, cost, theory), _window(rep))
            cells = [label, TAIL_UNIT if tail else UNITS.get(metric, ""), batches, cluster]
            if twin:
                cells += [_value(rep.twin, metric, j), _at(main, j, _gap(main)), _at(main, j, _word(main))]
                cells += [_value(rep.simulation, metric, j), cost_cell]
            else:
                cells += [
                    _value(rep.simulation, metric, j),
                    _at(main, j, _gap(main)),
                    _at(main, j, _word(main)),
                ]
            if theory is None:
                cells += ["-", "-"]
            else:
                cells += [_theory_value(rep.theory, metric, j), _at(theory, j, _theory_word(theory))]
            rows.append(cells)
    return rows


def _value(result: Result | None, metric: str, j: int | None) -> str:
    """A result's value of ``metric`` with its interval (a tail's at level j)."""
    if result is None:
        return "-"
    if metric.startswith("occupancy_tail["):
        return _tail_at(result, metric[len("occupancy_tail[") : -1], j)
    m = result.metrics[metric]
    return _num(m.get("value"), m.get("ci95"))


def _theory_value(result: Result | None, metric: str, j: int | None) -> str:
    """A theory value and what it is: [exact +-error], [finite_n +-error O(1/n^2)], [limit, gap >= x]."""
    if result is None:
        return "-"
    # a theory value has no interval: its stated error, if any, is in the brackets
    text = _value(result, metric, j).partition(" ")[0]
    if text == "-":
        return text
    if metric.startswith("occupancy_tail["):
        tail = (result.metrics["occupancy_tail"] or {}).get(metric[len("occupancy_tail[") : -1]) or []
        point = tail[j] if j is not None and j < len(tail) else (tail[0] if tail else {})
        what = describe({**point, "value": 0.0}, with_limit=False)
    else:
        what = describe(result.metrics[metric], with_limit=False)
    return f"{text} [{what}]" if what else text


def _tail_at(result: Result, name: str, j: int | None) -> str:
    """A result's occupancy tail at level j (0 beyond its end: no node holds that many)."""
    tail = (result.metrics["occupancy_tail"] or {}).get(name)
    if j is None or tail is None:
        return "-"
    if j >= len(tail):
        return "0"
    point = tail[j]
    ci = point.get("ci95")
    return _num(point.get("value"), ci if ci else None)


#: the metrics the cost sentence names, where the spec has them
COST_METRICS = ("mean_sojourn", "sojourn_p99", "utility", "wait_probability", "messages_per_task")


def cost_sentence(rep: RunReport) -> str | None:
    """What the emulation's delays cost the policy: the twin against the zero-delay simulation."""
    parts = []
    for metric in COST_METRICS:
        gap = _gap(rep.verdict(metric, "simulation", "twin"))
        if gap != "-":
            parts.append(f"{gap} of {metric.replace('_', ' ')}")
    if not parts:
        return None
    return (
        "The emulation's own delays (network, operating system, software; measured per task) cost this "
        f"{rep.exp.policy.name} run " + ", ".join(parts) + " (the twin against the zero-delay simulation, "
        "paired, 95 % intervals)."
    )


def markdown_table(rows: list[list[str]]) -> str:
    """``rows`` (the header first) as a Markdown table, for report.md and sweep.md (a terminal's tables
    go through ``results.text.table``, which fits them to its width)."""
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def _counted_groups(counted: Sequence[Verdict]) -> str:
    """What the verdict counted: how many metrics of which pair of sources, e.g. ``10 metrics cluster vs
    twin (paired batch by batch), 5 simulation vs theory (exact and finite-n values)``."""
    groups: dict[tuple[str, str], list[Verdict]] = {}
    for v in counted:
        groups.setdefault((v.subject, v.reference), []).append(v)
    parts = []
    for (subject, reference), vs in groups.items():
        how = "paired batch by batch" if all(v.paired for v in vs) else "within their 95% intervals"
        if reference == "theory":
            how = "the theory's exact and finite-n values, within their stated error"
        parts.append(f"{len(vs)} metric{'s' if len(vs) != 1 else ''} {subject} vs {reference} ({how})")
    return ", ".join(parts)


def headline(rep: RunReport) -> str:
    """The run's two answers: whether it is faithful, saying what it counted (a comparison is one metric,
    an occupancy tail one over all its levels, between two sources; verdicts in brackets are for
    information only), and, where it was judged, whether it is representative."""
    line = faithful_line(rep)
    second = rep.representative.line() if rep.representative is not None else None
    return f"{line}; {second}" if second else line


def faithful_line(rep: RunReport) -> str:
    """The first answer: the comparisons that decide, and whether they agree; a leg of the task path
    beyond what the machine explains is named first (it makes the run disagree whatever the twin says)."""
    counted = [v for v in rep.verdicts if v.counts and v.agrees is not None]
    slow = [leg.text() for leg in rep.legs.legs if leg.beyond] if rep.legs is not None else []
    if slow:
        return f"DISAGREES: {'; '.join(slow)}: the emulation spends time there that the machine does not"
    if not counted:
        return "NOTHING TO COMPARE: no metric has a reference that counts (no simulation, limit theory only)"
    what = _counted_groups(counted)
    bad = [v for v in counted if not v.agrees]
    if not bad:
        return f"AGREES: all {len(counted)} comparisons that decide agree: {what}"
    listed = ", ".join(
        f"{v.metric} vs {v.reference} ({v.word.partition(' ')[2].strip('()') or '-'})" for v in bad
    )
    return f"DISAGREES: {len(bad)} of {len(counted)} comparisons that decide: {listed}; counted {what}"


#: printed under the table: what a comparison is, and which rows do not count
COUNTING = (
    "A comparison is one metric (an occupancy tail is one, over all its levels) between two sources; "
    "verdicts in brackets are for information and do not count, nor do rows the twin cannot differ on "
    '"by construction" (docs/run.md, "Which rows decide").'
)


def _dispatchers(e: Experiment) -> str:
    """How many dispatchers ran, and how the arrivals reached them (every source of the run alike)."""
    k = e.policy.dispatchers
    return "dispatchers=1" if k == 1 else f"dispatchers={k} (split {e.policy.split})"


#: the terminal table's columns left out first when it is wider than the terminal (for information, or
#: said again under the table), and the ones whose cells may wrap
OPTIONAL_COLUMNS = ("unit", "theory", "simulation", "net cost", "batches")
WRAPPING_COLUMNS = ("metric", "verdict", "sim vs theory")


def terminal(rep: RunReport, fit: Fit = Fit()) -> str:  # noqa: B008 (frozen)
    """The comparison on a terminal of ``fit.width`` characters (every column with ``fit.wide``), the
    lines under it wrapped to that width."""
    e = rep.exp
    head = (
        f"{e.name}  policy={e.policy.name}  n={e.n}  {_dispatchers(e)}  load={e.workload.load:.4g}  "
        f"time_scale={e.run.time_scale:g}"
    )
    lines = [
        paragraph(head, fit),
        "",
        table(comparison_rows(rep), fit, wrap=WRAPPING_COLUMNS, drop=OPTIONAL_COLUMNS),
        "",
        *([paragraph(note, fit)] if (note := batch_note(rep)) else []),
        paragraph(COUNTING, fit),
        paragraph(headline(rep), fit),
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
    return markdown_table(rows)


def _faults_section(rep: RunReport) -> list[str]:
    """What the injector did, what the processes were seen doing, when the dispatchers noticed, and what
    the run excluded."""
    faults = rep.cluster.extras.get("faults")
    if not faults:
        return []
    return faults_table(rep.exp, faults, rep.cluster.extras.get("load", {}))


def _span(lo: float | None, hi: float | None) -> str:
    if lo is None:
        return "-"
    return f"{lo:.4g}-{hi:.4g}" if hi is not None else f"{lo:.4g}- (not back)"


def _out_windows(outages: Sequence[dict[str, Any]], process: str) -> list[tuple[float, float]]:
    """When process ``process`` was out (model seconds; an outage that never ended lasts for ever)."""
    inf = float("inf")
    return [(o["start"], inf if o["end"] is None else o["end"]) for o in outages if o["process"] == process]


def _uncovered(lo: float, hi: float, covers: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [lo, hi] that no window of ``covers`` covers."""
    left = [(lo, hi)]
    for a, b in covers:
        left = [piece for x, y in left for piece in ((x, min(y, a)), (max(x, b), y)) if piece[1] > piece[0]]
    return left


def observed_window(
    e: Experiment, fault: int, start: float | None, end: float | None, outages: Sequence[dict[str, Any]]
) -> tuple[float, float | None] | None:
    """Fault ``fault``'s window as the processes saw it (docs/faults.md, "Observed windows"): a process
    fault's outage of its target; a gray failure's scheduled window where its node's process and some
    dispatcher served (None: never, the fault could act on no task); a message fault's switches."""
    mine = [o for o in outages if o.get("fault") == fault]
    if mine:
        return mine[0]["start"], mine[-1]["end"]
    if start is None:
        return None
    if e.faults[fault].kind not in ("slow", "fail") or end is None:
        return start, end
    node = e.faults[fault].node
    hosts = {o["process"] for o in outages if node in (o.get("nodes") or [])}
    covers = [w for h in hosts for w in _out_windows(outages, h)]
    dispatchers = [f"dispatcher-{d}" for d in range(e.policy.dispatchers)]
    # the times every dispatcher was out: the intersection of their outages
    all_out = [(0.0, float("inf"))]
    for d in dispatchers:
        mine_d = _out_windows(outages, d)
        all_out = [(max(a, x), min(b, y)) for a, b in all_out for x, y in mine_d if min(b, y) > max(a, x)]
    left = _uncovered(start, end, covers + all_out)
    return (left[0][0], left[-1][1]) if left else None


def _noticed(
    e: Experiment,
    nodes: set[int],
    window: tuple[float, float | None],
    since: float,
    events: Sequence[dict[str, Any]],
) -> tuple[str, str]:
    """When the dispatchers marked the fault's nodes down within its observed window (from ``since``, the
    earliest it can have begun: its scheduled start, or the last check that saw its process serving, to
    its end plus the detection bound, heartbeat + timeout) and back up after it: the two cells of the
    faults table, with the delays after ``since`` and after its observed end."""
    lo, hi = window
    bound = (e.health.heartbeat + e.health.timeout) / e.run.time_scale
    last = (hi if hi is not None else lo) + bound
    hits = [ev for ev in events if nodes & set(range(ev["nodes"][0], ev["nodes"][-1] + 1))]
    d = next((ev for ev in hits if ev["to"] == "down" and min(lo, since) <= ev["model_time"] <= last), None)
    down = f"{d['model_time']:.4g} (+{d['model_time'] - since:.3g})" if d else "not noticed"
    if hi is None:
        return down, "-"
    u = next((ev for ev in hits if ev["to"] == "up" and ev["model_time"] >= hi), None)
    return down, f"{u['model_time']:.4g} (+{u['model_time'] - hi:.3g})" if u else "-"


def _fault_rows(e: Experiment, faults: dict[str, Any]) -> list[list[str]]:
    """One row per fault of the spec, then one per unplanned fault."""
    by_fault: dict[int, dict[str, Any]] = {}
    for a in faults["actions"]:
        entry = by_fault.setdefault(a["fault"], {"target": a["target"], "nodes": a.get("nodes") or []})
        entry[a["action"]] = a
    outages = faults.get("outages") or []
    events = faults["health_events"]
    rows = []
    for i, f in sorted(by_fault.items()):
        start, end = f.get("start", {}).get("model_time"), f.get("end", {}).get("model_time")
        window = observed_window(e, i, start, end, outages)
        nodes = set(f["nodes"])
        down = up = "-"
        if window is None:
            down = "not exercised (its process or every dispatcher was out)"
        elif nodes:
            down, up = _noticed(
                e, nodes, window, min(window[0], start if start is not None else window[0]), events
            )
        errors = "; ".join(x["error"] for x in (f.get("start", {}), f.get("end", {})) if x.get("error"))
        observed = _span(*window) if window is not None else "none"
        rows.append([str(i), f["target"], _span(start, end), observed, down, up, errors])
    for o in outages:
        if o.get("fault") is not None:
            continue
        what = f"node process {o['index']}" if o["role"] == "nodes" else f"dispatcher {o['index']}"
        window = (o["start"], o["end"])
        down, up = _noticed(e, set(o["nodes"]), window, o["last_seen"], events) if o["nodes"] else ("-", "-")
        again = ", ".join(f"{t:.4g}" for t in o.get("restarted") or [])
        note = f"unplanned: {o['cause']}" + (f"; started again at {again}" if again else "")
        rows.append(
            [
                f"u{o['id']}",
                what,
                "-",
                _span(*window),
                down,
                up,
                note + (f"; {o['error']}" if o.get("error") else ""),
            ]
        )
    return rows


def faults_table(e: Experiment, faults: dict[str, Any], load: dict[str, Any]) -> list[str]:
    """The report's Faults section: the table of faults, planned and not, and the accounting."""
    rows = [["fault", "target", "scheduled", "observed out", "marked down", "back up", "note"]]
    rows += _fault_rows(e, faults)
    excluded = faults["batches_excluded"]
    unanswered = faults.get("batches_unanswered", [])
    return [
        "## Faults",
        "",
        markdown_table(rows),
        "",
        f"Times in model seconds from the start of the load. *Scheduled*: the spec's window as the injector "
        f"acted; *observed out*: from the first check that found the process out (dead, stopped, not "
        f"answering, or a dispatcher still waiting for its nodes) to the first that found it serving again, "
        f"or for a gray failure the part of its window in which its process and a dispatcher served; rows "
        f"u*k* are faults nobody planned. The dispatchers' marks are judged on the observed window; in "
        f"brackets their delay after it began or ended (heartbeat every {e.health.heartbeat:g} s wall, "
        f"timeout {e.health.timeout:g} s wall = {e.health.timeout / e.run.time_scale:.3g} model s). Every "
        f"task is accounted for: "
        f"{load.get('scheduled', 0)} scheduled = {load.get('completed', 0)} completed + "
        f"{load.get('refused', 0)} refused + {load.get('lost', 0)} lost with a node + "
        f"{load.get('failed', 0)} lost with a dispatcher or unreachable + {load.get('expired', 0)} expired "
        f"(no answer within the generator's deadline) + {load.get('cancelled', 0)} cancelled (the run was "
        f"stopped) + {load.get('dropped', 0)} dropped by the generator + {load.get('unsent', 0)} not sent. "
        f"Batches {', '.join(map(str, excluded)) or 'none'} of {e.run.batches} overlap a fault (scheduled or "
        f"observed) or the settle time after it, or a process did not answer the scrape at one of their ends "
        f"({', '.join(map(str, unanswered)) or 'none'}), and are left out of the comparison "
        f"(docs/faults.md).",
        "",
    ]


def _explanation(rep: RunReport) -> str:
    if rep.twin is not None:
        return (
            "The cluster, its twin and the simulation saw the same tasks (the workload is in `trace.csv`). "
            "The twin is the simulation of the system that actually ran, with the delays the cluster "
            "measured on every leg; the cluster against it, paired batch by batch, decides the verdict "
            "(a disagreement is an emulation bug or an effect nobody modelled). The simulation has no "
            "delays: the twin against it is what the network and the software cost the policy (*net cost*). "
            "The theory's exact and finite-n values (within their stated error) decide against the "
            "simulation (*sim vs theory*); its limit values are for information, with their finite-n gap "
            "where one is known. Occupancy tails are compared point by point at the family-wise 95% level."
        )
    return (
        "Cluster and simulation saw the same tasks (same seed; the workload is in `trace.csv`) and are "
        "compared batch by batch: the mean per-batch gap (relative for sojourns, tasks and messages) with "
        "its 95% interval; otherwise how many standard errors apart. The theory's exact and finite-n values "
        "decide within their stated error; values that hold only as n grows are marked *limit*, with their "
        "finite-n gap where one is known, and do not decide the verdict. Occupancy tails are compared point "
        "by point at the family-wise 95% level."
    )


LEG_WORDS = {
    "late": "the generator's lateness (intended send to request)",
    "to_dispatcher": "request to the dispatcher's accept",
    "decide": "accept to decision (probes included)",
    "forward": "decision to the node's arrival",
    "notify": "the node's completion to the dispatcher reading its reply",
    "reply": "the node's completion to the client reading the answer",
    "total": "transport-and-dispatch overhead (sojourn minus stay)",
}


def _time_section(rep: RunReport) -> list[str]:
    """The overhead decomposition: every leg's p50 and p99, and the message ages by kind."""
    o = rep.cluster.extras.get("overhead")
    if not o:
        return []
    rows = [["leg", "what", "p50 ms", "p99 ms", "p50 model s", "p99 model s"]]

    def quantiles(q: dict[str, float]) -> list[str]:
        return [_num(q.get(k)) for k in ("p50_ms", "p99_ms", "p50_model", "p99_model")]

    for name, q in o["legs"].items():
        rows.append([name, LEG_WORDS.get(name, ""), *quantiles(q)])
    for label, ages in (("message", o.get("message_age", {})), ("rider", o.get("rider_age", {}))):
        what = "sent on its own request" if label == "message" else "riding on a reply"
        for kind, q in ages.items():
            rows.append([f"age of {kind}", what, *quantiles(q)])
    return [
        "## Where the time goes",
        "",
        markdown_table(rows),
        "",
        "Every leg is a difference of two readings of the machine's monotonic clock, which all the "
        'cluster\'s processes share (docs/run.md, "Where the time goes"); `tasks.csv` has them per task.',
        "",
        *_legs_section(rep),
    ]


def _legs_section(rep: RunReport) -> list[str]:
    """Each leg against what the machine explains (analysis.measurement.legs)."""
    check = rep.legs
    if check is None:
        return []
    rows = [["leg", "p50 ms", "the machine explains", "ratio", ""]]
    for leg in check.legs:
        word = "beyond" if leg.beyond else "explained"
        rows.append(
            [leg.leg, f"{1e3 * leg.measured:.3g}", f"{1e3 * leg.explained:.2g} ms", f"{leg.ratio:.2g}", word]
        )
    m = check.machine
    return [
        "### Each leg against the machine",
        "",
        markdown_table(rows),
        "",
        f"The machine meanwhile: one hop {1e3 * m.hop:.2g} ms (half the p50 of {len(m.round_trips)} echoes "
        f"of a bare probe beside the cluster), one timer wake-up {1e3 * m.timer:.2g} ms late (p50 of "
        f"{len(m.timer_lateness)}); the busiest cluster process used {100 * check.busy:.0f} % of a core. A "
        f'leg beyond {FACTOR:g} times what they explain counts against the run (docs/run.md, "Legs held '
        'against the machine").',
        "",
    ]


def _cpu_section(rep: RunReport) -> list[str]:
    """CPU seconds per task of every process over the window (analysis.measurement.cpu)."""
    cpu = rep.cluster.extras.get("cpu")
    if not cpu or not cpu.get("processes"):
        return []
    rows = [["process", "CPU s in the window", "CPU ms per task"]]
    for p in cpu["processes"]:
        per_task = p["per_task"]
        rows.append(
            [f"{p['role']} {p['index']}", _num(p["cpu_seconds"]), _num(1e3 * per_task if per_task else None)]
        )
    return [
        "## What a task costs in CPU",
        "",
        markdown_table(rows),
        "",
        f"Over the {cpu['tasks']:.0f} tasks the dispatchers accepted in the window: each process's "
        "`process_cpu_seconds_total` at the window's ends (the generator: this run's own process, its "
        'scrapes included; docs/run.md, "What a task costs in CPU").',
        "",
    ]


def partial_note(context: dict[str, Any]) -> str | None:
    """What a partial run's report says first: why it stopped, and that it covers what was measured."""
    if not context.get("partial"):
        return None
    how = f"stopped by {context['interrupted']}" if context.get("interrupted") else "cut short"
    return f"PARTIAL RUN ({how}): the report covers what was measured until then."


def accounting_lines(context: dict[str, Any]) -> list[str]:
    """Every task sent, counted one by one from the run's journal, and whether the identity holds."""
    a = context.get("accounting")
    if not a:
        return []
    fates = " + ".join(
        f"{a[k]} {k}" for k in ("completed", "refused", "lost", "failed", "expired", "cancelled")
    )
    still = f" + {a['open']} without a fate in the journal" if a.get("open") else ""
    word = "holds" if a.get("holds") else "DOES NOT HOLD: " + "; ".join(a.get("problems", []))
    return [
        "## Accounting",
        "",
        f"Task by task from the run's journal (`journal.jsonl`): {a['sent']} sent = {fates}{still} "
        f"({word}); of the {a['scheduled']} scheduled, {a['dropped']} were dropped by the generator and "
        f"{a['unsent']} not sent.",
        "",
    ]


def markdown(rep: RunReport, images: Sequence[Path]) -> str:
    e, c = rep.exp, rep.cluster
    load = c.extras.get("load", {})
    partial = partial_note(rep.context)
    out = [
        f"# {e.name}: {e.policy.name} on a {e.n}-node cluster, {_dispatchers(e)}",
        "",
        *([f"**{partial}**", ""] if partial else []),
        f"**{headline(rep)}**",
        "",
        markdown_table(comparison_rows(rep)),
        "",
        *([note, ""] if (note := batch_note(rep)) else []),
        COUNTING,
        "",
        _explanation(rep),
        *(["", cost] if (cost := cost_sentence(rep)) else []),
        "",
    ]
    if rep.warnings:
        out += ["## Warnings", "", *(f"- {w}" for w in rep.warnings), ""]
    out += accounting_lines(rep.context)
    out += _faults_section(rep)
    out += _time_section(rep)
    out += _cpu_section(rep)
    out += ["## Messages per task by kind", "", _messages_table(rep), ""]
    overhead = c.extras.get("network_overhead", {})
    out += [
        "## The run",
        "",
        f"- spec: `{e.source}`; seed {e.seed}; warm-up {e.run.warmup:g}, measured {e.run.duration:g} model s "
        f"in {e.run.batches} batches; time_scale {e.run.time_scale:g} wall s per model s",
        f"- metrics read by: {rep.context.get('metrics_source', 'scrape')}",
        f"- load: {load.get('sent', '-')} tasks sent, {load.get('completed', '-')} completed, "
        f"{load.get('refused', 0)} refused, {load.get('lost', 0)} lost, {load.get('expired', 0)} expired, "
        f"{load.get('dropped', 0)} dropped; "
        f"{load.get('late_sends', 0)} late sends (lateness p99 {_num(load.get('lateness_p99_ms'))} ms)",
        f"- network and dispatch overhead per task (client sojourn minus time at the node): "
        f"{_num(overhead.get('value'), overhead.get('ci95'))} model s",
        *([f"- {close}"] if (close := (rep.context.get("preflight") or {}).get("how_close")) else []),
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
    results = [r for r in (rep.cluster, rep.twin, rep.simulation, rep.theory) if r is not None]
    e = rep.exp
    run = plots.run_title(e.name, e.policy.name, e.policy.dispatchers)
    images: list[Path | None] = [
        plots.occupancy_tail(directory, results, run=run),
        plots.over_time(directory, e.run.warmup, e.run.duration, raws, rep.theory, e.run.batches, run=run),
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
                run=run,
                outages=faults.get("outages") or [],
            )
        )
    learned = policy_of(e).learned
    if learned is not None:
        sim = raws.get("simulation")
        images.append(plots.learned(directory, learned, r_series, sim, rep.theory, run=run))
    images.append(plots.messages(directory, results, run=run))
    sojourns = {src: [x for b in raw.sojourns for x in b] for src, raw in raws.items()}
    images.append(plots.sojourn(directory, sojourns, rep.theory, run=run))
    shown = [p for p in images if p is not None]
    (directory / "results.json").write_text(json.dumps(rep.to_json(), indent=1) + "\n")
    (directory / "report.md").write_text(markdown(rep, shown))
    return [directory / "results.json", directory / "report.md", *shown]


def write_unmeasured(
    directory: Path,
    exp: Experiment,
    context: dict[str, Any],
    warnings: Sequence[str],
    load: dict[str, Any],
    faults: dict[str, Any] | None,
) -> list[Path]:
    """The report of a run that left fewer than two batches to compare (stopped before, or faults took
    them): results.json and report.md with its accounting, its load and its faults, and no verdict."""
    directory.mkdir(parents=True, exist_ok=True)
    line = "NOTHING TO COMPARE: fewer than two batches of the window were measured undisturbed"
    body = {
        "name": exp.name,
        "policy": exp.policy.name,
        "agrees": False,
        "faithful": False,
        "passed": False,
        "headline": line,
        "results": {"cluster": {"source": "cluster", "load": load, "faults": faults}},
        "comparison": [],
        "warnings": list(warnings),
        **context,
    }
    partial = partial_note(context)
    text = [
        f"# {exp.name}: {exp.policy.name} on a {exp.n}-node cluster, {_dispatchers(exp)}",
        "",
        *([f"**{partial}**", ""] if partial else []),
        f"**{line}**",
        "",
        *(["## Warnings", "", *(f"- {w}" for w in warnings), ""] if warnings else []),
        *accounting_lines(context),
    ]
    if faults is not None:
        text += faults_table(exp, faults, load)
    (directory / "results.json").write_text(json.dumps(body, indent=1) + "\n")
    (directory / "report.md").write_text("\n".join(text) + "\n")
    return [directory / "results.json", directory / "report.md"]
