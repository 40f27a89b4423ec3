"""A callback at a monotonic instant, to the microsecond: the generator's schedule, a node's completions.

The event loop's own timers are coarse: uvloop's (libuv's) count whole milliseconds and fire up to one
early, so whoever must not act before an instant (the generator before a task's intended time, a node
before a completion's) looked at the clock and set another timer until the instant came. The generator
spun through its loop that way about 30 times per task at 2,000 tasks per second, most of its CPU; a node
host fired about 7 timers per completion, which cost it little but left its completions up to a
millisecond off. On Linux an ``Alarm`` is a timerfd on ``CLOCK_MONOTONIC`` (the clock of
``time.monotonic``), armed at the absolute instant and watched by the loop like a socket: the kernel's
high-resolution timer wakes the loop once, when the instant has come and not before. (Arming one close to
its instant costs a few µs on a virtual machine, which reprograms its timer: about what a node's spins
cost.) Elsewhere (no timerfd) it falls back on the loop's timers, and looks at the clock again when one
fires: it spins until the instant, as before.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable
from typing import Any

CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
#: wall seconds: an instant further away is never reached while a process lives (a node's task of 1e300
#: seconds of work, which the node's own route accepts), and is not armed: the timerfd's seconds are a C
#: long, and the loop's timers overflow too
NEVER = 1e9


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    except (OSError, AttributeError):  # not Linux (or a libc without timerfd)
        return None
    return libc


class Alarm:
    """Calls back from ``loop`` once the monotonic clock reaches the instant given to ``at``, never
    before. One instant at a time: ``at`` replaces the previous one. ``close`` when done."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.callback: Callable[..., None] | None = None
        self.args: tuple[Any, ...] = ()
        self.handle: asyncio.TimerHandle | None = None
        self.when = 0.0
        self.fd = -1
        self._libc = _libc()
        self._spec = _Itimerspec()
        if self._libc is not None:
            fd = self._libc.timerfd_create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self.fd = fd
                loop.add_reader(fd, self._fired)

    @property
    def precise(self) -> bool:
        """Whether it wakes at the instant itself (a timerfd), not at the loop timers' next tick."""
        return self.fd >= 0

    def at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        """Call ``callback(*args)`` at the monotonic instant ``when`` (never, when it is NEVER or more
        away, or not a number)."""
        if not when - time.monotonic() < NEVER:
            self.cancel()
            return
        self.callback, self.args, self.when = callback, args, when
        if self.fd < 0:
            if self.handle is not None:
                self.handle.cancel()
            self.handle = self.loop.call_later(max(0.0, when - time.monotonic()), self._fired)
            return
        assert self._libc is not None
        value = self._spec.it_value
        value.tv_sec = int(when)
        value.tv_nsec = int((when - value.tv_sec) * 1e9)
        if self._libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"timerfd_settime: {os.strerror(e)}")

    def _fired(self) -> None:
        if self.fd >= 0:
            try:
                os.read(self.fd, 8)  # the count of expirations: read, or the loop would report it again
            except BlockingIOError:  # re-armed since it expired
                return
        else:
            self.handle = None
            wait = self.when - time.monotonic()
            if wait > 0:  # the loop's timer fired early (uvloop's count whole milliseconds)
                self.handle = self.loop.call_later(wait, self._fired)
                return
        callback, self.callback = self.callback, None
        if callback is not None:
            callback(*self.args)

    def cancel(self) -> None:
        """No callback (until ``at`` again)."""
        self.callback = None
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def close(self) -> None:
        self.cancel()
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
