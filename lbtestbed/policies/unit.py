"""What one policy declares: everything the rest of the house knows about it (docs/contributing.md).

A policy is one unit: its module in ``lbtestbed/policies/`` holds its parameters (a ``PolicyParams``
subclass: its spec keys, their reading and checks, the message kinds it sends as configured), its two
halves (a ``DispatcherSide`` and, if its nodes speak, a ``NodeSide``) and a ``Policy`` subclass that names
them, with the message kinds it may send, which of them nodes accept, what they cost per task, the state
it learns and its tie to the health checks. The module lists its policies in ``POLICIES``; the catalog
(``policies.catalog``) finds every module's, so that adding a policy is adding its module (with its tests
and its section of docs/spec.md). Nothing outside the library compares a policy's name: the simulator,
the hosts, the pre-flight, the report and the theory read these declarations.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from lbtestbed.model.experiment import Experiment, PolicyParams
from lbtestbed.model.streams import node_random
from lbtestbed.policies.base import DispatcherSide, NodeSide


def theory_doc(heading: str) -> str:
    """A citation of a section of docs/theory.md."""
    return f'docs/theory.md, "{heading}"'


#: where docs/theory.md counts the messages each policy sends
SENDS = theory_doc("What each policy sends")
#: probes are answered on the probe's own request: never a message of their own on the wire
PROBE_KINDS = ("probe", "probe_reply")


@dataclass(frozen=True)
class MessageCost:
    """What a policy's state messages cost per task, as configured.

    ``per_task`` is the expected number of state messages per task (the theory's ``messages_per_task``:
    None when no closed form gives it), said in words by ``formula`` with its ``source`` and what it
    ``assumes``. ``probes`` (probe round trips per task: a request each, answered on it) and ``own`` (one-way
    messages per task on requests of their own; the rest ride on replies sent anyway) are what the
    pre-flight charges the processes for (``experiment.preflight``)."""

    per_task: float | None
    formula: str
    source: str = SENDS
    assumes: tuple[str, ...] = ()
    probes: float = 0.0
    own: float = 0.0


#: a policy that sends nothing
NO_COST = MessageCost(0.0, "no state messages", "policy definition")


@dataclass(frozen=True)
class Learned:
    """A quantity a dispatcher side learns as it runs (SLTA's index r), read by ``learned_value``.

    Both drivers follow it: the simulator and a dispatcher process integrate it over model time, so that its
    time average is a measured metric named ``name`` (compared like any other), and keep the time spent at
    each value and its path over the measured window (the report's plot ``<name>.png``)."""

    name: str  # the metric's name, and the dispatcher's gauge and integral
    label: str  # what it is, for titles and help texts ("SLTA's learned index r")
    unit: str = "index"


#: a dispatcher's family of quantity ``name`` is ``lbtestbed_dispatcher_<name>``
DISPATCHER_PREFIX = "lbtestbed_dispatcher_"
_METRIC_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class Quantity:
    """One quantity of a policy's state that its dispatcher exports as a metric family of its own,
    ``lbtestbed_dispatcher_<name>`` (docs/protocol.md, "Policy state"); ``DispatcherSide.gauges`` gives
    its value.

    Names follow Prometheus's conventions (https://prometheus.io/docs/practices/naming/): one family per
    quantity, its unit last where it has one, a ``counter`` (a count that only grows while the process
    lives) ending in ``_total``, a ``gauge`` not. ``label`` names the one dimension the quantity runs over
    (``class``: a value per node class; ``reason``), if any: its value is then one number per label value,
    and summing over them means something."""

    name: str  # after the prefix, as PromQL reads it: "idle_tokens", "prequal_probes_removed_total"
    help: str  # the family's help text
    kind: Literal["gauge", "counter"] = "gauge"
    label: str | None = None

    def __post_init__(self) -> None:
        if not _METRIC_NAME.fullmatch(self.name):
            raise ValueError(f"quantity {self.name!r}: a metric name is lower case letters, digits and _")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"quantity {self.name!r}: a counter's name ends in _total, a gauge's does not")

    @property
    def metric(self) -> str:
        """The name PromQL reads (a counter's with ``_total``)."""
        return DISPATCHER_PREFIX + self.name


@dataclass(frozen=True)
class Curve:
    """One way a policy trades messages for delay (``lbt frontier``): the policy run with ``fixed`` and each
    of ``values`` of its table's ``key`` in turn, one point each, drawn as one curve named ``label``."""

    label: str  # "JSQ(d)", "asynchronous updates"
    key: str  # a key of the policy's table
    values: tuple[int | float, ...]
    fixed: Mapping[str, object] = field(default_factory=dict)


class Policy:
    """One policy's declarations (module docstring); a module's ``POLICIES`` holds an instance of each."""

    #: the spec's ``policy.name``, and other names a spec may give it
    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    #: one line: what it does, and its source
    summary: ClassVar[str]
    params: ClassVar[type[PolicyParams]]
    dispatcher: ClassVar[type[DispatcherSide]]
    node: ClassVar[type[NodeSide]] = NodeSide
    #: every kind of state message it may send (``PolicyParams.message_kinds``: those of a configuration)
    kinds: ClassVar[tuple[str, ...]] = ()
    #: the kinds a node accepts from a dispatcher (the others go to dispatchers; probes have their route)
    node_bound: ClassVar[tuple[str, ...]] = ()
    #: per kind, the positions of a message's data that name the event which made it (``wire.message_key``);
    #: a kind not listed is named by all its data
    message_id: ClassVar[Mapping[str, tuple[int, ...]]] = {}
    #: the quantities of its dispatcher side's state, each a metric family of the dispatcher's
    #: (``DispatcherSide.gauges`` gives their values); the learned quantity and the picture are among them
    exported: ClassVar[tuple[Quantity, ...]] = ()
    #: the quantity its dispatcher side learns, if any (also the name of an exported gauge)
    learned: ClassVar[Learned | None] = None
    #: the kinds its dispatcher may send again when their answer is overdue (``DispatcherSide.resend``)
    resends: ClassVar[tuple[str, ...]] = ()
    #: the exported gauge that counts the idle nodes of its picture, if it keeps one (a healed picture
    #: shows every idle node: experiment.chaos checks it), and whether the dispatchers split the idle nodes
    #: between them (each idle node's token is held by one) rather than each counting them all
    picture: ClassVar[str | None] = None
    picture_split: ClassVar[bool] = False
    #: its message knobs, for ``lbt frontier``: none means one point, the policy as the spec gives it
    frontier: ClassVar[tuple[Curve, ...]] = ()

    @property
    def dispatcher_bound(self) -> tuple[str, ...]:
        """The kinds a dispatcher accepts from nodes."""
        return tuple(k for k in self.kinds if k not in PROBE_KINDS and k not in self.node_bound)

    def messages(self, exp: Experiment) -> MessageCost:
        """What its messages cost per task in ``exp`` (NO_COST unless it sends any)."""
        return NO_COST

    def make_dispatcher(
        self, exp: Experiment, rng: random.Random, index: int = 0, dispatchers: int = 1
    ) -> DispatcherSide:
        """The dispatcher side of dispatcher ``index`` of ``dispatchers`` running side by side."""
        return self.dispatcher(exp, rng, index)

    def make_node_sides(
        self, exp: Experiment, rng: random.Random, nodes: Sequence[int], dispatchers: int, replication: int
    ) -> list[NodeSide]:
        """The node sides of ``nodes``. One that draws random numbers (with several dispatchers) gets its
        node's own stream, so that every driver draws the same numbers for the same node; the others
        share ``rng``."""
        cls = self.node
        if cls.draws and dispatchers > 1:
            return [cls(exp, k, node_random(exp.seed, k, replication), dispatchers) for k in nodes]
        return [cls(exp, k, rng, dispatchers) for k in nodes]
