"""A bug the twin cannot see: a node host whose completion timers fire late (docs/run.md, "Legs held against
the machine").

The node hosts take a test-only hook, ``LBT_TEST_TIMER_LATE`` (a share of each completion timer's wait added
to it: the timer fires late by that share of the remaining service), which ``lbt run`` passes on to the
processes it starts. The twin replays the late replies as measured, so the cluster agrees with it; the legs
held against the machine do not: the completion-to-reply legs are beyond what the machine explains, the run
is not faithful, and ``lbt run`` does not exit 0. The same run without the hook keeps every leg within.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# pools under random routing: nothing queues, so the completion's timer is all there is between a task's
# service and its reply; at time_scale 0.5 a task serves 0.5 wall s on average, and 5 % of it is 25 ms
SPEC = """
name = "late-timer"
seed = 11
[[classes]]
name = "pools"
count = 8
discipline = "pool"
[workload]
arrival_rate = 8.0
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "random"
[run]
warmup = 1.0
duration = 16.0
time_scale = 0.5
batches = 8
tolerance = "off"
"""


def lbt_run(tmp: Path, late: float | None) -> tuple[int, dict[str, Any]]:
    spec = tmp / "spec.toml"
    spec.write_text(SPEC)
    env = {**os.environ}
    env.pop("LBT_TEST_TIMER_LATE", None)
    if late is not None:
        env["LBT_TEST_TIMER_LATE"] = str(late)
    proc = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "run", str(spec), "--out", str(tmp / "out"), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("late", [None, 0.05], ids=["on-time", "late-by-5-percent"])
def test_a_late_completion_timer_fails_the_run_and_only_then(tmp_path: Path, late: float | None) -> None:
    code, doc = lbt_run(tmp_path, late)
    legs = {leg["leg"]: leg for leg in doc["legs"]["legs"]}
    if late is None:
        assert doc["legs"]["explained"], legs  # every leg within what the machine explains
        return
    # the replies wait for the late timers: the completion-to-reply legs are named, and the run fails
    assert not doc["legs"]["explained"] and doc["faithful"] is False
    assert legs["notify"]["beyond"] and legs["reply"]["beyond"]
    assert code != 0
