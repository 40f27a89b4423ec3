"""``lbt cluster up``, ``status`` and ``down``: a local cluster that outlives the command that started it,
found again through its cluster file (docs/protocol.md, The cluster file); ``lbt cluster experiment``: the
experiment of a cluster started by other means."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtestbed.cluster.launcher import Cluster
from lbtestbed.cluster.prometheus import (
    GRAFANA_PORT,
    MAX_INTERVAL,
    MIN_INTERVAL,
    PrometheusError,
    prometheus_binary,
)
from lbtestbed.experiment.errors import BadInput, Failed
from lbtestbed.experiment.preflight import prepare
from lbtestbed.model.document import document
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.files import MAX_CLUSTER_BYTES, read_limited
from lbtestbed.transport.cluster_file import ClusterError, ClusterFile

Say = Callable[[str], None]


@dataclass(frozen=True)
class UpOptions:
    """How ``lbt cluster up`` starts the cluster (its options, defaults as there)."""

    node_processes: int | None = None  # None: one per core
    max_tasks: int = 100_000  # tasks a node holds before it refuses with 503
    netns: bool = False
    bandwidth: str = ""  # a tc rate on every node's link (with netns)
    force: bool = False  # start even when the pre-flight estimate refuses
    with_prometheus: bool = False
    scrape_interval: float = 1.0
    prometheus_port: int | None = None  # None: GRAFANA_PORT when free, else a free one


@dataclass
class StartedCluster:
    cluster: Cluster
    file: ClusterFile
    processes: list[dict[str, Any]]  # Cluster.status()'s rows, right after the start

    def serve(self, say: Say) -> bool:
        """Keep the cluster up until one of its processes exits (False, said) or the command is
        interrupted (the exception goes on); the cluster is stopped either way."""
        with _failures():
            try:
                while all(r["alive"] for r in self.cluster.status()):
                    time.sleep(1.0)
                say("a cluster process exited; stopping the rest")
                return False
            finally:
                self.cluster.down()


@contextlib.contextmanager
def _failures() -> Iterator[None]:
    """A cluster that cannot start, answer or stop is a failure of the command, not a bug."""
    try:
        yield
    except ClusterError as e:
        raise Failed(str(e)) from e


def cluster_up(exp: Experiment, path: Path, options: UpOptions, say: Say) -> StartedCluster:
    """Check what ``exp`` asks of this machine (its time scale resolved), then start its cluster and write
    the cluster file ``path``; with Prometheus, both or neither. BadInput before anything starts when the
    pre-flight estimate refuses or a Prometheus option cannot work; Failed when a process does not start."""
    _refuse_odd_file(path)
    cluster = Cluster(path)
    exp, _, refusal = prepare(exp, options.node_processes, options.force, say)
    if refusal:
        raise BadInput(refusal)
    if options.with_prometheus:
        _check_prometheus(options)
    with _failures():
        f = cluster.up(
            exp, options.node_processes, options.max_tasks, netns=options.netns, bandwidth=options.bandwidth
        )
        if options.with_prometheus:
            try:
                cluster.start_prometheus(
                    options.scrape_interval, options.prometheus_port, prefer=GRAFANA_PORT
                )
            except ClusterError:
                cluster.down()  # all or nothing: the user asked for both
                raise
        return StartedCluster(cluster, f, cluster.status())


def cluster_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a cluster file that ``lbt cluster up`` writes (one line), or None: it is
    replaced by a rename, with a lock file beside it, so it must be a regular file or not exist yet, in a
    directory that can take both (a device such as /dev/full would be replaced, or read for ever)."""
    if path.exists() and not path.is_file():
        return f"--file {path}: not a regular file (a cluster file is written there and replaced)"
    parent = path.parent
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"--file {path}: cannot write in {parent}"
    if str(parent.resolve()).startswith(("/dev", "/proc", "/sys")):
        return f"--file {path}: {parent} holds devices and the kernel's files, not a cluster file"
    return None


def _check_prometheus(options: UpOptions) -> None:
    """Why ``--with-prometheus`` cannot work, checked before any process starts: BadInput for an option,
    Failed when there is no prometheus binary."""
    if not MIN_INTERVAL <= options.scrape_interval <= MAX_INTERVAL:
        limits = f"between {MIN_INTERVAL:g} and {MAX_INTERVAL:g} s"
        raise BadInput(f"--scrape-interval {options.scrape_interval:g}: must be {limits}")
    if options.prometheus_port is not None and not 1 <= options.prometheus_port <= 65535:
        raise BadInput(f"--prometheus-port {options.prometheus_port}: not a TCP port")
    try:
        prometheus_binary()
    except PrometheusError as e:
        raise Failed(str(e)) from e


def _refuse_odd_file(path: Path) -> None:
    """BadInput when ``path`` is not a cluster file this command may read, lock and remove."""
    problem = cluster_file_problem(path)
    if problem:
        raise BadInput(problem)


def cluster_status(path: Path) -> list[dict[str, Any]]:
    """Every process of the cluster of the file ``path``: role, index, URL, pid, alive and healthy."""
    _refuse_odd_file(path)
    with _failures():
        return Cluster(path).status()


def cluster_down(path: Path) -> int:
    """Stop the cluster of the file ``path`` (its Prometheus too): how many processes were stopped."""
    _refuse_odd_file(path)
    with _failures():
        return Cluster(path).down()


def write_experiment(exp: Experiment, path: Path, spec_path: str | None = None) -> None:
    """Put ``exp``, resolved, into the cluster file ``path`` of processes started by other means (Compose,
    Kubernetes: deploy/README.md): its experiment document, and the spec's path as the processes would
    name it (``spec_path``, default the file's own). Everything else in the file stays as it is; the
    file must list as many dispatchers as ``exp`` runs. BadInput when the file or the experiment does not
    fit."""
    if exp.run.auto_time_scale:
        raise BadInput(
            f'{exp.source}: run.time_scale = "auto" is picked when lbt starts a cluster: give a number'
        )
    _refuse_odd_file(path)
    try:
        data = json.loads(read_limited(path, MAX_CLUSTER_BYTES))
    except (OSError, ValueError, RecursionError) as e:
        raise BadInput(f"{path}: not a cluster file: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("dispatchers"), list):
        raise BadInput(f"{path}: not a cluster file: no list of dispatchers")
    if len(data["dispatchers"]) != exp.policy.dispatchers:
        raise BadInput(
            f"{path}: it lists {len(data['dispatchers'])} dispatcher(s) but {exp.source} runs "
            f"{exp.policy.dispatchers} (policy.dispatchers)"
        )
    data.pop("overrides", None)  # a file from before the experiment travelled whole
    data["spec"] = spec_path or data.get("spec") or str(Path(exp.source).resolve())
    data["experiment_document"] = document(exp)
    # one line per array of numbers (a node host's nodes): a file people read and edit
    text = re.sub(r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]", _one_line, json.dumps(data, indent=1))
    path.write_text(text + "\n")


def _one_line(m: re.Match[str]) -> str:
    return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"
