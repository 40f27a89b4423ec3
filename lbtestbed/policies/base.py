"""The two halves of every policy (docs/design.md, principle 2), in the sans-I/O style.

A *dispatcher side* picks a node for each task from the information it holds; a *node side* decides which
state messages its node sends on local events. Neither owns a socket or reads a clock: events go in,
decisions and messages come out. The simulator wires the halves through a virtual clock, the networked
dispatcher and server node through HTTP, so both count the same messages.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, ClassVar, NamedTuple

from lbtestbed.model.experiment import Experiment

NO_MESSAGES: tuple[Message, ...] = ()
#: a dispatcher side's state as it exports it, by quantity (``unit.Quantity``): a number, or a number per
#: value of the quantity's label
State = dict[str, "float | dict[str, float]"]


class Message(NamedTuple):
    """A state message between a node and a dispatcher; ``kind`` names it in every count.

    Messages, routes and probes are named tuples: immutable, and the cheapest objects to create on the
    simulator's hot path (a frozen dataclass costs twice as much)."""

    kind: str
    node: int  # the node that sends it, or the node it is sent to
    data: tuple[Any, ...] = ()
    dispatcher: int = 0  # the dispatcher that sends it, or the one it is sent to


class Route(NamedTuple):
    """The decision: forward the task to ``node``.

    ``outcome`` labels the rule that decided (for metrics), ``messages`` go to nodes after the task is
    forwarded, and ``piggyback`` rides on the forwarded task itself at no message cost.
    """

    node: int
    outcome: str
    messages: tuple[Message, ...] = ()
    piggyback: tuple[Any, ...] = ()


class Probe(NamedTuple):
    """Ask these nodes for their occupancy, then call ``resolve`` with the replies in the same order."""

    nodes: tuple[int, ...]


class DispatcherSide:
    """The dispatcher half of a policy."""

    name: ClassVar[str] = ""
    #: whether the rules read ``now``: only then do the drivers set it, so that the simulator's hot path
    #: costs the policies that keep no time nothing
    uses_clock: ClassVar[bool] = False

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        #: model time, in model seconds from a start of the driver's choosing (only differences mean
        #: anything): set by the driver before every call into the side when ``uses_clock``
        self.now: float = 0.0
        self.exp = exp
        self.n = exp.n
        self.rng = rng
        self.index = index  # which dispatcher this is, when several run side by side
        self.live = Liveness(range(self.n))  # which nodes are up (only faults take any down)
        #: messages of nodes it dropped as outdated (duplicates, or overtaken by a later one)
        self.stale_tokens = 0

    def dispatch(self) -> Route | Probe:
        """Choose a node for a new task, or ask for probes first."""
        raise NotImplementedError

    def resolve(self, probe: Probe, replies: Sequence[int]) -> Route:
        """Choose among probed nodes; ``replies[k]`` is the occupancy reported by ``probe.nodes[k]``."""
        raise NotImplementedError(f"{self.name} does not probe")

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        """Apply a state message from a node; return messages to send to nodes."""
        raise ValueError(f"{self.name} does not expect {msg.kind!r} messages")

    def on_task_done(self, node: int, latency: float) -> None:
        """The answer to a task this dispatcher routed to ``node`` passed back through it, ``latency``
        model seconds after the dispatcher forwarded the task (the request's latency as a proxy sees it:
        the way to the node, the stay there and the way back). A task that failed ends here too, before
        ``on_task_failed``."""

    def on_task_failed(self, node: int) -> None:
        """The task routed to ``node`` never ran there (refused, or lost with the node): undo its count.
        Called after ``on_task_done`` for the same task."""

    def gauges(self) -> State:
        """The values of the quantities its policy exports (``unit.Policy.exported``: token counts,
        thresholds, what it learns), by name: each a number, or for a quantity with a label a number per
        label value (``{"class": ...}``'s class names, say)."""
        return {}

    def learned_value(self) -> float:
        """The current value of what this side learns (its policy's ``unit.Learned``; SLTA's r): only the
        sides of a policy that declares one define it."""
        raise NotImplementedError(f"{self.name} learns nothing")

    # ------------------------------------------------------------------ faults (docs/faults.md)
    # The networked dispatcher tracks node health; the simulator never calls these. A node's *report* is
    # what its node side's ``report`` returned: the node's own account of its state and counters.

    def on_node_down(self, node: int) -> None:
        """``node`` stopped answering: route nothing to it until ``on_node_up``. Tasks already routed
        there still end with ``on_task_done`` / ``on_task_failed``; no message of ``node`` arrives
        while it is down. Here: ``self.live`` marks it, which is all a policy that draws its nodes from
        ``self.live`` needs."""
        self.live.set_down(node)

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        """``node`` answers again; ``report`` is its state now. ``fresh``: the node (or this dispatcher)
        started anew, so forget everything about it and start from the report (nothing of ours is in
        flight to it, and no end of an earlier task of ours will be reported). Otherwise it was paused or
        unreachable and kept its state: resume routing and correct what the report shows was missed.
        Returns messages to send (an SLTA pool is told the current epoch). Here: ``self.live`` marks it."""
        self.live.set_up(node)
        return NO_MESSAGES

    def _without_down(self, probe: Probe, replies: Sequence[int]) -> tuple[Probe, Sequence[int]]:
        """The probed nodes that are still up, with their replies (a node may go down while its probe is
        out); ``probe`` and ``replies`` themselves when none went down."""
        down = self.live.down
        if not down or not any(k in down for k in probe.nodes):
            return probe, replies
        kept = [(k, x) for k, x in zip(probe.nodes, replies, strict=True) if k not in down]
        return Probe(tuple(k for k, _ in kept)), [x for _, x in kept]

    def reconcile(self, node: int, report: tuple[int, ...]) -> tuple[Message, ...]:
        """A report at least one heartbeat interval old: every message ``node`` sent before it should
        have arrived by now, so whatever the report shows that no message brought was lost. Apply it
        (only if it is newer than what we know: reports and messages carry sequence numbers)."""
        return NO_MESSAGES

    def awaiting(self) -> Collection[int]:
        """Nodes whose answer to a message of ours is outstanding (SLTA: pools told of the last epoch)."""
        return ()

    def resend(self, node: int) -> tuple[Message, ...]:
        """The message to repeat to ``node`` when its answer is overdue."""
        return NO_MESSAGES


class NodeSide:
    """The node half of a policy: messages a node sends on its own events."""

    #: whether its rules draw random numbers: each node then gets a stream of its own (``node_random``)
    draws: ClassVar[bool] = False
    #: whether it wants ``on_served`` with the latency of each task its node served (Prequal's estimate);
    #: the drivers pay for keeping each task's arrival only when a node side asks
    records_latency: ClassVar[bool] = False
    #: whether its node also speaks at times of its own choosing (``start_timer``, ``on_timer``): only then
    #: do the drivers keep a timer for it, so that the policies without one cost nothing
    timed: ClassVar[bool] = False

    def __init__(self, exp: Experiment, node: int, rng: random.Random, dispatchers: int = 1) -> None:
        self.node = node
        self.cls = exp.node_class[node]
        self.rng = rng
        self.dispatchers = dispatchers

    def on_arrival(self, x: int, origin: int, piggyback: tuple[Any, ...]) -> tuple[Message, ...]:
        """A task arrived (``x`` tasks present now) from dispatcher ``origin``."""
        return NO_MESSAGES

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        """A task left (``x`` tasks present now); ``origin`` routed it."""
        return NO_MESSAGES

    def on_served(self, found: int, latency: float) -> None:
        """A task left after ``latency`` model seconds at the node (arrival to completion); it found
        ``found`` tasks there when it arrived. Called before ``on_departure``, when ``records_latency``."""

    def probe_reply(self, x: int) -> int:
        """What a probe learns from a node holding ``x`` tasks: its occupancy, tasks waiting included."""
        return x

    def report(self, x: int) -> tuple[int, ...]:
        """The node's account of itself for the dispatchers' health checks: ``x`` and what the policy
        needs to reconcile its picture (sequence numbers, counters); integers only."""
        return (x,)

    def on_message(self, msg: Message, x: int) -> tuple[Message, ...]:
        """A message from a dispatcher; probes are answered with ``probe_reply``."""
        if msg.kind == "probe":
            return (Message("probe_reply", self.node, (self.probe_reply(x),), msg.dispatcher),)
        raise ValueError(f"node side does not expect {msg.kind!r} messages")

    # ------------------------------------------------------------------ its own timer (``timed``)
    # Times are model seconds on a *clock* the driver names: clock 1 is the run's (model time 0 when the run
    # starts: the simulator's 0, and the origin ``lbt run`` posts to every node host), clock 0 a node host's
    # own start before it hears the run's, clock n the n-th run's clock a node host hears. A node side's
    # schedule is a function of its clock alone (its own seeded stream, drawn from the start), so that every
    # driver runs the same schedule on the same clock.

    def start_timer(self, clock: int, after: float) -> float:
        """Start the node's own schedule afresh on ``clock``; the model time of its first event after
        ``after`` (earlier ones are skipped: a node host that joins a run late), ``math.inf`` for none."""
        return math.inf

    def on_timer(self, t: float, x: int) -> tuple[tuple[Message, ...], float]:
        """The node's own event at model time ``t`` of its clock, with ``x`` tasks present: the messages it
        sends, and the model time of its next own event (``math.inf``: none)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no timer")


def sample_distinct(rng: random.Random, n: int, d: int) -> tuple[int, ...]:
    """d distinct nodes out of n, in uniformly random order (so a first minimum is a uniform tie-break)."""
    r = rng.random
    if d == 1:
        return (int(r() * n),)
    if d == 2:
        a = int(r() * n)
        b = int(r() * (n - 1))
        return (a, b + 1 if b >= a else b)
    if 4 * d <= n:
        chosen: list[int] = []
        while len(chosen) < d:
            k = int(r() * n)
            if k not in chosen:
                chosen.append(k)
        return tuple(chosen)
    return tuple(rng.sample(range(n), d))


def sample_with_replacement(rng: random.Random, n: int, d: int) -> tuple[int, ...]:
    r = rng.random
    return tuple(int(r() * n) for _ in range(d))


class Liveness:
    """Which of some nodes are up, for the dispatcher sides' fault hooks (``base.DispatcherSide``).

    ``up`` lists the members that are up in member order, so while every member is up a pick or a sample
    over ``up`` draws exactly the random numbers a pick or sample over all members draws, and gives the
    same nodes.
    """

    __slots__ = ("down", "members", "up")

    def __init__(self, members: Iterable[int]) -> None:
        self.members = list(members)
        self.up = list(self.members)
        self.down: set[int] = set()

    def set_down(self, k: int) -> bool:
        """Mark ``k`` down; False if it already was."""
        if k in self.down:
            return False
        self.down.add(k)
        self.up.remove(k)
        return True

    def set_up(self, k: int) -> bool:
        """Mark ``k`` up; False if it already was."""
        if k not in self.down:
            return False
        self.down.discard(k)
        self.up = [m for m in self.members if m not in self.down]
        return True

    def pick(self, rng: random.Random) -> int:
        """A uniformly random node that is up (one must be)."""
        up = self.up
        return up[int(rng.random() * len(up))]

    def sample(
        self,
        rng: random.Random,
        d: int,
        sample: Callable[[random.Random, int, int], tuple[int, ...]] = sample_distinct,
    ) -> tuple[int, ...]:
        """``sample`` over the nodes that are up; a distinct sample takes at most as many as are up."""
        up = self.up
        if sample is sample_distinct and d > len(up):
            d = len(up)
        return tuple(up[j] for j in sample(rng, len(up), d))
