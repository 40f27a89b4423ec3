"""What a host's core asks of its shell, alike in both roles: send a state message, log a warning, and
observe into a histogram.

The cores (``dispatcher.core``, ``server_node.core``) leave actions in their outbox; the shells carry them
out after each event (``act``). Each role adds its own (a dispatcher's node transitions, a node's timers
and completions). The observers are what a core is handed to observe into, so that it imports no
Prometheus.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

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


class Observer(Protocol):
    """A histogram as a core sees it (a Prometheus ``Histogram`` or one of its labelled children)."""

    def observe(self, amount: float) -> None: ...


class AgeObserver(Protocol):
    """Where a core notes the age of a state message it applied (``transport.metrics.MessageAges``):
    ``sent`` is the sender's stamp, ``now`` the instant it was applied (both monotonic)."""

    def observe(self, m: Message, sent: float | None, now: float, rider: bool = False) -> None: ...
