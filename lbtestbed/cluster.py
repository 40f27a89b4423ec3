"""The local cluster: dispatcher and server-node processes on loopback, described by a cluster file.

``up`` picks free ports, writes the cluster file (spec, endpoints, the shared token; mode 0600), starts every
process in its own session, and waits until each answers its health check. Each process reads its part of
the cluster file, so the command lines carry no secret. ``down`` stops them (SIGTERM, then SIGKILL) and
removes the file. ``Cluster`` is the same as a context manager, for tests and ``lbt run``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lbtestbed.spec import Experiment, load_spec
from lbtestbed.wire import PREFIX

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


@dataclass
class ClusterFile:
    spec: str
    overrides: list[str]
    token: str
    dispatchers: list[Endpoint]
    node_hosts: list[Endpoint]
    max_tasks: int = 100_000
    prometheus_url: str = ""  # a Prometheus started with the cluster (lbt cluster up --with-prometheus)
    prometheus_pid: int = 0
    netns: dict[str, Any] = field(default_factory=dict)  # lbtestbed.netns.Layout of a --netns cluster

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
            data = json.loads(Path(path).read_text())
            return cls(
                spec=data["spec"],
                overrides=data.get("overrides", []),
                # containers get the file from a ConfigMap and the token from a Secret
                token=data.get("token") or os.environ.get("LBT_TOKEN", ""),
                dispatchers=[Endpoint(**e) for e in data["dispatchers"]],
                node_hosts=[Endpoint(**e) for e in data["node_hosts"]],
                max_tasks=data.get("max_tasks", 100_000),
                prometheus_url=data.get("prometheus_url", ""),
                prometheus_pid=data.get("prometheus_pid", 0),
                netns=data.get("netns") or {},
            )
        except FileNotFoundError:
            raise ClusterError(f"{path}: no cluster file (is a cluster up?)") from None
        except (ValueError, KeyError, TypeError) as e:
            raise ClusterError(f"{path}: not a cluster file: {e}") from None

    def experiment(self) -> Experiment:
        return load_spec(self.spec, self.overrides)


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free on loopback (held open together so that they are distinct)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
        from lbtestbed.netns import Layout

        prefix = ["ip", "netns", "exec", Layout.from_json(f.netns).namespaces[e.index]]  # exec: the pid stays
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
        self.procs: list[subprocess.Popen[bytes]] = []

    def up(
        self,
        spec: str,
        overrides: Sequence[str] = (),
        dispatchers: int = 1,
        node_processes: int | None = None,
        max_tasks: int = 100_000,
        timeout: float = 30.0,
        netns: bool = False,
        bandwidth: str = "",
    ) -> ClusterFile:
        """Start the cluster; ``netns``: every node process in its own network namespace on a bridge
        (``lbtestbed.netns``), with ``bandwidth`` (a tc rate) on every link if given."""
        exp = load_spec(spec, overrides)  # a bad spec fails here, before any process starts
        if exp.policy.name == "slta" and dispatchers > 1:
            raise ClusterError(
                "slta learns one threshold index for the whole cluster: run it with one dispatcher"
            )
        if dispatchers < 1:
            raise ClusterError(f"a cluster needs at least one dispatcher, got {dispatchers}")
        if self.path.exists():
            old = ClusterFile.load(self.path)
            alive = [e.pid for e in old.dispatchers + old.node_hosts if e.pid and _alive(e.pid)]
            alive += [old.prometheus_pid] if old.prometheus_pid and _alive(old.prometheus_pid) else []
            if alive:
                raise ClusterError(
                    f"{self.path}: a cluster is already up (pid {alive[0]}); run `lbt cluster down` first"
                )
        if bandwidth and not netns:
            raise ClusterError("a bandwidth limit needs --netns: loopback has no link to limit")
        groups = split_nodes(exp.n, node_processes or min(exp.n, max(1, (os.cpu_count() or 2) * 2)))
        layout = None
        if netns:
            from lbtestbed import netns as ns

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
        self.file = ClusterFile(
            str(Path(spec).resolve()),
            list(overrides),
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
                if not _alive(e.pid):
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
        from lbtestbed.prometheus import PrometheusError, start_prometheus

        if self.file is None:
            raise ClusterError(f"{self.path}: start the cluster before its Prometheus")
        try:
            server = start_prometheus(self.file, self.path, scrape_interval, port=port)
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
                "alive": _alive(e.pid),
                "healthy": healthy(e.url),
                "nodes": len(e.nodes),
            }
            for e in f.dispatchers + f.node_hosts
        ]
        if f.prometheus_pid:
            from lbtestbed.prometheus import ready

            alive = _alive(f.prometheus_pid)
            rows.append(
                {
                    "role": "prometheus",
                    "index": 0,
                    "url": f.prometheus_url,
                    "pid": f.prometheus_pid,
                    "alive": alive,
                    "healthy": alive and ready(f.prometheus_url),
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
        running = [p for p in pids if _alive(p)]
        for pid in running:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in running):
            self._reap()
            time.sleep(0.05)
        for pid in running:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        self._reap()
        if f is not None and f.netns:
            from lbtestbed import netns

            netns.destroy(netns.Layout.from_json(f.netns))
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


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reaps our own children
        if waited == pid:
            return False
    except ChildProcessError:
        pass  # not our child: fall through to a signal probe
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process that nobody has reaped yet still answers signal 0
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # each process leads its own session and group
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
