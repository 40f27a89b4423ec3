"""The policy library: a dispatcher side and a node side per policy (docs/design.md, principle 2)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from lbtestbed.model.spec import MESSAGE_KINDS, Experiment, node_random
from lbtestbed.policies.base import DispatcherSide, Message, NodeSide, Probe, Route
from lbtestbed.policies.hetero_ps import Scheme1Dispatcher, Scheme2Dispatcher
from lbtestbed.policies.jiq import IdleTokenSender, JIQDispatcher
from lbtestbed.policies.jlmu import JLMUDispatcher, ranking_of
from lbtestbed.policies.jsq import DepartureNotifier, JSQDispatcher
from lbtestbed.policies.peak_ewma import PeakEwmaDispatcher
from lbtestbed.policies.prequal import PrequalDispatcher, PrequalNode
from lbtestbed.policies.sampling import LeastRequestDispatcher, PowerOfDDispatcher
from lbtestbed.policies.slta import SLTADispatcher, SLTANode, Thresholds
from lbtestbed.policies.static import RandomDispatcher, RoundRobinDispatcher

__all__ = [
    "MESSAGE_ID",
    "MESSAGE_KINDS",
    "DispatcherSide",
    "Message",
    "NodeSide",
    "Probe",
    "Route",
    "make_dispatcher",
    "make_node_sides",
]

DISPATCHERS: dict[str, type[DispatcherSide]] = {
    cls.name: cls
    for cls in (
        RandomDispatcher,
        RoundRobinDispatcher,
        JSQDispatcher,
        PowerOfDDispatcher,
        LeastRequestDispatcher,
        JIQDispatcher,
        JLMUDispatcher,
        SLTADispatcher,
        Scheme1Dispatcher,
        Scheme2Dispatcher,
        PeakEwmaDispatcher,
        PrequalDispatcher,
    )
}

NODE_SIDES: dict[str, type[NodeSide]] = {
    "jsq": DepartureNotifier,
    "jlmu": DepartureNotifier,
    "jiq": IdleTokenSender,
    "slta": SLTANode,
    "prequal": PrequalNode,
}


#: the positions of a message's data that name the event which made it (the rest is content that a
#: simulation of the same run may compute otherwise): a token's round or event number, a notice's counts.
#: Kinds not listed are named by all their data.
MESSAGE_ID: dict[str, tuple[int, ...]] = {
    "departure": (0, 1, 3),  # (arrived, departed), and a full view's event number
    "arrival": (0, 1, 3),
    "token_count": (0,),  # the round it answers
    "token_departure": (2,),  # the pool's event number
    "token_arrival": (2,),
    "token_epoch": (0, 2),  # the epoch it answers, and the pool's event number
    "epoch": (0,),
    "prequal_probe": (0,),  # the dispatcher's probe number
    "prequal_reply": (0,),  # the probe it answers
}

#: kinds a node accepts from a dispatcher (probes have their own endpoint)
NODE_BOUND: dict[str, tuple[str, ...]] = {
    name: {"slta": ("epoch",), "jiq": ("token_count",), "prequal": ("prequal_probe",)}.get(name, ())
    for name in MESSAGE_KINDS
}
#: kinds a dispatcher accepts from nodes
DISPATCHER_BOUND: dict[str, tuple[str, ...]] = {
    name: tuple(k for k in kinds if k not in ("probe", "probe_reply", *NODE_BOUND[name]))
    for name, kinds in MESSAGE_KINDS.items()
}


def make_dispatcher(
    exp: Experiment, rng: random.Random, index: int = 0, dispatchers: int = 1
) -> DispatcherSide:
    """The dispatcher side of the spec's policy; ``index`` of ``dispatchers`` running side by side."""
    cls = DISPATCHERS[exp.policy.name]
    if cls is JIQDispatcher:
        return JIQDispatcher(exp, rng, index, dispatchers)
    return cls(exp, rng, index)


def make_node_sides(
    exp: Experiment,
    rng: random.Random,
    nodes: Sequence[int] | None = None,
    dispatchers: int = 1,
    replication: int = 0,
) -> list[NodeSide]:
    """The node sides of the spec's policy for ``nodes`` (all by default); they share derived tables. A
    node side that draws random numbers (with several dispatchers) gets its node's own stream, so that
    every driver draws the same numbers for the same node; the others share ``rng``."""
    cls = NODE_SIDES.get(exp.policy.name, NodeSide)
    nodes = range(exp.n) if nodes is None else nodes
    if cls is SLTANode:
        th = Thresholds(ranking_of(exp))
        return [SLTANode(exp, k, rng, dispatchers, th) for k in nodes]
    if cls.draws and dispatchers > 1:
        return [cls(exp, k, node_random(exp.seed, k, replication), dispatchers) for k in nodes]
    return [cls(exp, k, rng, dispatchers) for k in nodes]
