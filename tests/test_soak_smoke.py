"""A short run of the soak benchmark (benchmarks/bench_soak.py): the real command and cluster, ~12 s of load.

Nothing here looks at speed or latency values. The test checks what the benchmark promises whatever the
machine's load: every task is accounted for and none is lost, the generator's chunks together sent exactly
the spec's Poisson arrivals over the run (counted here independently with ``poisson_tasks``, so a chunk
boundary that dropped or repeated a task fails), and every sample carries every field for every process.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from lbtestbed.loadgen.openloop import poisson_tasks
from lbtestbed.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]

#: what the benchmark's README promises for each sample
SAMPLE_FIELDS = {
    "interval",
    "t_s",
    "warmup",
    "rate_sent",
    "rate_scheduled",
    "scheduled",
    "sent",
    "dropped",
    "late",
    "lateness_p99_ms",
    "completed_in_interval",
    "sojourn_p50_ms",
    "sojourn_p99_ms",
    "gen_sent",
    "gen_completed",
    "gen_refused",
    "gen_lost",
    "gen_failed",
    "gen_in_flight",
    "disp_completed",
    "disp_refused",
    "disp_lost",
    "disp_in_flight",
    "node_tasks",
    "balance_ok",
    "balance_note",
    "generator_objects",
    "processes",
}
PROCESSES = {"dispatcher-0", "nodes-0", "nodes-1", "generator"}
EXACT_CHECKS = (  # the end-of-run balance: each must have run, not only passed
    "dispatchers' completed = generator's",
    "dispatchers' lost = generator's",
    "no task lost or failed",
    "balance at every sample",
)


def test_a_short_soak_run_accounts_for_every_task(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    seconds, sample, rate = 12.0, 3.0, 60.0
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_soak.py"),
        "--minutes",
        str(seconds / 60),
        "--sample-seconds",
        str(sample),
        "--rate",
        str(rate),
        "--node-processes",
        "2",
        "--out",
        str(out),
        "--json",
        "--quiet",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    result = json.loads(proc.stdout)

    assert result["ok"] is True and not result["interrupted"]
    names = {c["check"] for c in result["checks"]}
    for wanted in EXACT_CHECKS:
        assert wanted in names, f"check {wanted!r} did not run: {sorted(names)}"
    assert all(c["ok"] for c in result["checks"]), result["checks"]

    # every task scheduled came back completed (nothing refused at the default task limit, nothing lost)
    tasks = result["summary"]["tasks"]
    assert tasks["lost"] == 0 and tasks["failed"] == 0 and tasks["dropped"] == 0
    assert tasks["completed"] == tasks["scheduled"] == tasks["sent"]

    # the chunks together are exactly the spec's arrivals before the run's end, no more, no fewer
    config = result["config"]
    exp = load_spec(config["spec"], config["overrides"])
    assert abs(exp.workload.arrival_rate / exp.run.time_scale - rate) < 1e-9 * rate
    horizon = config["intervals"] * sample / exp.run.time_scale  # model seconds
    assert tasks["scheduled"] == sum(1 for t, _ in poisson_tasks(exp, horizon) if t < horizon)

    samples = result["samples"]
    assert [s["interval"] for s in samples] == list(range(config["intervals"]))
    for s in samples:
        assert set(s) >= SAMPLE_FIELDS, f"sample {s['interval']} lacks {SAMPLE_FIELDS - set(s)}"
        assert set(s["processes"]) == PROCESSES
        for name, p in s["processes"].items():
            assert p is not None, f"{name} gone at sample {s['interval']}"
            assert p["rss_mb"] > 0 and p["fds"] >= 3 and p["cpu_s"] >= 0, (name, p)
        assert s["balance_ok"], s["balance_note"]
        # the generator's own balance at the sample instant
        assert s["gen_sent"] == (
            s["gen_completed"] + s["gen_refused"] + s["gen_lost"] + s["gen_failed"] + s["gen_in_flight"]
        )
        assert s["gen_lost"] == s["disp_lost"] == 0
    # the per-chunk counts add up to the run's; the live count of requests never runs ahead of them
    assert sum(s["sent"] for s in samples) == tasks["sent"]
    assert samples[-1]["gen_sent"] <= tasks["sent"]
    assert sum(s["completed_in_interval"] for s in samples) <= tasks["completed"]

    with open(out / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(samples)
    assert {f"{p}_{w}" for p in PROCESSES for w in ("rss_mb", "fds", "cpu_s")} <= set(rows[0])
    assert (out / "soak.png").stat().st_size > 10_000
    assert json.loads((out / "summary.json").read_text())["summary"] == result["summary"]
