"""Hardening (issue 16): what a local user or a careless operator can do to a cluster on loopback.

Each test reproduces one way the cluster broke before and checks that it no longer does:

- a process that takes over the port of a dead node process receives nothing it can use: no credential,
  nothing that can be replayed (to the dispatcher, another node process, or the node process that takes the
  port back), and its own answers are not believed;
- thousands of idle connections, or a burst of 20,000 tasks, cannot take a dispatcher's descriptors: what
  it cannot hold it refuses and counts as its own refusal, and it never blames a node for it;
- a dispatcher stopped for seconds does not take its own stall for the nodes' and refuses no task, and
  timeouts never eject more than ``health.max_ejection`` of the nodes;
- ``lbt load`` ends within its deadline even when the dispatcher never answers, and Ctrl-C prints what it
  sent and what completed;
- a spec that asks for more than a process can hold is refused when it is read;
- ``lbt cluster up`` and ``down`` hold a lock, signal only the processes they started (never a reused pid)
  and leave nothing running when ``up`` is interrupted;
- a restarted dispatcher still lists the node transitions its predecessor saw;

Real processes on 127.0.0.1 throughout; every cluster is stopped by its context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import resource
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import uvloop
from test_cluster import fcfs_spec, get, post, scrape, signed_by, wait_until, write_spec

from lbtestbed.cluster.launcher import Cluster, healthy, spawn
from lbtestbed.dispatcher.checks import failure_kind
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.loadgen.openloop import OUTCOMES, LoadReport, drive, poisson_tasks
from lbtestbed.spec import load_spec, parse_spec
from lbtestbed.transport.cluster_file import ClusterFile, Endpoint
from lbtestbed.transport.http import LocalError
from lbtestbed.transport.process import ConnectionGuard
from lbtestbed.transport.signing import WINDOW, Signer, Unauthorized, Verifier

HEALTH = "\n[health]\nheartbeat = 0.2\ntimeout = 1.0\n"


def health(url: str) -> dict[str, Any]:
    status, text = get(f"{url}/v1/health")
    assert status in (200, 503), (status, text)
    body: dict[str, Any] = json.loads(text)
    return body


# =========================================================================== 1. a squatter on a dead port


class Squatter(socketserver.ThreadingTCPServer):
    """Whoever binds the port of a dead node process: records every request whole and answers each like a
    node host would (200 and a plausible state), but without the cluster's key."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, port: int, nodes: list[int]) -> None:
        self.captured: list[bytes] = []
        state = {"incarnation": 1, "model_time": 0.0, "reports": {str(k): [0, 0, 0] for k in nodes}}
        self.answer = json.dumps(state).encode()
        super().__init__(("127.0.0.1", port), _SquatterHandler)


class _SquatterHandler(socketserver.StreamRequestHandler):
    server: Squatter

    def handle(self) -> None:
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            self.server.captured.append(head + self.rfile.read(length))
            body = self.server.answer
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )


@contextlib.contextmanager
def squatting(port: int, nodes: list[int]) -> Iterator[Squatter]:
    server = Squatter(port, nodes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def replay(raw: bytes, port: int) -> int:
    """Send a captured request's bytes, unchanged, to 127.0.0.1:``port``; the answer's status."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(raw.replace(b"keep-alive", b"close"))
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer:
                break
    return int(answer.split(b" ", 2)[1])


def authorization(raw: bytes) -> str:
    for line in raw.split(b"\r\n"):
        if line.lower().startswith(b"authorization:"):
            return line.split(b":", 1)[1].strip().decode()
    raise AssertionError(f"no Authorization header in {raw[:300]!r}")


def test_a_squatter_on_a_dead_node_port_gets_nothing_it_can_use(tmp_path: Path) -> None:
    """Node process 1 is killed and a local user binds its port. The dispatcher's health checks reach the
    squatter, carrying no key; the squatter's answers are not signed, so the process stays down and no task,
    probe or message goes there. What it captured is refused everywhere it could be replayed: with another
    body (a forged idle token) at the dispatcher, as it is at the live node process, and at the node process
    that takes the port back; a request signed now is refused the second time it arrives."""
    spec = write_spec(tmp_path, fcfs_spec('name = "jiq"', count=4) + HEALTH)
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=2)
        disp, live, victim = f.dispatchers[0].url, f.node_hosts[0], f.node_hosts[1]
        port = int(victim.url.rsplit(":", 1)[1])
        os.killpg(victim.pid, signal.SIGKILL)
        wait_until(lambda: health(disp)["nodes_down"] == victim.nodes, what="the kill to be noticed")
        with squatting(port, victim.nodes) as squatter:
            wait_until(lambda: len(squatter.captured) >= 5, what="health checks at the squatter")
            captured = list(squatter.captured)
            assert all(raw.startswith(b"GET /v1/state ") for raw in captured), captured[0][:200]
            assert not any(f.token.encode() in raw for raw in captured), "the key went to the squatter"
            assert health(disp)["nodes_down"] == victim.nodes, "the squatter's answers were believed"
            assert [e["to"] for e in health(disp)["events"]] == ["down"]
        before = scrape([disp, live.url])
        stolen = authorization(captured[-1])
        forged = json.dumps({"messages": [{"kind": "idle_token", "node": 2, "data": [0]}]}).encode()
        assert post(f"{disp}/v1/messages", forged, {"Authorization": stolen})[0] == 401
        assert replay(captured[-1], int(live.url.rsplit(":", 1)[1])) == 401  # signed for another receiver
        probe = f"{live.url}/v1/nodes/{live.nodes[0]}/probe"
        assert post(probe, b"", {"Authorization": stolen})[0] == 401
        after = scrape([disp, live.url])
        assert after.total("lbtestbed_dispatcher_messages_received_total") == before.total(
            "lbtestbed_dispatcher_messages_received_total"
        )
        assert after.total("lbtestbed_node_messages_received_total") == before.total(
            "lbtestbed_node_messages_received_total"
        )
        assert after.total("lbtestbed_dispatcher_unauthorized_total") == 1
        assert after.total("lbtestbed_node_unauthorized_total") == 2
        # the node process takes its port back: what was captured before it started is no use there either
        spawn(tmp_path / "cluster.json", f, victim)  # its new pid is in the cluster's file: down stops it
        wait_until(lambda: healthy(victim.url), timeout=15, what="the restarted node process")
        assert all(replay(raw, port) == 401 for raw in captured[-3:])
        wait_until(lambda: health(disp)["nodes_down"] == [], timeout=10, what="the restart to be noticed")
        # a request signed now is accepted once, and refused when it comes again
        url = f"{victim.url}/v1/nodes/{victim.nodes[0]}/probe"
        headers, _ = Signer(f.token).headers("POST", url, b"")
        assert post(url, b"", headers)[0] == 200
        assert post(url, b"", headers)[0] == 401
        assert post(url, b"", signed_by(f.token))[0] == 200


# =================================================================== 2. connections and descriptors


@contextlib.contextmanager
def cluster_up(
    directory: Path, spec_text: str, fd_limit: int | None = None, node_processes: int = 2
) -> Iterator[ClusterFile]:
    """A cluster started by ``lbt cluster up`` (with at most ``fd_limit`` descriptors per process, as an
    operator's ``ulimit -n`` would give it) and stopped by ``lbt cluster down``."""
    spec = write_spec(directory, spec_text)
    path = directory / "cluster.json"

    def limited() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    up = subprocess.run(
        [LBT, "cluster", "up", str(spec), "--file", str(path), "--node-processes", str(node_processes)],
        preexec_fn=limited,
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        assert up.returncode == 0, up.stderr
        yield ClusterFile.load(path)
    finally:
        down = subprocess.run([LBT, "cluster", "down", "--file", str(path)], capture_output=True, timeout=60)
        assert down.returncode == 0, down.stderr


LBT = str(Path(sys.executable).parent / "lbt")
#: descriptors each process of the crowded cluster may hold: its dispatcher takes at most 1,433 tasks in
#: flight and 2,150 connections (transport.process.Budget)
FD_LIMIT = 4096
#: four pools (a task never waits: every task a client sends is in service at once); work 1 lasts 4 s
CROWDED = """
name = "crowded"
seed = 3
[[classes]]
name = "pool"
count = 4
discipline = "pool"
[workload]
arrival_rate = 5.0
service = { dist = "exponential", mean = 1.0 }
[policy]
name = "least_request"
[run]
warmup = 0.0
duration = 40.0
time_scale = 4.0
"""


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFile]:
    """A cluster whose processes may hold 4,096 descriptors each, as an operator's ``ulimit -n`` gives."""
    with cluster_up(tmp_path_factory.mktemp("crowded"), CROWDED + HEALTH, fd_limit=FD_LIMIT) as f:
        yield f


def test_idle_connections_leave_task_service_untouched(crowded: ClusterFile) -> None:
    """5,000 connections that never send a byte. The dispatcher keeps its descriptors for its peers,
    refuses what exceeds its connection limit and closes silent connections to make room for real
    clients: every task of a load sent afterwards (200 tasks of 40 ms in 2 s) completes and no node is
    marked down."""
    disp = crowded.dispatchers[0].url
    port = int(disp.rsplit(":", 1)[1])
    before = scrape([disp])
    idle = []
    try:
        for _ in range(5000):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(ConnectionGuard.GRACE + 0.2)  # silent for longer than a client about to write
        scale = crowded.experiment().run.time_scale
        tasks = [(i * 0.01 / scale, 0.01) for i in range(200)]
        report = uvloop.run(drive([disp], tasks, scale))
    finally:
        for s in idle:
            s.close()
    assert report.outcomes["completed"] == len(tasks), report.summary()
    after = scrape([disp])
    for name in ("connections_shed_total", "connections_refused_total"):
        assert after.total(f"lbtestbed_dispatcher_{name}") > before.total(f"lbtestbed_dispatcher_{name}")
    assert health(disp)["events"] == [], "a node was marked down"
    assert after.total("lbtestbed_dispatcher_health_checks_total", outcome="local") == 0


BURST_CLIENT = """
import asyncio, json, sys, time
import uvloop
from lbtestbed.transport.http import HttpPool
url, count, spread = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
async def main():
    pool = HttpPool(url)
    start = time.monotonic()
    async def one(i):
        await asyncio.sleep(max(0.0, start + i * spread / count - time.monotonic()))
        try:
            status, body = await pool.post("/v1/tasks", b'{"work": 1.0}', timeout=120)
        except (OSError, TimeoutError) as e:
            return "failed"
        if status == 503 and b"holds its limit" in body:
            return "503 limit"
        return str(status)
    outcomes = await asyncio.gather(*(one(i) for i in range(count)))
    print(json.dumps({k: outcomes.count(k) for k in set(outcomes)}))
uvloop.run(main())
"""
#: wall seconds over which the burst's tasks are sent: each lasts 4 s, so all of them overlap
SPREAD = 2.0


def test_a_burst_of_20000_tasks_is_answered_without_blaming_a_node(crowded: ClusterFile) -> None:
    """20,000 tasks of 4 s sent within 2 s by three client processes, so that all of them would be in
    flight together (spread over 2 s rather than one instant, which only adds the kernel's SYN
    retransmissions). The dispatcher holds what its descriptors allow: every task ends completed,
    refused by the dispatcher at its limit of tasks in flight (503), or on a connection the dispatcher
    closed at its limit of connections; those counts are the dispatcher's own, no task is lost with a
    node and no node is marked down."""
    disp = crowded.dispatchers[0].url
    before = scrape([disp])
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", BURST_CLIENT, disp, str(count), str(SPREAD)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for count in (6667, 6667, 6666)
    ]
    seen: Counter[str] = Counter()
    for c in clients:
        out, _ = c.communicate(timeout=240)
        assert c.returncode == 0
        seen.update(json.loads(out))
    assert sum(seen.values()) == 20_000 and set(seen) <= {"200", "503 limit", "failed"}, seen
    after = scrape([disp])

    def grew(name: str, **labels: str) -> float:
        return after.total(name, **labels) - before.total(name, **labels)

    tasks = "lbtestbed_dispatcher_tasks_total"
    assert grew(tasks, outcome="lost") == 0
    assert grew(tasks, outcome="completed") == seen["200"] > 0
    limit = grew("lbtestbed_dispatcher_refusals_total", reason="limit")
    assert grew(tasks, outcome="refused") == seen["503 limit"] == limit > 0
    closed = grew("lbtestbed_dispatcher_connections_refused_total") + grew(
        "lbtestbed_dispatcher_connections_shed_total"
    )
    assert seen["failed"] == closed > 0, (seen, closed)
    assert health(disp)["events"] == [], "a node was marked down"
    assert grew("lbtestbed_dispatcher_health_checks_total", outcome="local") == 0


# ============================================================================= 3. a stalled dispatcher


async def drive_with(
    url: str, tasks: list[tuple[float, float]], scale: float, events: list[tuple[float, Any]]
) -> LoadReport:
    """Drive ``tasks`` through dispatcher ``url`` and run each event at its wall second of the load."""
    start = time.monotonic() + 0.1

    async def act() -> None:
        for at, event in events:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            event()

    report, _ = await asyncio.gather(drive([url], tasks, scale, start=start), act())
    return report


def test_a_stopped_dispatcher_refuses_no_task_when_it_continues(tmp_path: Path) -> None:
    """The dispatcher is stopped (SIGSTOP) for 5 s in the middle of a load and continued. To be sure it
    stops with health checks out, the node processes are stopped 0.4 s before it (for 0.5 s, half the
    health timeout): their answers wait in the stopped dispatcher's sockets, and when it continues, the
    checks' deadlines have passed while it stood still, which says nothing about the nodes. No node is
    marked down, and every task, those sent while it was stopped included, completes."""
    spec = write_spec(tmp_path, fcfs_spec('name = "jiq"', count=4, load=0.5, scale=0.02) + HEALTH)
    with Cluster(tmp_path / "cluster.json") as cluster:
        f = cluster.up(load_spec(spec), node_processes=2)
        disp, pid = f.dispatchers[0].url, f.dispatchers[0].pid
        hosts = [h.pid for h in f.node_hosts]
        exp = f.experiment()
        tasks = list(poisson_tasks(exp, 7.0 / exp.run.time_scale))  # 7 s of wall time, 100 tasks a second

        def each(pids: list[int], sig: int) -> Any:
            return lambda: [os.kill(p, sig) for p in pids]

        events = [
            (0.5, each(hosts, signal.SIGSTOP)),
            (0.9, each([pid], signal.SIGSTOP)),
            (1.0, each(hosts, signal.SIGCONT)),
            (5.9, each([pid], signal.SIGCONT)),
        ]
        try:
            report = uvloop.run(drive_with(disp, tasks, exp.run.time_scale, events))
        finally:
            each([pid, *hosts], signal.SIGCONT)()
        assert report.outcomes["completed"] == len(tasks), report.summary()
        assert health(disp)["events"] == [], "a node was marked down"
        stalled = scrape([disp]).total("lbtestbed_dispatcher_health_checks_total", outcome="stalled")
        assert stalled >= 2, "the health checks out when the dispatcher stopped were not asked again"


def test_timeouts_never_eject_more_than_max_ejection_of_the_nodes() -> None:
    """Four node processes of two nodes each time out one after the other: with max_ejection 0.5 the
    first two are marked down and the next two are spared (counted); a refused connection is evidence and
    marks the third down all the same."""
    doc = tomllib.loads(fcfs_spec('name = "jsq"', count=8) + HEALTH + "max_ejection = 0.5\n")
    exp = parse_spec(doc)
    urls = [f"http://127.0.0.1:{9000 + k // 2}/v1/nodes/{k}" for k in range(exp.n)]
    health = DispatcherHost(exp, 0, 1, urls, "key").health
    for p in health.processes:
        p.contacted = True
        health.down(p, "health check failed: TimeoutError", judged=True)
    assert [p.up for p in health.processes] == [False, False, True, True]
    assert (health.judged_down(), health.spared, health.up_count) == (4, 2, 4)
    health.unreachable(4, "forward failed: connection refused")  # node 4 lives in process 2
    assert [p.up for p in health.processes] == [False, False, False, True]


# ================================================================== 4, 8. the load generator ends


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterFile, Path]]:
    """A cluster of four FCFS nodes and the spec it runs (100 tasks a second of 10 ms on average)."""
    directory = tmp_path_factory.mktemp("small")
    spec = write_spec(directory, fcfs_spec('name = "jsq"', count=4, load=0.25, scale=0.01) + HEALTH)
    with Cluster(directory / "cluster.json") as cluster:
        yield cluster.up(load_spec(spec), node_processes=2), spec


def lbt_load(spec: Path, f: ClusterFile, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [LBT, "load", str(spec), "--dispatcher", f.dispatchers[0].url, "--json", "--quiet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ctrl_c_prints_what_was_sent_and_completed(small: tuple[ClusterFile, Path]) -> None:
    """SIGINT to ``lbt load`` once the dispatcher has completed 50 tasks of its 20 s schedule: it stops,
    prints the summary of what it did (every scheduled task accounted for: completed, or cancelled while
    out, or unsent) and exits 130."""
    f, spec = small
    disp = f.dispatchers[0].url

    def completed() -> float:
        return scrape([disp]).total("lbtestbed_dispatcher_tasks_total", outcome="completed")

    before = completed()
    proc = lbt_load(spec, f, "--duration", "2000")  # 20 s of wall time
    wait_until(lambda: completed() > before + 50, timeout=15, what="the load to start")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert out, err
    summary = json.loads(out)
    assert summary["interrupted"] is True and summary["completed"] > 50 and summary["unsent"] > 1000
    assert sum(summary[k] for k in OUTCOMES) == summary["scheduled"], summary


def test_the_generator_ends_within_its_deadline_with_the_dispatcher_stopped(
    small: tuple[ClusterFile, Path],
) -> None:
    """The dispatcher is stopped (SIGSTOP) and ``lbt load --deadline 1.5`` sends 0.5 s of tasks: none is
    answered, each expires 1.5 s after its send, and the generator ends by itself (the subprocess timeout
    is only the bound on a hang) and says so: every task expired, exit code 1."""
    f, spec = small
    pid = f.dispatchers[0].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        proc = lbt_load(spec, f, "--duration", "50", "--deadline", "1.5")
        out, err = proc.communicate(timeout=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert proc.returncode == 1, err
    summary = json.loads(out)
    assert summary["expired"] == summary["scheduled"] > 20, summary
    assert summary["completed"] == 0 and summary["interrupted"] is False


# ================================================================================== 5. specs too big

JIQ = Path(__file__).resolve().parents[1] / "examples" / "jiq.toml"


def address_space(limit: int) -> Any:
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize(
    ("command", "override", "key"),
    [
        ("run", "run.duration=1e9", "run.duration"),
        ("run", "run.warmup=1e12", "run.warmup"),
        ("simulate", "classes[0].count=10000000", "classes[0].count"),
        ("cluster", "classes[0].count=10000000", "classes[0].count"),
    ],
)
def test_a_spec_that_asks_too_much_is_refused_before_anything_starts(
    tmp_path: Path, command: str, override: str, key: str
) -> None:
    """Specs that look valid but ask for more than a process can hold (a window of 1e9 model seconds, a
    warm-up of 1e12, ten million nodes) are refused when they are read: one line naming the key, exit 2,
    nothing built. The process may use 3 GiB of address space, so that building the tasks or the nodes
    would fail at once with a MemoryError (exit 1) instead of filling the machine."""
    args = [LBT, command, *(["up"] if command == "cluster" else []), str(JIQ), "--set", override]
    if command == "cluster":
        args += ["--file", str(tmp_path / "cluster.json")]
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=60, preexec_fn=address_space(3 * 2**30), cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "cluster.json").exists()


# =========================================================================== 6. cluster up and down


def processes_of(path: Path) -> set[int]:
    """Every process on the machine that runs for the cluster file ``path``."""
    out = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "--cluster" in cmdline and str(path) in cmdline:
            out.add(proc.info["pid"])
    return out


def recorded(path: Path) -> set[int]:
    f = ClusterFile.load(path)
    return {e.pid for e in f.dispatchers + f.node_hosts}


def test_two_ups_at_once_leave_one_cluster_and_no_orphan(tmp_path: Path) -> None:
    """Two ``lbt cluster up`` on one cluster file, started together: one brings the cluster up, the other
    waits for the file's lock, finds it up and refuses (exit 1); every process running for the file is one
    the file records, and ``down`` leaves none."""
    spec = write_spec(tmp_path, fcfs_spec('name = "jsq"', count=4))
    path = tmp_path / "cluster.json"
    ups = [
        subprocess.Popen(
            [LBT, "cluster", "up", str(spec), "--file", str(path), "--node-processes", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        results = sorted((up.wait(timeout=60), up.communicate()[1]) for up in ups)
        assert [code for code, _ in results] == [0, 1], results
        assert "already up" in results[1][1]
        assert processes_of(path) == recorded(path) and len(recorded(path)) == 3
    finally:
        subprocess.run([LBT, "cluster", "down", "--file", str(path)], capture_output=True, timeout=60)
    wait_until(lambda: not processes_of(path), what="every process of the cluster to stop")


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    """A cluster file whose recorded pids now belong to another process (the cluster died and the kernel
    gave the numbers to others; here a sleeper in a session of its own, as ours are): one record has
    another start time, the other the sleeper's start time but the command line of a dispatcher. ``lbt
    cluster status`` calls both DEAD, ``down`` stops nothing and the sleeper lives on."""
    spec = write_spec(tmp_path, fcfs_spec('name = "jsq"', count=4))
    path = tmp_path / "cluster.json"
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        command = [sys.executable, "-m", "lbtestbed.dispatcher", "--cluster", str(path), "--index", "0"]
        born = psutil.Process(sleeper.pid).create_time()
        ClusterFile.of(
            load_spec(spec),
            token="0" * 32,
            dispatchers=[
                Endpoint(
                    "dispatcher", 0, "http://127.0.0.1:9", pid=sleeper.pid, started=born, cmdline=command
                )
            ],
            node_hosts=[
                Endpoint(
                    "nodes", 0, "http://127.0.0.1:9", [0], sleeper.pid, started=born - 3600, cmdline=["sleep"]
                )
            ],
        ).save(path)
        status = subprocess.run(
            [LBT, "cluster", "status", "--file", str(path)], capture_output=True, text=True, timeout=30
        )
        assert status.returncode == 1 and status.stdout.count("DEAD") == 2, status.stdout
        down = subprocess.run(
            [LBT, "cluster", "down", "--file", str(path)], capture_output=True, text=True, timeout=30
        )
        assert down.returncode == 0 and "stopped 0 process" in down.stdout, down.stdout
        assert sleeper.poll() is None, "down signalled a process that was not the cluster's"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_interrupted_up_leaves_nothing_running(tmp_path: Path) -> None:
    """SIGTERM to ``lbt cluster up`` once it has started some of the cluster's processes (the file records
    them): it stops what it started and exits, and nothing runs for the cluster file afterwards."""
    spec = write_spec(tmp_path, fcfs_spec('name = "jsq"', count=4))
    path = tmp_path / "cluster.json"
    up = subprocess.Popen(
        [LBT, "cluster", "up", str(spec), "--file", str(path), "--node-processes", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def started_some() -> bool:
        with contextlib.suppress(Exception):
            return any(e.pid for e in ClusterFile.load(path).node_hosts)
        return False

    try:
        wait_until(started_some, timeout=30, what="up to start a process")
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=60)
        assert up.returncode == 128 + signal.SIGTERM and "interrupted (SIGTERM)" in err, err
        assert processes_of(path) == set()
        assert not path.exists()
    finally:
        if up.poll() is None:
            up.kill()
        if path.exists():
            Cluster(path).down()


# ==================================================================== 7. a restarted dispatcher's memory


def logged_transitions(log: Path) -> list[tuple[int, str]]:
    """(node process, down or up) of every transition a dispatcher's log records, in order."""
    found = re.findall(r"node process (\d+) \(\S+\) (down|up): ", log.read_text(errors="replace"))
    return [(int(p), to) for p, to in found]


def test_a_restarted_dispatcher_still_lists_the_transitions_its_predecessor_saw(tmp_path: Path) -> None:
    """Node process 1 is killed and started again (the dispatcher marks it down, then up), then the
    dispatcher itself is killed and started again. Its ``GET /v1/health``, which ``lbt run`` reads into
    the report, lists every transition its log records, the predecessor's included, in the same order."""
    spec = write_spec(tmp_path, fcfs_spec('name = "jsq"', count=4) + HEALTH)
    path = tmp_path / "cluster.json"
    with Cluster(path) as cluster:
        f = cluster.up(load_spec(spec), node_processes=2)
        disp, victim = f.dispatchers[0], f.node_hosts[1]
        os.killpg(victim.pid, signal.SIGKILL)
        wait_until(lambda: health(disp.url)["nodes_down"] == victim.nodes, what="the kill to be noticed")
        spawn(path, f, victim)
        wait_until(lambda: health(disp.url)["nodes_down"] == [], timeout=15, what="the node process back")
        os.killpg(disp.pid, signal.SIGKILL)
        spawn(path, f, disp)
        wait_until(lambda: healthy(disp.url), timeout=15, what="the restarted dispatcher")
        events = health(disp.url)["events"]
        assert [(e["process"], e["to"]) for e in events] == logged_transitions(Path(disp.log))
        assert [(e["process"], e["to"]) for e in events] == [(1, "down"), (1, "up")], events
        assert len({e["dispatcher_started"] for e in events}) == 1  # both seen by the first dispatcher


# ============================================================ the signatures and the failure kinds, by hand


def test_signatures_bind_receiver_path_body_and_counter_and_refuse_replays() -> None:
    """A signed request is accepted once, by the receiver it was made for, with its own path and body;
    requests of one sender may arrive out of order within WINDOW; one signed before the receiver started
    is refused; an answer is good only for the request it answers."""
    signer = Signer("k" * 32)
    receiver = Verifier("k" * 32, "http://127.0.0.1:8000")
    first, tag = signer.sign(b"POST", b"127.0.0.1:8000", b"/v1/messages", b"{}")
    second, _ = signer.sign(b"POST", b"127.0.0.1:8000", b"/v1/messages", b"{}")
    assert receiver.verify("POST", "/v1/messages", second.decode(), b"{}")  # out of order: fine
    answer_tag = receiver.verify("POST", "/v1/messages", first.decode(), b"{}")
    assert signer.answer_ok(tag, 200, b"ok", receiver.sign(answer_tag, 200, b"ok"))
    assert not signer.answer_ok(tag, 200, b"forged", receiver.sign(answer_tag, 200, b"ok"))
    for method, path, value, body, why in (
        ("POST", "/v1/messages", first, b"{}", "replayed"),
        ("POST", "/v1/faults", second, b"{}", "wrong signature"),
        ("POST", "/v1/messages", second, b'{"x": 1}', "wrong signature"),
    ):
        with pytest.raises(Unauthorized, match=why):
            receiver.verify(method, path, value.decode(), body)
    elsewhere = Verifier("k" * 32, "http://127.0.0.1:8001")
    third, _ = signer.sign(b"POST", b"127.0.0.1:8000", b"/v1/messages", b"{}")
    with pytest.raises(Unauthorized, match="wrong signature"):
        elsewhere.verify("POST", "/v1/messages", third.decode(), b"{}")
    later = Verifier("k" * 32, "http://127.0.0.1:8000")
    later.started = time.time() + 1  # a process that started after the request was signed
    with pytest.raises(Unauthorized, match="before this process started"):
        later.verify("POST", "/v1/messages", third.decode(), b"{}")
    fourth, _ = signer.sign(b"POST", b"127.0.0.1:8000", b"/v1/messages", b"{}")  # the sender's 4th
    receiver.seen[signer.sender.encode()].highest = 4 + WINDOW  # a whole window of later ones arrived
    with pytest.raises(Unauthorized, match="replayed"):
        receiver.verify("POST", "/v1/messages", fourth.decode(), b"{}")


def test_a_local_shortage_is_nobodys_fault() -> None:
    """Running out of descriptors, memory or local ports is this process's failure (``local``), a refused
    connection is evidence the peer is gone, a timeout is a judgment."""
    assert failure_kind(LocalError("no descriptors")) == "local"
    assert failure_kind(OSError(errno.EMFILE, "Too many open files")) == "local"
    assert failure_kind(OSError(errno.EADDRNOTAVAIL, "no local port")) == "local"
    assert failure_kind(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) == "gone"
    assert failure_kind(TimeoutError()) == "timeout"
