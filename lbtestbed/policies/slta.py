"""SLTA: self-learning threshold assignment (``jlmu_slta.md`` §5).

Thresholds l_i(r) come from the slot ranking and the learned index r. A class-i pool holding x tasks has a
green token iff x < l_i(r), and a yellow token iff i = i_r and x < j_r. Dispatch priorities (§5.2): green
tokens of classes other than i_{r-1}, then green tokens of class i_{r-1}, then yellow tokens, then a uniformly
random pool. Learning (§5.3), on the state just before the arrival and applied after the dispatch:
r -> r - 1 when #green >= n beta and some green token is of class i_{r-1}; r -> r + 1 when #yellow <= 1 and
#green = 0.

Messages (§5.4). Dispatcher and pool share a *belief*, the pool's bits as the dispatcher holds them. The
dispatcher updates its belief on its own (dispatch and change of r, by the inference below); a pool sends a
TOKEN whenever its true bits differ from the belief, so with exact delivery the belief is always the truth.
The belief rides to the pool on every forwarded task and on the EPOCH message a pool gets when r changes its
class's thresholds. Inference works on the interval of occupancies that the believed bits allow; where the
interval decides a bit the bit is exact. Where it does not, an arrival assumes the token is gone, and a change
of r assumes a green token is gone and a yellow one is there; the pool corrects the belief when it is wrong.

The epoch rule departs from the notes' §5.4, which keep green and withhold yellow until the pools report.
That rule feeds the learning rule its own lag: right after r rises the dispatcher sees no yellow token, so
the next arrival raises r again, and with any message delay r runs away (measured: r from 1 to 1,817 at
n = 400 with a delay of 0.1% of the mean work). Believing the new yellow tokens and doubting the old green
ones makes each change of r damp the condition that caused it. With exact delivery both rules give the same
dispatcher state; this one also sends fewer corrections near r*, where most pools of the next class sit
exactly at the new yellow level.

Every change of r starts a new epoch. TOKENs carry the pool's epoch, a sequence number and its number of
tasks; the dispatcher drops a token older than one it has applied, and reads a token computed under
thresholds that have changed since from its task count (dropping it instead let every correction go stale
while r moved, and r ran away in a loopback cluster).
A pool answers every EPOCH (with a correction, or with its unchanged bits), and the dispatcher does not
apply the learning rule again until every pool it told has answered: r moves on settled counts, never on
its own guesses. With exact delivery the answers arrive at once and the rule is the paper's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, NodeSide, Route
from lbtestbed.policies.jlmu import ranking_of
from lbtestbed.policies.ranking import Ranking
from lbtestbed.policies.structures import TokenSet
from lbtestbed.spec import Experiment

Bits = tuple[bool, bool]

#: largest index a pool accepts from a dispatcher (r* is in the tens for the papers' settings; the ranking
#: is built up to r, so an absurd r would stall the node)
MAX_R = 100_000


class Thresholds:
    """What pools and dispatcher both derive from the ranking: contexts, true bits, inference."""

    def __init__(self, ranking: Ranking) -> None:
        self.ranking = ranking

    def context(self, i: int, r: int) -> tuple[int, int]:
        """Everything class i's bits depend on at index r: (l_i(r), j_r if i = i_r else 0)."""
        ir, jr = self.ranking.slot(r)
        return self.ranking.thresholds(r)[i], jr if ir == i else 0

    def true_bits(self, i: int, x: int, r: int) -> Bits:
        ell, jr = self.context(i, r)
        return x < ell, jr > 0 and x < jr

    def _interval(self, i: int, r: int, g: bool, y: bool) -> tuple[float, float]:
        """The occupancies a class-i pool can hold when it is believed to have bits (g, y) at r."""
        ell, jr = self.context(i, r)
        if g:
            return 0, ell - 1
        if y and jr:
            return ell, jr - 1
        return (max(ell, jr) if jr else ell), math.inf

    def _decide(self, i: int, r: int, lo: float, hi: float, g_unsure: bool, y_unsure: bool) -> Bits:
        ell, jr = self.context(i, r)
        g = True if hi < ell else False if lo >= ell else g_unsure
        y = False if not jr else True if hi < jr else False if lo >= jr else y_unsure
        return g, y

    def after_arrival(self, i: int, r: int, bits: Bits) -> Bits:
        """Belief after the dispatcher sends a task to a pool it believed to have ``bits``."""
        lo, hi = self._interval(i, r, *bits)
        return self._decide(i, r, lo + 1, hi + 1, False, False)

    def after_epoch(self, i: int, r_old: int, r_new: int, bits: Bits) -> Bits:
        """Belief after r moves from r_old to r_new: unsure green is gone, unsure yellow is there."""
        lo, hi = self._interval(i, r_old, *bits)
        return self._decide(i, r_new, lo, hi, False, True)


class SLTADispatcher(DispatcherSide):
    name = "slta"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        assert exp.policy.beta is not None
        self.th = Thresholds(ranking_of(exp))
        self.ranking = self.th.ranking
        self.green_needed = self.n * exp.policy.beta
        self.node_class = exp.node_class
        self.m = len(exp.classes)
        self.members = [[k for k in range(self.n) if self.node_class[k] == i] for i in range(self.m)]
        self.r = 1
        self.epoch = 0
        self.class_changed = [0] * self.m  # epoch of the last change of each class's context
        self.green = [TokenSet() for _ in range(self.m)]
        self.yellow = TokenSet()
        self.bits: list[Bits] = [(False, False)] * self.n
        self.seen_seq = [0] * self.n
        self.stale_tokens = 0
        self.translated_tokens = 0
        self.unsettled: set[int] = set()  # pools told of the current epoch that have not answered
        for k in range(self.n):  # the system starts empty with r = 1
            self._set(k, self.th.true_bits(self.node_class[k], 0, 1))

    def _set(self, k: int, bits: Bits) -> None:
        self.bits[k] = bits
        i = self.node_class[k]
        if bits[0]:
            self.green[i].add(k)
        else:
            self.green[i].discard(k)
        if bits[1]:
            self.yellow.add(k)
        else:
            self.yellow.discard(k)

    @property
    def green_total(self) -> int:
        return sum(len(g) for g in self.green)

    def dispatch(self) -> Route:
        r, rng = self.r, self.rng
        green_total = self.green_total
        prev = self.ranking.slot(r - 1)[0] if r > 1 else -1
        green_prev = len(self.green[prev]) if prev >= 0 else 0
        yellow = len(self.yellow)
        if green_total > green_prev:
            # uniform over all green tokens of classes other than i_{r-1}: class by weight, then a token
            u = rng.random() * (green_total - green_prev)
            for i, g in enumerate(self.green):
                if i == prev or not g:
                    continue
                u -= len(g)
                if u < 0:
                    break
            node, outcome = g.pick(rng), "green_other"
        elif green_prev:
            node, outcome = self.green[prev].pick(rng), "green_prev"
        elif yellow:
            node, outcome = self.yellow.pick(rng), "yellow"
        else:
            node, outcome = int(rng.random() * self.n), "random"
        bits = self.th.after_arrival(self.node_class[node], r, self.bits[node])
        self._set(node, bits)
        piggyback = (self.epoch, r, self.seen_seq[node], *bits)
        messages = NO_MESSAGES
        if self.unsettled and (green_total or yellow):
            pass  # the pools told of the last change of r have not all answered: the counts are guesses
        elif r > 1 and green_total >= self.green_needed and green_prev >= 1:
            messages = self._move(r - 1)
        elif yellow <= 1 and green_total == 0:
            # also while unsettled once no token at all is left: waiting would route every task at random
            messages = self._move(r + 1)
        return Route(node, outcome, messages, piggyback)

    def _move(self, r_new: int) -> tuple[Message, ...]:
        """Change r, update the belief of every pool whose class's thresholds changed, tell those pools."""
        r_old = self.r
        self.r = r_new
        self.epoch += 1
        out: list[Message] = []
        for i in range(self.m):
            if self.th.context(i, r_old) == self.th.context(i, r_new):
                continue
            self.class_changed[i] = self.epoch
            for k in self.members[i]:
                bits = self.th.after_epoch(i, r_old, r_new, self.bits[k])
                self._set(k, bits)
                out.append(Message("epoch", k, (self.epoch, r_new, self.seen_seq[k], *bits), self.index))
        self.unsettled = {m.node for m in out}
        return tuple(out)

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if not msg.kind.startswith("token_"):
            return super().on_message(msg)
        if len(msg.data) != 6:
            raise ValueError(
                f"an SLTA token is (epoch, r, seq, green, yellow, tasks), got {len(msg.data)} values"
            )
        epoch, _r, seq, g, y, x = msg.data
        k = msg.node
        if msg.kind == "token_epoch" and epoch == self.epoch:
            self.unsettled.discard(k)
        answer = msg.kind == "token_epoch" and seq == self.seen_seq[k]  # an answer that changes nothing
        if seq < self.seen_seq[k] or (seq == self.seen_seq[k] and not answer):
            self.stale_tokens += 1  # a duplicate, or overtaken by a later token of the same pool
            return NO_MESSAGES
        self.seen_seq[k] = seq
        cls = self.node_class[k]
        if epoch < self.class_changed[cls]:
            # computed under thresholds that have changed since: the pool's task count gives its bits now
            self.translated_tokens += 1
            self._set(k, self.th.true_bits(cls, int(x), self.r))
        else:
            self._set(k, (g, y))
        return NO_MESSAGES

    def gauges(self) -> dict[str, float]:
        out = {
            "slta_r": float(self.r),
            "slta_yellow_tokens": float(len(self.yellow)),
            "slta_unanswered_epochs": float(len(self.unsettled)),
        }
        ell = self.ranking.thresholds(self.r)
        for i, c in enumerate(self.exp.classes):
            out[f"slta_green_tokens:{c.name}"] = float(len(self.green[i]))
            out[f"slta_threshold:{c.name}"] = float(ell[i])
        return out


class SLTANode(NodeSide):
    """A pool's half: compares its true bits with the shared belief and sends a TOKEN when they differ."""

    def __init__(
        self,
        exp: Experiment,
        node: int,
        rng: random.Random,
        dispatchers: int = 1,
        thresholds: Thresholds | None = None,
    ) -> None:
        super().__init__(exp, node, rng, dispatchers)
        self.th = thresholds or Thresholds(ranking_of(exp))
        self.epoch, self.r = 0, 1
        self.belief = self.sent = self.th.true_bits(self.cls, 0, 1)
        self.seq = 0

    def _sync(self, x: int, kind: str, to: int) -> tuple[Message, ...]:
        bits = self.th.true_bits(self.cls, x, self.r)
        if bits == self.belief:
            return NO_MESSAGES
        self.seq += 1
        self.belief = self.sent = bits
        return (Message(kind, self.node, (self.epoch, self.r, self.seq, *bits, x), to),)

    def _adopt(self, data: Sequence[object], with_task: bool) -> None:
        """Take the epoch, r and belief a dispatcher sent, unless something newer arrived first."""
        if len(data) != 5:
            raise ValueError(f"an SLTA belief is (epoch, r, seen, green, yellow), got {len(data)} values")
        epoch, r, seen, g, y = data
        if not (isinstance(epoch, int) and isinstance(r, int) and isinstance(seen, int)) or isinstance(
            r, bool
        ):
            raise ValueError("epoch, r and seen must be integers")
        if not 1 <= r <= MAX_R or epoch < 0:
            raise ValueError(f"r must lie in 1..{MAX_R} and the epoch must not be negative")
        if epoch < self.epoch:
            return  # overtaken by a later epoch message, whose belief already counts this one
        self.epoch, self.r = epoch, r
        if with_task and seen != self.seq:
            # a token of ours is still on its way: the dispatcher will hold what it says
            self.belief = self.sent
        else:
            # an epoch message makes every older token of ours stale, so its belief stands
            self.belief = (bool(g), bool(y))

    def on_arrival(self, x: int, origin: int, piggyback: tuple[object, ...]) -> tuple[Message, ...]:
        if piggyback:
            self._adopt(piggyback, with_task=True)
        return self._sync(x, "token_arrival", origin)

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        return self._sync(x, "token_departure", origin)

    def on_message(self, msg: Message, x: int) -> tuple[Message, ...]:
        if msg.kind != "epoch":
            return super().on_message(msg, x)
        self._adopt(msg.data, with_task=False)
        # always answer an epoch: the dispatcher learns again only once every pool it told has answered
        return self._sync(x, "token_epoch", msg.dispatcher) or (
            Message(
                "token_epoch", self.node, (self.epoch, self.r, self.seq, *self.belief, x), msg.dispatcher
            ),
        )
