"""What a host's core asks its shell to do, alike in both roles: send a state message, log a warning.

The cores (``dispatcher.core``, ``server_node.core``) leave these in their outbox; the shells carry them
out after each event (``act``). Each role adds its own (a dispatcher's node transitions, a node's timers
and completions).
"""

from __future__ import annotations

from typing import NamedTuple

from lbtestbed.policies.base import Message


class Send(NamedTuple):
    """Post one copy of a state message, ``extra`` model seconds late (a delay fault) and behind the
    emulated network delay; its age runs from ``at`` (monotonic), the instant it was decided."""

    message: Message
    at: float
    extra: float


class Note(NamedTuple):
    """A warning for the log."""

    text: str
