"""The local cluster: dispatcher and server-node processes on loopback, described by a cluster file.

``up`` picks free ports, writes the cluster file (spec, endpoints, the shared token; mode 0600), starts every
process in its own session, and waits until each answers its health check. Each process reads its part of
the cluster file, so the command lines carry no secret. ``down`` stops them (SIGTERM, then SIGKILL) and
removes the file. ``Cluster`` is the same as a context manager, for tests and ``lbt run``.

``up`` and ``down`` hold the cluster file's lock (two ``up``s on one file: the second finds the first's
cluster and refuses). Every process is recorded in the file, with its start time and command line, before
anything else happens (a signal that arrives meanwhile waits), and ``down`` signals only processes that
still match their record. SIGINT, SIGTERM or SIGHUP during ``up`` stop what it started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from lbtestbed.cluster import netns as ns
from lbtestbed.cluster.processes import DeferredSignals, Started, free_ports, locked, stop_all
from lbtestbed.model.experiment import Experiment
from lbtestbed.transport.cluster_file import (
    DEFAULT_FILE,
    LOOPBACK,
    ClusterError,
    ClusterFile,
    Endpoint,
    journal_of,
)
from lbtestbed.transport.wire import PREFIX


def default_node_processes(n: int, cores: int) -> int:
    """Node processes when none are asked for: one per core, no more than there are nodes. Two per core
    measured worse on a 2-core machine: JIQ on 200 FCFS nodes at 1,800 tasks/s had a transport-and-dispatch
    overhead of 7 to 60 ms p50 in four node processes against 3.6 to 6.4 ms in two (and 4.5 against 16.7 ms
    for JLMU's pools at 1,500 tasks/s): more processes than cores wait for one another's time slices."""
    return min(n, max(1, cores))


def split_nodes(n: int, processes: int) -> list[list[int]]:
    """Node ids 0..n-1 in ``processes`` contiguous, nearly equal groups."""
    processes = max(1, min(processes, n))
    base, extra = divmod(n, processes)
    groups, start = [], 0
    for p in range(processes):
        size = base + (p < extra)
        groups.append(list(range(start, start + size)))
        start += size
    return groups


def log_dir(cluster_path: Path) -> Path:
    """Where the processes of the cluster of file ``cluster_path`` write their logs: beside the file, named
    after it (``.lbt/cluster.json`` -> ``.lbt/cluster.logs/``), so that two clusters' files in one
    directory keep their logs apart (as their Prometheus directories, ``cluster.prometheus/``)."""
    return cluster_path.with_suffix(".logs")


def started(e: Endpoint) -> Started:
    """The process of endpoint ``e`` as the cluster file records it."""
    return Started(e.pid, e.started, tuple(e.cmdline))


def spawn(path: Path, f: ClusterFile, e: Endpoint) -> subprocess.Popen[bytes]:
    """Start the process of endpoint ``e`` of the cluster file at ``path`` (also to restart it after a
    fault); records it in ``e`` (pid, start time, command line). It reads its part of the cluster file;
    output goes to its log."""
    module = "lbtestbed.server_node" if e.role == "nodes" else "lbtestbed.dispatcher"
    command = [sys.executable, "-m", module, "--cluster", str(path), "--index", str(e.index)]
    prefix = []
    if f.netns and e.role == "nodes":
        prefix = [
            "ip",
            "netns",
            "exec",
            ns.Layout.from_json(f.netns).namespaces[e.index],
        ]  # exec: the pid stays
    with open(e.log or os.devnull, "ab") as log:
        proc = subprocess.Popen(
            [*prefix, *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    record = Started.of(proc.pid, command)
    e.pid, e.started, e.cmdline = record.pid, record.started, list(record.cmdline)
    return proc


def healthy(url: str) -> bool:
    """The process at base URL ``url`` answers its health check with 200."""
    try:
        with urllib.request.urlopen(f"{url}{PREFIX}/health", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _prometheus(f: ClusterFile) -> Started:
    return Started(f.prometheus_pid, f.prometheus_started, tuple(f.prometheus_cmdline))


def _recorded(f: ClusterFile) -> list[Started]:
    """Every process the cluster file records: dispatchers, node hosts, and its Prometheus (which closes
    its database on SIGTERM)."""
    procs = [started(e) for e in f.dispatchers + f.node_hosts if e.pid]
    return procs + ([_prometheus(f)] if f.prometheus_pid else [])


class Cluster:
    """Start, query and stop a local cluster; usable as a context manager."""

    def __init__(self, path: Path = DEFAULT_FILE) -> None:
        self.path = Path(path)
        self.file: ClusterFile | None = None
        self.exp: Experiment | None = None  # what up() started
        self.procs: list[subprocess.Popen[bytes]] = []

    def up(
        self,
        exp: Experiment,
        node_processes: int | None = None,
        max_tasks: int = 100_000,
        timeout: float = 30.0,
        netns: bool = False,
        bandwidth: str = "",
    ) -> ClusterFile:
        """Start a cluster for ``exp``; ``netns``: every node process in its own network namespace on a
        bridge (``lbtestbed.cluster.netns``), with ``bandwidth`` (a tc rate) on every link if given.

        The processes read ``exp`` whole from the cluster file (``ClusterFile.experiment``), as it is
        here: overrides applied and the time scale resolved; it runs ``policy.dispatchers`` dispatchers."""
        if node_processes is not None and node_processes < 1:
            raise ClusterError(f"a cluster needs at least one node process, got {node_processes}")
        if bandwidth and not netns:
            raise ClusterError("a bandwidth limit needs --netns: loopback has no link to limit")
        with locked(self.path), DeferredSignals() as signals:
            self._refuse_if_up()
            try:
                self._start(exp, node_processes, max_tasks, timeout, netns, bandwidth, signals)
            except BaseException:
                self._stop()
                raise
        assert self.file is not None
        return self.file

    def _refuse_if_up(self) -> None:
        if not self.path.exists():
            return
        try:
            old = ClusterFile.load(self.path)
        except ClusterError:
            return  # not a cluster file (an interrupted save): nothing of it runs
        running = [p.pid for p in _recorded(old) if p.ours()]
        if running:
            raise ClusterError(
                f"{self.path}: a cluster is already up (pid {running[0]}); run `lbt cluster down` first"
            )

    def _start(
        self,
        exp: Experiment,
        node_processes: int | None,
        max_tasks: int,
        timeout: float,
        netns: bool,
        bandwidth: str,
        signals: DeferredSignals,
    ) -> None:
        dispatchers = exp.policy.dispatchers
        if node_processes is None:
            node_processes = default_node_processes(exp.n, os.cpu_count() or 2)
        groups = split_nodes(exp.n, node_processes)
        layout = None
        if netns:
            try:
                ns.cleanup_stale()
                layout = ns.create(len(groups), bandwidth)
            except ns.NetnsError as problem:
                raise ClusterError(str(problem)) from None
        ports = free_ports(dispatchers + len(groups))
        logdir = log_dir(self.path)
        logdir.mkdir(parents=True, exist_ok=True)
        dispatcher_ip = layout.bridge_ip if layout else LOOPBACK
        disp = [
            Endpoint(
                "dispatcher", i, f"http://{dispatcher_ip}:{ports[i]}", log=str(logdir / f"dispatcher-{i}.log")
            )
            for i in range(dispatchers)
        ]
        hosts = [
            Endpoint(
                "nodes",
                j,
                f"http://{layout.host_ip(j) if layout else LOOPBACK}:{ports[dispatchers + j]}",
                nodes=g,
                log=str(logdir / f"nodes-{j}.log"),
            )
            for j, g in enumerate(groups)
        ]
        for e in disp:  # a new cluster starts a new history of node transitions
            journal = journal_of(e)
            if journal is not None:
                journal.unlink(missing_ok=True)
        self.exp = exp
        self.file = ClusterFile.of(
            exp,
            token=secrets.token_hex(16),
            dispatchers=disp,
            node_hosts=hosts,
            max_tasks=max_tasks,
            netns=layout.to_json() if layout else {},
        )
        self.file.save(self.path)
        for e in hosts + disp:
            with signals.critical():  # a process exists only once the file records it
                self.procs.append(spawn(self.path, self.file, e))
                self.file.save(self.path)
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        assert self.file is not None
        pending = self.file.dispatchers + self.file.node_hosts
        deadline = time.monotonic() + timeout
        while pending:
            for e in list(pending):
                if not started(e).ours():
                    tail = Path(e.log).read_text(errors="replace").strip().splitlines()[-3:] if e.log else []
                    raise ClusterError(
                        f"{e.role} {e.index} (pid {e.pid}) exited at start: " + " | ".join(tail)
                    )
                if healthy(e.url):
                    pending.remove(e)
            if time.monotonic() > deadline:
                e = pending[0]
                raise ClusterError(
                    f"{e.role} {e.index} at {e.url} not healthy after {timeout:g} s (log: {e.log})"
                )
            time.sleep(0.05)

    def start_prometheus(
        self, scrape_interval: float = 1.0, port: int | None = None, prefer: int | None = None
    ) -> str:
        """Start a Prometheus that scrapes this cluster and record it in the cluster file; its URL
        (``port``, ``prefer``: as ``prometheus.start_prometheus``)."""
        from lbtestbed.cluster.prometheus import PrometheusError, start_prometheus

        if self.file is None or self.exp is None:
            raise ClusterError(f"{self.path}: start the cluster before its Prometheus")
        try:
            server = start_prometheus(
                self.exp, self.file, self.path, scrape_interval, port=port, prefer=prefer
            )
        except PrometheusError as e:
            raise ClusterError(str(e)) from None
        if server.proc is not None:
            self.procs.append(server.proc)  # reaped with the cluster's processes
        self.file.prometheus_url, self.file.prometheus_pid = server.url, server.pid
        self.file.prometheus_started = server.started.started
        self.file.prometheus_cmdline = list(server.started.cmdline)
        self.file.save(self.path)
        return server.url

    def status(self) -> list[dict[str, Any]]:
        f = self.file or ClusterFile.load(self.path)
        rows = [
            {
                "role": e.role,
                "index": e.index,
                "url": e.url,
                "pid": e.pid,
                "alive": started(e).ours(),
                "healthy": healthy(e.url),
                "nodes": len(e.nodes),
            }
            for e in f.dispatchers + f.node_hosts
        ]
        if f.prometheus_pid:
            from lbtestbed.cluster.prometheus import ready, serves

            running = _prometheus(f).ours()
            # ready, and the very server it started (not another on its port)
            mine = running and ready(f.prometheus_url) and serves(f.prometheus_url, _prometheus(f))
            rows.append(
                {
                    "role": "prometheus",
                    "index": 0,
                    "url": f.prometheus_url,
                    "pid": f.prometheus_pid,
                    "alive": running,
                    "healthy": mine,
                    "nodes": 0,
                }
            )
        return rows

    def down(self, grace: float = 5.0) -> int:
        """Stop every process of the cluster that is still the one its file records; returns how many
        were running."""
        with locked(self.path):
            return self._stop(grace)

    def _stop(self, grace: float = 5.0) -> int:
        """``down`` with the lock held."""
        f = self.file
        if f is None and self.path.exists():
            with contextlib.suppress(ClusterError):  # a file cut short by an interrupted save
                f = ClusterFile.load(self.path)
        procs = _recorded(f) if f is not None else []
        # our own children the file may not record yet (a start interrupted): theirs pids are still ours
        recorded = {p.pid for p in procs}
        procs += [Started.of(p.pid, ()) for p in self.procs if p.pid not in recorded and p.poll() is None]
        stopped = stop_all(procs, grace)
        self._reap()
        if f is not None and f.netns:
            ns.destroy(ns.Layout.from_json(f.netns))
        if self.path.exists():
            self.path.unlink()
        self.file = None
        return stopped

    def _reap(self) -> None:
        for p in self.procs:
            p.poll()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
