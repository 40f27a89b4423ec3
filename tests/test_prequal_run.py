"""``lbt run`` of Prequal on nodes whose speed changes while they run: the cluster against its twin.

Twelve ps nodes; six of them drop to half speed at model time 40 and ramp back to full speed over [70, 100)
(docs/spec.md, "Speed over time": timed speed changes that the node hosts and the simulator apply alike).
The dispatcher's outlier ejection for slowness is off (``health.slow_share = 0``): the run compares the
policy, not the health checks. The probes and their replies travel as state messages (``prequal_probe``,
``prequal_reply``), so the cluster counts what the simulation counts: 2 r_probe per task.

The setting is chosen for a paired verdict that can hold: Prequal's state has a long memory (each node's
window of recent latencies, the pool), so a cluster and its twin whose decisions part on one reply's
timing stay apart for long. At this load, six simulations of the same tasks with different policy streams
give mean sojourns within 1.58-1.72 (4 % of their mean); at load 0.5 they spread over 2.18-2.46
(docs/spec.md, "`prequal`", Long memory).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_run import lbt_run, verdict

SPEC = """name = "run-prequal"
seed = 7

[[classes]]
name = "a"
count = 6
discipline = "ps"
speed = 1.0

[[classes]]            # half speed from 40 on, then a ramp back to full speed over [70, 100)
name = "b"
count = 6
discipline = "ps"
speed = 1.0
speed_schedule = [
  { at = 40.0, factor = 0.5 },
  { start = 70.0, end = 100.0, to = 1.0, steps = 5 },
]

[workload]
load = 0.3
service = { dist = "exponential", mean = 1.0 }

[policy]
name = "prequal"

[run]
warmup = 10.0
duration = 100.0
time_scale = 0.3
batches = 10

[health]
slow_share = 0.0
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("prequal")
    spec = d / "spec.toml"
    spec.write_text(SPEC)
    _, doc, _ = lbt_run(spec, d / "report", timeout=300)
    assert isinstance(doc, dict)
    return doc


def test_the_cluster_agrees_with_its_twin(run: dict[str, Any]) -> None:
    """The paired batch-by-batch comparison (ten batches) of the cluster with the simulation of the same
    tasks under the delays it measured: sojourn, its tails and the messages agree."""
    for metric in ("mean_sojourn", "messages_per_task"):
        v = verdict(run, metric)
        assert v["paired"] and v["counts"] and v["verdict"] == "agrees", v
    for name in run["results"]["cluster"]["metrics"]["occupancy_tail"]:
        v = verdict(run, f"occupancy_tail[{name}]")
        assert v["verdict"] == "agrees", v
    load = run["results"]["cluster"]["load"]
    assert load["completed"] == load["scheduled"], load


def test_probes_and_replies_are_counted_as_messages(run: dict[str, Any]) -> None:
    """r_probe = 3: the simulation counts 3 probes and 3 replies for every task, exactly. The cluster
    counts a probe when it is sent and a reply when it arrives, so the replies of the probes out at the
    window's two ends (a few tasks' worth, at 12 tasks a wall second) fall on the other side."""
    sim = run["results"]["simulation"]["metrics"]["messages_per_task"]
    assert sim["by_kind"] == {"prequal_probe": 3.0, "prequal_reply": 3.0}
    cluster = run["results"]["cluster"]["metrics"]["messages_per_task"]["by_kind"]
    decided = sum(run["results"]["cluster"]["decisions"].values())
    assert cluster["prequal_probe"] * decided == pytest.approx(3 * decided, abs=3 * 2)
    assert cluster["prequal_reply"] * decided == pytest.approx(3 * decided, abs=3 * 10)


def test_decisions_come_from_the_pool(run: dict[str, Any]) -> None:
    """The pool empties only when no reply has come within max_age = 1 model second: at least when a task
    comes more than 1 s after the previous one, probability exp(-3.6) = 2.7 % at 3.6 tasks a second (b_reuse
    = 1 and r_remove = 1 take two probes per task, three replies come back). The uniform fallback stays a
    few per cent (at most 8 %: 360 tasks, 2.7 % expected, sd 0.85 %), and the rest is HCL's."""
    for source in ("cluster", "twin", "simulation"):
        decisions = run["results"][source]["decisions"]
        total = sum(decisions.values())
        assert decisions.get("random", 0) <= 0.08 * total, (source, decisions)
        assert set(decisions) <= {"hcl_cold", "hcl_hot", "random"}, (source, decisions)


def test_the_theory_gives_the_messages_only(run: dict[str, Any]) -> None:
    """``lbt predict``'s part: 2 r_probe messages per task, and no queue metric."""
    theory = run["results"]["theory"]["metrics"]
    assert theory["messages_per_task"]["value"] == 6.0
    assert theory["mean_sojourn"]["value"] is None
