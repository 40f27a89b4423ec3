"""The cluster file: every process of a cluster, its URL and role, the experiment it runs and the token.

``lbt cluster up`` writes it (mode 0600: it holds the token); each dispatcher and node process reads its
own part of it at start, so command lines carry no secret. The experiment is there whole, as the parent
resolved it (overrides applied, the time scale picked: ``model.document``), so that every process runs
that very experiment and none reads the spec file again. Containers get the file from a ConfigMap and the
token from the environment (``LBT_TOKEN``).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from lbtestbed.model.document import document
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.files import MAX_CLUSTER_BYTES, read_limited, too_deep
from lbtestbed.model.reader import SpecError
from lbtestbed.spec import apply_overrides, parse_spec
from lbtestbed.transport.wire import PREFIX

LOOPBACK = "127.0.0.1"
DEFAULT_FILE = Path(".lbt") / "cluster.json"


class ClusterError(RuntimeError):
    """The cluster could not be started, reached or stopped; the message says which process and why."""


@dataclass
class Endpoint:
    role: str  # "dispatcher" or "nodes"
    index: int
    url: str
    nodes: list[int] = field(default_factory=list)  # node ids served (node hosts)
    pid: int = 0
    log: str = ""
    # what identifies the process under ``pid`` (cluster.processes.Started): its start time and the command
    # line it was started with; a process with another start time or command line is not this one
    started: float = 0.0
    cmdline: list[str] = field(default_factory=list)


def journal_of(e: Endpoint) -> Path | None:
    """Where dispatcher ``e`` keeps its node transitions across restarts: beside its log (none without)."""
    return Path(e.log).with_suffix(".events.jsonl") if e.log else None


def _read_object(path: Path) -> dict[str, Any]:
    """The JSON object of a cluster file, at most MAX_CLUSTER_BYTES and MAX_DEPTH deep (ValueError if it
    is larger, deeper or not an object; OSError if it cannot be read)."""
    try:
        data = json.loads(read_limited(path, MAX_CLUSTER_BYTES))
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    problem = too_deep(data)
    if problem:
        raise ValueError(problem)
    return data


@dataclass
class ClusterFile:
    spec: str  # the spec file the experiment was read from (for messages: nothing reads it again)
    experiment_document: dict[str, Any]  # the resolved experiment (model.document)
    token: str
    dispatchers: list[Endpoint]
    node_hosts: list[Endpoint]
    max_tasks: int = 100_000
    prometheus_url: str = ""  # a Prometheus started with the cluster (lbt cluster up --with-prometheus)
    prometheus_pid: int = 0
    prometheus_started: float = 0.0
    prometheus_cmdline: list[str] = field(default_factory=list)
    netns: dict[str, Any] = field(default_factory=dict)  # lbtestbed.cluster.netns.Layout of a --netns cluster
    # the Unix time of model time 0 of the run on this cluster (lbt run sets it), so that a node host
    # restarted during the run applies the spec's timed changes on the run's clock (POST /v1/origin)
    origin: float = 0.0
    # the same instant on the monotonic clock of the machine whose boot id is origin_machine: a node host on
    # that machine maps the run's clock through it exactly (through Unix time, two clocks read one after the
    # other, the mapping is off by the microseconds between the two readings)
    origin_monotonic: float = 0.0
    origin_machine: str = ""

    def node_urls(self) -> list[str]:
        """Base URL of every node id, in id order."""
        urls: dict[int, str] = {}
        for host in self.node_hosts:
            for k in host.nodes:
                urls[k] = f"{host.url}{PREFIX}/nodes/{k}"
        return [urls[k] for k in sorted(urls)]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the token
        os.fchmod(fd, 0o600)  # also when a leftover file had other permissions
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=1)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ClusterFile:
        try:
            data = _read_object(Path(path))
            if not isinstance(data.get("experiment_document"), dict):
                raise KeyError("experiment_document")
            return cls(
                spec=data["spec"],
                experiment_document=data["experiment_document"],
                # containers get the file from a ConfigMap and the token from a Secret
                token=data.get("token") or os.environ.get("LBT_TOKEN", ""),
                dispatchers=[Endpoint(**e) for e in data["dispatchers"]],
                node_hosts=[Endpoint(**e) for e in data["node_hosts"]],
                max_tasks=data.get("max_tasks", 100_000),
                prometheus_url=data.get("prometheus_url", ""),
                prometheus_pid=data.get("prometheus_pid", 0),
                prometheus_started=data.get("prometheus_started", 0.0),
                prometheus_cmdline=data.get("prometheus_cmdline", []),
                netns=data.get("netns") or {},
                origin=data.get("origin", 0.0),
                origin_monotonic=data.get("origin_monotonic", 0.0),
                origin_machine=data.get("origin_machine", ""),
            )
        except FileNotFoundError:
            raise ClusterError(f"{path}: no cluster file (is a cluster up?)") from None
        except OSError as e:
            raise ClusterError(f"{path}: cannot read: {e.strerror or e}") from None
        except (ValueError, KeyError, TypeError) as e:
            raise ClusterError(f"{path}: not a cluster file: {e}") from None

    @classmethod
    def of(cls, exp: Experiment, **extra: Any) -> ClusterFile:
        """A cluster file for the resolved experiment ``exp``."""
        return cls(str(Path(exp.source).resolve()), document(exp), **extra)

    def experiment(self, overrides: Sequence[str] = ()) -> Experiment:
        """The experiment the cluster's processes run (with ``overrides`` applied on top: SpecError)."""
        doc = apply_overrides(copy.deepcopy(self.experiment_document), overrides, self.spec)
        return parse_spec(doc, self.spec)

    def check(self) -> str | None:
        """What makes the file unusable by the cluster's processes, or None: an experiment that does not
        read back, or another number of dispatchers than the experiment runs."""
        try:
            exp = self.experiment()
        except SpecError as e:
            return f"its experiment does not read back: {e}"
        if len(self.dispatchers) != exp.policy.dispatchers:
            return (
                f"it lists {len(self.dispatchers)} dispatcher(s) but the experiment runs "
                f"{exp.policy.dispatchers} (policy.dispatchers)"
            )
        return None


def _first_difference(path: str, mine: Any, theirs: Any) -> tuple[str, Any, Any] | None:
    """The first place where two parsed spec values differ: (key path, mine, theirs), or None."""
    if mine == theirs:
        return None
    if is_dataclass(mine) and is_dataclass(theirs):  # field by field, those they share (name first)
        shared = [f for f in fields(mine) if f.name in {g.name for g in fields(theirs)}]
        for f in shared:
            found = _first_difference(f"{path}.{f.name}", getattr(mine, f.name), getattr(theirs, f.name))
            if found:
                return found
    if isinstance(mine, tuple) and isinstance(theirs, tuple) and len(mine) == len(theirs):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            found = _first_difference(f"{path}[{i}]", a, b)
            if found:
                return found
    return path, mine, theirs


def spec_difference(exp: Experiment, running: Experiment) -> str | None:
    """What ``exp`` asks of a cluster that differs from what the cluster's processes run (``running``, the
    experiment of its file): the node classes and their speeds, the policy, the time scale, the network
    delays; None when they agree. The workload, the seed of the arrivals and the run's length may differ:
    they are the load's, not the cluster's."""
    for path, mine, theirs in (
        ("classes", exp.classes, running.classes),
        ("node speeds", exp.node_speeds, running.node_speeds),  # drawn from the seed: compared as drawn
        ("policy", exp.policy, running.policy),
        ("run.time_scale", exp.run.time_scale, running.run.time_scale),
        ("network", exp.network, running.network),
    ):
        found = _first_difference(path, mine, theirs)
        if found:
            where, a, b = found
            if where.startswith("node speeds"):
                return f"{where}: the cluster's nodes run at {b!r}, the spec's at {a!r} (another seed?)"
            return f"{where}: the cluster runs {b!r}, the spec asks for {a!r}"
    return None
