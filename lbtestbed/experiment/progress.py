"""Progress of long work on stderr (``lbt load``'s sends, ``lbt simulate``, ``lbt sweep``'s points).

On a terminal: a rich progress bar with the count done, the rate and the time left. Anywhere else (a log
file, a pipe, CI): a plain line every ``every`` seconds and one at the end, with the same figures and no
carriage return, so a log file reads line by line.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from types import TracebackType
from typing import IO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

EVERY = 10.0  # wall seconds between plain lines


def _average(task: Task) -> float | None:
    """The work done per second since the start (rich's own estimate follows the last few updates, which
    for a few coarse steps, such as sweep points finishing together, says nothing)."""
    elapsed = task.elapsed
    return task.completed / elapsed if elapsed and task.completed else None


class _Rate(ProgressColumn):
    """The average rate, in the work's own unit per second (or per minute)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        rate = _average(task)
        return Text("" if rate is None else rate_text(rate, self.unit))


class _Left(ProgressColumn):
    """The time left at the average rate."""

    def render(self, task: Task) -> Text:
        rate = _average(task)
        if task.finished:
            return Text("left 0:00")
        if rate is None or task.total is None:
            return Text("left -:--")
        return Text(f"left {_clock((task.total - task.completed) / rate)}")


def rate_text(per_second: float, unit: str) -> str:
    """A rate in the unit per second, or per minute when it is below one a second."""
    return f"{per_second:,.1f} {unit}/s" if per_second >= 1 else f"{60 * per_second:,.2f} {unit}/min"


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """``update(done)`` with the count done so far out of ``total`` ``unit``; ``close()`` at the end.

    ``rate=False`` leaves the rate out (when the count is not the work's own, e.g. per mille of model
    time). ``stream`` (default stderr) decides the form: a terminal gets the bar."""

    def __init__(
        self,
        label: str,
        total: float,
        unit: str,
        *,
        rate: bool = True,
        stream: IO[str] | None = None,
        every: float = EVERY,
    ) -> None:
        self.label, self.total, self.unit, self.rate, self.every = label, total, unit, rate, every
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self.last_line = self.started
        self.done = 0.0
        self.closed = False
        self.bar: RichProgress | None = None
        if self.stream.isatty():
            columns: list[ProgressColumn | str] = [
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn() if rate else TaskProgressColumn(),
            ]
            if rate:
                columns.append(_Rate(unit))
            columns += [TimeElapsedColumn(), _Left()]
            self.bar = RichProgress(
                *columns, console=Console(file=self.stream), auto_refresh=False, transient=False
            )
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)

    def update(self, done: float) -> None:
        self.done = done
        if self.bar is not None:
            self.bar.update(self.task, completed=done, refresh=True)
            return
        now = time.monotonic()
        if now - self.last_line >= self.every:
            self.last_line = now
            self._line(now)

    def line(self, now: float | None = None) -> str:
        """The plain line: count, share, rate, elapsed and left."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        share = self.done / self.total if self.total else 1.0
        if self.rate:
            parts = [f"{self.label}: {self.done:,.0f}/{self.total:,.0f} {self.unit} ({100 * share:.1f}%)"]
            if elapsed > 0:
                parts.append(rate_text(self.done / elapsed, self.unit))
        else:
            parts = [f"{self.label}: {100 * share:.1f}% {self.unit}"]
        parts.append(f"elapsed {_clock(elapsed)}")
        if 0 < share < 1:
            parts.append(f"left {_clock(elapsed * (1 - share) / share)}")
        return ", ".join(parts)

    def _line(self, now: float) -> None:
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        else:
            self._line(time.monotonic())

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextlib.contextmanager
def optional_progress(
    quiet: bool, label: str, total: float, unit: str, *, rate: bool = True
) -> Iterator[Progress | None]:
    """A ``Progress`` for the block, closed at its end; None when ``quiet`` (a command's ``--quiet``)."""
    if quiet:
        yield None
        return
    with Progress(label, total, unit, rate=rate) as bar:
        yield bar
