"""Many faults at once (issue 16): a seeded storm of overlapping kills, pauses, dispatcher restarts, slow
and failing nodes and message faults on a real cluster (``lbtestbed.experiment.chaos``). Afterwards
every task is accounted for, the drained dispatchers' picture equals the nodes' truth, and no process is
left. This is the short storm of CI; benchmarks/bench_chaos.py runs long ones over many seeds.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

from test_cluster import fcfs_spec, write_spec

from lbtestbed.experiment.chaos import KINDS, chaos_faults, faults_toml, problems, run_chaos
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
