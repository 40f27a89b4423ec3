"""Many faults at once (issues 16 and 27): a seeded storm of overlapping kills, pauses, dispatcher restarts,
slow and failing nodes and message faults on a real cluster (``lbtestbed.experiment.chaos``). Afterwards
every task is accounted for, the drained dispatchers' picture equals the nodes' truth, and no process is
left. Then the nemesis (``lbtestbed.experiment.nemesis``): twenty seeded schedules, ten on each of two
supervised clusters, with crashes and stalls outside the spec's faults, checked by invariants on both sides
after each. benchmarks/bench_chaos.py and benchmarks/bench_soak.py run more seeds.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

import pytest
from test_cluster import fcfs_spec, write_spec

from lbtestbed.experiment.chaos import KINDS, chaos_faults, faults_toml, problems, run_chaos
from lbtestbed.experiment.nemesis import (
    BASE,
    LEAD,
    PLANNED,
    SEGMENT,
    NemesisOutcome,
    run_nemesis,
    segment_problems,
)
from lbtestbed.loadgen.journal import accounting
from lbtestbed.spec import load_spec, parse_spec

#: JSQ on 6 FCFS nodes in 3 node processes, two dispatchers, 150 tasks a second for 7 s of wall time
STORM = (
    fcfs_spec('name = "jsq"\ndispatchers = 2', count=6, load=0.5, duration=350, scale=0.02)
    + "\n[health]\noutlier_interval = 0.5\nejection_time = 0.5\n"
)
NODE_PROCESSES = 3
SEED = 16


def test_a_seeded_storm_leaves_every_task_accounted_for_and_the_picture_true(tmp_path: Path) -> None:
    """Eight faults, one of each kind, overlapping, over 7 s of load (``STORM``, schedule seed 16); the
    faults' switches all reach their processes (a stopped one answers once it continues)."""
    base = parse_spec(tomllib.loads(STORM))
    one_way = [k for k in base.policy.message_kinds() if k not in ("probe", "probe_reply")]
    faults = chaos_faults(base, NODE_PROCESSES, SEED, count=len(KINDS), one_way=one_way)
    assert sorted(f["kind"] for f in faults) == sorted(KINDS)  # one of each kind, overlapping in time
    assert any(a["until"] > b["at"] for a, b in itertools.pairwise(faults))
    exp = load_spec(write_spec(tmp_path, STORM + faults_toml(faults)))
    outcome = run_chaos(exp, tmp_path / "run", NODE_PROCESSES, lambda _: None)
    assert problems(outcome) == []
    assert outcome.load.outcomes["completed"] > 0.8 * outcome.load.scheduled
    assert [(a["target"], a["error"]) for a in outcome.actions if a["error"]] == []
    assert len(outcome.actions) == 2 * len(faults)


# ---------------------------------------------------------------------------------------------- the nemesis

#: ten schedules on each of two policies: JSQ (departure reports) and JIQ (idle tokens, held by one
#: dispatcher each)
NEMESIS_SEEDS = {"jsq": list(range(101, 111)), "jiq": list(range(111, 121))}


@pytest.fixture(scope="module", params=list(NEMESIS_SEEDS))
def nemesis(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> NemesisOutcome:
    policy = request.param
    base = BASE.replace("{policy}", policy)
    directory = tmp_path_factory.mktemp(f"nemesis-{policy}")
    return run_nemesis(base, NEMESIS_SEEDS[policy], 3, SEGMENT, directory, lambda _: None)


def test_every_invariant_holds_after_every_seeded_schedule(nemesis: NemesisOutcome) -> None:
    """Task by task from the journal, generator against dispatchers against nodes, and the policy's state
    healed at every segment's end (nemesis.segment_problems)."""
    problems = segment_problems(nemesis)
    assert len(problems) == len(nemesis.schedules) == 10
    assert [p for p in problems if p] == []
    # the journal as a whole: every task sent has exactly one fate, and none expired or was cancelled
    a = accounting(nemesis.events, sum(1 for e in nemesis.events if e["e"] in ("sent", "dropped")))
    assert a["holds"] and a["expired"] == a["cancelled"] == a["open"] == 0, a
    # and the cluster served through it all: tasks completed in every segment
    completed = [e["t"] for e in nemesis.events if e["e"] == "completed"]
    assert all(any(s.start <= t < s.end for t in completed) for s in nemesis.schedules)


def test_the_schedules_hit_every_kind_overlapping_and_at_start_up_and_restart(
    nemesis: NemesisOutcome,
) -> None:
    """What the ten schedules dealt, and that the run saw it: every kind of the spec's faults, overlapping;
    faults with the segment's first tasks; crashes and stalls outside the spec, among them crashes of a
    process starting again; every crash and stall seen as an unplanned outage of its process, and the
    crashed (or too long stalled) process started again by the supervision and serving at the end."""
    schedules, scale = nemesis.schedules, nemesis.exp.run.time_scale
    assert {k for s in schedules for k in s.drawn} == set(PLANNED)
    assert sum(s.at_start for s in schedules) >= 2
    assert all(
        min(f["at"] for f in s.faults) == pytest.approx(s.start + LEAD / scale)
        for s in schedules
        if s.at_start
    )
    overlapping = [
        s
        for s in schedules
        if any(a["at"] < b["until"] and b["at"] < a["until"] for a, b in itertools.combinations(s.faults, 2))
    ]
    assert len(overlapping) >= 5
    strikes = [x for s in schedules for x in s.strikes]
    assert {x.kind for x in strikes} == {"crash", "stall"} and any(x.starting for x in strikes)
    lag = 2 * (nemesis.exp.health.heartbeat + nemesis.exp.health.timeout) / scale  # checks to notice it
    for x in strikes:  # seen out (on its own, or within an outage its process was in already)
        seen = [o for o in nemesis.outages if o["process"] == x.process and o["start"] <= x.until + lag]
        seen = [o for o in seen if o["end"] is None or x.at <= o["end"]]
        assert seen, (x, [o for o in nemesis.outages if o["process"] == x.process])
    unplanned = [o for o in nemesis.outages if o["fault"] is None]
    crashes = [x for x in strikes if x.kind == "crash" and not x.starting]
    assert len(unplanned) >= len(crashes) > 0 and all(
        o["restarted"] for o in unplanned if o["cause"] == "dead"
    )
    assert all(o["end"] is not None for o in nemesis.outages)  # every process served again
    assert nemesis.leftover == []
