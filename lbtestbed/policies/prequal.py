"""Prequal: asynchronous probes, a probe pool, and the hot-cold lexicographic rule.

Wydrowski, Kleinberg, Rumble and Archer, "Load is not what you should balance: Introducing Prequal",
NSDI 2024, arXiv 2312.10172; the rules and defaults below are the paper's section 4 (the design) and
section 5 (the testbed's defaults). docs/spec.md, "`prequal`", states each rule and where the paper leaves
a detail open; docs/theory.md, "Prequal", says why there is no theory.

Dispatcher side (the paper's client), for each task (query):

1. Probes older than ``max_age`` (model seconds since their reply arrived) leave the pool.
2. Selection. With the pool empty: a node drawn uniformly at random (the paper's fallback). Otherwise the
   hot-cold lexicographic (HCL) rule: theta is the ``q_rif`` quantile of the RIFs that the last
   ``rif_history`` replies reported (the ceil(q_rif * h)-th smallest of h); a probe is hot when its RIF
   exceeds theta. Among the cold probes the
   one with the lowest latency estimate wins (ties: lower RIF, then uniform); when all are hot, the lowest
   RIF (ties: lower latency, then uniform).
3. The chosen probe has served one more query; used ``b_reuse`` times it leaves the pool. The budget is
   Eq. 1, b_reuse = max(1, (1 + delta) / ((1 - m/n) r_probe - r_remove)) with m the pool size and n the
   nodes, rounded at random per probe (floor, plus one with probability the fraction); 1 when the
   denominator is not positive (the max of 1 and a negative quotient, as written).
4. ``r_remove`` probes leave the pool, alternately the worst (the hot one with the highest RIF, or with
   none hot the one with the highest latency) and the oldest.
5. ``r_probe`` probes go out (a fractional rate is rounded at random per query) to distinct nodes drawn
   uniformly, as ``prequal_probe`` messages numbered by this dispatcher. Each reply (``prequal_reply``:
   the number, the node's RIF and latency estimate) enters the pool when it arrives, in place of an older
   probe of the same node; a full pool first drops its oldest probe. The probes' targets (and the
   rounding of a fractional r_probe) come from a random stream of their own, split off the policy's when
   the side is made: the draws of tie-breaks and of the empty pool's fallback depend on what the pool
   holds, so on one stream they would shift every later probe whenever two runs' pools differ. Apart, the
   n-th query's probes are the same draws in the cluster and in its twin, which can then replay each
   probe and reply with the age the cluster measured for it (``wire.message_key``).

Node side (the paper's server): RIF is the node's tasks present; the latency estimate is the median
latency (arrival to completion at the node, model seconds) of the last ``latency_window`` tasks that found
as many tasks on arrival as the node holds now, or, with none, of those that found the nearest number
(both sides pooled); 0 before any task has left.

Several dispatchers: each keeps a pool of its own, probes on its own tasks, and the nodes answer each
probe to the dispatcher that sent it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lbtestbed.model.experiment import MAX_NODES, Experiment, NodeClass, PolicyParams
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
from lbtestbed.policies.unit import SENDS, Curve, MessageCost, Policy, Quantity


@dataclass(frozen=True)
class PrequalParams(PolicyParams):
    """Prequal's parameters, named as Wydrowski et al. 2024 (arXiv 2312.10172) name them (docs/spec.md,
    "`prequal`"): probes per query, probes removed per query, the pool's size m, its age limit (model
    seconds), delta and the reuse budget of Eq. 1 (None: derived), the RIF quantile and over how many recent
    replies it is taken, and how many recent latencies a node keeps for its estimate."""

    name: str = "prequal"
    r_probe: float = 3.0
    r_remove: float = 1.0
    pool_size: int = 16
    max_age: float = 1.0
    delta: float = 1.0
    b_reuse: float | None = None
    q_rif: float = 2**-0.25
    rif_history: int = 16
    latency_window: int = 16

    KEYS = (
        "r_probe",
        "r_remove",
        "pool_size",
        "max_age",
        "delta",
        "b_reuse",
        "q_rif",
        "rif_history",
        "latency_window",
    )

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> PrequalParams:
        """Each key with the paper's default (docs/spec.md, "`prequal`")."""
        n = sum(c.count for c in classes)
        dflt = cls()
        r_probe = r.number("r_probe", default=dflt.r_probe)
        if r_probe > n:
            raise r.fail("r_probe", f"probes {r_probe:g} distinct nodes per query but the spec has only {n}")
        q_rif = r.number("q_rif", default=dflt.q_rif, positive=False)
        if q_rif > 1:
            raise r.fail("q_rif", f"is a quantile: from 0 to 1, got {q_rif:g}")
        b_reuse = r.number("b_reuse") if r.has("b_reuse") else None
        if b_reuse is not None and b_reuse < 1:
            raise r.fail("b_reuse", f"a probe serves at least one query: must be at least 1, got {b_reuse:g}")
        return cls(
            **common,
            r_probe=r_probe,
            r_remove=r.number("r_remove", default=dflt.r_remove, positive=False),
            pool_size=r.integer("pool_size", default=dflt.pool_size, minimum=1, maximum=MAX_NODES),
            max_age=r.number("max_age", default=dflt.max_age),
            delta=r.number("delta", default=dflt.delta, positive=False),
            b_reuse=b_reuse,
            q_rif=q_rif,
            rif_history=r.integer("rif_history", default=dflt.rif_history, minimum=1, maximum=100_000),
            latency_window=r.integer(
                "latency_window", default=dflt.latency_window, minimum=1, maximum=100_000
            ),
        )

    def message_kinds(self) -> tuple[str, ...]:
        return ("prequal_probe", "prequal_reply")


def reuse_budget(params: PrequalParams, n: int) -> float:
    """b_reuse: the spec's, or Eq. 1's max(1, (1 + delta) / ((1 - m/n) r_probe - r_remove)). A negative
    denominator makes the quotient negative and the max 1, as written; a zero one is read as its limit
    from below, 1 as well."""
    if params.b_reuse is not None:
        return params.b_reuse
    net = (1 - params.pool_size / n) * params.r_probe - params.r_remove
    if net <= 0:
        return 1.0
    return max(1.0, (1 + params.delta) / net)


def _rounded(rng: random.Random, x: float) -> int:
    """x rounded at random to floor(x) or floor(x) + 1, with mean x (no draw when x is an integer)."""
    whole = math.floor(x)
    frac = x - whole
    if frac == 0:
        return whole
    return whole + (1 if rng.random() < frac else 0)


class _Probe:
    """One probe in the pool: its node, when its reply arrived, what it said, the uses left."""

    __slots__ = ("latency", "node", "received", "rif", "seq", "uses_left")

    def __init__(self, node: int, seq: int, received: float, rif: int, latency: float, uses: float) -> None:
        self.node, self.seq, self.received = node, seq, received
        self.rif, self.latency, self.uses_left = rif, latency, uses


def _reply(data: tuple[Any, ...]) -> tuple[int, int, float]:
    if len(data) != 3:
        raise ValueError(f"a prequal reply is (probe, rif, latency), got {len(data)} values")
    seq, rif, latency = data
    if type(seq) is not int or seq < 0:
        raise ValueError(f"a probe's number is an integer >= 0, got {seq!r}")
    if type(rif) is not int or rif < 0:
        raise ValueError(f"RIF is an integer >= 0, got {rif!r}")
    if isinstance(latency, bool) or not isinstance(latency, int | float) or not 0 <= latency < math.inf:
        raise ValueError(f"a latency estimate is a finite number >= 0, got {latency!r}")
    return seq, rif, float(latency)


class PrequalDispatcher(DispatcherSide):
    """The client side of Prequal (module docstring): a probe pool, HCL, asynchronous probes."""

    name = "prequal"
    uses_clock = True  # reads ``now`` (model time) for the probes' ages

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        params = exp.policy
        assert isinstance(params, PrequalParams)
        self.params = params
        self.b_reuse = reuse_budget(params, self.n)
        # the probes' own stream (module docstring, rule 5): it depends on the policy stream's seed alone
        self.probe_rng = random.Random(rng.getrandbits(64))
        self.pool: dict[int, _Probe] = {}  # by node, oldest reply first
        self.rifs: deque[int] = deque(maxlen=params.rif_history)  # the RIFs of the last replies taken
        self.sent = 0  # probes numbered so far
        self.remove_worst = True  # the next removal: worst, then oldest, in turn
        self.removed: dict[str, int] = {"aged": 0, "used_up": 0, "worst": 0, "oldest": 0, "full": 0}

    # ------------------------------------------------------------------------------------ the pool

    def _age_out(self) -> None:
        limit = self.now - self.params.max_age
        old = [k for k, p in self.pool.items() if p.received < limit]
        for k in old:
            del self.pool[k]
        self.removed["aged"] += len(old)

    def _theta(self) -> int:
        """The q_rif quantile of the RIFs the last replies reported: the ceil(q_rif * h)-th smallest of h
        (at least the 1st)."""
        rifs = sorted(self.rifs)
        j = max(1, math.ceil(self.params.q_rif * len(rifs)))
        return rifs[j - 1]

    def _pick(self, probes: list[_Probe]) -> _Probe:
        """One of tied probes, uniformly (no draw when there is one)."""
        return probes[0] if len(probes) == 1 else probes[int(self.rng.random() * len(probes))]

    def _hcl(self) -> tuple[_Probe, bool]:
        """The HCL choice, and whether it is hot."""
        theta = self._theta()
        probes = list(self.pool.values())
        cold = [p for p in probes if p.rif <= theta]
        if cold:
            fast = min((p.latency, p.rif) for p in cold)
            return self._pick([p for p in cold if (p.latency, p.rif) == fast]), False
        least = min((p.rif, p.latency) for p in probes)
        return self._pick([p for p in probes if (p.rif, p.latency) == least]), True

    def _worst(self) -> _Probe:
        """The hot probe with the highest RIF (then latency); with none hot, the one with the highest
        latency (then RIF); the oldest of ties."""
        theta = self._theta()
        probes = list(self.pool.values())
        hot = [p for p in probes if p.rif > theta]
        if hot:
            return max(hot, key=lambda p: (p.rif, p.latency, -p.received))
        return max(probes, key=lambda p: (p.latency, p.rif, -p.received))

    def _oldest(self) -> _Probe:
        return min(self.pool.values(), key=lambda p: p.received)  # the first of ties: inserted first

    def _remove(self) -> None:
        """One of r_remove: the worst and the oldest in turn."""
        if not self.pool:
            return
        if self.remove_worst:
            del self.pool[self._worst().node]
            self.removed["worst"] += 1
        else:
            del self.pool[self._oldest().node]
            self.removed["oldest"] += 1
        self.remove_worst = not self.remove_worst

    # ----------------------------------------------------------------------------------- decisions

    def dispatch(self) -> Route:
        self._age_out()
        if self.pool:
            probe, hot = self._hcl()
            node, outcome = probe.node, "hcl_hot" if hot else "hcl_cold"
            probe.uses_left -= 1
            if probe.uses_left <= 0:
                del self.pool[node]
                self.removed["used_up"] += 1
        else:
            node, outcome = self.live.pick(self.rng), "random"  # the paper's fallback: uniform
        for _ in range(_rounded(self.rng, self.params.r_remove)):
            self._remove()
        return Route(node, outcome, self._probes())

    def _probes(self) -> tuple[Message, ...]:
        up, rng = self.live.up, self.probe_rng
        count = min(_rounded(rng, self.params.r_probe), len(up))
        if count <= 0:
            return NO_MESSAGES
        if self.live.down:
            nodes = tuple(up[j] for j in sample_distinct(rng, len(up), count))
        else:
            nodes = sample_distinct(rng, self.n, count)
        first = self.sent
        self.sent += count
        return tuple(Message("prequal_probe", k, (first + i,), self.index) for i, k in enumerate(nodes))

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if msg.kind != "prequal_reply":
            return super().on_message(msg)
        seq, rif, latency = _reply(msg.data)
        k = msg.node
        if seq >= self.sent:
            raise ValueError(f"reply to probe {seq}, but this dispatcher has sent {self.sent}")
        if k in self.live.down:
            return NO_MESSAGES
        held = self.pool.get(k)
        if held is not None:
            if held.seq > seq:
                return NO_MESSAGES  # overtaken: the pool holds a later probe of this node
            del self.pool[k]  # a newer probe of the same node takes its place
        elif len(self.pool) >= self.params.pool_size:
            del self.pool[self._oldest().node]
            self.removed["full"] += 1
        self.rifs.append(rif)
        uses = self.b_reuse if math.isinf(self.b_reuse) else _rounded(self.rng, self.b_reuse)
        self.pool[k] = _Probe(k, seq, self.now, rif, latency, uses)
        return NO_MESSAGES

    # ------------------------------------------------------------------------------------ faults

    def on_node_down(self, node: int) -> None:
        if self.live.set_down(node):
            self.pool.pop(node, None)  # route nothing to it; its replies are ignored while it is down

    def gauges(self) -> State:
        return {
            "prequal_pool_probes": float(len(self.pool)),
            "prequal_probes_removed_total": {why: float(count) for why, count in self.removed.items()},
        }


class PrequalNode(NodeSide):
    """The server side of Prequal: answers each ``prequal_probe`` with its RIF and latency estimate."""

    records_latency = True

    def __init__(self, exp: Experiment, node: int, rng: random.Random, dispatchers: int = 1) -> None:
        super().__init__(exp, node, rng, dispatchers)
        params = exp.policy
        assert isinstance(params, PrequalParams)
        self.window = params.latency_window
        self.recent: dict[int, deque[float]] = {}  # per count found on arrival: the last latencies

    def on_served(self, found: int, latency: float) -> None:
        kept = self.recent.get(found)
        if kept is None:
            kept = self.recent[found] = deque(maxlen=self.window)
        kept.append(latency)

    def estimate(self, x: int) -> float:
        """The median of the last ``latency_window`` latencies of tasks that found ``x`` tasks on arrival,
        or of those at the nearest count with any (both sides pooled); 0 with none at all."""
        if not self.recent:
            return 0.0
        kept = self.recent.get(x)
        if kept is None:
            gap = min(abs(f - x) for f in self.recent)
            kept = deque(s for f in (x - gap, x + gap) for s in self.recent.get(f, ()))
        return float(statistics.median(kept))

    def on_message(self, msg: Message, x: int) -> tuple[Message, ...]:
        if msg.kind != "prequal_probe":
            return super().on_message(msg, x)
        if len(msg.data) != 1 or type(msg.data[0]) is not int or msg.data[0] < 0:
            raise ValueError(f"a prequal probe is (number,) with an integer >= 0, got {msg.data!r}")
        return (Message("prequal_reply", self.node, (msg.data[0], x, self.estimate(x)), msg.dispatcher),)


class Prequal(Policy):
    name = "prequal"
    summary = "asynchronous probes, a probe pool and hot-cold lexicographic selection (Wydrowski et al. 2024)"
    params = PrequalParams
    dispatcher = PrequalDispatcher
    node = PrequalNode
    kinds = ("prequal_probe", "prequal_reply")
    node_bound = ("prequal_probe",)
    frontier = (Curve("probes per query", "r_probe", (1.0, 2.0, 3.0)),)
    message_id: ClassVar[Mapping[str, tuple[int, ...]]] = {
        "prequal_probe": (0,),
        "prequal_reply": (0,),
    }  # the dispatcher's probe number
    exported = (
        Quantity("prequal_pool_probes", "Probe replies in the pool"),
        Quantity(
            "prequal_probes_removed_total",
            "Probe replies removed from the pool, by reason: aged (older than max_age), used_up (reused "
            "b_reuse times), worst and oldest (r_remove's removals in turn), full (a new reply's room)",
            "counter",
            "reason",
        ),
    )

    def messages(self, exp: Experiment) -> MessageCost:
        assert isinstance(exp.policy, PrequalParams)
        r = exp.policy.r_probe
        # each probe is a request of its own; its reply rides on the answer unless delays are emulated
        own = 2.0 * r if exp.network.delay is not None else r
        return MessageCost(
            2.0 * r, f"2 r_probe = {2 * r:g}: r_probe probes and their replies", SENDS, own=own
        )


POLICIES = (Prequal(),)
