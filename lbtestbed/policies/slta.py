"""SLTA: self-learning threshold assignment (Goldsztajn et al. 2021, arXiv 2112.08958, §3.2; docs/theory.md,
"SLTA: thresholds, tokens and dispatching" and "SLTA's learning rule and the bound on beta").

Thresholds l_i(r) come from the slot ranking and the learned index r. A class-i pool holding x tasks has a
green token iff x < l_i(r), and a yellow token iff i = i_r and x < j_r. Dispatch priorities (§3.2): green
tokens of classes other than i_{r-1}, then green tokens of class i_{r-1}, then yellow tokens, then a uniformly
random pool. Learning (§3.2), on the state just before the arrival and applied after the dispatch:
r -> r - 1 when #green >= n beta and some green token is of class i_{r-1}; r -> r + 1 when #yellow <= 1 and
#green = 0.

The dispatcher's picture. For each pool the dispatcher counts ``xhat``: the tasks it has sent there less the
departures the pool has reported. Its token bits are always the bits of these counts under its r, and the
rules above run on them. Pools report every departure, so ``xhat`` is the pool's true count (counting the
tasks still on their way to it) plus the tasks that have left but whose reports are still on their way:
nothing is guessed. With exact delivery the picture is the true state and the policy is the paper's. Under
a message delay the dispatcher runs the paper's SLTA on a system whose departures take effect one report
delay late:

- the paper's invariants hold for the picture. Remark 1 keeps a yellow token in it, so no task is ever
  routed at random, and every task goes to a slot ranked at or above (i_r, j_r) of the picture, which the
  pool, holding no more tasks than the picture says, fills at that rank or better;
- r settles where the paper's SLTA puts it for tasks that last one delay longer: near r* of the load
  rho (1 + delay / mean work) (r* = 22 instead of 20 at rho = 9.75 with a delay of 0.1 mean works);
- the utility is JLMU's under the same delay, whose dispatcher counts from the same delayed departures.

This departs from the messaging design of docs/theory.md, "SLTA's messages", which keeps two bits per pool and
infers: after a task lands on a green pool the token is assumed gone unless the pool answers otherwise, a
round trip later. Under any delay that picture runs short of tokens the pools hold; the learning rule read the
shortfall as "no tokens" and raised r, and tasks went to yellow tokens or at random while green ones were
free. Measured: with 8 pools and 256 tasks in flight r ran to 1,288 and one task in six was routed at random;
at n = 400 with a delay of 0.1 mean works the utility fell to 9.051 (JLMU: 9.125). The price is memory: a task
count per pool instead of two bits; the messages stay about one per task (at the optimum nearly every
departure changes a token, so that design reports nearly every one as well).

Messages. A token is (epoch, r, seq, green, yellow, x, arrived): the pool's epoch and r, ``seq`` its number
of task events so far (arrivals plus departures), its bits under its r, its task count x, and how many of
the receiving dispatcher's tasks it has received. ``seq`` orders a pool's tokens (an older one is dropped),
and the tasks the dispatcher had sent that had not yet arrived go on top of x. A pool sends
``token_departure`` after every departure and ``token_epoch`` in answer to every EPOCH; ``token_arrival``
only tells the other dispatchers of a full view (below), though one is read like any token. Every change of
r starts a new epoch, sent to the pools of each class whose thresholds changed, with the dispatcher's bits
for the pool under the new r; a pool adopts the latest epoch and r, from an EPOCH or from the belief riding
on a task. The dispatcher lowers r again only once every pool told of the last change has answered (with
exact delivery: at once; with a delay this changed nothing measurable); it raises r whenever the rule says
so, as that step keeps a yellow token in the picture. A pool that received more tasks than the dispatcher
sent it (the cluster benchmark also sends tasks to the pools directly) resets the dispatcher's count of
tasks sent to it.

Several dispatchers (docs/spec.md, "`view`"; docs/theory.md, "Several dispatchers"). With ``view =
"local"`` each dispatcher runs the rules above on its own tasks alone: a pool keeps, per dispatcher, the
epoch and r that dispatcher told it, the events and the count of that dispatcher's tasks, and reports the
departure of a task to the dispatcher that sent it. Each dispatcher learns its own r, for the load it
carries, about one message per task as with one. With ``view = "full"`` every dispatcher's picture counts
every task and all share one r: a pool tells every other dispatcher of each arrival (``token_arrival``),
every dispatcher of each departure, and answers an EPOCH to every dispatcher; x and seq are then the
pool's own. Epoch numbers are ordered across dispatchers (dispatcher i numbers its epochs i modulo K, each
above every epoch it has seen), and a dispatcher that sees a token of a later epoch than its own adopts its
epoch and r. With exact delivery every picture is the true state and every dispatcher holds the same r at
every arrival, so K dispatchers make the decisions one would, at 2K - 1 messages per task (and K answers
per EPOCH).

Faults (``base.DispatcherSide``). A pool's report (x, seq, epoch, r, arrived, one such five per
dispatcher) is read like a token when its ``seq`` is newer than the last applied, so lost tokens are made
good by ``reconcile``. A lost EPOCH or answer keeps the pool in ``unsettled`` (``awaiting``), and
``resend`` repeats the current epoch to it. A pool that is down holds no token in the picture, gets no
EPOCH, is never picked at random and does not count in the learning rule (which needs n_up beta green
tokens); when it comes back it is told the current epoch if its own differs. A dispatcher that restarts
numbers its epochs above the pools' (on their first contact), or, in a full view, adopts a later epoch
another dispatcher started.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lbtestbed.model.experiment import Experiment, NodeClass
from lbtestbed.model.reader import TableReader
from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, NodeSide, Route, State
from lbtestbed.policies.jlmu import RANK_ORDERS, UtilityParams, ranking_of
from lbtestbed.policies.ranking import Ranking
from lbtestbed.policies.structures import TokenSet
from lbtestbed.policies.unit import Learned, MessageCost, Policy, Quantity, theory_doc

Bits = tuple[bool, bool]

#: largest index a pool accepts from a dispatcher (r* is in the tens for the papers' settings; the ranking
#: is built up to r, so an absurd r would stall the node)
MAX_R = 100_000


@dataclass(frozen=True)
class SLTAParams(UtilityParams):
    """SLTA's learning threshold beta_n (``beta``, or ``beta_scale`` c in beta_n = c n^(-1/4))."""

    name: str = "slta"
    beta: float = 0.0

    KEYS = ("beta", "beta_scale", "rank_order", "view")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> SLTAParams:
        n = sum(c.count for c in classes)
        if r.has("beta") == r.has("beta_scale"):
            raise r.fail(
                "beta",
                "give exactly one of beta (the learning threshold beta_n) or beta_scale "
                "(c in beta_n = c n^(-1/4))",
            )
        beta = r.number("beta") if r.has("beta") else r.number("beta_scale") * n**-0.25
        if n * beta < 2:
            raise r.fail(
                "beta" if r.has("beta") else "beta_scale",
                f"n * beta_n = {n * beta:.3g} < 2 breaks SLTA's yellow-token invariant "
                f'(docs/theory.md, "SLTA\'s learning rule and the bound on beta"); use beta >= {2 / n:.3g}',
            )
        rank_order = r.string("rank_order", default="ij", choices=RANK_ORDERS)
        return cls(**common, beta=beta, rank_order=rank_order)

    def message_kinds(self) -> tuple[str, ...]:
        return ("token_departure", "token_arrival", "token_epoch", "epoch")

    def table(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dispatchers": self.dispatchers,
            "split": self.split,
            "view": self.view,
            "beta": self.beta,
            "rank_order": self.rank_order,
        }


class Thresholds:
    """What pools and dispatcher both derive from the ranking: contexts and token bits."""

    def __init__(self, ranking: Ranking) -> None:
        self.ranking = ranking

    def context(self, i: int, r: int) -> tuple[int, int]:
        """Everything class i's bits depend on at index r: (l_i(r), j_r if i = i_r else 0)."""
        ir, jr = self.ranking.slot(r)
        return self.ranking.thresholds(r)[i], jr if ir == i else 0

    def true_bits(self, i: int, x: int, r: int) -> Bits:
        ell, jr = self.context(i, r)
        return x < ell, jr > 0 and x < jr


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class SLTADispatcher(DispatcherSide):
    name = "slta"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        assert isinstance(exp.policy, SLTAParams)
        self.beta: float = exp.policy.beta
        self.th = Thresholds(ranking_of(exp))
        self.ranking = self.th.ranking
        self.green_needed = self.n * exp.policy.beta
        self.node_class = exp.node_class
        self.m = len(exp.classes)
        self.members = [[k for k in range(self.n) if self.node_class[k] == i] for i in range(self.m)]
        self.r = 1
        self.epoch = 0
        self.k = exp.policy.dispatchers
        self.full = exp.policy.view == "full" and self.k > 1  # every task in the picture, one shared r
        self.green = [TokenSet() for _ in range(self.m)]
        self.yellow = TokenSet()
        self.bits: list[Bits] = [(False, False)] * self.n
        self.sent = [0] * self.n  # tasks sent to each pool (less those that never ran there)
        self.xhat = [0] * self.n  # tasks sent minus departures reported: the pool's count in our picture
        self.seen_seq = [0] * self.n
        self.stale_tokens = 0
        self.unsettled: set[int] = set()  # pools told of the current epoch that have not answered
        for k in range(self.n):  # the system starts empty with r = 1
            self._set(k, self.th.true_bits(self.node_class[k], 0, 1))

    def _set(self, k: int, bits: Bits) -> None:
        self.bits[k] = bits
        i = self.node_class[k]
        if k in self.live.down:
            bits = (False, False)  # a pool that is down holds no token in the picture
        if bits[0]:
            self.green[i].add(k)
        else:
            self.green[i].discard(k)
        if bits[1]:
            self.yellow.add(k)
        else:
            self.yellow.discard(k)

    def _refresh(self, k: int) -> Bits:
        bits = self.th.true_bits(self.node_class[k], self.xhat[k], self.r)
        self._set(k, bits)
        return bits

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
        else:  # while all are up: int(random() * n), as ever
            node, outcome = self.live.pick(rng), "random"
        self.sent[node] += 1
        self.xhat[node] += 1
        bits = self._refresh(node)
        piggyback = (self.epoch, r, self.seen_seq[node], *bits)
        messages = NO_MESSAGES
        if r > 1 and green_total >= self.green_needed and green_prev >= 1:
            if not self.unsettled:  # a decrease waits for the answers to the last change of r
                messages = self._move(r - 1)
        elif yellow <= 1 and green_total == 0:
            messages = self._move(r + 1)
        return Route(node, outcome, messages, piggyback)

    def _next_epoch(self, after: int) -> int:
        """Our next epoch number after ``after``: the first above it that is ours (index modulo K), so
        that the epochs of several dispatchers never coincide (with one: after + 1)."""
        return after + (self.index - after - 1) % self.k + 1

    def _changed(self, r_old: int, r_new: int) -> list[int]:
        """Set r and recompute the bits of every pool whose class's thresholds changed; those pools."""
        self.r = r_new
        out = []
        for i in range(self.m):
            if self.th.context(i, r_old) != self.th.context(i, r_new):
                for k in self.members[i]:
                    self._refresh(k)
                    out.append(k)
        return out

    def _move(self, r_new: int) -> tuple[Message, ...]:
        """Change r, recompute the bits of every pool whose class's thresholds changed, tell those pools."""
        self.epoch = self._next_epoch(self.epoch)
        down = self.live.down
        told = [k for k in self._changed(self.r, r_new) if k not in down]  # the others: when they are back
        self.unsettled = set(told)
        return tuple(self._epoch_message(k, self.bits[k]) for k in told)

    def _adopt(self, epoch: int, r: int) -> None:
        """Full view: another dispatcher started a later epoch; take its r (we told no pool of it)."""
        if not 1 <= r <= MAX_R:
            raise ValueError(f"r must lie in 1..{MAX_R}, got {r!r}")
        self.epoch = epoch
        self.unsettled = set()
        self._changed(self.r, r)

    def _epoch_message(self, k: int, bits: Bits) -> Message:
        return Message("epoch", k, (self.epoch, self.r, self.seen_seq[k], *bits), self.index)

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if not msg.kind.startswith("token_"):
            return super().on_message(msg)
        if len(msg.data) != 7:
            raise ValueError(
                f"an SLTA token is (epoch, r, seq, green, yellow, tasks, arrived), got {len(msg.data)} values"
            )
        epoch, r, seq, _g, _y, x, arrived = msg.data
        if not (_count(seq) and _count(x) and _count(arrived) and _count(epoch) and _count(r)):
            raise ValueError("epoch, r, seq, tasks and arrived must be integers >= 0")
        k = msg.node
        if self.full and epoch > self.epoch:
            self._adopt(epoch, r)
        if msg.kind == "token_epoch" and epoch == self.epoch:
            self.unsettled.discard(k)
        answer = msg.kind == "token_epoch" and seq == self.seen_seq[k]  # an answer with no event since
        if seq < self.seen_seq[k] or (seq == self.seen_seq[k] and not answer):
            self.stale_tokens += 1  # a duplicate, or overtaken by a later token of the same pool
            return NO_MESSAGES
        self._apply(k, seq, x, arrived)
        return NO_MESSAGES

    def _apply(self, k: int, seq: int, x: int, arrived: int) -> None:
        """A pool's count ``x`` after ``seq`` task events, newer than what we applied, when ``arrived`` of
        our tasks had reached it."""
        self.seen_seq[k] = seq
        # the tasks we sent that it had not received yet come on top of x. A pool that received more than
        # we sent (tasks sent to it by someone else, as the cluster benchmark does, or a task we counted as
        # lost that ran all the same) sets the count of tasks sent to it anew.
        self.sent[k] = max(self.sent[k], arrived)
        self.xhat[k] = x + self.sent[k] - arrived
        self._refresh(k)

    def on_task_failed(self, node: int) -> None:
        self.sent[node] -= 1  # refused or lost: it never ran there, and no report will come for it
        self.xhat[node] = max(0, self.xhat[node] - 1)
        self._refresh(node)

    # ------------------------------------------------------------------------------------------ faults

    def _report(self, report: Sequence[Any]) -> tuple[int, int, int, int, int]:
        """Our five of a pool's report: (x, seq, epoch, r, arrived) per dispatcher, in dispatcher order."""
        if len(report) != 5 * self.k:
            raise ValueError(
                f"an SLTA report is (x, seq, epoch, r, arrived) per dispatcher ({self.k}), "
                f"got {len(report)} values"
            )
        x, seq, epoch, r, arrived = report[5 * self.index : 5 * self.index + 5]
        if not all(_count(v) for v in (x, seq, epoch, r, arrived)):
            raise ValueError(f"an SLTA report holds integers >= 0, got {tuple(report)!r}")
        return x, seq, epoch, r, arrived

    def reconcile(self, node: int, report: tuple[int, ...]) -> tuple[Message, ...]:
        x, seq, epoch, r, arrived = self._report(report)
        if self.full and epoch > self.epoch:
            self._adopt(epoch, r)
        if seq > self.seen_seq[node]:
            self._apply(node, seq, x, arrived)  # the tokens that would have said so were lost
        return NO_MESSAGES

    def awaiting(self) -> Collection[int]:
        return frozenset(self.unsettled)

    def resend(self, node: int) -> tuple[Message, ...]:
        if node in self.live.down:
            return NO_MESSAGES
        return (self._epoch_message(node, self.bits[node]),)

    def on_node_down(self, node: int) -> None:
        if self.live.set_down(node):
            self.unsettled.discard(node)
            self._set(node, self.bits[node])  # out of the token sets
            self.green_needed = len(self.live.up) * self.beta

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        x, seq, epoch, r, arrived = self._report(report)
        if self.live.set_up(node):
            self.green_needed = len(self.live.up) * self.beta
        if fresh:  # nothing of ours on its way there: its counts are the whole truth
            self.seen_seq[node] = seq
            self.sent[node] = arrived
            self.xhat[node] = x
        elif seq > self.seen_seq[node]:
            self._apply(node, seq, x, arrived)
        if self.full and epoch > self.epoch and epoch % self.k != self.index:
            self._adopt(epoch, r)  # another dispatcher's later epoch
        bits = self._refresh(node)
        if epoch > self.epoch or (epoch == self.epoch and r != self.r):
            # a restarted dispatcher meets the pools' epochs of its previous life: ours must come after them
            # (an equal number with another r is one of those too)
            self.epoch = self._next_epoch(epoch)
        if epoch == self.epoch:
            return NO_MESSAGES
        self.unsettled.add(node)
        return (self._epoch_message(node, bits),)

    def learned_value(self) -> int:
        return self.r

    def gauges(self) -> State:
        names = [c.name for c in self.exp.classes]
        ell = self.ranking.thresholds(self.r)
        return {
            "slta_r": float(self.r),
            "slta_yellow_tokens": float(len(self.yellow)),
            "slta_unanswered_epochs": float(len(self.unsettled)),
            "slta_green_tokens": {name: float(len(self.green[i])) for i, name in enumerate(names)},
            "slta_threshold": {name: float(ell[i]) for i, name in enumerate(names)},
        }


class SLTANode(NodeSide):
    """A pool's half: reports every departure with its task count and answers every epoch (module
    docstring); with several dispatchers, per dispatcher (local view) or to all of them (full view)."""

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
        k = max(1, dispatchers)
        self.full = exp.policy.view == "full" and k > 1
        own = 1 if self.full else k  # one (epoch, r, events) for all, or one per dispatcher
        self.epoch, self.r = [0] * own, [1] * own
        self.seq = [0] * own  # task events so far (of that dispatcher's tasks): arrivals plus departures
        self.arrived = [0] * k  # tasks of each dispatcher received
        self.departed = [0] * k

    def _slot(self, d: int) -> int:
        return 0 if self.full else d

    def _tasks(self, d: int, x: int) -> int:
        """The task count dispatcher d is told: the pool's, or (local view) of d's tasks."""
        return x if self.full or self.dispatchers <= 1 else self.arrived[d] - self.departed[d]

    def _token(self, kind: str, x: int, to: int) -> Message:
        i, tasks = self._slot(to), self._tasks(to, x)
        g, y = self.th.true_bits(self.cls, tasks, self.r[i])
        return Message(
            kind, self.node, (self.epoch[i], self.r[i], self.seq[i], g, y, tasks, self.arrived[to]), to
        )

    def _tokens(self, kind: str, x: int, origin: int, to_origin: bool = True) -> tuple[Message, ...]:
        """The token for ``origin`` (local view) or for every dispatcher (full view; the origin's only if
        ``to_origin``)."""
        if not self.full:
            return (self._token(kind, x, origin),) if to_origin else NO_MESSAGES
        return tuple(self._token(kind, x, e) for e in range(self.dispatchers) if to_origin or e != origin)

    def _adopt(self, i: int, data: Sequence[object]) -> None:
        """Take the epoch and r a dispatcher sent, unless a later epoch arrived first."""
        if len(data) != 5:
            raise ValueError(f"an SLTA belief is (epoch, r, seen, green, yellow), got {len(data)} values")
        epoch, r, seen = data[:3]
        if not (isinstance(epoch, int) and isinstance(r, int) and isinstance(seen, int)) or isinstance(
            r, bool
        ):
            raise ValueError("epoch, r and seen must be integers")
        if not 1 <= r <= MAX_R or epoch < 0:
            raise ValueError(f"r must lie in 1..{MAX_R} and the epoch must not be negative")
        if epoch < self.epoch[i]:
            return  # overtaken by a later epoch message, which already counts this one
        self.epoch[i], self.r[i] = epoch, r

    def on_arrival(self, x: int, origin: int, piggyback: tuple[object, ...]) -> tuple[Message, ...]:
        # nothing to report to the origin: it counted this task itself, and its picture never shows a token
        # that the pool lacks (it counts every task it sent, and departures only once reported)
        i = self._slot(origin)
        self.seq[i] += 1
        self.arrived[origin] += 1
        if piggyback:
            self._adopt(i, piggyback)
        return self._tokens("token_arrival", x, origin, to_origin=False)

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        self.seq[self._slot(origin)] += 1
        self.departed[origin] += 1
        return self._tokens("token_departure", x, origin)

    def report(self, x: int) -> tuple[int, ...]:
        out: list[int] = []
        for d in range(len(self.arrived)):
            i = self._slot(d)
            out += (self._tasks(d, x), self.seq[i], self.epoch[i], self.r[i], self.arrived[d])
        return tuple(out)

    def on_message(self, msg: Message, x: int) -> tuple[Message, ...]:
        if msg.kind != "epoch":
            return super().on_message(msg, x)
        if not 0 <= msg.dispatcher < len(self.arrived):
            raise ValueError(f"no dispatcher {msg.dispatcher} in this cluster")
        self._adopt(self._slot(msg.dispatcher), msg.data)
        # always answer an epoch, with the count: the dispatcher lowers r only once every told pool has
        # answered, and a class whose reach grew needs the counts at its new top; in a full view every
        # dispatcher hears the answer, and with it the new epoch and r
        return self._tokens("token_epoch", x, msg.dispatcher)


#: SLTA's message count: no closed form (docs/theory.md)
SLTA_MESSAGES = theory_doc("SLTA's messages")


class SLTA(Policy):
    name = "slta"
    summary = (
        "the self-learning threshold assignment: JLMU by green and yellow tokens (Goldsztajn et al. 2021)"
    )
    params = SLTAParams
    dispatcher = SLTADispatcher
    node = SLTANode
    kinds = ("token_departure", "token_arrival", "token_epoch", "epoch")
    node_bound = ("epoch",)
    # a token's pool event number, and the epoch an answer is for
    message_id: ClassVar[Mapping[str, tuple[int, ...]]] = {
        "token_departure": (2,),
        "token_arrival": (2,),
        "token_epoch": (0, 2),
        "epoch": (0,),
    }
    learned = Learned("slta_r", "SLTA's learned index r")
    exported = (
        Quantity(
            "slta_r",
            "SLTA's learned index r now (the integral lbtestbed_dispatcher_slta_r_model_seconds_total gives "
            "its exact time average)",
        ),
        Quantity(
            "slta_green_tokens", "Green tokens in this dispatcher's picture, by pool class", label="class"
        ),
        Quantity("slta_yellow_tokens", "Yellow tokens in this dispatcher's picture"),
        Quantity(
            "slta_threshold",
            "The threshold l_i(r) of each pool class: a pool of the class that holds fewer tasks is green",
            label="class",
        ),
        Quantity(
            "slta_unanswered_epochs",
            "Pools told of the current epoch that have not answered: r does not decrease while it is above 0",
        ),
    )
    resends = ("epoch",)

    def messages(self, exp: Experiment) -> MessageCost:
        k = exp.policy.dispatchers
        full = exp.policy.view == "full" and k > 1
        epochs = 0.1 * k  # a few EPOCHs per hundred tasks, counted as a tenth
        if exp.network.delay is not None:
            own = (2.0 * k - 1 if full else 1.0) + epochs
        else:
            own = (2.0 * (k - 1) if full else 0.0) + epochs  # the origin's token rides
        return MessageCost(
            None,
            "SLTA has no closed form: about one token per task at q* plus corrections and epoch messages; "
            "the exact-CTMC reference run for this project gives 1.02-1.14 for n = 50..800 "
            f"({SLTA_MESSAGES})",
            SLTA_MESSAGES,
            own=own,
        )

    def make_node_sides(
        self, exp: Experiment, rng: random.Random, nodes: Sequence[int], dispatchers: int, replication: int
    ) -> list[NodeSide]:
        th = Thresholds(ranking_of(exp))  # derived once, shared by every pool
        return [SLTANode(exp, k, rng, dispatchers, th) for k in nodes]


POLICIES = (SLTA(),)
