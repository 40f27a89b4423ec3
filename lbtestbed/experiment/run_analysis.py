"""The report of a measured run: the cluster's counters and tasks as a result, the simulation and the twin
of the same tasks, the theory, the verdicts, and the report directory (``analyse``). ``lbt run`` calls it
once its measurement is over, ``lbt report`` on a run's directory read back (``run_record``).

A run stopped early (a signal) or cut short is compared on the batches it measured: the experiment is cut
at the last boundary reached (``measured_part``), the simulation and the twin run that experiment. A run
whose faults, planned or not, left fewer than two batches to compare gets a report of its accounting and
its faults only (``run_report.write_unmeasured``).
"""

from __future__ import annotations

import dataclasses
import itertools
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lbtestbed.analysis.comparison.compare import Side
from lbtestbed.analysis.measurement.legs import LegCheck, busiest, hold
from lbtestbed.analysis.measurement.measure import NODE_CLOCK, cluster_raw
from lbtestbed.analysis.measurement.overhead import overhead_of, write_records
from lbtestbed.analysis.measurement.scrape import Snapshot
from lbtestbed.analysis.report import run_report as report
from lbtestbed.analysis.report.run_report import RunReport
from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.results.result import Result, summarize
from lbtestbed.analysis.results.statistics import ratio_estimate
from lbtestbed.analysis.simulator.twin import Emulation
from lbtestbed.dispatcher.core import DISPATCHER_STREAM
from lbtestbed.experiment.run_record import Measurement
from lbtestbed.experiment.watch import exclusions
from lbtestbed.model.experiment import Experiment

Say = Callable[[str], None]


def drain_arrivals(exp: Experiment) -> float:
    """Model seconds of arrivals after the window, so that its last tasks are served as the simulator
    serves them: the simulator keeps arrivals coming until every measured task has left. That matters only
    where later arrivals slow earlier tasks, on processor-sharing nodes; pools and FCFS nodes serve a task
    the same whatever arrives after it."""
    if "ps" not in {c.discipline for c in exp.classes}:
        return 0.0
    return 0.2 * exp.run.duration


def boundaries(exp: Experiment) -> list[float]:
    """Model times of the snapshots: the batch boundaries of the measured window."""
    B = exp.run.batches
    return [exp.run.warmup + exp.run.duration * b / B for b in range(B + 1)]


def excluded_batches(exp: Experiment, observed: Sequence[tuple[float, float]] = ()) -> list[bool]:
    """Which batches of the measured window a fault may have disturbed: those overlapping [at, until +
    settle] of some fault of the spec, or one of the ``observed`` windows (model seconds: the processes
    seen out, planned or not, with the settle time after each; ``watch.exclusions``)."""
    marks = boundaries(exp)
    return [
        any(f.at < hi and lo < f.until + f.settle for f in exp.faults)
        or any(a < hi and lo < b for a, b in observed)
        for lo, hi in itertools.pairwise(marks)
    ]


def clock_shift(a: Snapshot, b: Snapshot) -> float | None:
    """The largest difference between two snapshots' model clocks of the same node process."""

    def clocks(s: Snapshot) -> dict[str, float]:
        out = {}
        for key, proc in s.processes.items():
            if any(n == NODE_CLOCK for n, _, _ in proc.samples):
                out[key.rpartition("/")[2]] = proc.value(NODE_CLOCK)  # URL or Prometheus instance
        return out

    ca, cb = clocks(a), clocks(b)
    return max((abs(ca[k] - cb[k]) for k in ca.keys() & cb.keys()), default=None)


def unanswered_batches(snaps: Sequence[Snapshot]) -> list[int]:
    """The batches at one of whose ends a process did not answer the scrape (the fault's target, or any
    process too slow for the scrape's deadline on a busy machine)."""
    return [b for b in range(len(snaps) - 1) if snaps[b].missing or snaps[b + 1].missing]


def batches_kept(
    exp: Experiment, snaps: Sequence[Snapshot], observed: Sequence[tuple[float, float]] = ()
) -> list[bool]:
    """The batches to compare: not disturbed by a fault (of the spec, or ``observed``: excluded_batches),
    and every process answered at both ends."""
    excluded = excluded_batches(exp, observed)
    unanswered = set(unanswered_batches(snaps))
    return [not (excluded[b] or b in unanswered) for b in range(len(snaps) - 1)]


def cluster_result(exp: Experiment, m: Measurement) -> tuple[Result, RawRun]:
    """The cluster's measurements as the shared result object (source: cluster)."""
    keep = batches_kept(exp, m.snapshots, exclusions(exp, m.outages))
    raw = cluster_raw(exp, m.snapshots, m.load.records, keep)
    if m.r_series:
        raw.r_series = [(t, int(r)) for t, r in m.r_series]
    result = summarize(exp, [raw], source="cluster")
    for key in ("events", "wall_seconds", "censored_tasks"):  # simulator bookkeeping
        result.extras.pop(key, None)
    num, den = raw.ratios["network_overhead"]
    if m.direct:  # the same window scraped directly: the time averages should match Prometheus's
        direct = summarize(exp, [cluster_raw(exp, m.direct, m.load.records, keep)], source="cluster")
        checked = ("mean_tasks_per_node", "tasks_in_system", "utility", "idle_nodes", "messages_per_task")
        result.extras["direct_scrape"] = {k: direct.metrics[k]["value"] for k in checked}
        result.extras["direct_scrape"]["occupancy_tail"] = {
            name: [e["value"] for e in tail] for name, tail in direct.metrics["occupancy_tail"].items()
        }
        # how far apart the two windows' ends are, in model seconds (the largest over the node processes)
        result.extras["direct_scrape"]["window_shift"] = [
            clock_shift(m.snapshots[0], m.direct[0]),
            clock_shift(m.snapshots[-1], m.direct[-1]),
        ]
    if exp.faults or m.outages:
        result.extras["faults"] = faults_extras(m, keep)
        # per task, for the timeline: (intended arrival, node) of each completed task, and the others
        result.extras["fault_timeline"] = {
            "completed": [(round(r.t, 6), r.node) for r in m.load.records],
            "failures": [(round(t, 6), outcome, node) for t, outcome, node in m.load.failures],
        }
    touched = excluded_batches(exp, exclusions(exp, m.outages))
    result.extras["batches"] = {  # the batch set of every row of the report (run_report.batch_note)
        "window": len(keep),
        "kept": [b for b, k in enumerate(keep) if k],
        "faults": [b for b, t in enumerate(touched) if t],
        # left out for want of an answer alone (the target of a fault does not answer either)
        "unanswered": [b for b in unanswered_batches(m.snapshots) if not touched[b]],
    }
    result.extras |= {
        "decisions": raw.decisions,
        "network_overhead": ratio_estimate(num, den).to_json(),
        "load": m.load.summary(),
        "metrics_source": m.source,
        "endpoints": m.cluster,
        "cpu": m.cpu,
    }
    return result, raw


def emulation_of(exp: Experiment, m: Measurement) -> Emulation:
    """What the twin replays of a cluster run: its trace, every completed task's legs, message ages."""
    legs = {r.t: (r.arrive, r.decide, r.forward, r.notify, r.reply, r.leave) for r in m.load.records}
    # messages for a task's dispatcher ride on the task's reply unless the network is emulated
    return Emulation(
        m.tasks,
        legs,
        m.message_ages,
        m.rider_ages,
        m.keyed_ages,
        riders=exp.network.delay is None,
        policy_stream=DISPATCHER_STREAM,
    )


def how_close(preflight: dict[str, Any], cluster: Result, rep: RunReport) -> str:
    """How close the pre-flight's estimate came: its live calibration at the scale picked where it made one,
    else its table's."""
    from lbtestbed.experiment.calibration import how_close

    measured_ms = cluster.extras["overhead"]["legs"]["total"]["p50_ms"]
    costs = {c.metric: c.cost for c in rep.representative.costs} if rep.representative else {}
    picked = preflight.get("time_scale", {}).get("picked")
    live = [x for x in preflight.get("live", []) if x["time_scale"] == picked]
    if live:
        x = live[-1]
        return how_close("live", x["overhead_p50_ms"], x["cost"], measured_ms, costs.get("mean_sojourn"))
    est = preflight["estimate"]["overhead_ms"]
    return how_close("the machine's table", est, None, measured_ms, costs.get("mean_sojourn"))


def legs_held(exp: Experiment, m: Measurement) -> LegCheck | None:
    """Each leg of the run's tasks against what its machine probe measured over the window."""
    if m.machine is None:
        return None
    busy = (
        m.unavailable if m.unavailable is not None else busiest(m.cpu, exp.run.duration * exp.run.time_scale)
    )
    return hold(m.load.records, m.machine, busy, exp.run.time_scale)


def measured_part(exp: Experiment, batches: int) -> Experiment:
    """``exp`` cut at the end of its first ``batches`` batches (a run stopped early): the same warm-up and
    batch length, so that its batches are the run's first ones."""
    run = exp.run
    if batches >= run.batches:
        return exp
    part = dataclasses.replace(run, duration=run.duration * batches / run.batches, batches=batches)
    return dataclasses.replace(exp, run=part)


def _context(m: Measurement, directory: Path, preflight: dict[str, Any] | None) -> dict[str, Any]:
    """What results.json says of the run beside its results: where its counters came from, whether it
    was stopped early, and its tasks counted one by one from its journal."""
    context: dict[str, Any] = {"metrics_source": m.source, "directory": str(directory)}
    partial = bool(m.interrupted) or not m.finished
    context["partial"] = partial
    if m.interrupted:
        context["interrupted"] = signal.Signals(m.interrupted).name
    if m.accounting:
        context["accounting"] = m.accounting
    if preflight:
        context["preflight"] = preflight
    return context


def _load_warnings(m: Measurement) -> list[str]:
    load = m.load.summary()
    out = []
    if load["late_sends"] or load["dropped"]:
        out.append(
            f"the load generator could not keep its schedule: {load['late_sends']} late sends, "
            f"{load['dropped']} dropped"
        )
    lost = sum(int(load[k]) for k in ("refused", "lost", "failed", "expired"))  # type: ignore[call-overload]
    if lost:
        out.append(f"{lost} tasks did not complete (refused, lost, failed or expired): see results.json")
    if m.interrupted or not m.finished:
        how = f"stopped by {signal.Signals(m.interrupted).name}" if m.interrupted else "cut short"
        batches = max(0, len(m.snapshots) - 1)
        out.insert(0, f"a partial run ({how}): it measured {batches} batches, and is compared on those")
    return out


def analyse(
    exp: Experiment,
    m: Measurement,
    directory: Path,
    say: Say,
    *,
    simulate: bool = True,
    twin: bool = True,
    preflight: dict[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> tuple[RunReport | None, list[Path]]:
    """Compare the run ``m`` of ``exp`` with its twin, its simulation and its theory and write the report
    directory; the report (None when fewer than two batches could be compared: then only the accounting
    and the faults are written) and the files written."""
    from lbtestbed.analysis.simulator import simulate_once
    from lbtestbed.analysis.simulator.twin import simulate_twin
    from lbtestbed.analysis.theory.predict import predict

    warnings = [*warnings, *_load_warnings(m)]
    context = _context(m, directory, preflight)
    if preflight and "time_scale" in preflight:
        warnings.insert(0, preflight["time_scale"]["why"])
    exp = measured_part(exp, max(0, len(m.snapshots) - 1))
    write_records(directory / "tasks.csv", m.load.records)
    observed = exclusions(exp, m.outages)
    keep = batches_kept(exp, m.snapshots, observed) if len(m.snapshots) >= 2 else []
    if sum(keep) < 2:
        say("writing the report: fewer than two batches to compare")
        extras = faults_extras(m, keep) if exp.faults or m.outages else None
        files = report.write_unmeasured(directory, exp, context, warnings, m.load.summary(), extras)
        return None, files
    cluster, raw = cluster_result(exp, m)
    ages = [{k: [a for _, a in v] for k, v in t.items()} for t in (m.message_ages, m.rider_ages)]
    kinds = exp.policy.message_kinds()
    cluster.extras["overhead"] = overhead_of(m.load.records, exp.run.time_scale, ages[0], ages[1], kinds)
    raws = {"cluster": raw}
    # one batch set for every column: the simulation and the twin are cut to the batches the cluster
    # keeps (a fault, or a scrape unanswered, leaves the others out), so that a row's values, its gap and
    # its verdict are all over the same batches
    kept = raw.positions()
    simulation = twin_result = None
    if simulate:
        say("simulating the same tasks")
        sim_raw = simulate_once(exp).only(kept)
        simulation = summarize(exp, [sim_raw])
        raws["simulation"] = sim_raw
    if simulate and twin:
        say("simulating the twin: the same tasks with the delays the cluster measured")
        twin_raw, replayed = simulate_twin(exp, emulation_of(exp, m))
        twin_raw = twin_raw.only(kept)
        twin_result = summarize(exp, [twin_raw], source="twin")
        # every kind of the policy (0 and 0 where none was sent): the same keys in every run of the spec
        twin_result.extras["message_ages_replayed"] = {
            k: dict(zip(("own", "drawn"), replayed.get(k, [0, 0]), strict=True))
            for k in sorted({*kinds, *replayed})
        }
        raws["twin"] = twin_raw
    theory = predict(exp)
    warnings += [f"theory: {w}" for w in theory.extras.get("warnings", [])]
    rep = report.build(
        exp,
        Side(cluster, raw),
        Side(simulation, raws["simulation"]) if simulation is not None else None,
        theory,
        context,
        warnings,
        twin=Side(twin_result, raws["twin"]) if twin_result is not None else None,
        legs=legs_held(exp, m),
    )
    if preflight and "estimate" in preflight:
        preflight["how_close"] = how_close(preflight, cluster, rep)
        say(preflight["how_close"])
    _overhead_warning(exp, cluster, rep)
    say("writing the report")
    completed = [(rec.t, rec.node) for rec in m.load.records]
    files = report.write(directory, rep, raws, m.r_series, (completed, m.load.failures))
    return rep, files


def _overhead_warning(exp: Experiment, cluster: Result, rep: RunReport) -> None:
    """Where a sojourn disagrees: how much of it is the network's and the dispatch's."""
    overhead = cluster.extras["network_overhead"]["value"]
    sojourn_off = [v for v in rep.verdicts if v.metric.startswith("sojourn") or v.metric == "mean_sojourn"]
    if overhead and any(v.counts and v.agrees is False for v in sojourn_off):
        rep.warnings.append(
            f"sojourn times are measured at the client and include {overhead:.3g} model s "
            f"({1e3 * overhead * exp.run.time_scale:.2g} ms wall) of network and dispatch overhead per "
            f"task; a larger run.time_scale makes it smaller against the work"
        )


def faults_extras(m: Measurement, keep: Sequence[bool]) -> dict[str, Any]:
    """results.json's ``faults``: what the injector did, what the processes were seen doing, the
    dispatchers' transitions and the batches left out."""
    return {
        "actions": m.faults,
        "outages": m.outages,
        "health_events": m.health_events,
        "batches_excluded": [b for b, k in enumerate(keep) if not k],
        "batches_unanswered": unanswered_batches(m.snapshots),  # of those, for want of an answer
    }
