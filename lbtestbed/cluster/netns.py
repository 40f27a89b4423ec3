"""Many hosts on one machine: every node process in its own network namespace, on a bridge.

``lbt cluster up --netns`` makes a bridge ``lbt<tag>`` in the root namespace with address 10.213.S.1/24 and,
for node process j, a namespace ``lbt-<tag>-<j>`` holding one end of a veth pair (``eth0``, address
10.213.S.(10 + j)) whose other end is on the bridge. Dispatchers stay in the root namespace and listen on
the bridge's address, so every task, probe and state message between a dispatcher and a node really crosses
two interfaces and the bridge. An optional rate limit (``tbf``) applies to both directions of every veth.
Everything is torn down with the cluster; ``cleanup_stale`` removes what a crashed run left behind (the
names carry the ``lbt`` prefix and a namespace with no process in it is stale). Needs root and iproute2.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

NETWORK = "10.213"  # a /16 of the private range, one /24 per cluster
FIRST_HOST = 10


class NetnsError(RuntimeError):
    """A namespace, link or address could not be made or removed; the message names the command."""


@dataclass
class Layout:
    tag: str
    subnet: int  # third octet of the cluster's /24
    namespaces: list[str] = field(default_factory=list)
    rate: str = ""  # tbf rate on every veth, e.g. "100mbit"; empty: none

    @property
    def bridge(self) -> str:
        return f"lbt{self.tag}"

    @property
    def bridge_ip(self) -> str:
        return f"{NETWORK}.{self.subnet}.1"

    def host_ip(self, j: int) -> str:
        return f"{NETWORK}.{self.subnet}.{FIRST_HOST + j}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        return cls(data["tag"], int(data["subnet"]), list(data.get("namespaces", [])), data.get("rate", ""))


def _ip(*args: str, namespace: str | None = None) -> str:
    cmd = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, "ip", *args]
    return _run(cmd)


def _run(cmd: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetnsError(
            f"{cmd[0]} not found: --netns needs iproute2 (Debian: apt-get install iproute2)"
        ) from None
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def check_usable() -> None:
    """--netns needs root and the ip command; say so before anything is made."""
    if os.geteuid() != 0:
        raise NetnsError("--netns needs root: network namespaces, veth pairs and bridges are privileged")
    if shutil.which("ip") is None:
        raise NetnsError("--netns needs the ip command of iproute2 (Debian: apt-get install iproute2)")


def _free_subnet() -> int:
    used = {int(m) for m in re.findall(rf"inet {re.escape(NETWORK)}\.(\d+)\.", _ip("-4", "addr", "show"))}
    free = [s for s in range(1, 255) if s not in used]
    if not free:
        raise NetnsError(f"no free /24 left in {NETWORK}.0.0/16")
    return free[secrets.randbelow(len(free))]


def create(hosts: int, rate: str = "") -> Layout:
    """A bridge and ``hosts`` namespaces wired to it; on any failure what was made is removed again."""
    check_usable()
    if rate and not re.fullmatch(r"\d+(\.\d+)?(bit|kbit|mbit|gbit)", rate):
        raise NetnsError(f"bandwidth {rate!r}: expected a tc rate such as 100mbit, 512kbit or 1gbit")
    layout = Layout(secrets.token_hex(3), _free_subnet(), rate=rate)
    try:
        _ip("link", "add", layout.bridge, "type", "bridge")
        _ip("addr", "add", f"{layout.bridge_ip}/24", "dev", layout.bridge)
        _ip("link", "set", layout.bridge, "up")
        for j in range(hosts):
            ns = f"lbt-{layout.tag}-{j}"
            outer, inner = f"lbt{layout.tag}{j}", f"lbp{layout.tag}{j}"
            _ip("netns", "add", ns)
            layout.namespaces.append(ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", layout.bridge)
            _ip("link", "set", outer, "up")
            _ip("link", "set", "lo", "up", namespace=ns)
            _ip("link", "set", inner, "name", "eth0", namespace=ns)
            _ip("addr", "add", f"{layout.host_ip(j)}/24", "dev", "eth0", namespace=ns)
            _ip("link", "set", "eth0", "up", namespace=ns)
            if rate:  # both directions: toward the node on the outer end, from it on eth0
                tbf = [
                    "qdisc",
                    "add",
                    "dev",
                    "{dev}",
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    "64kb",
                    "latency",
                    "50ms",
                ]
                _run(["tc", *[a.replace("{dev}", outer) for a in tbf]])
                _run(["ip", "netns", "exec", ns, "tc", *[a.replace("{dev}", "eth0") for a in tbf]])
    except BaseException:
        destroy(layout)
        raise
    return layout


def destroy(layout: Layout) -> None:
    """Remove the namespaces (their veth pairs go with them) and the bridge; missing ones are fine."""
    for ns in layout.namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    subprocess.run(["ip", "link", "del", layout.bridge], capture_output=True, timeout=30)


def exec_prefix(namespace: str) -> list[str]:
    return ["ip", "netns", "exec", namespace]


def _ports_gone(bridge: str, wait: float = 2.0) -> bool:
    """Whether the bridge has no port; a namespace just deleted takes its veth end away a moment later."""
    deadline = time.monotonic() + wait
    while _ip("-o", "link", "show", "master", bridge).strip():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def cleanup_stale() -> list[str]:
    """Remove lbt namespaces with no process left in them, and lbt bridges with no port: what a crash
    left behind. Returns the names removed."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return []
    removed = []
    for line in _run(["ip", "netns", "list"]).splitlines():
        ns = line.split()[0] if line.split() else ""
        if re.fullmatch(r"lbt-[0-9a-f]{6}-\d+", ns) and not _run(["ip", "netns", "pids", ns]).strip():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            removed.append(ns)
    for bridge in re.findall(r"^\d+: (lbt[0-9a-f]{6}):", _ip("-o", "link", "show", "type", "bridge"), re.M):
        if _ports_gone(bridge):
            subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)
            removed.append(bridge)
    return removed
