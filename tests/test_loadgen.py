"""The open-loop generator: Poisson schedule, achieved rate, trace round trip, late and dropped sends, rate
schedules (steps and ramps), and ``lbt load`` against the benchmark's sink."""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvloop
from aiohttp import web
from scipy import stats

from lbtestbed.loadgen.openloop import drive, poisson_tasks, read_trace, run_load, write_trace
from lbtestbed.loadgen.schedule import ScheduleError, parse_schedule, scheduled_tasks
from lbtestbed.spec import parse_spec
from lbtestbed.transport import alarm

ROOT = Path(__file__).resolve().parents[1]

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


async def _serve(delay: float, answers: Sequence[Any] = ({"node": 0},)) -> tuple[web.AppRunner, str]:
    """A sink for tasks on loopback; it answers the i-th task with ``answers[i % len(answers)]``."""
    count = itertools.count()

    async def task(request: web.Request) -> web.Response:
        await request.read()
        if delay:
            await asyncio.sleep(delay)
        return web.json_response(answers[next(count) % len(answers)])

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


async def test_every_answered_task_is_counted_once_whatever_its_answer_holds() -> None:
    """A 200 whose legs lack a stamp is a completed task without those legs; one that is not the protocol's
    answer (a stay that is no number, not an object) is a failed task; none is lost or counted twice."""
    exp = parse_spec(SPEC)
    tasks = list(poisson_tasks(exp, 0.4))
    stamps = {"accepted": 1.0, "decided": 1.0, "node_due": 2.0, "released": 2.5}  # no "answered"
    answers = [{"node": 1, "legs": stamps}, {"node": 0, "completed": "soon"}, [1, 2]]
    runner, url = await _serve(0.0, answers)
    try:
        report = await drive([url], tasks, time_scale=1.0)
    finally:
        await runner.cleanup()
    o = report.outcomes
    partial = sum(1 for i in range(len(tasks)) if i % 3 == 0)
    assert len(tasks) > 30
    assert o["completed"] == len(report.records) == len(report.sojourns) == partial
    assert o["failed"] == len(tasks) - partial and sum(o.values()) == len(tasks)
    for r in report.records:
        assert r.node == 1 and math.isnan(r.forward) and math.isnan(r.notify)  # the missing stamps
        assert r.decide == 0.0 and math.isfinite(r.leave)  # the stamps it has


# ------------------------------------------------------------------------------------ rate schedules
#
# The expected values below are worked out by hand from the schedule text (a step's integral is
# duration x multiplier, a ramp's is duration x the mean of its end points), not read from RateSchedule.

SCHEDULE = "4@1, 6@0.5->2.5, 4@3, 2@0, 4@2->0"
#: (start, end, multiplier at start, multiplier at end) of each segment of SCHEDULE, model seconds
PIECES = [(0, 4, 1, 1), (4, 10, 0.5, 2.5), (10, 14, 3, 3), (14, 16, 0, 0), (16, 20, 2, 0)]


def hand_multiplier(t: np.ndarray) -> np.ndarray:
    out = np.zeros_like(t)
    for a, b, m0, m1 in PIECES:
        inside = (t >= a) & (t < b)
        out[inside] = m0 + (m1 - m0) * (t[inside] - a) / (b - a)
    return out


def hand_integral(t: np.ndarray) -> np.ndarray:
    """M(t) on a fine grid that contains every break point: the trapezoid rule is exact for linear pieces,
    and between grid points M is interpolated linearly (error below 1e-9 at this grid step)."""
    grid = np.unique(np.concatenate([np.linspace(0, 20, 400_001), [p[0] for p in PIECES], [20.0]]))
    m = hand_multiplier(grid)
    m[-1] = 0.0  # m(20) is the left limit of the last ramp: 0
    cumulative = np.concatenate([[0.0], np.cumsum(0.5 * (m[1:] + m[:-1]) * np.diff(grid))])
    return np.interp(t, grid, cumulative)


def test_schedule_multiplier_integral_and_inverse() -> None:
    s = parse_schedule("2@1, 2@1->3")
    assert s.duration == 4.0 and s.total == 2.0 + 4.0
    assert s.multiplier(1.0) == 1.0 and s.multiplier(3.0) == 2.0 and s.multiplier(4.5) == 0.0
    assert s.integral(3.0) == pytest.approx(2.0 + 1.5)  # 1 s of the ramp from 1 to 2: mean 1.5
    for u in np.linspace(0.0, 6.0, 61):
        t, _ = s.inverse(float(u))
        assert s.integral(t) == pytest.approx(u, abs=1e-12)


def test_a_constant_schedule_gives_exactly_the_spec_workload() -> None:
    exp = parse_spec(SPEC)
    assert list(scheduled_tasks(exp, parse_schedule("5@1"))) == list(poisson_tasks(exp, 5.0))


def test_a_schedule_changes_when_tasks_come_not_which() -> None:
    exp = parse_spec(SPEC)
    works = [w for _, w in scheduled_tasks(exp, parse_schedule(SCHEDULE))]
    spec_works = [w for _, w in poisson_tasks(exp, 100.0)][: len(works)]
    assert works == spec_works


def test_segment_counts_are_poisson_with_the_integrated_rate() -> None:
    exp = parse_spec(SPEC)  # 500 tasks per model second at multiplier 1
    times = np.array([t for t, _ in scheduled_tasks(exp, parse_schedule(SCHEDULE))])
    # cells: every step, and each ramp in quarters (which checks the ramp's shape, not only its total)
    cells: list[tuple[float, float]] = []
    for a, b, m0, m1 in PIECES:
        k = 1 if m0 == m1 else 4
        cells += [(a + (b - a) * j / k, a + (b - a) * (j + 1) / k) for j in range(k)]
    means = [500.0 * float(np.diff(hand_integral(np.array([lo, hi])))[0]) for lo, hi in cells]
    assert sum(means) == pytest.approx(500.0 * (4 + 9 + 12 + 0 + 4))
    # two-sided 99.9 % family-wise over the cells (Bonferroni): the normal approximation of a Poisson
    # count is good here, every mean being at least 250
    z = stats.norm.ppf(1 - 0.001 / (2 * len(cells)))
    for (lo, hi), mean in zip(cells, means, strict=True):
        count = int(np.sum((times >= lo) & (times < hi)))
        if mean == 0:
            assert count == 0, f"{count} arrivals in [{lo}, {hi}) where the rate is 0"
        else:
            assert abs(count - mean) < z * math.sqrt(mean), f"[{lo}, {hi}): {count} arrivals, expected {mean}"


def test_time_changed_gaps_are_exponential() -> None:
    # if T_i is Poisson with intensity 500 m(t), then 500 M(T_i) is a unit-rate Poisson process
    exp = parse_spec(SPEC)
    times = np.array([t for t, _ in scheduled_tasks(exp, parse_schedule(SCHEDULE))])
    gaps = np.diff(np.concatenate([[0.0], 500.0 * hand_integral(times)]))
    assert stats.kstest(gaps, "expon").pvalue > 0.01
    # the same statistic rejects arrivals that ignore the schedule (homogeneous at the same count): the
    # test has the power to see a wrong time change
    flat = np.sort(np.random.default_rng(1).uniform(0, 20, len(times)))
    flat_gaps = np.diff(np.concatenate([[0.0], 500.0 * hand_integral(flat)]))
    assert stats.kstest(flat_gaps, "expon").pvalue < 1e-6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty schedule"),
        ("  # only a comment", "empty schedule"),
        ("10", "segment 1 '10': expected DURATION@MULT"),
        ("5@1, 2@x", "segment 2 '2@x': expected DURATION@MULT"),
        ("5@1; 0@1", "segment 2 '0@1': the duration must be a positive"),
        ("1e999@1", "the duration must be a positive"),
        ("5@-1", "segment 1 '5@-1': multipliers must be finite and >= 0"),
        ("5@1->-2", "multipliers must be finite and >= 0"),
        ("5@0, 3@0", "every multiplier is 0"),
        ("5@1->2->3", "segment 1 '5@1->2->3': expected"),
    ],
)
def test_a_bad_schedule_names_the_segment(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        parse_schedule(text)


def test_schedule_text_allows_lines_comments_and_spaces() -> None:
    s = parse_schedule("# warm up\n 10 @ 1 \n20@1 -> 2 ; 5@0.5  # tail\n")
    assert [(g.duration, g.start, g.end) for g in s.segments] == [(10, 1, 1), (20, 1, 2), (5, 0.5, 0.5)]


# ------------------------------------------------------------------------------ the send loop itself


@pytest.mark.parametrize("precise", [True, False], ids=["timerfd", "loop-timers"])
def test_no_send_leaves_before_its_time_on_uvloop(precise: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # uvloop's timers have millisecond resolution and can fire up to 1 ms early; the target notes when each
    # task arrives, which is after it was sent, so an early send shows as an arrival before its time. The
    # generator's alarm is a timerfd; without one (not Linux) it falls back on the loop's timers
    if not precise:
        monkeypatch.setattr(alarm, "_libc", lambda: None)
    exp = parse_spec(SPEC)
    tasks = list(poisson_tasks(exp, 2.0))
    arrivals: dict[float, float] = {}

    async def main() -> float:
        async def task(request: web.Request) -> web.Response:
            arrivals[(await request.json())["work"]] = time.monotonic()
            return web.json_response({"node": 0})

        app = web.Application()
        app.router.add_post("/v1/tasks", task)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        start = time.monotonic() + 0.1
        try:
            report = await drive([f"http://127.0.0.1:{port}"], tasks, 1.0, start=start)
        finally:
            await runner.cleanup()
        assert report.outcomes["completed"] == len(tasks)
        assert min(report.lateness) >= 0.0
        return start

    start = uvloop.run(main())
    assert len(arrivals) == len(tasks)  # the works are distinct floats: one arrival each
    early = [(w, arrivals[w] - (start + t)) for t, w in tasks if arrivals[w] < start + t]
    assert not early, f"{len(early)} tasks arrived before their time, e.g. {early[0][1] * 1e3:.3f} ms"


def test_run_load_leaves_the_garbage_collector_as_it_was() -> None:
    import gc

    exp = parse_spec(SPEC)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    report = run_load(["http://127.0.0.1:1"], list(poisson_tasks(exp, 0.05)), 1.0)  # nothing listens there
    assert report.outcomes["failed"] == report.scheduled > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the run's settings do not outlive it


# --------------------------------------------------------------------------------- lbt load, the CLI


@pytest.fixture
def sink() -> Iterator[str]:
    """The benchmark's sink (completes every task at once) in a process of its own."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "sink.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v1/health", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("the sink did not come up") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def write_spec(path: Path) -> Path:
    path.write_text(
        """name = "loadgen"
seed = 11
[[classes]]
name = "a"
count = 10
discipline = "pool"
[workload]
arrival_rate = 500.0
service = { dist = "exponential", mean = 0.01 }
[policy]
name = "random"
[run]
warmup = 0.0
duration = 2.0
time_scale = 1.0
"""
    )
    return path


def lbt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_load_with_a_schedule_sends_the_scheduled_tasks(tmp_path: Path, sink: str) -> None:
    spec = write_spec(tmp_path / "spec.toml")
    trace = tmp_path / "sent.trace"
    out = lbt(
        "load", str(spec), "--dispatcher", sink, "--schedule", "1@1, 1@0.5->1.5", "--record", str(trace)
    )
    out.check_returncode()
    summary = {line.split()[0]: line.split()[1] for line in out.stdout.splitlines()}
    tasks = read_trace(trace)
    # the schedule asks for 500 x (1 + 1) = 1000 tasks on average; 4 sd: a 99.99 % interval
    assert abs(len(tasks) - 1000) < 4 * math.sqrt(1000)
    assert int(summary["scheduled"]) == int(summary["completed"]) == len(tasks)
    # and the count in the ramp's second half, 500 x 0.5 x (1 + 1.5) / 2 = 312.5 on average
    late = sum(1 for t, _ in tasks if 1.5 <= t < 2.0)
    assert abs(late - 312.5) < 4 * math.sqrt(312.5)


def test_cli_load_rejects_a_bad_schedule_in_one_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.toml")
    nowhere = "http://127.0.0.1:1"
    out = lbt("load", str(spec), "--dispatcher", nowhere, "--schedule", "10@1, 5@fast")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "lbt: error: schedule: segment 2 '5@fast': "
        "expected DURATION@MULT (a step) or DURATION@MULT->MULT (a ramp)"
    )
    both = lbt("load", str(spec), "--dispatcher", nowhere, "--schedule", "1@1", "--duration", "3")
    assert both.returncode == 2 and "Traceback" not in both.stderr
    assert (
        both.stderr.strip() == "lbt: error: give at most one of a schedule, a duration and a trace to replay"
    )


async def test_a_schedule_without_tasks_takes_no_time() -> None:
    """`lbt load --duration 1` on a slow spec can draw no task: the run ends at once and says it took 0 s,
    not the lead-in before model time 0 as a negative time."""
    report = await drive(["http://127.0.0.1:9"], [], time_scale=1.0)
    assert report.wall_seconds == 0.0 and report.send_seconds == 0.0 and report.model_seconds == 0.0


@pytest.mark.parametrize("precise", [True, False], ids=["timerfd", "loop-timers"])
def test_an_alarm_beyond_any_run_is_never_called_and_raises_nothing(
    precise: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's own task route accepts any finite work: a task of 1e300 seconds has its completion at an
    instant no C long holds (or at infinity once scaled). Its alarm replaces the one before and never
    calls; a near instant afterwards is called as usual (the fuzzer's 500 and the node's traceback)."""
    if not precise:
        monkeypatch.setattr(alarm, "_libc", lambda: None)

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        a = alarm.Alarm(loop)
        called: list[str] = []
        a.at(time.monotonic() + 0.005, lambda: called.append("replaced"))
        for far in (time.monotonic() + 1e300, math.inf, math.nan):
            a.at(far, lambda: called.append("far"))
        await asyncio.sleep(0.02)
        a.at(time.monotonic() + 0.002, lambda: called.append("near"))
        await asyncio.sleep(0.05)
        a.close()
        return called

    assert uvloop.run(main()) == ["near"]


@pytest.mark.parametrize("precise", [True, False], ids=["timerfd", "loop-timers"])
def test_an_alarm_calls_back_at_its_instant_and_not_before(
    precise: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instants a fraction of a millisecond apart (below the loop timers' resolution): each callback comes
    at or after its instant; a new instant replaces the one before, and a cancelled alarm calls nobody."""
    if not precise:
        monkeypatch.setattr(alarm, "_libc", lambda: None)

    async def main() -> tuple[list[float], list[float], bool]:
        loop = asyncio.get_running_loop()
        a = alarm.Alarm(loop)
        instants = [time.monotonic() + 0.01 + 0.0003 * i for i in range(20)]
        called: list[float] = []
        done = loop.create_future()

        def next_one() -> None:
            called.append(time.monotonic())
            if len(called) < len(instants):
                want = instants[len(called)]
                if time.monotonic() < want:
                    a.at(want, next_one)
                else:
                    next_one()
            elif not done.done():
                done.set_result(None)

        a.at(time.monotonic() + 10.0, lambda: called.append(-1.0))  # replaced at once
        a.at(instants[0], next_one)
        await asyncio.wait_for(done, 5.0)
        a.at(time.monotonic() + 0.001, lambda: called.append(-1.0))
        a.cancel()
        await asyncio.sleep(0.01)
        was_precise = a.precise
        a.close()
        return instants, called, was_precise

    instants, called, was_precise = uvloop.run(main())
    assert was_precise == (precise and sys.platform == "linux")
    assert len(called) == len(instants) and all(c >= i for c, i in zip(called, instants, strict=True))
