"""The random streams of an experiment: one per purpose, replication and (for node sides) node.

Every driver (the simulator, its twin, the cluster's processes, the load generators) draws each quantity
from the stream named for it, seeded from the experiment's seed, so that they draw the same numbers for the
same purpose whichever of them runs it.
"""

from __future__ import annotations

import random

import numpy as np

_STREAMS = {
    "speeds": 1,
    "arrivals": 2,
    "sizes": 3,
    "policy": 4,
    "network": 5,
    "nodes": 6,
    "split": 7,  # which dispatcher each arrival reaches (policy.split = "random")
    "dispatchers": 8,  # the simulator's dispatchers 1..K-1 (dispatcher 0 draws from "policy")
    "node_side": 9,  # node k's own draws (which dispatcher hears of it): one stream per node, see below
    "faults": 10,  # which tasks a failing node fails (fail faults): the simulator's, and each node host's
    "antagonists": 11,  # node k's antagonist: one stream per node (model.schedules.antagonist_random)
    "rates": 12,  # the rates kernel's draws: when each completion comes and where (analysis.simulator.rates)
}


def seed_sequence(seed: int, stream: str, replication: int = 0) -> np.random.SeedSequence:
    """An independent random stream of an experiment: one per purpose and replication."""
    return np.random.SeedSequence([seed, replication, _STREAMS[stream]])


def seeded_random(seed: int, stream: str, replication: int = 0) -> random.Random:
    """A Python generator on one of an experiment's streams (policies draw scalars: faster than numpy)."""
    return random.Random(int(seed_sequence(seed, stream, replication).generate_state(1)[0]))


def node_random(seed: int, node: int, replication: int = 0) -> random.Random:
    """Node ``node``'s own stream for its policy half's draws. One per node, so that the simulator, the
    twin and a node process (which may host many nodes, in whatever order their events come) draw the
    same numbers for the same node events."""
    state = np.random.SeedSequence([seed, replication, _STREAMS["node_side"], node]).generate_state(1)
    return random.Random(int(state[0]))
