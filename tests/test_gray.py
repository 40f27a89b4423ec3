"""Gray failures (issue 16, docs/faults.md): nodes that answer but serve slowly or fail some tasks.

- ``NodeModel.set_speed`` re-times the tasks in service exactly, for every discipline (hand-computed
  completion times);
- the simulator applies a spec's timed speed changes and fail faults (its sojourns are the exact ones of
  the speed profile, task by task);
- on a real cluster the node host applies them on the run's clock, the dispatcher ejects the slow node and
  the failing one (outlier detection) and takes them back, and every task is accounted for.
"""

from __future__ import annotations

import asyncio
import math
import time
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_cluster import scrape, write_spec
from test_hardening import health

from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.cluster.launcher import Cluster
from lbtestbed.experiment.fault_injector import Injector
from lbtestbed.loadgen.openloop import drive, poisson_tasks
from lbtestbed.model.conditions import SpeedChange, speed_changes
from lbtestbed.model.nodes import INF, make_node
from lbtestbed.model.reader import SpecError
from lbtestbed.model.workload import PoissonWorkload, Task
from lbtestbed.spec import load_spec, parse_spec

# ================================================================================= set_speed, exactly


def drain(node: Any, changes: list[tuple[float, float]]) -> list[tuple[int, float]]:
    """(task id, completion time) of every task at ``node``, with speed changes (time, speed) applied."""
    out = []
    changes = list(changes)
    while True:
        t = node.next_completion()
        if changes and changes[0][0] <= t:
            at, speed = changes.pop(0)
            node.set_speed(at, speed)
            continue
        if t == INF:
            return out
        out.append((node.complete(t).id, t))


def test_a_pool_serves_the_rest_of_each_task_at_the_new_speed() -> None:
    """Works 3 and 1 at time 0, speed 1; at time 0.5 speed 0.25: the second has 0.5 left (done at 2.5),
    the first 2.5 (done at 10.5); back to speed 1 at 4.5, when the first has 1.5 left: done at 6."""
    pool = make_node("pool", 1.0)
    pool.arrive(Task(1, 3.0, 0.0), 0.0)
    pool.arrive(Task(2, 1.0, 0.0), 0.0)
    assert drain(pool, [(0.5, 0.25), (4.5, 1.0)]) == [(2, 2.5), (1, 6.0)]


def test_processor_sharing_serves_the_rest_at_the_new_speed() -> None:
    """Works 2 and 4 at time 0, speed 1 (each served at 1/2); at time 1 (each has received 0.5) speed 2
    (each at 1): the first is done at 2.5, then the second (2 left) alone at speed 2: done at 3.5."""
    ps = make_node("ps", 1.0)
    ps.arrive(Task(1, 2.0, 0.0), 0.0)
    ps.arrive(Task(2, 4.0, 0.0), 0.0)
    assert [(k, pytest.approx(t, abs=1e-12)) for k, t in drain(ps, [(1.0, 2.0)])] == [(1, 2.5), (2, 3.5)]


def test_fcfs_serves_the_rest_of_the_task_in_service_and_the_queue_at_the_new_speed() -> None:
    """Works 2 and 3 at time 0, speed 1: the first is in service; at time 1 speed 0.5: its 1 left takes
    2 (done at 3), then the second takes 6 (done at 9)."""
    fcfs = make_node("fcfs", 1.0)
    fcfs.arrive(Task(1, 2.0, 0.0), 0.0)
    assert fcfs.arrive(Task(2, 3.0, 0.0), 0.0) is True  # it waits
    assert drain(fcfs, [(1.0, 0.5)]) == [(1, 3.0), (2, 9.0)]
    assert fcfs.time_at[2] == 3.0 and fcfs.time_at[1] == 6.0  # the occupancy integrals are unaffected


# ============================================================================ the simulator, exactly

ONE_POOL = """
name = "one-pool"
seed = 8
[[classes]]
name = "pool"
count = 1
discipline = "pool"
[workload]
arrival_rate = 2.0
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "random"
[run]
warmup = 0.0
duration = 60.0
batches = 4
[[faults]]
kind = "slow"
node = 0
speed = 0.25
at = 10.0
until = 30.0
"""


def finish(arrival: float, work: float, changes: tuple[SpeedChange, ...]) -> float:
    """When a task of ``work`` that arrives at ``arrival`` leaves a pool of speed 1 under ``changes``."""
    t, left, speed = arrival, work, 1.0
    for c in changes:
        if c.at <= t:
            speed = c.factor
            continue
        if left <= (c.at - t) * speed:
            break
        left -= (c.at - t) * speed
        t, speed = c.at, c.factor
    return t + left / speed


def test_the_simulator_applies_timed_speed_changes_exactly() -> None:
    """One pool, a slow fault to 0.25 over [10, 30): every task's sojourn is the one the speed profile
    gives its own arrival time and work (computed here from the spec's own seeded workload)."""
    exp = parse_spec(tomllib.loads(ONE_POOL))
    changes = speed_changes(exp)
    assert changes == (SpeedChange(10.0, 0, 0.25), SpeedChange(30.0, 0, 1.0))
    raw = Simulator(exp).run()
    workload = PoissonWorkload(exp)
    expected = []
    while (task := workload.next())[0] < exp.run.duration:
        a, w = task
        expected.append(finish(a, w, changes) - a)
    got = sorted(s for batch in raw.sojourns for s in batch)
    assert len(got) == len(expected) > 100
    assert got == pytest.approx(sorted(expected), rel=1e-9, abs=1e-12)


def test_the_simulator_fails_the_tasks_of_a_failing_node() -> None:
    """fail with fraction 1 over [10, 30) on the only node: exactly the tasks that reach it then fail (none
    of them completes), all the others complete."""
    doc = tomllib.loads(ONE_POOL.split("[[faults]]")[0])
    doc["faults"] = [{"kind": "fail", "node": 0, "fraction": 1.0, "at": 10.0, "until": 30.0}]
    exp = parse_spec(doc)
    sim = Simulator(exp)
    raw = sim.run()
    workload = PoissonWorkload(exp)
    arrivals = []
    while (task := workload.next())[0] < exp.run.duration:
        arrivals.append(task[0])
    inside = sum(1 for a in arrivals if 10.0 <= a < 30.0)
    assert sim.failed == inside > 20
    assert sum(len(b) for b in raw.sojourns) == len(arrivals) - inside


@pytest.mark.parametrize(
    ("fault", "key", "says"),
    [
        ({"kind": "slow", "node": 0, "speed": 1.5}, "faults[0].speed", "fraction of its speed"),
        ({"kind": "slow", "node": 0}, "faults[0].speed", "missing"),
        ({"kind": "fail", "node": 0, "fraction": 0}, "faults[0].fraction", "positive"),
        ({"kind": "fail", "node": 4, "fraction": 0.5}, "faults[0].node", "at most 0"),
    ],
)
def test_a_bad_gray_fault_is_one_line_naming_its_key(fault: dict[str, Any], key: str, says: str) -> None:
    doc = tomllib.loads(ONE_POOL.split("[[faults]]")[0])
    doc["faults"] = [{"at": 1.0, "until": 2.0, **fault}]
    with pytest.raises(SpecError) as err:
        parse_spec(doc, "g.toml")
    assert err.value.key == key and says in str(err.value), str(err.value)


def test_two_slow_faults_of_one_node_may_not_overlap() -> None:
    doc = tomllib.loads(ONE_POOL)
    doc["faults"].append({"kind": "slow", "node": 0, "speed": 0.5, "at": 20.0, "until": 40.0})
    with pytest.raises(SpecError, match="overlaps faults"):
        parse_spec(doc, "g.toml")


# ============================================================================== on a real cluster

SCALE = 0.02  # wall seconds per model second: a task of work 1 lasts 20 ms
GRAY = f"""
name = "gray"
seed = 4
[[classes]]
name = "pool"
count = 6
discipline = "pool"
[workload]
arrival_rate = 2.4
service = {{ dist = "exponential", mean = 1.0 }}
[policy]
name = "random"
[run]
warmup = 0.0
duration = 260.0
time_scale = {SCALE}
[health]
outlier_interval = 0.5
ejection_time = 0.5
[[faults]]
kind = "slow"
node = 0
speed = 0.25
at = 50.0
until = 175.0
[[faults]]
kind = "fail"
node = 3
fraction = 1.0
at = 50.0
until = 175.0
"""


async def run_with_origin(
    exp: Any, f: Any, path: Path, tasks: list[tuple[float, float]]
) -> tuple[Any, float]:
    """Drive ``tasks``, telling the node hosts the run's clock first as ``lbt run`` does; the report and
    the Unix time of model time 0."""
    origin = time.monotonic() + 0.3
    origin_unix = time.time() + 0.3
    async with aiohttp.ClientSession() as session:
        await Injector(exp, f, path, origin, lambda _: None).set_origin(session, origin_unix)
        report = await drive([f.dispatchers[0].url], tasks, exp.run.time_scale, start=origin)
    return report, origin_unix


def test_on_a_cluster_a_slow_node_and_a_failing_node_are_ejected_and_taken_back(tmp_path: Path) -> None:
    """Six pools under random routing, 120 tasks a second; over model times [50, 175) (1 s to 3.5 s of
    wall time) node 0 serves at a quarter of its speed and node 3 fails every task. The node host applies
    the speed change exactly (a task's stay at node 0 is its work / 1, / 0.25, or between for the few in
    service at a change); the dispatcher ejects node 0 for its speed and node 3 for its failures, routes
    nothing to them while they are out, takes both back, and they serve again after the faults; every task
    is completed or lost with node 3, as many as node 3 says it failed."""
    spec = write_spec(tmp_path, GRAY)
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=2)
        exp = f.experiment()
        tasks = list(poisson_tasks(exp, exp.run.duration))
        report, origin_unix = asyncio.run(run_with_origin(exp, f, tmp_path / "cluster.json", tasks))
        disp = f.dispatchers[0].url
        events = health(disp)["events"]
        nodes = scrape([h.url for h in f.node_hosts])
        failed = nodes.by("lbtestbed_node_failed_total", "node")
    out = report.outcomes
    assert out["completed"] + out["lost"] == report.scheduled == len(tasks), report.summary()
    assert {node for _, outcome, node in report.failures} == {3} and out["lost"] == failed["3"] > 0
    # the speed change, exactly: stay / work is 1, 4, or between for a task in service at a change
    ratios = [r.stay / r.work for r in report.records if r.node == 0]
    assert all(1 - 1e-9 <= x <= 4 + 1e-9 for x in ratios), max(ratios)
    assert sum(math.isclose(x, 4.0, rel_tol=1e-9) for x in ratios) > 5
    assert (
        sum(not math.isclose(x, 1.0, rel_tol=1e-9) and not math.isclose(x, 4.0, rel_tol=1e-9) for x in ratios)
        < 10
    )
    assert all(math.isclose(r.stay, r.work, rel_tol=1e-9) for r in report.records if r.node != 0)

    # ejections and take-backs, on the run's model clock
    def when(e: dict[str, Any]) -> float:
        return (e["unix_time"] - origin_unix) / SCALE

    for node, why in ((0, "served at"), (3, "failed in a row")):
        mine = [e for e in events if e["nodes"] == [node, node]]
        downs = [when(e) for e in mine if e["to"] == "down"]
        ups = [when(e) for e in mine if e["to"] == "up"]
        assert downs and all(why in e["reason"] for e in mine if e["to"] == "down"), mine
        assert downs[0] >= 50 and len(ups) == len(downs), mine
        for down, up in zip(downs, ups, strict=True):  # nothing routed there while it was out
            slack = 0.1 / SCALE  # a task is routed up to 0.1 s wall after its intended time
            routed = [r.t for r in report.records if r.node == node and down + slack < r.t < up - slack]
            assert routed == [], (node, down, up, routed)
        assert any(r.t > max(ups) and r.t > 175 for r in report.records if r.node == node), "not taken back"
    assert [e for e in events if e["nodes"] != [e["nodes"][0]] * 2] == [], "a whole process was marked down"
