"""Hardening (issue 16): what a local user or a careless operator can do to a cluster on loopback.

Each test reproduces one way the cluster broke before and checks that it no longer does:

- a process that takes over the port of a dead node process receives nothing it can use: no credential,
  nothing that can be replayed (to the dispatcher, another node process, or the node process that takes the
  port back), and its own answers are not believed;

Real processes on 127.0.0.1 throughout; every cluster is stopped by its context manager.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from test_cluster import fcfs_spec, get, post, scrape, signed_by, wait_until, write_spec

from lbtestbed.cluster.launcher import Cluster, healthy, spawn
from lbtestbed.model.spec import load_spec
from lbtestbed.transport.signing import Signer

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


@contextmanager
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
