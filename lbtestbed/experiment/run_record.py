"""A run's directory as ``lbt run`` writes it while the run goes on, and read back (docs/run.md, "The
journal"), so that the report of any run, finished or not, can be written again from it (``lbt report``).

- ``experiment.json``: the experiment as the run resolved it (``model.document``: the time scale picked,
  the overrides applied) and the pre-flight's record, written before the cluster starts;
- ``trace.csv``: every task intended (written before the first is sent);
- ``journal.jsonl``: every task's fate as it happens (``loadgen.journal``), and what the run learns on the
  way: its start (``run``), each batch boundary (``boundary``), the faults injected (``fault``), the
  processes seen out and serving again (``outage``), samples of what the policy learns (``r``), an
  interruption (``interrupted``);
- ``snapshots.jsonl``: every process's counters at each batch boundary, each written and synced as it is
  taken;
- ``measurement.json``: what the run read once the load was over (the dispatchers' transitions, the
  message ages, the machine's cost, the CPU per task, counters from Prometheus). A run cut short (killed)
  has none: ``read_run`` then takes what the journal says and the dispatchers' own journals of their
  transitions (``cluster.logs/dispatcher-i.events.jsonl``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbtestbed.analysis.measurement.legs import MachineCost
from lbtestbed.analysis.measurement.scrape import Snapshot
from lbtestbed.loadgen.journal import JOURNAL, Journal, read_events
from lbtestbed.loadgen.openloop import LoadReport, read_trace
from lbtestbed.model.document import document
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.files import MAX_CLUSTER_BYTES, read_limited, too_deep
from lbtestbed.model.reader import SpecError

EXPERIMENT = "experiment.json"
SNAPSHOTS = "snapshots.jsonl"
MEASUREMENT = "measurement.json"
TRACE = "trace.csv"

Timeline = dict[str, list[tuple[float, float]]]


@dataclass
class Measurement:
    """What the cluster side of a run produced."""

    snapshots: list[Snapshot]
    load: LoadReport
    direct: list[Snapshot] = field(default_factory=list)  # scraped beside Prometheus, as a check
    r_series: list[tuple[float, float]] = field(default_factory=list)  # (model time, r) samples
    source: str = "scrape"  # or the Prometheus URL the counters came from
    cluster: dict[str, Any] = field(default_factory=dict)  # endpoints, processes
    faults: list[dict[str, Any]] = field(default_factory=list)  # what the injector did, when
    health_events: list[dict[str, Any]] = field(default_factory=list)  # the dispatchers' down/up
    tasks: list[tuple[float, float]] = field(default_factory=list)  # the trace sent
    # the ages every process measured for the messages it applied, pooled by kind, as (model time it was
    # sent, age in model seconds) in sending order: sent on their own request, and riding on the reply to one
    message_ages: Timeline = field(default_factory=dict)
    rider_ages: Timeline = field(default_factory=dict)
    keyed_ages: dict[str, float] = field(default_factory=dict)  # by wire.message_key
    generator_cpu: list[float] = field(default_factory=list)  # this process's CPU seconds at each boundary
    cpu: dict[str, Any] = field(default_factory=dict)  # analysis.measurement.cpu.cpu_per_task
    machine: MachineCost | None = None  # what the machine cost its probe over the window
    unavailable: float | None = None  # the least available cluster process's running-or-waiting share
    # every process seen out of service and serving again (experiment.watch), planned or not
    outages: list[dict[str, Any]] = field(default_factory=list)
    interrupted: int = 0  # the signal that stopped the run early (0: it ran to its end)
    finished: bool = True  # False: read back from a run that was cut short (no measurement.json)
    accounting: dict[str, Any] = field(default_factory=dict)  # loadgen.journal.accounting


#: Measurement's fields that measurement.json holds as they are (JSON values)
_PLAIN = (
    "r_series",
    "source",
    "cluster",
    "faults",
    "health_events",
    "message_ages",
    "rider_ages",
    "keyed_ages",
    "generator_cpu",
    "cpu",
    "unavailable",
    "outages",
    "interrupted",
)


class RunRecord:
    """The files of a run's directory, written as the run goes on (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.journal = Journal(directory / JOURNAL)
        self.snapshots = Journal(directory / SNAPSHOTS)

    def begin(self, exp: Experiment, preflight: dict[str, Any]) -> None:
        """Write the experiment as the run resolved it, and the pre-flight's record."""
        body = {"source": exp.source, "overrides": list(exp.overrides), "document": document(exp)}
        _write_json(self.directory / EXPERIMENT, {**body, "preflight": preflight})

    def event(self, event: dict[str, Any]) -> None:
        self.journal.write(event)

    def snapshot(self, b: int, snap: Snapshot) -> None:
        """Keep the snapshot of boundary ``b`` on the disk before the run goes on."""
        self.snapshots.write({"e": "snapshot", "b": b, **snap.to_json()})
        self.snapshots.sync()

    def sync(self) -> None:
        """Put the journal on the disk (JournalError if a write failed: a full disk)."""
        self.journal.sync()

    def finish(self, m: Measurement) -> None:
        """Write what the run read once the load was over, and close the journals."""
        body: dict[str, Any] = {k: getattr(m, k) for k in _PLAIN}
        if m.machine is not None:
            body["machine"] = {"round_trips": m.machine.round_trips, "timer": m.machine.timer_lateness}
        if m.direct:  # the counters came from Prometheus: keep what it answered
            body["prometheus_snapshots"] = [s.to_json() for s in m.snapshots]
        self.sync()
        _write_json(self.directory / MEASUREMENT, body)

    def close(self) -> None:
        self.journal.close()
        self.snapshots.close()


def _write_json(path: Path, body: Any) -> None:
    """Write ``body`` to ``path`` whole or not at all (a temporary file renamed), synced."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(body, f, allow_nan=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class RunDirectoryError(ValueError):
    """A directory that does not hold a run (or holds one that cannot be read); one line naming the file."""


def is_run(directory: Path) -> bool:
    return (directory / JOURNAL).is_file() and (directory / EXPERIMENT).is_file()


def read_run(directory: Path) -> tuple[Experiment, Measurement, dict[str, Any]]:
    """The experiment, its measurement and its pre-flight record as a run's directory holds them, finished
    or not (RunDirectoryError if it holds none)."""
    from lbtestbed.loadgen.journal import accounting
    from lbtestbed.spec import parse_spec

    if not directory.is_dir():
        raise RunDirectoryError(f"{directory}: not a directory")
    if not is_run(directory):
        raise RunDirectoryError(f"{directory}: not a run's directory (no {EXPERIMENT} and {JOURNAL})")
    head = _read_json(directory / EXPERIMENT)
    try:
        exp = parse_spec(head["document"], str(head.get("source", directory / EXPERIMENT)))
    except (KeyError, TypeError, SpecError) as e:
        raise RunDirectoryError(f"{directory / EXPERIMENT}: not the experiment of a run: {e}") from None
    try:
        tasks = read_trace(directory / TRACE)
        events = list(read_events(directory / JOURNAL))
        kept = directory / SNAPSHOTS
        snaps = [Snapshot.from_json(s) for s in read_events(kept)] if kept.exists() else []
    except (OSError, ValueError) as e:  # JournalError is an OSError; read_trace's lines raise ValueError
        raise RunDirectoryError(str(e)) from None
    except (KeyError, TypeError) as e:
        raise RunDirectoryError(f"{directory / SNAPSHOTS}: not a snapshot: {e}") from None
    scale = exp.run.time_scale
    load = LoadReport.from_events(events, len(tasks), scale)
    m = Measurement(snaps, load, tasks=tasks, accounting=accounting(events, len(tasks)))
    body = _read_json(directory / MEASUREMENT) if (directory / MEASUREMENT).exists() else None
    if body is not None:
        _from_body(m, body)
    else:
        _from_journal(m, events, directory)
    return exp, m, head.get("preflight") or {}


def _read_json(path: Path) -> Any:
    """A JSON file of a run's directory (at most a cluster file's size and depth)."""
    try:
        body = json.loads(read_limited(path, MAX_CLUSTER_BYTES))
    except OSError as e:
        raise RunDirectoryError(f"{path}: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise RunDirectoryError(f"{path}: not JSON a run writes: {e or type(e).__name__}") from None
    problem = too_deep(body)
    if problem:
        raise RunDirectoryError(f"{path}: {problem}")
    return body


def _from_body(m: Measurement, body: dict[str, Any]) -> None:
    """What measurement.json holds."""
    for k in _PLAIN:
        if k in body:
            setattr(m, k, body[k])
    m.r_series = [tuple(x) for x in m.r_series]  # type: ignore[misc]
    for timeline in (m.message_ages, m.rider_ages):
        for kind, pairs in timeline.items():
            timeline[kind] = [tuple(p) for p in pairs]  # type: ignore[misc]
    if "machine" in body:
        m.machine = MachineCost(body["machine"]["round_trips"], body["machine"]["timer"])
    if "prometheus_snapshots" in body:
        m.direct, m.snapshots = m.snapshots, [Snapshot.from_json(s) for s in body["prometheus_snapshots"]]


def _from_journal(m: Measurement, events: Sequence[dict[str, Any]], directory: Path) -> None:
    """A run cut short: what its journal and its dispatchers' journals say."""
    m.finished = False
    origin_unix = scale = 0.0
    outages: dict[int, dict[str, Any]] = {}  # each outage as its last line says (it changes as it goes)
    for e in events:
        kind = e["e"]
        if kind == "run":
            origin_unix, scale = e["origin_unix"], e["time_scale"]
        elif kind == "boundary":
            m.generator_cpu.append(e["cpu"])
        elif kind == "fault":
            m.faults.append({k: v for k, v in e.items() if k != "e"})
        elif kind == "outage":
            outages[e["id"]] = {k: v for k, v in e.items() if k != "e"}
        elif kind == "r":
            m.r_series.append((e["t"], e["r"]))
        elif kind == "interrupted":
            m.interrupted = e["signal"]
    m.outages = [outages[i] for i in sorted(outages)]
    if scale:
        m.health_events = list(_dispatcher_journals(directory, origin_unix, scale))


def _dispatcher_journals(directory: Path, origin_unix: float, scale: float) -> Iterator[dict[str, Any]]:
    """The node transitions the dispatchers of the run's own cluster kept in their journals."""
    found = []
    for path in sorted((directory / "cluster.logs").glob("dispatcher-*.events.jsonl")):
        index = int(path.name.split("-")[1].split(".")[0])
        for line in path.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and isinstance(e.get("unix_time"), int | float):
                found.append({"dispatcher": index, "model_time": (e["unix_time"] - origin_unix) / scale, **e})
    yield from sorted(found, key=lambda e: e["model_time"])
