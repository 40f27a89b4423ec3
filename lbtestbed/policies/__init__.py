"""The policy library: per policy, its parameters, a dispatcher side and a node side, and what it
declares to the rest of the house (docs/design.md, principle 2; ``unit.Policy``)."""

from __future__ import annotations

from lbtestbed.policies.base import DispatcherSide, Message, NodeSide, Probe, Route
from lbtestbed.policies.catalog import CATALOG, make_dispatcher, make_node_sides, policy_of
from lbtestbed.policies.unit import Learned, MessageCost, Policy

__all__ = [
    "CATALOG",
    "DISPATCHERS",
    "DISPATCHER_BOUND",
    "MESSAGE_ID",
    "MESSAGE_KINDS",
    "NODE_BOUND",
    "DispatcherSide",
    "Learned",
    "Message",
    "MessageCost",
    "NodeSide",
    "Policy",
    "Probe",
    "Route",
    "make_dispatcher",
    "make_node_sides",
    "policy_of",
]

#: the tables the protocol reads, derived from the catalog: each policy's dispatcher class, every kind of
#: message it may send, the kinds its nodes and its dispatchers accept, and how a message is named
DISPATCHERS: dict[str, type[DispatcherSide]] = {p.name: p.dispatcher for p in CATALOG}
MESSAGE_KINDS: dict[str, tuple[str, ...]] = {p.name: p.kinds for p in CATALOG}
NODE_BOUND: dict[str, tuple[str, ...]] = {p.name: p.node_bound for p in CATALOG}
DISPATCHER_BOUND: dict[str, tuple[str, ...]] = {p.name: p.dispatcher_bound for p in CATALOG}
MESSAGE_ID: dict[str, tuple[int, ...]] = CATALOG.message_id()
