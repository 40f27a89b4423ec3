"""The local cluster: dispatcher and server-node processes on loopback, described by a cluster file.

``up`` picks free ports, writes the cluster file (spec, endpoints, the shared token; mode 0600), starts every
process in its own session, and waits until each answers its health check. Each process reads its part of
the cluster file, so the command lines carry no secret. ``down`` stops them (SIGTERM, then SIGKILL) and
removes the file. ``Cluster`` is the same as a context manager, for tests and ``lbt run``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from lbtestbed.cluster import netns as ns
from lbtestbed.cluster.processes import alive, free_ports, signal_group
from lbtestbed.model.spec import Experiment
from lbtestbed.transport.cluster_file import DEFAULT_FILE, LOOPBACK, ClusterError, ClusterFile, Endpoint
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


def spawn(path: Path, f: ClusterFile, e: Endpoint) -> subprocess.Popen[bytes]:
    """Start the process of endpoint ``e`` of the cluster file at ``path`` (also to restart it after a
    fault); sets ``e.pid``. It reads its part of the cluster file; output goes to its log."""
    module = "lbtestbed.server_node" if e.role == "nodes" else "lbtestbed.dispatcher"
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
            [*prefix, sys.executable, "-m", module, "--cluster", str(path), "--index", str(e.index)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    e.pid = proc.pid
    return proc


def healthy(url: str) -> bool:
    """The process at base URL ``url`` answers its health check with 200."""
    try:
        with urllib.request.urlopen(f"{url}{PREFIX}/health", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


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

        The processes read the experiment themselves, from the file and overrides it was loaded from
        (``exp.source``, ``exp.overrides``); it runs the spec's ``policy.dispatchers`` dispatchers."""
        dispatchers = exp.policy.dispatchers
        if not Path(exp.source).is_file():
            raise ClusterError(
                f"{exp.source}: the cluster's processes read the spec from a file: no such file"
            )
        if node_processes is not None and node_processes < 1:
            raise ClusterError(f"a cluster needs at least one node process, got {node_processes}")
        if self.path.exists():
            old = ClusterFile.load(self.path)
            running = [e.pid for e in old.dispatchers + old.node_hosts if e.pid and alive(e.pid)]
            running += [old.prometheus_pid] if old.prometheus_pid and alive(old.prometheus_pid) else []
            if running:
                raise ClusterError(
                    f"{self.path}: a cluster is already up (pid {running[0]}); run `lbt cluster down` first"
                )
        if bandwidth and not netns:
            raise ClusterError("a bandwidth limit needs --netns: loopback has no link to limit")
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
        logdir = self.path.parent / "logs"
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
        self.exp = exp
        self.file = ClusterFile(
            str(Path(exp.source).resolve()),
            list(exp.overrides),
            secrets.token_hex(16),
            disp,
            hosts,
            max_tasks,
            netns=layout.to_json() if layout else {},
        )
        self.file.save(self.path)
        try:
            for e in hosts + disp:
                self.procs.append(spawn(self.path, self.file, e))
            self.file.save(self.path)
            self._wait_healthy(timeout)
        except BaseException:
            self.down()
            raise
        return self.file

    def _wait_healthy(self, timeout: float) -> None:
        assert self.file is not None
        pending = self.file.dispatchers + self.file.node_hosts
        deadline = time.monotonic() + timeout
        while pending:
            for e in list(pending):
                if not alive(e.pid):
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

    def start_prometheus(self, scrape_interval: float = 1.0, port: int | None = None) -> str:
        """Start a Prometheus that scrapes this cluster and record it in the cluster file; its URL."""
        from lbtestbed.cluster.prometheus import PrometheusError, start_prometheus

        if self.file is None or self.exp is None:
            raise ClusterError(f"{self.path}: start the cluster before its Prometheus")
        try:
            server = start_prometheus(self.exp, self.file, self.path, scrape_interval, port=port)
        except PrometheusError as e:
            raise ClusterError(str(e)) from None
        if server.proc is not None:
            self.procs.append(server.proc)  # reaped with the cluster's processes
        self.file.prometheus_url, self.file.prometheus_pid = server.url, server.pid
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
                "alive": alive(e.pid),
                "healthy": healthy(e.url),
                "nodes": len(e.nodes),
            }
            for e in f.dispatchers + f.node_hosts
        ]
        if f.prometheus_pid:
            from lbtestbed.cluster.prometheus import ready

            running = alive(f.prometheus_pid)
            rows.append(
                {
                    "role": "prometheus",
                    "index": 0,
                    "url": f.prometheus_url,
                    "pid": f.prometheus_pid,
                    "alive": running,
                    "healthy": running and ready(f.prometheus_url),
                    "nodes": 0,
                }
            )
        return rows

    def down(self, grace: float = 5.0) -> int:
        """Stop every process of the cluster; returns how many were still running."""
        f = self.file
        if f is None and self.path.exists():
            f = ClusterFile.load(self.path)
        pids = [e.pid for e in (f.dispatchers + f.node_hosts if f else []) if e.pid]
        pids += [f.prometheus_pid] if f and f.prometheus_pid else []  # SIGTERM: it closes its TSDB
        pids += [p.pid for p in self.procs if p.pid not in pids]
        running = [p for p in pids if alive(p)]
        for pid in running:
            signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in running):
            self._reap()
            time.sleep(0.05)
        for pid in running:
            if alive(pid):
                signal_group(pid, signal.SIGKILL)
        self._reap()
        if f is not None and f.netns:
            ns.destroy(ns.Layout.from_json(f.netns))
        if self.path.exists():
            self.path.unlink()
        self.file = None
        return len(running)

    def _reap(self) -> None:
        for p in self.procs:
            p.poll()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
