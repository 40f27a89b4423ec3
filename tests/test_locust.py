"""locust as a load generator: ``lbt load --locust`` against a real cluster, the open loop that does not wait,
the closed loop that does (the caveat of docs/load.md), and the load shape's user counts.

locust runs in child processes only: importing it here would monkey-patch this process for gevent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.loadgen.locust_run import LOCUSTFILE
from lbtestbed.loadgen.plan import LEAD_IN, build_plan, closed_users
from lbtestbed.model.spec import load_spec
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
    """A dispatcher stand-in that holds every task for HOLD seconds; it counts tasks and the most at once."""

    def __init__(self) -> None:
        self.tasks = 0
        self.open = 0
        self.peak = 0
        self.loop = asyncio.new_event_loop()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _task(self, request: web.Request) -> web.Response:
        await request.read()
        self.tasks += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            await asyncio.sleep(HOLD)
        finally:
            self.open -= 1
        return web.json_response({"node": 0, "arrived": 0.0, "completed": HOLD, "waited": False})

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
    out = lbt("load", str(spec), "--dispatcher", server.url, "--locust", "--json", "--quiet")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    sent = len(build_plan(load_spec(spec), dispatchers=[server.url]).tasks)  # Poisson, mean 200
    assert summary["sent"] == summary["completed"] == server.tasks == sent
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
    cluster file's overrides), locust's processes as much as its own loop."""
    server, spec = slow
    auto = spec.with_name("auto.toml")
    auto.write_text(SLOW_SPEC.replace("time_scale = 1.0", 'time_scale = "auto"'))
    cluster = spec.with_name("cluster.json")
    ClusterFile(str(auto), ["run.time_scale=0.5"], "t", [Endpoint("dispatcher", 0, server.url)], []).save(
        cluster
    )
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
