"""``lbt frontier``: every policy over its own message knob on one spec, and the frontier of messages
against delay (docs/run.md, "The frontier").

What runs is read from the policies' declarations (``policies.unit.Curve``): a policy that declares curves
runs each value of each curve's knob (its ``fixed`` keys set beside it); one that declares none runs once,
as the spec gives it (the spec's own policy with its table, any other at its defaults, with the spec's
``dispatchers`` and ``split``). A policy whose settings the spec cannot hold (a ``SpecError`` on reading
the point: pools only, a key it needs) is left out with that reason. Every point is simulated (independent
replications, or batch means) beside its theory on an executor (``sweep.simulate_point``); with
``cluster`` each also runs on a local cluster (``sweep.run_points``: ``lbt run``'s machinery, without the
twin, but with the simulation of its own tasks), its warm-up and window cut so that all the points fit
the wall-clock budget.

The delay is the mean wait, the mean sojourn less the mean service time (the mean work over the nodes'
one speed: the same for every policy, so the wait keeps the sojourn's interval), and the 99th percentile
of the sojourn. The frontier, for each message budget the best measured point, comes from
``analysis.comparison.frontier``; the plot from ``analysis.report.frontier``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtestbed.analysis.comparison.frontier import envelope
from lbtestbed.experiment.errors import BadInput, Failed
from lbtestbed.experiment.executor import LOCAL, open_executor
from lbtestbed.experiment.frontier_output import (
    P99,
    FrontierOutcome,
    FrontierPoint,
    LeftOut,
    Setting,
    measured,
    write,
)
from lbtestbed.experiment.progress import optional_progress
from lbtestbed.experiment.run import default_directory, run_errors, run_size_problem
from lbtestbed.experiment.sweep import run_points, simulate_points, with_overrides
from lbtestbed.model.conditions import speed_varies
from lbtestbed.model.experiment import COMMON_POLICY_KEYS, Experiment
from lbtestbed.model.reader import SpecError
from lbtestbed.model.reading import toml_value
from lbtestbed.policies import CATALOG, policy_of
from lbtestbed.policies.unit import Policy

Say = Callable[[str], None]

#: wall seconds a cluster point costs beyond its load: start the processes, drain, write its report
#: (measured on a busy 2-core machine: 7.5 to 10 s; docs/run.md, "The frontier")
CLUSTER_OVERHEAD = 10.0
#: a cluster point's window must hold at least this many tasks per batch: fewer make batch means of a 99th
#: percentile meaningless
MIN_TASKS_PER_BATCH = 100
#: the share of a cluster point's model time given to its warm-up
CLUSTER_WARMUP_SHARE = 1 / 5


@dataclass(frozen=True)
class FrontierOptions:
    """How ``lbt frontier`` runs (its options, defaults as there)."""

    policies: tuple[str, ...] = ()  # only these (names or aliases); empty: every policy of the catalog
    replications: int = 5  # independent replications per point; 1: batch means of one run
    jobs: int = 2
    executor: str = LOCAL
    cluster: bool = False  # also run every point on a local cluster
    cluster_minutes: float = 9.0  # the wall-clock budget of the cluster points together
    node_processes: int | None = None
    force: bool = False  # run cluster points the pre-flight estimate refuses
    out: Path | None = None
    quiet: bool = False


# --------------------------------------------------------------------------------------------- settings


def selected(names: Sequence[str]) -> list[Policy]:
    """The catalog's policies named (names or aliases, in catalog order), or all; BadInput for a name
    the catalog does not hold."""
    if not names:
        return list(CATALOG)
    unknown = [n for n in names if n not in CATALOG.names()]
    if unknown:
        raise BadInput(
            f"--policies {','.join(names)}: no policy {unknown[0]!r} (policies: {', '.join(CATALOG.names())})"
        )
    wanted = {CATALOG.canonical(n) for n in names}
    return [p for p in CATALOG if p.name in wanted]


def policy_table(exp: Experiment, policy: Policy) -> dict[str, Any]:
    """The ``[policy]`` table a point of ``policy`` starts from: the spec's own for its own policy, else
    the policy's name with the spec's keys common to every policy (dispatchers, split)."""
    table = dict(exp.raw.get("policy") or {})
    if policy_of(exp) is policy:
        return table
    return {"name": policy.name, **{k: table[k] for k in COMMON_POLICY_KEYS if k in table}}


def settings_of(policy: Policy, exp: Experiment) -> list[Setting]:
    """The points ``policy`` declares for ``exp``: each value of each curve, or one point."""
    base = f"policy={toml_value(policy_table(exp, policy))}"
    if not policy.frontier:
        return [Setting(policy.name, policy.name, overrides=(base,))]
    out = []
    for curve in policy.frontier:
        fixed = tuple(f"policy.{k}={toml_value(v)}" for k, v in curve.fixed.items())
        for value in curve.values:
            knob = f"policy.{curve.key}={toml_value(value)}"
            name = f"{policy.name}: {curve.label}"
            out.append(Setting(policy.name, name, curve.key, value, (base, *fixed, knob)))
    return out


def plan(
    exp: Experiment, names: Sequence[str] = ()
) -> tuple[list[tuple[Setting, Experiment]], list[LeftOut]]:
    """Every point to run on ``exp`` with its experiment, and the points left out with their reason."""
    runs: list[tuple[Setting, Experiment]] = []
    left: list[LeftOut] = []
    for policy in selected(names):
        for s in settings_of(policy, exp):
            try:
                runs.append((s, with_overrides(exp, s.overrides)))
            except SpecError as e:
                left.append(
                    LeftOut(s.policy, s.curve, s.knob, f"{e.key}: {e.message}" if e.key else e.message)
                )
    return runs, left


def mean_service_time(exp: Experiment) -> float | None:
    """The mean service time when it is one number for every policy (every node the same constant speed):
    the mean work over that speed; None otherwise. BadInput for pools, where the delay is the work."""
    pools = [c.name for c in exp.classes if c.discipline == "pool"]
    if pools:
        raise BadInput(
            f"{exp.source}: class {pools[0]!r} is a pool: a pool serves every task at once, so no policy "
            f"changes its delay; lbt frontier compares delays on fcfs or ps nodes (pools trade messages "
            f"for utility: lbt sweep plots it)"
        )
    speeds = set(exp.node_speeds)
    if len(speeds) != 1 or speed_varies(exp) or any(f.kind == "slow" for f in exp.faults):
        return None
    return exp.workload.service.mean / speeds.pop()


# ------------------------------------------------------------------------------------------- running


def run_frontier(exp: Experiment, options: FrontierOptions, say: Say) -> FrontierOutcome:
    """The frontier of ``exp``: every point simulated (and run on a cluster with ``options.cluster``),
    the frontiers found and the directory written. BadInput before anything runs (a pool, an unknown
    policy, nothing that runs, a cluster budget too small); Failed when a cluster run fails."""
    service = mean_service_time(exp)
    runs, left = plan(exp, options.policies)
    if not runs:
        reasons = "; ".join(f"{o.policy}: {o.reason}" for o in left)
        raise BadInput(f"{exp.source}: no policy runs on this spec ({reasons})")
    lengths = cluster_lengths(exp, options.cluster_minutes, len(runs)) if options.cluster else None
    for o in left:  # after the last check of the input: bad input is one line
        say(f"left out: {o.curve} {o.knob}".rstrip() + f": {o.reason}")
    cluster_runs = _cluster_checked(runs, lengths, options, left, say) if lengths else []
    directory = options.out or default_directory(f"frontier-{exp.name}")
    points = _simulate(runs, options, say)
    if cluster_runs:
        _on_cluster(points, cluster_runs, directory, options, say)
    delay = "mean_wait" if service is not None else "mean_sojourn"
    steps = {
        source: {m: envelope(measured(points, source, m, service)) for m in (delay, P99)}
        for source in ("simulation", *(["cluster"] if cluster_runs else []))
    }
    done = FrontierOutcome(exp, points, left, delay, service, steps, lengths, directory=directory)
    done.files = write(directory, done)
    return done


def _simulate(
    runs: Sequence[tuple[Setting, Experiment]], options: FrontierOptions, say: Say
) -> list[FrontierPoint]:
    pairs = [(list(s.overrides), e) for s, e in runs]
    what = "replications" if options.replications > 1 else "batch means"
    say(f"simulating {len(runs)} points ({options.replications} {what} each)")
    with (
        open_executor(options.executor, min(options.jobs, len(runs))) as executor,
        optional_progress(
            options.quiet, f"{runs[0][1].name}: frontier, simulated", len(runs), "points"
        ) as bar,
    ):
        done = simulate_points(
            pairs,
            executor,
            say,
            None if bar is None else bar.update,
            replications=options.replications,
            labels=[s.label for s, _ in runs],
        )
    return [FrontierPoint(s, p.result, p.theory) for (s, _), p in zip(runs, done, strict=True)]


def cluster_lengths(exp: Experiment, minutes: float, points: int) -> dict[str, float]:
    """The warm-up and window (model seconds) of every cluster point, so that ``points`` of them take
    about ``minutes`` of wall time at the spec's time scale; BadInput when the window would hold fewer
    than MIN_TASKS_PER_BATCH tasks per batch."""
    per_point = 60.0 * minutes / points
    wall = per_point - CLUSTER_OVERHEAD
    scale = exp.run.time_scale
    # arrivals cover the warm-up and the window, and on processor-sharing nodes a fifth of it more
    extra = 1.2 if any(c.discipline == "ps" for c in exp.classes) else 1.0
    model = max(0.0, wall) / scale
    warmup = _round(model * CLUSTER_WARMUP_SHARE)
    duration = _round((model - warmup) / extra)
    per_batch = exp.workload.arrival_rate * duration / exp.run.batches
    if per_batch < MIN_TASKS_PER_BATCH:
        raise BadInput(
            f"--cluster-minutes {minutes:g}: {points} points leave {per_point:.0f} s of wall time each, "
            f"{max(wall, 0.0):.0f} s of it for the load (the rest starts the cluster and writes its report): "
            f"{duration:g} model s at time_scale {scale:g}, {per_batch:.0f} tasks per batch where at least "
            f"{MIN_TASKS_PER_BATCH} are needed; give more minutes, fewer --policies or a larger "
            f"run.time_scale"
        )
    return {"minutes": minutes, "per_point_wall": per_point, "warmup": warmup, "duration": duration}


def _round(x: float) -> float:
    """Two significant digits, so that the lengths read as chosen, not computed."""
    return float(f"{x:.2g}") if x > 0 else 0.0


def _cluster_checked(
    runs: Sequence[tuple[Setting, Experiment]],
    lengths: dict[str, float],
    options: FrontierOptions,
    left: list[LeftOut],
    say: Say,
) -> list[tuple[int, Experiment]]:
    """Every point at the cluster's lengths, its time scale resolved and the pre-flight asked, before
    anything runs; a point the pre-flight refuses (without --force) or that is too large to send is left
    out of the cluster with the reason (it is still simulated)."""
    from lbtestbed.experiment.preflight import prepare

    out = []
    for i, (s, exp) in enumerate(runs):
        short = with_overrides(
            exp, [f"run.warmup={lengths['warmup']!r}", f"run.duration={lengths['duration']!r}"]
        )
        resolved, _, refusal = prepare(short, options.node_processes, options.force, _prefixed(say, s.label))
        refusal = refusal or run_size_problem(resolved)
        if refusal:
            left.append(LeftOut(s.policy, s.curve, s.knob, refusal, "cluster"))
            say(f"left out of the cluster: {s.label}: {refusal}")
            continue
        out.append((i, resolved))
    return out


def _prefixed(say: Say, label: str) -> Say:
    """``say`` with every line naming the point it is about."""
    return lambda line: say(f"{label}: {line}")


def _on_cluster(
    points: list[FrontierPoint],
    runs: Sequence[tuple[int, Experiment]],
    directory: Path,
    options: FrontierOptions,
    say: Say,
) -> None:
    """Run the cluster points one by one, each with its report under ``directory/cluster``: ``lbt run``
    with the simulation of its own tasks (the cluster's window is short, and its queues may not have
    settled: that simulation has the same start) but without the twin (it would cost as much as the run)."""
    pairs = [(list(points[i].setting.overrides), exp) for i, exp in runs]
    labels = [points[i].setting.label for i, _ in runs]
    name = runs[0][1].name
    with optional_progress(options.quiet, f"{name}: frontier, on the cluster", len(runs), "points") as bar:
        try:
            done = run_points(
                pairs,
                directory / "cluster",
                say,
                None if bar is None else bar.update,
                labels,
                simulate=True,
                twin=False,
                node_processes=options.node_processes,
            )
        except run_errors() as e:
            raise Failed(str(e)) from e
    for (i, _), p in zip(runs, done, strict=True):
        points[i].cluster, points[i].directory = p.result, p.directory
        points[i].same_tasks = p.extras.get("simulation")
