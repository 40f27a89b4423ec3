"""locust as a load generator: ``lbt load --locust`` against a real cluster, the open loop that does not wait,
the closed loop that does (the caveat of docs/load.md), the load shape's user counts, options passed through
to locust, a master and two workers sharing the plan, and a restart from the web UI's HTTP API.

locust runs in child processes only: importing it here would monkey-patch this process for gevent.
"""

from __future__ import annotations

import asyncio
import csv
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.loadgen.locust_run import LOCUSTFILE
from lbtestbed.loadgen.plan import LEAD_IN, build_plan, closed_users
from lbtestbed.spec import load_spec
from lbtestbed.transport.cluster_file import ClusterFile, Endpoint

#: 4 pools (infinite servers, so no task waits) and 2 dispatchers (arrivals split at random); 150 tasks
#: per wall second for 2 s, each holding its pool for 50 ms of wall time on average
CLUSTER_SPEC = """
name = "locust"
seed = 4
[[classes]]
name = "pools"
count = 4
discipline = "pool"
[workload]
arrival_rate = 7.5
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "random"
dispatchers = 2
[run]
warmup = 0.0
duration = 40.0
time_scale = 0.05
"""

#: the target of the slow-server tests below: 100 tasks per second for 2 s, time in wall seconds
SLOW_SPEC = """
name = "slow"
seed = 9
[[classes]]
name = "a"
count = 1
discipline = "pool"
[workload]
arrival_rate = 100.0
service = { dist = "deterministic", mean = 1.0 }
[policy]
name = "random"
[run]
warmup = 0.0
duration = 2.0
time_scale = 1.0
"""
HOLD = 0.5  # wall seconds the slow server keeps every task


def lbt(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "lbtestbed.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def dispatcher_tasks(url: str) -> dict[str, float]:
    """``lbtestbed_dispatcher_tasks_total`` of one dispatcher, by outcome."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "lbtestbed_dispatcher_tasks_total":
                out[s.labels["outcome"]] = s.value
    return out


def test_locust_tasks_are_counted_by_the_dispatchers(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(CLUSTER_SPEC)
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=2)
        out = lbt("load", str(spec), "--cluster", str(cluster.path), "--locust", "--json", "--quiet")
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        counted = [dispatcher_tasks(d.url) for d in f.dispatchers]
    # locust sent the spec's tasks: the same ones lbt load would send
    plan = build_plan(load_spec(spec), dispatchers=["http://unused", "http://unused-too"])
    assert summary["generator"] == "locust" and summary["mode"] == "open"
    assert summary["scheduled"] == summary["completed"] == len(plan.tasks)
    # each dispatcher completed the tasks the spec's split sends it, as lbt load and the simulator split them
    completed = [c.get("completed", 0.0) for c in counted]
    assert completed == [plan.routes.count(0), plan.routes.count(1)]
    assert 0 < plan.routes.count(0) < len(plan.tasks)
    assert all(c.get("refused", 0.0) == c.get("lost", 0.0) == 0.0 for c in counted)
    assert summary["locust_requests"] == len(plan.tasks) and summary["locust_failures"] == 0


# ------------------------------------------------------------------------ open and closed loops


class SlowServer:
    """A dispatcher stand-in that holds every task for ``hold`` seconds; it counts tasks and the most at once,
    and keeps each task's arrival (Unix time) and work."""

    def __init__(self, hold: float = HOLD) -> None:
        self.hold = hold
        self.tasks = 0
        self.open = 0
        self.peak = 0
        self.arrivals: list[tuple[float, float]] = []
        self.loop = asyncio.new_event_loop()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _task(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.arrivals.append((time.time(), float(body["work"])))
        self.tasks += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            await asyncio.sleep(self.hold)
        finally:
            self.open -= 1
        return web.json_response({"node": 0, "arrived": 0.0, "completed": self.hold, "waited": False})

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/tasks", self._task)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())

    def __enter__(self) -> SlowServer:
        self.thread.start()
        assert self.ready.wait(10), "the slow server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[tuple[SlowServer, Path]]:
    spec = tmp_path / "slow.toml"
    spec.write_text(SLOW_SPEC)
    with SlowServer() as server:
        yield server, spec


def test_open_mode_keeps_sending_while_tasks_are_slow(slow: tuple[SlowServer, Path]) -> None:
    server, spec = slow
    csv_prefix, html = spec.with_name("out"), spec.with_name("report.html")
    out = lbt(
        "load", str(spec), "--dispatcher", server.url, "--locust", "--json", "--quiet",
        "--", "--csv", str(csv_prefix), "--html", str(html),  # passed through to locust
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    sent = len(build_plan(load_spec(spec), dispatchers=[server.url]).tasks)  # Poisson, mean 200
    assert summary["sent"] == summary["completed"] == server.tasks == sent
    # locust wrote its own statistics where the options passed through told it to
    with open(f"{csv_prefix}_stats.csv", newline="") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    assert int(rows["Aggregated"]["Request Count"]) == sent
    assert "<html" in html.read_text().lower()
    # Tasks in the server at a time are an M/D/inf count, Poisson with mean 100 x HOLD = 50 once the
    # first HOLD has passed; P(Poisson(50) <= 25) < 1e-4, so an open loop peaks above 25. A loop that
    # waited for replies would hold one at a time.
    assert server.peak > 25


def test_closed_mode_lets_a_slow_system_lower_its_load(slow: tuple[SlowServer, Path]) -> None:
    server, spec = slow
    users = 5
    out = lbt(
        "load", str(spec), "--dispatcher", server.url, "--locust", "--locust-mode", "closed",
        "--locust-users", str(users), "--json", "--quiet",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    # each user holds one task at a time, HOLD seconds each: over the 2 s schedule (its shape checks once a
    # second, so up to 1 s more) a user sends at most 3 / HOLD + 1 tasks, far below the ~200 asked for
    assert summary["mode"] == "closed" and summary["expected"] == pytest.approx(200.0)
    assert server.peak <= users
    assert summary["sent"] <= users * (3 / HOLD + 1)
    assert summary["completed"] == summary["sent"]
    assert summary["late_sends"] is None  # no intended times in a closed loop


@pytest.mark.parametrize("generator", ["lbt", "locust"])
def test_an_auto_time_scale_is_the_clusters_for_either_generator(
    slow: tuple[SlowServer, Path], generator: str
) -> None:
    """``run.time_scale = "auto"``: ``lbt load`` sends at the scale the cluster was started with (its
    cluster file's experiment), locust's processes as much as its own loop."""
    server, spec = slow
    auto = spec.with_name("auto.toml")
    auto.write_text(SLOW_SPEC.replace("time_scale = 1.0", 'time_scale = "auto"'))
    cluster = spec.with_name("cluster.json")
    running = load_spec(auto, ["run.time_scale=0.5"])  # the scale the cluster was started with
    ClusterFile.of(
        running, token="t", dispatchers=[Endpoint("dispatcher", 0, server.url)], node_hosts=[]
    ).save(cluster)
    args = ["load", str(auto), "--cluster", str(cluster), "--dispatcher", server.url, "--json", "--quiet"]
    out = lbt(*args, *(["--locust"] if generator == "locust" else []))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["completed"] == server.tasks > 0
    # model seconds are wall seconds over the time scale the load ran at: the cluster's, not auto's 1.0
    assert summary["model_seconds"] == pytest.approx(summary["wall_seconds"] / 0.5)


# ------------------------------------------------------------------------------- the load shape


def test_closed_users_follow_the_schedule(tmp_path: Path) -> None:
    spec = tmp_path / "slow.toml"
    spec.write_text(SLOW_SPEC)  # time scale 1: model seconds are wall seconds
    plan = build_plan(
        load_spec(spec), mode="closed", schedule="2@1, 2@0->2, 1@0.5", users=10, dispatchers=["http://x"]
    )
    # (times away from the segment boundaries, where the float sum LEAD_IN + t may land on either side)
    at = {t: closed_users(plan, LEAD_IN + t) for t in (0.0, 1.9, 2.02, 2.5, 3.0, 3.99, 4.2, 5.01, 9.0)}
    assert at == {0.0: 10, 1.9: 10, 2.02: 0, 2.5: 5, 3.0: 10, 3.99: 20, 4.2: 5, 5.01: None, 9.0: None}
    assert plan.think == pytest.approx(10 / 100.0)  # 10 users x 10 tasks/s each at zero response time


def test_the_locustfile_rejects_a_bad_spec_in_one_line(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", "http://127.0.0.1:1",
        "--lbt-spec", str(tmp_path / "missing.toml"),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    missing = tmp_path / "missing.toml"
    assert errors == [f"lbt locustfile: error: {missing}: cannot read: No such file or directory"]


# ------------------------------------------------------------------ distributed, and the web UI's restart

#: 100 tasks per wall second for 3 s (a Poisson count of mean 300), each answered at once
DIST_SPEC = SLOW_SPEC.replace('name = "slow"', 'name = "dist"').replace("seed = 9", "seed = 11")
DIST_SPEC = DIST_SPEC.replace("duration = 2.0", "duration = 3.0")
SPAN = 3.0  # wall seconds of arrivals (time scale 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def locust(*args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "WARNING", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_a_master_and_two_workers_send_the_plan_once_and_stop_together(tmp_path: Path) -> None:
    spec = tmp_path / "dist.toml"
    spec.write_text(DIST_SPEC)
    report = tmp_path / "summary.json"
    port = str(free_port())
    with SlowServer(hold=0.0) as sink:
        # the workers get nothing but the master's address: the spec, the duration and the host come from it
        master = locust(
            "--master", "--headless", "--expect-workers", "2", "--master-bind-host", "127.0.0.1",
            "--master-bind-port", port, "--host", sink.url, "--lbt-spec", str(spec),
            "--lbt-duration", f"{SPAN:g}", "--lbt-drain", "10", "--lbt-report", str(report),
        )  # fmt: skip
        workers = [locust("--worker", "--master-host", "127.0.0.1", "--master-port", port) for _ in range(2)]
        try:
            master.wait(90)
            for w in workers:
                w.wait(30)  # they quit with the master
        finally:
            stop_all([master, *workers])
        arrivals = list(sink.arrivals)
    assert master.returncode == 0, master.stderr.read().decode() if master.stderr else ""
    assert [w.returncode for w in workers] == [0, 0]
    summary = json.loads(report.read_text())
    plan = build_plan(load_spec(spec), duration=SPAN, dispatchers=[sink.url])
    n = len(plan.tasks)
    # the spec's count: Poisson with mean 100/s x 3 s = 300; its central 99.9% interval is [245, 359]
    # (scipy.stats.poisson(300).ppf(0.0005), .ppf(0.9995)); a worker running a plan of its own duration, or
    # two workers each sending the whole plan, would land outside it
    assert 245 <= len(arrivals) <= 359
    # exactly the plan's tasks, each once: the works the sink received are the plan's works
    assert sorted(w for _, w in arrivals) == sorted(w for _, w in plan.tasks)
    assert summary["scheduled"] == summary["completed"] == summary["locust_requests"] == n
    # worker i sent tasks i, i + 2, ...: shares of ceil(n / 2) and floor(n / 2)
    rows = summary["workers"]
    halves = [(0, (n + 1) // 2, (n + 1) // 2), (1, n // 2, n // 2)]
    assert [(r["index"], r["sent"], r["completed"]) for r in rows] == halves
    # they stopped together at the duration: each worker's last send (wall seconds from the common time
    # zero) was at or after its share's last intended time and within a second of the 3 s; nothing reached
    # the sink before time zero or later than a second after the duration
    t0 = summary["start_epoch"]
    for r in rows:
        last_intended = plan.tasks[range(r["index"], n, 2)[-1]][0]
        assert last_intended <= r["send_seconds"] < SPAN + 1.0
        assert abs(r["send_seconds"] - SPAN) < 1.0
    assert abs(rows[0]["send_seconds"] - rows[1]["send_seconds"]) < 1.0
    assert min(t for t, _ in arrivals) >= t0 and max(t for t, _ in arrivals) < t0 + SPAN + 1.0


def ui_call(url: str, data: dict[str, str] | None = None) -> dict[str, object]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    with urllib.request.urlopen(url, data=body, timeout=10) as resp:
        out: dict[str, object] = json.loads(resp.read())
    return out


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.1)


def test_a_second_start_from_the_web_ui_runs_the_workload_again(tmp_path: Path) -> None:
    spec = tmp_path / "ui.toml"
    # exponential work sizes: each task of the plan is known at the sink by its work
    spec.write_text(DIST_SPEC.replace('dist = "deterministic"', 'dist = "exponential"'))
    port = free_port()
    ui = f"http://127.0.0.1:{port}"
    with SlowServer(hold=0.0) as sink:
        proc = locust(
            "--web-host", "127.0.0.1", "--web-port", str(port), "--host", sink.url, "--lbt-spec", str(spec),
            "--lbt-duration", "1",
        )  # fmt: skip
        try:
            plan1 = [w for _, w in build_plan(load_spec(spec), duration=1.0, dispatchers=[sink.url]).tasks]
            plan2 = [w for _, w in build_plan(load_spec(spec), duration=2.0, dispatchers=[sink.url]).tasks]
            n1 = len(plan1)
            assert len(set(plan2)) == len(plan2) and plan2[:n1] == plan1  # the longer plan extends it

            def state() -> str | None:
                """The runner's state as the web UI's page shows it (its /stats/requests is cached)."""
                try:
                    with urllib.request.urlopen(ui, timeout=10) as resp:
                        found = re.search(r'"state": "(\w+)"', resp.read().decode())
                except OSError:
                    return None
                return found.group(1) if found else None

            wait_for(lambda: state() == "ready", "web UI")
            # the form says what START sends (its custom parameter lbt_run): the plan's count of tasks
            with urllib.request.urlopen(ui, timeout=10) as resp:
                page = resp.read().decode()
            assert f"dist: {n1} tasks, open loop" in page
            form = {"user_count": "0", "spawn_rate": "0", "host": sink.url}
            # START, then STOP while it sends: the first run is cut short after k tasks
            assert ui_call(f"{ui}/swarm", form)["success"]
            wait_for(lambda: sink.tasks >= 10, "tasks of the first run")
            ui_call(f"{ui}/stop", {})
            wait_for(lambda: state() == "stopped", "stop")
            first = sink.tasks
            # START again: the whole plan from its beginning, and the run ends on its own (its replies in)
            assert ui_call(f"{ui}/swarm", form)["success"]
            wait_for(lambda: sink.tasks >= first + n1 and state() == "stopped", "second run")
            # and a third START with another duration in the form's custom parameters: the plan for it
            second = sink.tasks
            assert ui_call(f"{ui}/swarm", {**form, "lbt_duration": "2"})["success"]
            wait_for(lambda: sink.tasks >= second + len(plan2) and state() == "stopped", "third run")
        finally:
            stop_all([proc])
        seen = Counter(w for _, w in sink.arrivals)
    # Task j of the longer plan reached the sink once per run that sent it: the first run sent tasks
    # 0..k-1 (cut short: 10 <= k < n1), the second the shorter plan's n1, the third the longer plan's.
    k = sum(1 for w in plan1 if seen[w] == 3)
    assert 10 <= k < n1
    assert [seen[w] for w in plan2] == [(j < k) + (j < n1) + 1 for j in range(len(plan2))]
    assert sum(seen.values()) == k + n1 + len(plan2)


def test_the_locustfile_serves_the_generators_metrics(slow: tuple[SlowServer, Path]) -> None:
    """`lbt load --locust --metrics-port PORT`: the locustfile serves lbt load's series on that port while
    it sends (scraped until it has scheduled its tasks and sent some), with the standard collectors."""
    server, spec = slow
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lbtestbed.cli", "load", str(spec), "--dispatcher", server.url, "--locust",
         "--json", "--quiet", "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    found: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while found.get("lbtestbed_loadgen_tasks_sent_total", 0) == 0 and proc.poll() is None:
        assert time.monotonic() < deadline, "no generator metrics while locust sent"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            time.sleep(0.05)
            continue
        found = {
            s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels
        }
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert found["lbtestbed_loadgen_tasks_scheduled"] == summary["scheduled"] > 100
    assert 0 < found["lbtestbed_loadgen_tasks_sent_total"] <= summary["sent"]
    assert "process_cpu_seconds_total" in found and "process_open_fds" in found
