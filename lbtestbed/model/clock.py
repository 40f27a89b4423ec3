"""Model time on a wall clock: the one conversion between the two (docs/design.md, principle 3).

A process runs model time at ``time_scale`` wall seconds per model second from a wall instant ``origin``
(its monotonic clock when it started, or the run's model time 0): model time = (wall - origin) /
time_scale. Every conversion a dispatcher or a node host makes, instants and durations alike, goes through
a ``ModelClock``; the clock is only arithmetic: it reads no clock itself, the caller hands it the instant.
"""

from __future__ import annotations

from typing import NamedTuple


class ModelClock(NamedTuple):
    """Model seconds from wall instants (``to_model``) and back (``to_wall``), and durations either way
    (immutable: a clock with another origin is another clock)."""

    time_scale: float  # wall seconds per model second
    origin: float = 0.0  # the wall instant of model time 0

    def to_model(self, wall: float) -> float:
        """The model time at the wall instant ``wall``."""
        return (wall - self.origin) / self.time_scale

    def to_wall(self, model: float) -> float:
        """The wall instant of model time ``model``."""
        return self.origin + model * self.time_scale

    def model_span(self, wall_seconds: float) -> float:
        """How many model seconds ``wall_seconds`` wall seconds last."""
        return wall_seconds / self.time_scale

    def wall_span(self, model_seconds: float) -> float:
        """How many wall seconds ``model_seconds`` model seconds last."""
        return model_seconds * self.time_scale
