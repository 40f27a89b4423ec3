"""The raw record of one run, batch by batch: what the simulator and the cluster's measurement both produce
and ``summarize`` turns into a result."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

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
    )  # model seconds at each value of what the policy learns (several: their mean)
    r_series: list[tuple[float, int | float]] = field(default_factory=list)
    decisions: dict[str, int] = field(default_factory=dict)
    message_kinds: tuple[str, ...] = ()
    censored: int = 0
    events: int = 0
    wall_seconds: float = 0.0
    stale_tokens: int = 0
    batch_of: list[int] = field(default_factory=list)  # positions of the batches kept (empty: all)

    def positions(self) -> list[int]:
        """The window positions of the batches held (a cluster run may have left some out)."""
        return list(self.batch_of) if self.batch_of else list(range(self.batches))

    def only(self, positions: Collection[int]) -> RawRun:
        """The same run restricted to the batches at window ``positions`` (those it has): what the other
        sources of a run are cut to when the cluster's comparison keeps only some batches, so that every
        column of a report's row is computed over the same batches. Whole-run records (the learned
        index's time at each value, the decisions) are kept as they are."""
        held = self.positions()
        mask = np.array([p in positions for p in held], bool)
        if mask.all():
            return self
        return replace(
            self,
            batches=int(mask.sum()),
            ratios={k: (num[mask], den[mask]) for k, (num, den) in self.ratios.items()},
            sojourns=[s for s, k in zip(self.sojourns, mask, strict=True) if k],
            batch_of=[p for p, k in zip(held, mask, strict=True) if k],
        )
