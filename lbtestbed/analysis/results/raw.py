"""The raw record of one run, batch by batch: what the simulator and the cluster's measurement both produce
and ``summarize`` turns into a result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RawRun:
    """What one replication measured, batch by batch: numerators and denominators of every ratio."""

    batches: int
    ratios: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # per batch, by arrival batch (the simulator's are arrays of doubles)
    sojourns: Sequence[Sequence[float]] = field(default_factory=list)
    r_time: dict[int | float, float] = field(
        default_factory=dict
    )  # SLTA: seconds at each r (several: their mean)
    r_series: list[tuple[float, int | float]] = field(default_factory=list)
    decisions: dict[str, int] = field(default_factory=dict)
    message_kinds: tuple[str, ...] = ()
    censored: int = 0
    events: int = 0
    wall_seconds: float = 0.0
    stale_tokens: int = 0
    batch_of: list[int] = field(default_factory=list)  # positions of the batches kept (empty: all)
