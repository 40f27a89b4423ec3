"""The run's journal (``loadgen.journal``): every task's fate appended as it happens, read back whole or cut
short, counted task by task; the generator's report rebuilt from it is the report the run kept in memory.

The generator runs against a sink on loopback that answers each task in turn with 200, 503, 502, a broken
connection or no answer at all (past the deadline), so that every fate appears.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import socket
from pathlib import Path

import pytest
from aiohttp import web

from lbtestbed.loadgen.journal import BATCH, Journal, JournalError, accounting, read_events
from lbtestbed.loadgen.openloop import Interrupt, LoadReport, drive

#: what the sink does with the i-th task, in turn
ANSWERS = ("ok", "refuse", "lose", "break", "hang", "ok", "ok")
DEADLINE = 0.5  # wall seconds: the "hang" tasks expire


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _sink(hold: float = 0.0) -> tuple[web.AppRunner, str]:
    count = itertools.count()
    stamps = {"accepted": 1.0, "decided": 1.0, "node_arrived": 1.5, "node_due": 2.0, "answered": 2.1}

    async def task(request: web.Request) -> web.StreamResponse:
        await request.read()
        what = ANSWERS[next(count) % len(ANSWERS)]
        if hold:
            await asyncio.sleep(hold)
        if what == "ok":
            body = {"node": 3, "arrived": 0.5, "completed": 1.5, "legs": stamps}
            return web.json_response(body)
        if what == "refuse":
            return web.json_response({"error": "at its limit", "node": 2}, status=503)
        if what == "lose":
            return web.json_response({"error": "node died", "node": 4}, status=502)
        if what == "hang":
            await asyncio.sleep(10 * DEADLINE)
        assert request.transport is not None
        request.transport.close()  # "break" (and a hang that outlived its client)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/tasks", task)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = _port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _tasks(count: int, spacing: float = 0.005) -> list[tuple[float, float]]:
    return [(i * spacing, 1.0 + i % 3) for i in range(count)]


def test_every_fate_is_journaled_and_the_report_rebuilt_from_it_is_the_same(tmp_path: Path) -> None:
    tasks = _tasks(70)
    journal = Journal(tmp_path / "journal.jsonl")

    async def main() -> LoadReport:
        runner, url = await _sink()
        try:
            return await drive([url], tasks, time_scale=0.5, deadline=DEADLINE, journal=journal)
        finally:
            await runner.cleanup()

    report = asyncio.run(main())
    journal.sync()
    journal.close()
    events = list(read_events(tmp_path / "journal.jsonl"))
    rebuilt = LoadReport.from_events(events, len(tasks), 0.5)
    expected = {"completed": 30, "refused": 10, "lost": 10, "failed": 10, "expired": 10}
    assert {k: report.outcomes[k] for k in expected} == expected
    assert rebuilt.summary() == report.summary()
    assert sorted(map(repr, rebuilt.records)) == sorted(map(repr, report.records))  # NaN legs too
    assert sorted(rebuilt.failures) == sorted(report.failures)
    assert sorted(rebuilt.other_sojourns) == sorted(report.other_sojourns)
    a = accounting(events, len(tasks))
    assert a["holds"] and a["sent"] == len(tasks) and {k: a[k] for k in expected} == expected
    # a lost or refused task names the node its dispatcher's answer named
    assert {(e["e"], e["node"]) for e in events if e["e"] in ("refused", "lost")} == {
        ("refused", 2),
        ("lost", 4),
    }


def test_an_interrupt_drains_then_cancels_and_every_task_keeps_one_fate(tmp_path: Path) -> None:
    """Interrupted while tasks are held by the sink: those answered within the drain complete, a second
    interrupt cancels the rest; the tasks not yet due are unsent."""
    tasks = _tasks(400, spacing=0.01)
    journal = Journal(tmp_path / "journal.jsonl")
    interrupt = Interrupt()

    async def main() -> LoadReport:
        runner, url = await _sink(hold=0.3)
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, interrupt)  # mid-schedule: some tasks out, most not yet due
        loop.call_later(0.65, interrupt)  # again, within the 10 s drain: cancel what is still out
        try:
            return await drive(
                [url], tasks, 1.0, deadline=5.0, interrupt=interrupt, journal=journal, drain=10.0
            )
        finally:
            await runner.cleanup()

    report = asyncio.run(main())
    journal.close()
    events = list(read_events(tmp_path / "journal.jsonl"))
    a = accounting(events, len(tasks))
    assert a["holds"], a["problems"]
    assert a["cancelled"] > 0 and a["unsent"] > 0 and a["completed"] > 0
    assert a["sent"] + a["unsent"] == len(tasks) and report.interrupted
    assert LoadReport.from_events(events, len(tasks), 1.0).summary() == report.summary()


def test_a_journal_cut_short_loses_only_its_last_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    lines = [json.dumps({"e": "sent", "i": i, "t": float(i), "d": 0, "late": 0.0}) for i in range(3)]
    path.write_text("\n".join(lines) + "\n" + lines[0][:10])  # killed mid-write
    assert [e["i"] for e in read_events(path)] == [0, 1, 2]
    a = accounting(read_events(path), 5)
    # no fate, no last line: the three sent are open, the two not sent unsent; nothing is made up
    assert (a["sent"], a["open"], a["unsent"], a["finished"], a["holds"]) == (3, 3, 2, False, True)
    report = LoadReport.from_events(read_events(path), 5, 1.0)
    assert report.outcomes["cancelled"] == 3 and report.outcomes["unsent"] == 2 and report.interrupted


def test_a_broken_line_inside_a_journal_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"e": "sent", "i": 0}\nnot json\n{"e": "load"}\n')
    with pytest.raises(JournalError, match=r"journal.jsonl:2: not a journal event"):
        list(read_events(path))


def test_a_task_with_two_fates_or_none_breaks_the_identity() -> None:
    events = [
        {"e": "sent", "i": 0, "t": 0.0},
        {"e": "completed", "i": 0},
        {"e": "lost", "i": 0, "t": 0.0, "node": 1},
        {"e": "failed", "i": 1, "t": 1.0, "node": -1},
        {"e": "load"},
    ]
    a = accounting(events, 2)
    assert not a["holds"]
    assert any("task 0 ended 2 times" in p for p in a["problems"])
    assert any("task 1 ended failed without being sent" in p for p in a["problems"])


def test_a_full_disk_never_disturbs_the_load_and_is_said_at_the_sync() -> None:
    journal = Journal(Path("/dev/full"))
    for i in range(BATCH + 1):  # one batch written: the write fails and is kept
        journal.write({"e": "sent", "i": i, "t": math.nan, "d": 0, "late": 0.0})
    assert journal.error is not None
    with pytest.raises(JournalError, match="No space left on device"):
        journal.sync()
    journal.close()
