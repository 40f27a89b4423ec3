"""The open-loop generator: Poisson schedule, achieved rate, trace round trip, late and dropped sends."""

from __future__ import annotations

import asyncio
import math
import socket
from pathlib import Path

import numpy as np
from aiohttp import web
from scipy import stats

from lbtestbed.loadgen.openloop import drive, poisson_tasks, read_trace, write_trace
from lbtestbed.spec import parse_spec

SPEC = {
    "name": "loadgen",
    "seed": 11,
    "classes": [{"name": "a", "count": 10, "discipline": "pool"}],
    "workload": {"arrival_rate": 500.0, "service": {"dist": "exponential", "mean": 0.01}},
    "policy": {"name": "random"},
    "run": {"warmup": 0.0, "duration": 2.0, "time_scale": 1.0},
}


def test_gaps_are_exponential_and_the_count_is_poisson() -> None:
    exp = parse_spec(SPEC)
    times = np.array([t for t, _ in poisson_tasks(exp, 200.0)])
    gaps = np.diff(np.concatenate([[0.0], times]))
    # Kolmogorov-Smirnov against Exp(rate 500); with a fixed seed the p-value is one number, and a
    # generator with the wrong law or rate drives it to 0 at this sample size (1e5 gaps)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 500.0)).pvalue > 0.01
    # the count in [0, 200] is Poisson(1e5): within 4 sd
    assert abs(len(times) - 1e5) < 4 * math.sqrt(1e5)


def test_trace_round_trip(tmp_path: Path) -> None:
    exp = parse_spec(SPEC)
    tasks = list(poisson_tasks(exp, 5.0))
    path = tmp_path / "w.trace"
    write_trace(path, tasks)
    assert read_trace(path) == tasks  # repr() round-trips floats exactly


def test_a_malformed_trace_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.trace"
    path.write_text("# lbtestbed trace v1\n0.1,1.0\n0.2,oops\n")
    try:
        read_trace(path)
    except ValueError as e:
        assert f"{path}:3" in str(e)
    else:
        raise AssertionError("a malformed trace was accepted")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(delay: float) -> tuple[web.AppRunner, str]:
    async def task(request: web.Request) -> web.Response:
        await request.read()
        if delay:
            await asyncio.sleep(delay)
        return web.json_response({"node": 0})

    app = web.Application()
    app.router.add_post("/v1/tasks", task)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def test_the_schedule_is_kept_against_a_sink() -> None:
    exp = parse_spec(SPEC)
    tasks = list(poisson_tasks(exp, 2.0))
    runner, url = await _serve(0.0)
    try:
        report = await drive([url], tasks, time_scale=1.0)
    finally:
        await runner.cleanup()
    assert report.outcomes["completed"] == len(tasks)
    # every send left at its intended time, give or take the event loop: the sends span the schedule
    assert abs(report.send_seconds - tasks[-1][0]) < 0.25
    assert len(report.lateness) == len(tasks)


async def test_a_slow_target_shows_as_drops_not_as_a_slower_rate() -> None:
    # a target that holds every task for 0.5 s with room for 20 outstanding: an open loop keeps sending
    # on schedule and drops (and counts) what does not fit, instead of waiting
    exp = parse_spec(SPEC)
    tasks = list(poisson_tasks(exp, 1.0))
    runner, url = await _serve(0.5)
    try:
        report = await drive([url], tasks, time_scale=1.0, max_outstanding=20)
    finally:
        await runner.cleanup()
    o = report.outcomes
    assert o["dropped"] > 0 and o["completed"] > 0
    assert o["completed"] + o["dropped"] + o["failed"] + o["refused"] + o["lost"] == len(tasks)
    # about 20 tasks per 0.5 s get through over 1 s of sends (plus the ones still open at the end)
    assert o["completed"] <= 20 * (1.0 / 0.5 + 1) + 1
    assert report.send_seconds < tasks[-1][0] + 0.25  # the schedule was kept: no waiting on the target
