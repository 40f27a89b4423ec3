"""Message faults as a process applies them to the state messages it sends (``docs/faults.md``).

The spec's ``[[faults]]`` of kind drop, duplicate and delay act on one-way state messages at their sender,
like the emulated network delay: a dropped message is sent and never arrives, a duplicated one arrives
twice, a delayed one later by a draw of the fault's distribution. The run switches each fault on and off
at its times (``POST /v1/faults``); every process draws from its own seeded stream. This is the bookkeeping
only: it reads no clock and sends nothing (the hosts' cores ask it what to send, their shells send it).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from lbtestbed.model.distributions import BlockSampler
from lbtestbed.model.experiment import MESSAGE_FAULTS, Experiment
from lbtestbed.model.streams import seed_sequence, seeded_random
from lbtestbed.transport import wire

#: what a sender does with a message that no fault hits: one copy, no extra delay
ONCE = (0.0,)


class MessageFaults:
    """The message faults of a spec that are active in this process, and what they did."""

    def __init__(self, exp: Experiment, stream: int) -> None:
        self.faults = exp.faults
        self.active: set[int] = set()
        self.rng = seeded_random(exp.seed, "network", 5000 + stream)
        np_rng = np.random.default_rng(seed_sequence(exp.seed, "network", 6000 + stream))
        self.delays = {
            i: BlockSampler(f.delay, np_rng) for i, f in enumerate(self.faults) if f.delay is not None
        }
        self.hits: Counter[tuple[str, str]] = Counter()  # (fault kind, message kind)

    def set(self, index: int, active: bool) -> None:
        if not 0 <= index < len(self.faults) or self.faults[index].kind not in MESSAGE_FAULTS:
            raise wire.BadRequest(f"the spec has no message fault {index}", "fault")
        if active:
            self.active.add(index)
        else:
            self.active.discard(index)

    def copies(self, kind: str) -> tuple[float, ...]:
        """The extra delays (model seconds) of the copies of a ``kind`` message to send: () drops it."""
        if not self.active:
            return ONCE
        out = [0.0]
        for i in sorted(self.active):
            f = self.faults[i]
            if kind not in f.messages:
                continue
            if f.kind == "drop" and self.rng.random() < f.fraction:
                self.hits["drop", kind] += 1
                return ()
            if f.kind == "duplicate" and self.rng.random() < f.fraction:
                self.hits["duplicate", kind] += 1
                out.append(out[0])
            elif f.kind == "delay":
                self.hits["delay", kind] += 1
                extra = self.delays[i]()
                out = [d + extra for d in out]
        return tuple(out)
