"""``lbt load --locust``: run the locustfile headless in a child process and read back its summary.

The child gets the spec, the overrides and the schedule, and builds the same plan as ``lbt load`` (plan.py),
so it sends the same tasks. It writes its summary (the keys of ``lbt load --json``, plus locust's own
request counts) to a file that this side reads when locust has exited. locust's periodic statistics go to
stderr as progress, so stdout stays free for the summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lbtestbed.model.document import document
from lbtestbed.model.experiment import Experiment

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
SCRUBBED = ("LBT_SPEC", "LBT_SCHEDULE")  # the command line says everything; stray settings must not add to it
#: locust options ``lbt load --locust`` sets itself (or the load shape does): not to be passed through
RESERVED = (
    "-f", "--locustfile", "-H", "--host", "--headless", "-u", "--users", "-r", "--spawn-rate",
    "-t", "--run-time", "--lbt-",
)  # fmt: skip


def passthrough_problem(args: Sequence[str]) -> str | None:
    """What is wrong with locust options passed through (``lbt load --locust -- ARGS``), or None."""
    for a in args:
        name = a.split("=", 1)[0]
        if any(name == r or (r.endswith("-") and name.startswith(r)) for r in RESERVED):
            return f"{a!r} after --: lbt load --locust sets it itself (the spec, the host and the load shape)"
    return None


class LocustError(RuntimeError):
    """locust did not run or wrote no summary; the message ends with the tail of its output."""


def locust_command(
    spec: str,
    overrides: Sequence[str],
    dispatchers: Sequence[str],
    report: str,
    *,
    mode: str = "open",
    schedule: str | None = None,
    duration: float | None = None,
    replay: str | None = None,
    users: int = 20,
    max_outstanding: int = 10_000,
    drain: float = 120.0,
    quiet: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The locust command line that runs ``spec`` against ``dispatchers`` and writes ``report``; ``extra``:
    locust options of the user's (``--csv``, ``--html``, ``--processes``...), last."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", dispatchers[0]]
    cmd += ["--loglevel", "WARNING", "--stop-timeout", f"{drain:g}"]  # closed-loop users finish their task
    if quiet:
        cmd.append("--only-summary")
    cmd += ["--lbt-spec", str(Path(spec).resolve()), "--lbt-dispatchers", ",".join(dispatchers)]
    cmd += ["--lbt-report", report, "--lbt-mode", mode, "--lbt-users", str(users)]
    cmd += ["--lbt-max-outstanding", str(max_outstanding), "--lbt-drain", f"{drain:g}"]
    for o in overrides:
        cmd += ["--lbt-set", o]
    if schedule is not None:
        cmd += ["--lbt-schedule", schedule]
    if duration is not None:
        cmd += ["--lbt-duration", repr(duration)]
    if replay is not None:
        cmd += ["--lbt-replay", str(Path(replay).resolve())]
    return [*cmd, *extra]


def run_locust(
    exp: Experiment,
    dispatchers: Sequence[str],
    *,
    timeout: float,
    quiet: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run locust (``options`` as for ``locust_command``); its summary, or LocustError.

    With ``quiet`` locust's output is kept and only its tail shown on failure; otherwise it streams to stderr.
    """
    with tempfile.TemporaryDirectory(prefix="lbt-locust-") as tmp:
        report = Path(tmp) / "summary.json"
        log = Path(tmp) / "locust.log"
        # locust's processes read the experiment as resolved here (overrides applied, time scale set), from
        # its document: none of them reads the spec file again
        spec = Path(tmp) / "experiment.json"
        spec.write_text(json.dumps(document(exp)))
        cmd = locust_command(str(spec), (), dispatchers, str(report), quiet=quiet, **options)
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        with open(log, "wb") as out:
            sink = out if quiet else sys.stderr
            try:
                # locust exits 1 when any request failed (a 503 is one): the summary says what happened
                proc = subprocess.run(
                    cmd,
                    stdout=sink,
                    stderr=sink,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise LocustError(f"locust did not finish within {timeout:.0f} s{_tail(log)}") from None
        if not report.exists():
            raise LocustError(f"locust exited with code {proc.returncode} and wrote no summary{_tail(log)}")
        summary: dict[str, Any] = json.loads(report.read_text())
        return summary


def _tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines()[-lines:] if log.exists() else []
    return (": " + " | ".join(line.strip() for line in text)) if text else ""
