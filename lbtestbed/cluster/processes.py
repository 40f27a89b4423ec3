"""What the launcher asks of the operating system: free ports, whether a process we started still runs,
signals to it, the lock on a cluster file, and signals that must not cut a start in half.

A pid alone names a process only while it lives: once it has exited the kernel may give the number to
another. So every process the launcher starts is recorded with its start time (psutil's ``create_time``,
from the kernel) and the command line it was started with (``Started``), and is signalled only when the
process under that pid has both: a stale cluster file never stops an unrelated process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psutil

from lbtestbed.transport.cluster_file import LOOPBACK, ClusterError


@dataclass(frozen=True)
class Started:
    """A process as its starter recorded it: pid, start time (seconds since the epoch, psutil's
    ``create_time``) and the command line it ends with (an ``ip netns exec`` prefix may precede it)."""

    pid: int
    started: float
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int, cmdline: Sequence[str]) -> Started:
        """Record our child ``pid``, just started with ``cmdline`` (its pid cannot be reused before we
        reap it, so the start time read now is its own)."""
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            started = 0.0  # it is gone already: nothing will ever match it
        return cls(pid, started, tuple(cmdline))

    def ours(self) -> bool:
        """Whether the process under ``pid`` is the one recorded (same start time and command line) and
        has not exited."""
        if self.pid <= 0 or not self.started:
            return False
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:  # our exited child: reap it
                return False
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.started) > 1e-3:
                return False  # the pid was given to another process
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            if proc.ppid() == os.getpid():
                return True  # our own child (its pid is ours until we reap it), exec'd or about to be
            tail = tuple(proc.cmdline()[-len(self.cmdline) :]) if self.cmdline else ()
        except psutil.Error:
            return False
        return tail == self.cmdline

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the process (and the group it leads) if it is still the one recorded."""
        if not self.ours():
            return False
        signal_group(self.pid, sig)
        return True


def stop_all(procs: Sequence[Started], grace: float = 5.0) -> int:
    """SIGTERM every process that is still ours, SIGKILL after ``grace`` seconds; how many were running."""
    running = [p for p in procs if p.signal(signal.SIGTERM)]
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.ours() for p in running):
        time.sleep(0.05)
    for p in running:
        p.signal(signal.SIGKILL)
    while any(p.ours() for p in running) and time.monotonic() < deadline + 5.0:
        time.sleep(0.05)
    return len(running)


@contextlib.contextmanager
def locked(path: Path, timeout: float = 120.0) -> Iterator[None]:
    """Hold the lock of the cluster file ``path`` (``path`` with suffix ``.lock``, beside it): one ``up``
    or ``down`` at a time per cluster file; another waits up to ``timeout`` seconds for it."""
    lock = path.with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{path}: another lbt cluster up or down still holds {lock} after {timeout:g} s"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP while a cluster starts; ``signal`` says which."""

    def __init__(self, sig: int) -> None:
        super().__init__(signal.Signals(sig).name)
        self.signal = sig


class DeferredSignals:
    """While a cluster starts, SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` (so that the start is
    undone: Python's default for SIGTERM and SIGHUP ends the process and leaves its children running);
    inside ``critical()`` they wait until its end, so that a process is never started without being
    recorded in the cluster file. Only the main thread can take signals; elsewhere this does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.pending: int | None = None
        self._critical = False
        self._old: dict[int, object] = {}

    def __enter__(self) -> DeferredSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        if self._critical:
            self.pending = sig
            return
        raise Interrupted(sig)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self._critical = True
        try:
            yield
        finally:
            self._critical = False
        if self.pending is not None:
            raise Interrupted(self.pending)


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
