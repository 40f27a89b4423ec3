"""``lbt simulate --records FILE``: one CSV row per task, with the simulator's exact times.

The rows are checked against what can be computed without the simulator: on a single FCFS server every
task starts at the later of its arrival and the previous departure and leaves its work later (Lindley's
recurrence); in a pool it starts on arrival and leaves work / speed later. The counts are checked against
the simulation's own result, and the same run with and without records gives the same result.
"""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lbtestbed.analysis.results.result import summarize
from lbtestbed.analysis.simulator.engine import Simulator
from lbtestbed.analysis.simulator.records import (
    COLUMNS,
    RecordingSimulator,
    simulate_with_records,
    write_records,
)
from lbtestbed.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]


def spec(
    discipline: str, count: int, policy: str, *, load: float = 0.7, speed: float = 1.0
) -> dict[str, Any]:
    return {
        "name": "records",
        "seed": 3,
        "classes": [{"name": "c", "count": count, "discipline": discipline, "speed": speed}],
        "workload": {"load": load, "service": {"dist": "exponential", "mean": 1.0}},
        "policy": {"name": policy},
        "run": {"warmup": 5.0, "duration": 60.0, "batches": 4},
    }


def rows_of(data: dict[str, Any]) -> tuple[list[dict[str, str]], Simulator]:
    sim = RecordingSimulator(parse_spec(data))
    sim.run()
    out = io.StringIO()
    write_records(out, sim.rows())
    return list(csv.DictReader(io.StringIO(out.getvalue()))), sim


def test_one_fcfs_server_follows_lindleys_recurrence() -> None:
    rows, _ = rows_of(spec("fcfs", 1, "random"))
    assert len(rows) > 30
    last_departure = 0.0
    for i, r in enumerate(rows):
        assert int(r["task"]) == i and r["node"] == "0" and r["outcome"] == "completed"
        arrival, work = float(r["arrival"]), float(r["work"])
        start = max(arrival, last_departure)
        assert float(r["node_arrival"]) == float(r["routed"]) == arrival  # no network delay
        assert float(r["service_start"]) == pytest.approx(start, abs=1e-9)
        assert float(r["departure"]) == pytest.approx(start + work, abs=1e-9)
        assert float(r["sojourn"]) == pytest.approx(float(r["departure"]) - arrival, abs=1e-12)
        last_departure = float(r["departure"])


def test_in_a_pool_every_task_starts_on_arrival_and_takes_its_work_over_the_speed() -> None:
    rows, _ = rows_of(spec("pool", 3, "round_robin", load=2.0, speed=2.0))
    first = int(rows[0]["node"])
    for i, r in enumerate(rows):
        assert int(r["node"]) == (first + i) % 3  # round robin: the nodes in turn
        assert float(r["service_start"]) == float(r["arrival"])
        assert float(r["sojourn"]) == pytest.approx(float(r["work"]) / 2.0, rel=1e-12)


def test_the_counts_and_the_mean_sojourn_are_the_simulations() -> None:
    exp = load_spec(ROOT / "examples" / "power_of_d_jsq2.toml", ["run.duration=200", "run.warmup=20"])
    out = io.StringIO()
    raw = simulate_with_records(exp, out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert tuple(rows[0]) == COLUMNS
    measured = [r for r in rows if int(r["batch"]) >= 0]
    # every task of the window arrived in it, and is followed to its completion
    assert {r["outcome"] for r in measured} == {"completed"}
    assert all(exp.run.warmup <= float(r["arrival"]) < exp.run.warmup + exp.run.duration for r in measured)
    assert all(not exp.run.warmup <= float(r["arrival"]) < 220 for r in rows if int(r["batch"]) < 0)
    assert [int(r["task"]) for r in rows] == list(range(len(rows)))
    result = summarize(exp, [raw]).to_json()["metrics"]
    # mean sojourn from the rows: the simulation's batch means put together (batches are equal in length)
    sojourns = [float(r["sojourn"]) for r in measured]
    assert math.fsum(sojourns) / len(sojourns) == pytest.approx(result["mean_sojourn"]["value"], rel=1e-9)
    assert {r["rule"] for r in rows} == {"probed"}
    # the tasks the simulation counted in the window, batch by batch (its messages-per-task denominators)
    arrivals = raw.ratios["messages_per_task"][1]
    assert [sum(1 for r in measured if int(r["batch"]) == b) for b in range(len(arrivals))] == list(arrivals)


def test_recording_changes_nothing_in_the_run() -> None:
    exp = load_spec(ROOT / "examples" / "jiq.toml", ["run.duration=100", "run.warmup=10"])
    plain = summarize(exp, [Simulator(exp).run()]).to_json()["metrics"]
    recorded = summarize(exp, [simulate_with_records(exp, io.StringIO())]).to_json()["metrics"]
    assert json.dumps(plain, sort_keys=True) == json.dumps(recorded, sort_keys=True)


def lbt(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_cli_writes_the_records_and_refuses_a_bad_path_before_simulating(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(
        'name = "tiny"\nseed = 1\n[[classes]]\nname = "c"\ncount = 2\ndiscipline = "fcfs"\n'
        '[workload]\nload = 0.5\nservice = { dist = "exponential", mean = 1.0 }\n[policy]\nname = "jsq"\n'
        "[run]\nwarmup = 0.0\nduration = 40.0\nbatches = 4\n"
    )
    done = lbt(tmp_path, "simulate", "s.toml", "--records", "r.csv", "--json", "--quiet")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    # load 0.5 on 2 servers: 1 task per model second, 40 s measured: Poisson(40), 4 sd
    measured = [r for r in rows if int(r["batch"]) >= 0]
    assert abs(len(measured) - 40) < 4 * math.sqrt(40)
    for bad, why in (("missing/r.csv", "No such file or directory"), (".", "Is a directory")):
        out = lbt(tmp_path, "simulate", "s.toml", "--records", bad)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.splitlines() == [f"lbt: error: --records {bad}: {why}"]  # no progress: not run
    both = lbt(tmp_path, "simulate", "s.toml", "--records", "r2.csv", "--replications", "2")
    assert both.returncode == 2 and "--replications" in both.stderr and not (tmp_path / "r2.csv").exists()
