"""What the launcher asks of the operating system: free ports, whether a pid runs, signals to a group."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from lbtestbed.transport.cluster_file import LOOPBACK


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not); reaps it when it is our exited child."""
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


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pid`` leads, or to the process alone if it leads none."""
    try:
        os.killpg(pid, sig)  # each process leads its own session and group
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


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
