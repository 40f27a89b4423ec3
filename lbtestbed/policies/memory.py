"""JSQ(d) with memory: the (d, m) policy of Mitzenmacher, Prabhakar and Shah, "Load Balancing with Memory",
FOCS 2002 (its supermarket-model section; docs/spec.md, "`power_of_d_memory`").

Each task samples d distinct nodes uniformly at random (of those that are up) and adds the m nodes the
dispatcher remembers from the task before; the dispatcher probes them all, since a remembered node's count
may have changed since, and sends the task to the one holding the fewest tasks. It then remembers the m least
loaded of the nodes it probed, counted after the placement (the chosen node with its new task).

Choices the paper leaves open, made here: ties for the fewest tasks are broken uniformly at random (with
m = 0 by the sample's own random order, the first of them as JSQ(d) takes it, so that the policy is
``power_of_d`` draw for draw; otherwise by one more draw among the tied); ties for a place in memory go to the
node probed earlier (sampled before remembered); a node both sampled and remembered is probed once; a
remembered node that goes down is forgotten. The first task, with nothing remembered, probes d nodes.
Messages: a ``probe`` and a ``probe_reply`` per node probed, 2 (d + m (1 - d/n)) per task once the memory
is full (a remembered node is among the d sampled with probability d/n).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lbtestbed.model.experiment import Experiment, NodeClass, PolicyParams
from lbtestbed.model.reader import TableReader
from lbtestbed.policies.base import DispatcherSide, Probe, Route, State, sample_distinct
from lbtestbed.policies.unit import SENDS, Curve, MessageCost, Policy, Quantity


@dataclass(frozen=True)
class MemoryParams(PolicyParams):
    """d fresh samples per task and m nodes remembered from the task before."""

    name: str = "power_of_d_memory"
    d: int = 1
    m: int = 1

    KEYS = ("d", "m")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> MemoryParams:
        n = sum(c.count for c in classes)
        d = r.integer("d", default=1, minimum=1)
        if d > n:
            raise r.fail("d", f"samples {d} distinct nodes but the spec has only {n}")
        return cls(**common, d=d, m=r.integer("m", default=1, minimum=0, maximum=n))

    def message_kinds(self) -> tuple[str, ...]:
        return ("probe", "probe_reply")


class MemoryDispatcher(DispatcherSide):
    """The (d, m) rule (module docstring)."""

    name = "power_of_d_memory"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        params = exp.policy
        assert isinstance(params, MemoryParams)
        self.d, self.m = params.d, params.m
        self.memory: tuple[int, ...] = ()  # the nodes remembered, least loaded first

    def dispatch(self) -> Probe:
        if self.live.down:
            sample = self.live.sample(self.rng, self.d)
        else:
            sample = sample_distinct(self.rng, self.n, self.d)
        return Probe(sample + tuple(k for k in self.memory if k not in sample))

    def resolve(self, probe: Probe, replies: Sequence[int]) -> Route:
        probe, replies = self._without_down(probe, replies)
        if not probe.nodes:  # every probed node went down while the probes were out
            return Route(self.live.pick(self.rng), "probed")
        low = min(replies)
        if self.m == 0:
            best = list(replies).index(low)  # the sample's random order breaks the tie
        else:
            tied = [i for i, x in enumerate(replies) if x == low]
            best = tied[0] if len(tied) == 1 else tied[int(self.rng.random() * len(tied))]
        after = [x + 1 if i == best else x for i, x in enumerate(replies)]
        order = sorted(range(len(after)), key=after.__getitem__)  # stable: a tie keeps the probe order
        self.memory = tuple(probe.nodes[i] for i in order[: self.m])
        return Route(probe.nodes[best], "probed")

    def on_node_down(self, node: int) -> None:
        super().on_node_down(node)
        self.memory = tuple(k for k in self.memory if k != node)

    def gauges(self) -> State:
        return {"remembered_nodes": float(len(self.memory))}


class PowerOfDMemory(Policy):
    name = "power_of_d_memory"
    aliases = ("jsq_d_memory",)
    summary = (
        "JSQ(d) with memory: d samples and the m least loaded of the last probe (Mitzenmacher et al 2002)"
    )
    params = MemoryParams
    dispatcher = MemoryDispatcher
    kinds = ("probe", "probe_reply")
    frontier = (Curve("JSQ(d) with memory m = 1", "d", (1, 2, 3), {"m": 1}),)
    exported = (Quantity("remembered_nodes", "Nodes in the memory: the least loaded of the last probe"),)

    def messages(self, exp: Experiment) -> MessageCost:
        assert isinstance(exp.policy, MemoryParams)
        d, m, n = exp.policy.d, exp.policy.m, exp.n
        probes = d + m * (1 - d / n)
        return MessageCost(
            2.0 * probes,
            f"2 (d + m (1 - d/n)) = {2 * probes:.4g}: the d sampled and the m remembered nodes not among "
            "them, each a probe and a reply",
            SENDS,
            ("the memory full (from the second task on when m <= d)",),
            probes=probes,
        )


POLICIES = (PowerOfDMemory(),)
