"""Progress on stderr when it is not a terminal: whole lines, at most one per interval, and one at the end."""

from __future__ import annotations

import io

from lbtestbed.experiment.progress import Progress, rate_text


def test_plain_lines_carry_count_share_rate_and_time_left() -> None:
    out = io.StringIO()  # not a terminal
    bar = Progress("run: sent", 200, "tasks", stream=out, every=0.0)
    bar.started -= 10.0  # as if it had started 10 s ago
    bar.update(50)
    bar.update(200)
    bar.close()
    bar.close()  # a second close prints nothing more
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 3
    # 50 of 200 after 10 s: 25 %, 5 tasks/s, 30 s left
    assert lines[0] == "run: sent: 50/200 tasks (25.0%), 5.0 tasks/s, elapsed 0:10, left 0:30"
    assert lines[1].startswith("run: sent: 200/200 tasks (100.0%), 20.0 tasks/s, elapsed 0:10")
    assert "left" not in lines[1]


def test_lines_come_at_most_once_per_interval() -> None:
    out = io.StringIO()
    bar = Progress("sweep", 4, "points", stream=out, every=3600.0)
    for k in range(1, 5):
        bar.update(k)
    assert out.getvalue() == ""  # within the interval: nothing yet
    bar.close()
    assert out.getvalue().count("\n") == 1 and out.getvalue().startswith("sweep: 4/4 points (100.0%)")


def test_a_share_without_a_rate_and_slow_rates_per_minute() -> None:
    out = io.StringIO()
    bar = Progress("sim", 1.0, "of model time", rate=False, stream=out, every=0.0)
    bar.started -= 30.0
    bar.update(0.75)
    assert out.getvalue() == "sim: 75.0% of model time, elapsed 0:30, left 0:10\n"
    assert rate_text(0.05, "points") == "3.00 points/min" and rate_text(2.0, "points") == "2.0 points/s"
