"""The load generator's ``/metrics`` (lbtestbed.loadgen.metrics): the summary's numbers, live.

Histogram buckets are counted by hand from the values put in; the counts are compared with the report's
own summary after a real run against a sink; a send loop held on purpose shows as ``behind_seconds``; and
``lbt load --metrics-port`` serves them, refuses a bad port in one line, and fails in one line on a port
that is taken. The Prometheus side (scraping, the alert) is in tests/test_prometheus.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_loadgen import SPEC, _serve, sink, write_spec  # noqa: F401 (sink: a fixture)

from lbtestbed.loadgen.metrics import LoadCollector, registry_for
from lbtestbed.loadgen.openloop import LoadReport, drive, poisson_tasks
from lbtestbed.spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def scrape(collector: LoadCollector) -> Samples:
    return samples(generate_latest(registry_for(collector)).decode())


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def test_the_histograms_hold_what_was_put_in_counted_by_hand() -> None:
    r = LoadReport(scheduled=9)
    # wall seconds; the bounds are 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500 ms, 1, 2.5, 5, 10, 30 s
    r.lateness = [0.0001, 0.0015, 0.002, 0.0021, 0.3, 12.0, 40.0]
    r.late = 4  # the last four are more than 2 ms late, as drive counts them
    r.outcomes.update(completed=3, refused=1, expired=1, dropped=2)
    r.sojourns = [0.05, 1.0, 3.0]  # model seconds; the spec's buckets below are multiples of 1.0
    r.other_sojourns = [("refused", 0.2), ("expired", 300.0)]
    found = scrape(LoadCollector(r, 1.0, [0.1, 1.0, 10.0]))
    lat = {
        le: value(found, "lbtestbed_loadgen_lateness_seconds_bucket", le=le)
        for le in ("0.002", "0.5", "+Inf")
    }
    assert lat == {"0.002": 3.0, "0.5": 5.0, "+Inf": 7.0}
    assert value(found, "lbtestbed_loadgen_lateness_seconds_bucket", le="10.0") == 5.0
    assert value(found, "lbtestbed_loadgen_lateness_seconds_bucket", le="30.0") == 6.0
    assert abs(value(found, "lbtestbed_loadgen_lateness_seconds_sum") - 52.3057) < 1e-9
    # the late sends are exactly the lateness count above the 2 ms bucket
    count = value(found, "lbtestbed_loadgen_lateness_seconds_count")
    assert value(found, "lbtestbed_loadgen_late_sends_total") == count - lat["0.002"] == 4
    assert value(found, "lbtestbed_loadgen_tasks_sent_total") == 7 - 2  # reached minus dropped
    assert value(found, "lbtestbed_loadgen_tasks_total", outcome="dropped") == 2
    assert value(found, "lbtestbed_loadgen_tasks_total", outcome="unsent") == 0
    assert value(found, "lbtestbed_loadgen_tasks_outstanding") == 5 - 5  # sent minus ended
    soj = "lbtestbed_loadgen_sojourn_model_seconds_bucket"
    assert [value(found, soj, outcome="completed", le=le) for le in ("0.1", "1.0", "10.0", "+Inf")] == [
        1.0, 2.0, 3.0, 3.0,
    ]  # fmt: skip
    assert value(found, soj, outcome="refused", le="1.0") == 1.0
    assert value(found, soj, outcome="expired", le="10.0") == 0.0
    assert value(found, soj, outcome="expired", le="+Inf") == 1.0
    assert value(found, "lbtestbed_loadgen_sojourn_model_seconds_count", outcome="lost") == 0.0
    assert value(found, "lbtestbed_loadgen_behind_seconds") == 0.0  # nothing left to send
    # the standard collectors ride along
    assert value(found, "process_cpu_seconds_total") > 0 and ("python_info" in {k[0] for k in found})


def test_values_that_arrive_between_scrapes_are_binned_once() -> None:
    r = LoadReport()
    collector = LoadCollector(r, 1.0, [1.0])
    r.lateness += [0.001, 0.003]
    first = scrape(collector)
    r.lateness += [0.004, 0.0001]
    second = scrape(collector)
    third = scrape(collector)
    bucket = "lbtestbed_loadgen_lateness_seconds_bucket"
    assert value(first, bucket, le="0.002") == 1 and value(first, bucket, le="+Inf") == 2
    assert value(second, bucket, le="0.002") == value(third, bucket, le="0.002") == 2
    assert value(second, bucket, le="+Inf") == value(third, bucket, le="+Inf") == 4


async def test_after_a_run_the_metrics_agree_with_the_summary() -> None:
    exp = parse_spec(SPEC)
    tasks = list(poisson_tasks(exp, 0.6))
    runner, url = await _serve(0.0)
    report = LoadReport()
    collector = LoadCollector(report, 1.0, [0.01, 0.1])
    try:
        done = await drive([url], tasks, 1.0, max_outstanding=10_000, report=report)
    finally:
        await runner.cleanup()
    assert done is report
    s = report.summary()
    found = scrape(collector)
    assert value(found, "lbtestbed_loadgen_tasks_scheduled") == s["scheduled"] == len(tasks) > 100
    assert value(found, "lbtestbed_loadgen_tasks_sent_total") == s["sent"]
    assert value(found, "lbtestbed_loadgen_late_sends_total") == s["late_sends"]
    for outcome in ("completed", "refused", "lost", "dropped", "failed", "expired", "cancelled", "unsent"):
        assert value(found, "lbtestbed_loadgen_tasks_total", outcome=outcome) == s[outcome], outcome
    n = value(found, "lbtestbed_loadgen_sojourn_model_seconds_count", outcome="completed")
    total = value(found, "lbtestbed_loadgen_sojourn_model_seconds_sum", outcome="completed")
    assert n == s["completed"] and abs(total / n - float(s["mean_sojourn"])) < 1e-9  # type: ignore[arg-type]
    assert value(found, "lbtestbed_loadgen_tasks_outstanding") == 0


def test_a_held_send_loop_shows_how_far_behind_it_is() -> None:
    """The progress callback runs in the send loop: holding it holds every send. A scrape after 1 s of
    holding sees the loop at least 1 s behind, whatever else the machine does."""
    exp = parse_spec(SPEC)
    tasks = list(poisson_tasks(exp, 3.0))
    report = LoadReport()
    collector = LoadCollector(report, 1.0, [0.1])
    holding, release = threading.Event(), threading.Event()

    def hold(done: int, total: int) -> None:
        if not holding.is_set():
            holding.set()
            release.wait(30)

    async def run() -> None:
        runner, url = await _serve(0.0)
        try:
            await drive([url], tasks, 1.0, progress=hold, report=report)
        finally:
            await runner.cleanup()

    loader = threading.Thread(target=lambda: asyncio.run(run()))
    loader.start()
    try:
        assert holding.wait(30), "the loop never reported progress"
        time.sleep(1.0)
        behind = value(scrape(collector), "lbtestbed_loadgen_behind_seconds")
    finally:
        release.set()
        loader.join(60)
    assert behind >= 1.0
    assert value(scrape(collector), "lbtestbed_loadgen_behind_seconds") == 0.0  # done: nothing is due


# --------------------------------------------------------------------------------------------- CLI


def lbt_popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lbtestbed.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_load_serves_its_metrics_on_the_port_it_prints(tmp_path: Path, sink: str) -> None:  # noqa: F811
    spec = write_spec(tmp_path / "spec.toml")
    proc = lbt_popen(
        "load", str(spec), "--dispatcher", sink, "--metrics-port", "0", "--duration", "3", "--json"
    )
    assert proc.stderr is not None
    line = ""
    while "metrics" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "lbt load ended without printing its metrics URL"
    url = re.search(r"http://127\.0\.0\.1:\d+/metrics", line)
    assert url, line
    with urllib.request.urlopen(url.group(0), timeout=10) as resp:
        found = samples(resp.read().decode())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert value(found, "lbtestbed_loadgen_tasks_scheduled") == json.loads(out)["scheduled"] > 1000
    assert ("process_open_fds", ()) in found and ("lbtestbed_time_scale", ()) in found


def test_cli_load_refuses_a_bad_port_and_fails_on_a_taken_one(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.toml")
    nowhere = "http://127.0.0.1:1"
    load = [sys.executable, "-m", "lbtestbed.cli", "load", str(spec), "--dispatcher", nowhere]
    bad = subprocess.run([*load, "--metrics-port", "70000"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--metrics-port 70000" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = subprocess.run([*load, "--metrics-port", port], capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1, busy.stderr
    assert busy.stderr.strip().splitlines()[-1].startswith(f"lbt: error: --metrics-port {port}: ")
    assert "Traceback" not in busy.stderr
