"""A run that survives its own crashes (issue 27): ``lbt run`` stopped by SIGINT or SIGTERM mid-window, and
its processes killed with SIGKILL outside the spec's ``[[faults]]``, still ends with a report whose every
task is accounted for, task by task, against the journal it kept (``journal.jsonl``).

Each test starts ``lbt run`` as a process, waits for its progress lines on stderr (a bounded wait: nothing
here depends on how fast the machine is) and acts at a batch boundary: a signal to ``lbt run`` itself, or
SIGKILL to one of its cluster's processes. The journal is counted here, line by line, independently of
``loadgen.journal.accounting``; ``lbt report DIR`` must write the same report again from the directory.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psutil

#: 6 FCFS nodes in 2 processes, JSQ, 300 tasks... per wall second 180 for 8 s of wall time
SPEC = """
name = "survival"
seed = 3
[[classes]]
name = "servers"
count = 6
discipline = "fcfs"
[workload]
load = 0.6
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "jsq"
[run]
warmup = 20
duration = 400
time_scale = 0.02
batches = 10
"""
SUPERVISED = SPEC + "[health]\nrestart = true\n"
FATES = ("completed", "refused", "lost", "failed", "expired", "cancelled")
WAIT = 180.0  # wall seconds: a bound on any wait below (a run takes about 10), never an assertion


class Run:
    """``lbt run`` as a process, its stderr read line by line."""

    def __init__(self, tmp: Path, spec: str) -> None:
        (tmp / "spec.toml").write_text(spec)
        self.out = tmp / "run"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lbtestbed.cli", "run", str(tmp / "spec.toml"), "--out", str(self.out),
             "--node-processes", "2", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        # its stdout read all along too: results.json printed whole can outgrow a pipe's buffer, and
        # communicate() must not share a pipe with the thread that reads stderr
        self._stdout = threading.Thread(target=self._drain, daemon=True)
        self._stdout.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line)
        self._queue.put(None)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()

    def wait_for(self, marker: str) -> None:
        """Until a line of stderr holds ``marker`` (the run ending first fails the test)."""
        while True:
            line = self._queue.get(timeout=WAIT)
            assert line is not None, f"lbt run ended before {marker!r}:\n{''.join(self.lines)}"
            self.lines.append(line)
            if marker in line:
                return

    def finish(self) -> tuple[int, dict[str, Any]]:
        self.proc.wait(timeout=WAIT)
        self._stdout.join(timeout=WAIT)
        while (line := self._queue.get(timeout=WAIT)) is not None:
            self.lines.append(line)
        results = json.loads((self.out / "results.json").read_text())
        return self.proc.returncode, results

    def process_of(self, module: str, index: int) -> psutil.Process:
        """The cluster's process running ``module`` with ``--index index`` (a child of lbt run)."""
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            cmd = p.cmdline()
            if f"lbtestbed.{module}" in cmd and cmd[cmd.index("--index") + 1] == str(index):
                return p
        raise AssertionError(f"no {module} {index} among lbt run's children")


def counted(journal: Path) -> tuple[Counter[str], list[str]]:
    """The journal counted task by task: every task sent, and its fate; and what breaks the identity
    (a task with no fate or two, a fate without a send)."""
    sent: set[int] = set()
    fates: dict[int, list[str]] = defaultdict(list)
    for line in journal.read_text().splitlines():
        e = json.loads(line)
        if e["e"] == "sent":
            sent.add(e["i"])
        elif e["e"] in FATES:
            fates[e["i"]].append(e["e"])
    counts: Counter[str] = Counter(sent=len(sent))
    problems = [f"task {i}: {fates.get(i)}" for i in sent if len(fates.get(i, [])) != 1]
    problems += [f"task {i} has a fate and was not sent" for i in fates.keys() - sent]
    for i in sent:
        for fate in fates.get(i, [])[:1]:
            counts[fate] += 1
    return counts, problems


def assert_accounted(results: dict[str, Any], out: Path) -> Counter[str]:
    """results.json's accounting is the journal's, task by task, and adds up."""
    counts, problems = counted(out / "journal.jsonl")
    assert problems == []
    a = results["accounting"]
    assert a["holds"] is True
    assert a["sent"] == counts["sent"] == sum(counts[k] for k in FATES)
    assert {k: a[k] for k in FATES} == {k: counts[k] for k in FATES}
    load = results["results"]["cluster"]["load"]
    assert load["sent"] == a["sent"] and all(load[k] == a[k] for k in FATES)
    return counts


def test_sigint_mid_window_ends_with_a_partial_report_that_adds_up(tmp_path: Path) -> None:
    run = Run(tmp_path, SPEC)
    run.wait_for("measuring: batch 4/10")
    run.proc.send_signal(signal.SIGINT)
    code, results = run.finish()
    assert code == 128 + signal.SIGINT, "".join(run.lines)
    assert results["partial"] is True and results["interrupted"] == "SIGINT"
    counts = assert_accounted(results, run.out)
    assert 0 < counts["completed"] < results["accounting"]["scheduled"]  # stopped mid-window
    assert results["accounting"]["unsent"] > 0
    assert "PARTIAL RUN (stopped by SIGINT)" in (run.out / "report.md").read_text()
    # the comparison covers the batches measured before the signal: at least three, fewer than ten
    kept = len(results["results"]["cluster"]["batch_values"]["batches"])
    assert 3 <= kept < 10
    # the report is written again from the directory, to the same accounting and numbers
    again = subprocess.run(
        [sys.executable, "-m", "lbtestbed.cli", "report", str(run.out), "--json", "--quiet"],
        capture_output=True, text=True, timeout=WAIT,
    )  # fmt: skip
    rebuilt = json.loads(again.stdout)
    assert again.returncode == 1  # a partial run never passes
    assert rebuilt["accounting"] == results["accounting"]
    metrics = ("mean_sojourn", "mean_tasks_per_node", "messages_per_task")
    for source in ("cluster", "twin", "simulation"):
        for metric in metrics:
            assert (
                rebuilt["results"][source]["metrics"][metric] == results["results"][source]["metrics"][metric]
            )


def test_an_unplanned_kill_then_sigterm_ends_with_the_kill_on_the_report(tmp_path: Path) -> None:
    """No supervision: the killed node process stays dead; SIGTERM later stops the run."""
    run = Run(tmp_path, SPEC)
    run.wait_for("measuring: batch 3/10")
    run.process_of("server_node", 0).kill()
    run.wait_for("nodes-0 out (dead)")
    run.wait_for("measuring: batch 6/10")
    run.proc.send_signal(signal.SIGTERM)
    code, results = run.finish()
    assert code == 128 + signal.SIGTERM, "".join(run.lines)
    assert results["partial"] is True and results["interrupted"] == "SIGTERM"
    assert_accounted(results, run.out)
    faults = results["results"]["cluster"]["faults"]
    [outage] = faults["outages"]
    assert (outage["process"], outage["cause"], outage["fault"], outage["end"]) == (
        "nodes-0",
        "dead",
        None,
        None,
    )
    assert outage["last_seen"] < outage["start"]
    # every batch from the one the kill fell in is left out: the process never answered again
    first = int((outage["last_seen"] - 20) // 40)
    assert set(range(max(first, 0), len(faults["batches_excluded"]) + first)) >= set(
        faults["batches_excluded"]
    )
    assert "| u0 | node process 0 | - |" in (run.out / "report.md").read_text()


def test_supervised_kills_of_a_node_process_and_the_dispatcher_are_worked_around(tmp_path: Path) -> None:
    """``health.restart``: each killed process is started again; the run goes on to its full report."""
    run = Run(tmp_path, SUPERVISED)
    run.wait_for("measuring: batch 3/10")
    run.process_of("server_node", 1).kill()
    run.wait_for("nodes-1 serves again")
    run.wait_for("measuring: batch 7/10")
    run.process_of("dispatcher", 0).kill()
    run.wait_for("dispatcher-0 serves again")
    code, results = run.finish()
    assert code in (0, 1), "".join(run.lines)
    assert results["partial"] is False
    counts = assert_accounted(results, run.out)
    assert counts["failed"] > 0  # sent to the dead dispatcher: failed, and counted
    assert results["accounting"]["unsent"] == 0 and counts["sent"] == results["accounting"]["scheduled"]
    faults = results["results"]["cluster"]["faults"]
    outages = {o["process"]: o for o in faults["outages"]}
    assert set(outages) == {"nodes-1", "dispatcher-0"}
    for o in outages.values():
        assert o["fault"] is None and o["cause"] == "dead" and len(o["restarted"]) == 1
        assert o["last_seen"] < o["start"] <= o["restarted"][0] < o["end"]
    # the tasks that failed were sent while the dispatcher was out, between its last answer and its return
    journal = [json.loads(x) for x in (run.out / "journal.jsonl").read_text().splitlines()]
    failed = [e["t"] for e in journal if e["e"] == "failed"]
    d = outages["dispatcher-0"]
    assert all(d["last_seen"] - 30 <= t <= d["end"] for t in failed)  # 30 model s: 5 times the p99 sojourn
    # lost tasks were routed to the killed process's nodes
    lost = {e["node"] for e in journal if e["e"] == "lost"}
    assert lost <= set(outages["nodes-1"]["nodes"])
    report = (run.out / "report.md").read_text()
    assert "unplanned: dead; started again at" in report
    # batches outside both outages remain and are compared
    assert len(faults["batches_excluded"]) < 10 - 2
    assert any(v["counts"] for v in results["comparison"])
    left = [
        p.pid for p in psutil.process_iter(["cmdline"]) if str(run.out) in " ".join(p.info["cmdline"] or [])
    ]
    assert left == []
