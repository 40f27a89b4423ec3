"""The run's journal: every task's fate, appended as it happens (docs/run.md, "The journal").

A journal is a file of JSON lines, one event a line, each with its kind under ``e``. The generator writes a
task's line when it is sent (``sent``: its index ``i`` in the trace, intended arrival ``t``, dispatcher ``d``,
lateness ``late`` in wall seconds) and a second one when it ends (``completed`` with the task's record:
node, sojourn, the legs, among them the dispatcher's accept and decision; or ``refused``, ``lost``,
``failed``, ``expired``, ``cancelled`` with its node and sojourn), a task it never sent is ``dropped`` (its
bound on outstanding requests) or counted in ``unsent`` (the run was interrupted); ``lbt run`` adds what it
learns on the way (the batch boundaries, the faults it injected, the processes seen down and up again).
The trace (``trace.csv``) holds every task intended.

Lines are kept in memory and written in batches; ``sync`` writes what is pending and asks the kernel to put
it on the disk (``lbt run`` does at each end of the measured window and when it stops). A write that fails
(a full disk) never disturbs the load: the journal keeps the error, stops writing and raises it at the next
``sync``. A reader takes a journal cut short, as a run killed mid-write leaves it: its last line is dropped
if it is incomplete.

``LoadReport.from_events`` (``loadgen.openloop``) rebuilds the generator's report from the lines, and
``accounting`` counts the tasks one by one: every task sent has exactly one fate.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import orjson

JOURNAL = "journal.jsonl"
#: lines kept before they are written (about 100 KB): a run at 1,000 tasks per wall second writes a few
#: times a second
BATCH = 1024
#: the fates a task sent can have (``sent`` = their sum, task by task)
FATES = ("completed", "refused", "lost", "failed", "expired", "cancelled")
#: the longest journal line a reader takes (a task's line is about 300 bytes; a fault's a few hundred)
MAX_LINE = 1 << 20


class JournalError(OSError):
    """The journal could not be written or read; the message names the file."""


class Journal:
    """An append-only file of JSON lines, written in batches (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = open(path, "ab")  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise JournalError(f"{path}: {e.strerror or e}") from None
        self._lines: list[bytes] = []
        self.error: OSError | None = None

    def write(self, event: Mapping[str, Any]) -> None:
        """Append one event (a JSON object; NaN and infinities are written as null)."""
        if self.error is not None:
            return
        self._lines.append(orjson.dumps(event, option=orjson.OPT_SERIALIZE_NUMPY))
        if len(self._lines) >= BATCH:
            self.flush()

    def flush(self) -> None:
        """Hand the pending lines to the kernel; a failure is kept for ``sync`` (it never raises)."""
        if not self._lines or self.error is not None:
            return
        data = b"\n".join(self._lines) + b"\n"
        self._lines.clear()
        try:
            self._file.write(data)
            self._file.flush()
        except OSError as e:
            self.error = e

    def sync(self) -> None:
        """Write what is pending and wait until the kernel has it on the disk; JournalError if any write
        failed so far."""
        self.flush()
        if self.error is None:
            try:
                os.fsync(self._file.fileno())
            except OSError as e:
                self.error = e
        if self.error is not None:
            raise JournalError(f"{self.path}: {self.error.strerror or self.error}")

    def close(self) -> None:
        """Write what is pending and close the file (a failure stays in ``error``)."""
        self.flush()
        try:
            self._file.close()
        except OSError as e:
            self.error = self.error or e


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of a journal in order. A last line cut short (a run killed mid-write) is dropped;
    JournalError for a file that cannot be read or a line that is not an event."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as e:
        raise JournalError(f"{path}: {e.strerror or e}") from None
    with f:
        number = 0
        while True:
            number += 1
            try:
                line = f.readline(MAX_LINE + 1)
            except OSError as e:
                raise JournalError(f"{path}: {e.strerror or e}") from None
            if not line:
                return
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE:
                    raise JournalError(f"{path}:{number}: a line longer than {MAX_LINE:,} bytes")
                return  # the last line, cut short
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                event = None
            if not isinstance(event, dict) or not isinstance(event.get("e"), str):
                raise JournalError(f"{path}:{number}: not a journal event")
            yield event


def sent(i: int, t: float, dispatcher: int, late: float) -> dict[str, Any]:
    return {"e": "sent", "i": i, "t": t, "d": dispatcher, "late": late}


def completed(i: int, record: NamedTuple) -> dict[str, Any]:
    return {"e": "completed", "i": i, **record._asdict()}


def ended(i: int, outcome: str, t: float, node: int, sojourn: float | None) -> dict[str, Any]:
    return {"e": outcome, "i": i, "t": t, "node": node, "sojourn": sojourn}


def accounting(events: Iterable[Mapping[str, Any]], scheduled: int) -> dict[str, Any]:
    """The tasks counted one by one from the journal: how many were sent and how each ended. ``holds``:
    every task sent has exactly one fate and none has a fate without being sent, so that ``sent`` =
    completed + refused + lost + failed + expired + cancelled; ``open``: tasks sent without a fate in the
    journal (a run killed before their answer was written); ``finished``: the generator wrote its last line
    (else the tasks it had not sent count as ``unsent``); ``problems``: the first tasks that break it."""
    fates: dict[int, list[str]] = {}
    sent_tasks: set[int] = set()
    dropped = unsent = 0
    finished = False  # the generator wrote its last line (``load``)
    for e in events:
        kind = e["e"]
        if kind == "sent":
            if e["i"] in sent_tasks:
                fates.setdefault(e["i"], []).append("sent twice")
            sent_tasks.add(e["i"])
        elif kind in FATES:
            fates.setdefault(e["i"], []).append(kind)
        elif kind == "dropped":
            dropped += 1
        elif kind == "unsent":
            unsent += e["count"]
        elif kind == "load":
            finished = True
    counts: Counter[str] = Counter()
    problems = []
    for i in sorted(sent_tasks | fates.keys()):
        ends = fates.get(i, [])
        if i not in sent_tasks:
            problems.append(f"task {i} ended {'/'.join(ends)} without being sent")
        elif len(ends) > 1:
            problems.append(f"task {i} ended {len(ends)} times: {', '.join(ends)}")
        elif not ends:
            counts["open"] += 1
        else:
            counts[ends[0]] += 1
    total = len(sent_tasks)
    if not finished:  # cut short: what was not sent yet never will be
        unsent = scheduled - total - dropped
    out: dict[str, Any] = {
        "scheduled": scheduled,
        "sent": total,
        **{k: counts[k] for k in FATES},
        "open": counts["open"],
        "dropped": dropped,
        "unsent": unsent,
        "finished": finished,
    }
    balanced = total == sum(counts[k] for k in (*FATES, "open"))
    if total + dropped + unsent != scheduled:
        problems.append(f"{total} sent + {dropped} dropped + {unsent} unsent: not the {scheduled} scheduled")
    out["holds"] = not problems and balanced
    out["problems"] = problems[:10]
    return out
