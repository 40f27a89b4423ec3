"""Join the idle queue (Lu et al. 2011; docs/theory.md, "Classical results for JSQ and JIQ", "What each
policy sends", "Several dispatchers").

A node that becomes idle sends an idle token to one dispatcher: with several, JIQ-Random (``d = 1``) picks
one uniformly; JIQ-SQ(d) asks d distinct dispatchers chosen uniformly how many tokens each holds
(``token_probe``, answered by ``token_count``) and sends its token to the one holding the fewest, ties
broken uniformly. A round whose answers are not all in when the node receives a task is void: the node is
busy, and it starts a new round when it is idle again.
A dispatcher that holds tokens sends the task to one of their nodes and drops that token; with none it picks
a node uniformly at random. Which token: ``random`` uniform, ``longest_idle`` the oldest token (FIFO),
``fastest``/``fastest_idle`` the fastest node's, ``slowest`` the slowest node's.

Sequence numbers. A token carries the node's count of arrivals when it became idle, ``a``: a node becomes
idle again only after another arrival, so its tokens are numbered in increasing order. The dispatcher keeps
per node ``used`` (the number of its last token it consumed or saw superseded) and the number of the token
it holds: a token is taken iff it is newer than both, so a duplicate or an overtaken token is dropped (and
counted). A node's report (x, a, the dispatcher it sent its last token to, -1 after an arrival) shows a lost
token: the node is idle, its token came here, is newer than ``used`` and is not held.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lbtestbed.model.experiment import Experiment, NodeClass, PolicyParams
from lbtestbed.model.reader import TableReader
from lbtestbed.policies.base import (
    NO_MESSAGES,
    DispatcherSide,
    Message,
    NodeSide,
    Route,
    State,
    sample_distinct,
)
from lbtestbed.policies.jsq import TIE_BREAKS
from lbtestbed.policies.structures import SpeedBuckets, TokenSet
from lbtestbed.policies.unit import SENDS, MessageCost, Policy, Quantity, theory_doc


@dataclass(frozen=True)
class JIQParams(PolicyParams):
    """Which token a dispatcher uses (``tie_break``), and JIQ-SQ(d)'s d (1: JIQ-Random)."""

    name: str = "jiq"
    tie_break: str = "random"
    d: int = 1

    KEYS: ClassVar[tuple[str, ...]] = ("tie_break", "d")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> JIQParams:
        d = r.integer("d", default=1, minimum=1)
        dispatchers = common["dispatchers"]
        if d > dispatchers:
            raise r.fail(
                "d",
                f"JIQ-SQ(d): an idle node probes {d} distinct dispatchers but the spec runs {dispatchers} "
                "(policy.dispatchers)",
            )
        return cls(**common, tie_break=r.string("tie_break", default="random", choices=TIE_BREAKS), d=d)

    def message_kinds(self) -> tuple[str, ...]:
        # JIQ-SQ(d) probes the dispatchers first
        return ("idle_token", "token_probe", "token_count") if self.d != 1 else ("idle_token",)


def _seq(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"an idle token's number is an integer >= 0, got {v!r}")
    return v


class JIQDispatcher(DispatcherSide):
    name = "jiq"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0, dispatchers: int = 1) -> None:
        super().__init__(exp, rng, index)
        assert isinstance(exp.policy, JIQParams)
        self.tie_break = exp.policy.tie_break
        self.speeds = exp.node_speeds
        self.tokens = TokenSet()
        self._fifo: deque[int] = deque()
        self._by_speed = SpeedBuckets(self.speeds, rng, fastest=self.tie_break != "slowest")
        self.held: dict[int, int] = {}  # node -> the number of its token we hold
        self.used = [0] * self.n  # per node: the number of its last token consumed or superseded
        self.stale_tokens = 0  # tokens dropped: duplicates, or overtaken by a later one of the same node
        self._taken: dict[int, int] = {}  # node -> the number of its token we used last
        # at start every node is idle; with several dispatchers each node announces itself to one of them
        for k in range(self.n):
            if dispatchers == 1 or k % dispatchers == index:
                self.used[k] = -1  # its token number 0 is the one we start with
                self._add(k, 0)

    def _add(self, k: int, seq: int) -> None:
        self.held[k] = seq
        self.tokens.add(k)
        if self.tie_break == "longest_idle":
            self._fifo.append(k)
        elif self.tie_break != "random":
            self._by_speed.add(k)

    def _offer(self, k: int, seq: int) -> bool:
        """Take token ``seq`` of node ``k`` unless it is no newer than what we used or hold; False if not."""
        if seq <= self.used[k] or k in self.live.down:
            return False
        held = self.held.get(k)
        if held is None:
            self._add(k, seq)
        elif held < seq:
            self.used[k] = held  # superseded: the same idle node, announced once more (it keeps its place)
            self.held[k] = seq
        else:
            return False
        return True

    def _drop(self, k: int) -> None:
        """Forget the token of ``k`` we hold (its node went down, or restarted)."""
        if self.held.pop(k, None) is None:
            return
        self.tokens.discard(k)
        self._by_speed.discard(k)
        if self.tie_break == "longest_idle":
            self._fifo.remove(k)

    def _take(self) -> int:
        if self.tie_break == "random":
            k = self.tokens.pick(self.rng)
        else:
            k = self._fifo.popleft() if self.tie_break == "longest_idle" else self._by_speed.pick()
        self.tokens.discard(k)
        self._by_speed.discard(k)
        self.used[k] = self._taken[k] = self.held.pop(k)
        return k

    def dispatch(self) -> Route:
        if self.tokens:
            return Route(self._take(), "idle_token")
        return Route(self.live.pick(self.rng), "random")  # while all are up: int(random() * n), as ever

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if msg.kind == "token_probe":  # JIQ-SQ(d): how many tokens do we hold?
            if len(msg.data) != 1:
                raise ValueError(f"a token probe is (round,), got {len(msg.data)} values")
            answer = (_seq(msg.data[0]), len(self.tokens))
            return (Message("token_count", msg.node, answer, self.index),)
        if msg.kind != "idle_token":
            return super().on_message(msg)
        if len(msg.data) != 1:
            raise ValueError(f"an idle token is (arrivals,), got {len(msg.data)} values")
        if not self._offer(msg.node, _seq(msg.data[0])) and msg.node not in self.live.down:
            self.stale_tokens += 1
        return NO_MESSAGES

    def on_task_failed(self, node: int) -> None:
        # if the task that used the node's token never ran there, the node is still idle and sends no new
        # token: count that token unused again, so that the node's report brings it back (reconcile)
        seq = self._taken.pop(node, None)
        if seq is not None and self.used[node] == seq and node not in self.held:
            self.used[node] = seq - 1

    def _report(self, report: Sequence[Any]) -> tuple[int, int, int]:
        if len(report) != 3:
            raise ValueError(f"a JIQ report is (x, arrivals, token_to), got {len(report)} values")
        x, a, to = report
        if type(to) is not int or to < -1:
            raise ValueError(f"token_to must be an integer >= -1, got {to!r}")
        return _seq(x), _seq(a), to

    def reconcile(self, node: int, report: tuple[int, ...]) -> tuple[Message, ...]:
        x, a, to = self._report(report)
        if x == 0 and to == self.index and node not in self.held:
            self._offer(node, a)  # the node is idle and sent its token here: it was lost unless used
        return NO_MESSAGES

    def on_node_down(self, node: int) -> None:
        if self.live.set_down(node):
            self._drop(node)  # its report brings it back if it is still idle when it returns

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        x, a, to = self._report(report)
        self.live.set_up(node)
        if not fresh:
            return self.reconcile(node, report)
        self._taken.pop(node, None)
        if x == 0 and to == self.index:  # idle, its token is ours: hold number a (in place if held)
            self.used[node] = a - 1
            if node in self.held:
                self.held[node] = a
            else:
                self._add(node, a)
        else:
            # busy: its next token will be numbered a or more, any earlier one is spent; idle with its
            # token elsewhere: its next token comes after another arrival, numbered a + 1 or more
            self.used[node] = a - 1 if x else a
            self._drop(node)
        return NO_MESSAGES

    def gauges(self) -> State:
        return {"idle_tokens": float(len(self.tokens)), "jiq_stale_tokens_total": float(self.stale_tokens)}


class IdleTokenSender(NodeSide):
    """Sends an idle token, numbered by its arrivals so far, when the node's last task leaves: to a
    uniformly random dispatcher, or (JIQ-SQ(d)) to the one of d probed that holds the fewest tokens."""

    draws = True

    def __init__(self, exp: Experiment, node: int, rng: random.Random, dispatchers: int = 1) -> None:
        super().__init__(exp, node, rng, dispatchers)
        self.arrivals = 0
        # the dispatcher that starts with this node's token (JIQDispatcher.__init__); -1 after an arrival
        # and while a JIQ-SQ(d) round is out
        self.token_to = node % dispatchers if dispatchers > 1 else 0
        assert isinstance(exp.policy, JIQParams)
        self.d = exp.policy.d
        self.asked: tuple[int, ...] = ()  # the dispatchers of the round out, in random order
        self.counts: dict[int, int] = {}  # their answers so far
        self.round = -1  # the arrivals count the round is for: void once another task arrives

    def on_arrival(self, x: int, origin: int, piggyback: tuple[Any, ...]) -> tuple[Message, ...]:
        self.arrivals += 1
        self.token_to = -1
        return NO_MESSAGES

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        if x:
            return NO_MESSAGES
        if self.d > 1:
            self.asked = sample_distinct(self.rng, self.dispatchers, self.d)
            self.counts = {}
            self.round = self.arrivals
            return tuple(Message("token_probe", self.node, (self.round,), e) for e in self.asked)
        to = int(self.rng.random() * self.dispatchers) if self.dispatchers > 1 else 0
        self.token_to = to
        return (Message("idle_token", self.node, (self.arrivals,), to),)

    def on_message(self, msg: Message, x: int) -> tuple[Message, ...]:
        if msg.kind != "token_count":
            return super().on_message(msg, x)
        if len(msg.data) != 2:
            raise ValueError(f"a token count is (round, tokens), got {len(msg.data)} values")
        rnd, count = _seq(msg.data[0]), _seq(msg.data[1])
        if rnd != self.round or rnd != self.arrivals or msg.dispatcher not in self.asked:
            return NO_MESSAGES  # a void round (a task came first), or an answer nobody asked for
        self.counts[msg.dispatcher] = count
        if len(self.counts) < len(self.asked):
            return NO_MESSAGES
        # the first of the fewest in the random order of the probes: ties are broken uniformly
        to = min(self.asked, key=self.counts.__getitem__)
        self.round, self.token_to = -1, to
        return (Message("idle_token", self.node, (self.arrivals,), to),)

    def report(self, x: int) -> tuple[int, ...]:
        return (x, self.arrivals, self.token_to)


class JIQ(Policy):
    name = "jiq"
    summary = "join the idle queue: idle nodes send tokens, JIQ-Random or JIQ-SQ(d) (Lu et al. 2011)"
    params = JIQParams
    dispatcher = JIQDispatcher
    node = IdleTokenSender
    kinds = ("idle_token", "token_probe", "token_count")
    node_bound = ("token_count",)
    message_id: ClassVar[Mapping[str, tuple[int, ...]]] = {"token_count": (0,)}  # the round it answers
    exported = (
        Quantity(
            "idle_tokens",
            "Idle tokens this dispatcher holds: nodes that said they were idle and had no task from it since",
        ),
        Quantity(
            "jiq_stale_tokens_total",
            "Idle tokens dropped as outdated: duplicates, or overtaken by a later token of the same node",
            "counter",
        ),
    )
    picture = "idle_tokens"
    picture_split = True

    def messages(self, exp: Experiment) -> MessageCost:
        assert isinstance(exp.policy, JIQParams)
        k, d = exp.policy.dispatchers, exp.policy.d
        per_token = 1.0 + (2 * d if d > 1 else 0)  # at most one token a task, after 2d probes and answers
        # without an emulated delay, JIQ-Random sends a token of its own only to another dispatcher than the
        # task's, JIQ-SQ(d) its probes and answers (the token rides on the reply to the answer it follows)
        riding = (k - 1) / k if d == 1 else 2.0 * d
        own = per_token if exp.network.delay is not None else riding
        if k > 1:
            return MessageCost(
                None,
                "tokens per task with several dispatchers: Lu et al.'s limit gives them for equal speeds "
                f"({theory_doc('Several dispatchers')})",
                SENDS,
                own=own,
            )
        return MessageCost(
            1.0,
            "1 - P(wait) idle tokens per task, -> 1 as n grows at load < 1",
            SENDS,
            ("large n", "load < 1", "one dispatcher"),
            own=own,
        )

    def make_dispatcher(
        self, exp: Experiment, rng: random.Random, index: int = 0, dispatchers: int = 1
    ) -> DispatcherSide:
        return JIQDispatcher(exp, rng, index, dispatchers)


POLICIES = (JIQ(),)
