"""Why a command of the experiment layer stopped before it was done: bad input, or a failure on the way.

The command line turns the first into exit code 2 and the second into 1, each with its message as the one
line it prints (``lbt: error: <message>``).
"""

from __future__ import annotations

import errno


class BadInput(Exception):
    """What was asked cannot work (a spec against its cluster, an option against the spec): exit 2."""


class Failed(Exception):
    """What was asked could not be done (a process, a port, a server answered otherwise): exit 1."""


#: the errors of a write that found no room: a full disk (or quota), which is a failure (exit 1), where any
#: other error writing a file the user named is bad input (exit 2)
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(e: OSError, what: str) -> Failed:
    """The failure of a write that found no room, said as such."""
    return Failed(f"{what}: the disk is full ({e.strerror or e})")
