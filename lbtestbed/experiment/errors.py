"""Why a command of the experiment layer stopped before it was done: bad input, or a failure on the way.

The command line turns the first into exit code 2 and the second into 1, each with its message as the one
line it prints (``lbt: error: <message>``).
"""

from __future__ import annotations


class BadInput(Exception):
    """What was asked cannot work (a spec against its cluster, an option against the spec): exit 2."""


class Failed(Exception):
    """What was asked could not be done (a process, a port, a server answered otherwise): exit 1."""
