"""Scheme 1 and Scheme 2 for heterogeneous processor-sharing clusters (Mukhopadhyay et al. 2015, arXiv
1502.05786, §2; docs/theory.md, "The two assignment rules" and "What each policy sends").

Each task probes d_j distinct nodes of every class j and keeps, per class, the least occupied (uniform ties).
Scheme 1 joins the kept node with the fewest tasks; Scheme 2 the one with the highest rate per task
speed / q (an idle node scores infinity). Ties across classes go to the faster node: candidates are visited
fastest first and replaced only on strict improvement. Speeds compare exactly as fractions, so the ties the
mean field counts as ties (speed ratio exactly 2 at equal q ratio) stay ties.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from lbtestbed.model.experiment import Experiment, NodeClass, PolicyParams
from lbtestbed.model.reader import TableReader, show
from lbtestbed.policies.base import DispatcherSide, Liveness, Message, Probe, Route, sample_distinct
from lbtestbed.policies.unit import SENDS, MessageCost, Policy

#: short citation of the schemes' paper (docs/theory.md, "Sources")
PS_PAPER = "Mukhopadhyay et al. 2015 (arXiv 1502.05786)"


@dataclass(frozen=True)
class SchemeParams(PolicyParams):
    """``d``: the probes per class d_j (one number for every class, or an array of one per class)."""

    d: tuple[int, ...] = ()

    KEYS = ("d",)

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> SchemeParams:
        raw = r.get("d", [2] * len(classes))
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = [raw] * len(classes)
        if not isinstance(raw, list) or len(raw) != len(classes):
            raise r.fail("d", f"must be an array with one probe count per class ({len(classes)} classes)")
        for i, (dj, c) in enumerate(zip(raw, classes, strict=True)):
            if isinstance(dj, bool) or not isinstance(dj, int) or dj < 1:
                raise r.fail(f"d[{i}]", f"must be a positive integer, got {show(dj)}")
            if dj > c.count:
                raise r.fail(
                    f"d[{i}]", f"samples {dj} distinct nodes but class {c.name!r} has only {c.count}"
                )
        return cls(**common, d=tuple(raw))

    def message_kinds(self) -> tuple[str, ...]:
        return ("probe", "probe_reply")


class _SchemeDispatcher(DispatcherSide):
    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        assert isinstance(exp.policy, SchemeParams)
        self.d = exp.policy.d
        self.members = [[k for k in range(self.n) if exp.node_class[k] == i] for i in range(len(exp.classes))]
        self.node_class = exp.node_class
        self.by_class = [Liveness(m) for m in self.members]  # for the per-class samples
        fixed = [c.speed.value for c in exp.classes]
        self.speed = [fixed[exp.node_class[k]] or Fraction(exp.node_speeds[k]) for k in range(self.n)]
        self._probes = sum(self.d)

    def on_node_down(self, node: int) -> None:
        super().on_node_down(node)
        self.by_class[self.node_class[node]].set_down(node)

    def on_node_up(self, node: int, report: tuple[int, ...], fresh: bool) -> tuple[Message, ...]:
        self.by_class[self.node_class[node]].set_up(node)
        return super().on_node_up(node, report, fresh)

    def dispatch(self) -> Probe:
        nodes: list[int] = []
        if not self.live.down:
            for members, d in zip(self.members, self.d, strict=True):
                nodes.extend(members[j] for j in sample_distinct(self.rng, len(members), d))
        else:  # d_j = min(d_j, pools of class j that are up); a class with none is skipped
            for live, d in zip(self.by_class, self.d, strict=True):
                if live.up:
                    nodes.extend(live.sample(self.rng, d))
        return Probe(tuple(nodes))

    def _per_class(self, nodes: Sequence[int]) -> list[int]:
        """How many of ``nodes`` (grouped by class, as dispatch makes them) each probed class has."""
        counts: list[int] = []
        last = -1
        for k in nodes:
            c = self.node_class[k]
            if c != last:
                counts.append(0)
                last = c
            counts[-1] += 1
        return counts

    def _kept(self, probe: Probe, replies: Sequence[int]) -> list[tuple[int, int]]:
        """Per class, the least occupied probed node (first minimum of a random sample: uniform ties)."""
        kept, start = [], 0
        ds = self.d if len(probe.nodes) == self._probes else self._per_class(probe.nodes)
        for d in ds:
            best = start
            for k in range(start + 1, start + d):
                if replies[k] < replies[best]:
                    best = k
            kept.append((probe.nodes[best], replies[best]))
            start += d
        speed = self.speed
        kept.sort(key=lambda nq: -speed[nq[0]])  # fastest first (stable: equal speeds keep class order)
        return kept

    def better(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        raise NotImplementedError

    def resolve(self, probe: Probe, replies: Sequence[int]) -> Route:
        probe, replies = self._without_down(probe, replies)
        if not probe.nodes:  # every probed node went down while the probes were out: a class, a node
            live = [lv for lv in self.by_class if lv.up]
            return Route(live[int(self.rng.random() * len(live))].pick(self.rng), "busy")
        kept = self._kept(probe, replies)
        best = kept[0]
        for cand in kept[1:]:
            if self.better(cand, best):
                best = cand
        return Route(best[0], "idle" if best[1] == 0 else "busy")


class Scheme1Dispatcher(_SchemeDispatcher):
    """Least occupancy among the kept nodes."""

    name = "scheme1"

    def better(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        return a[1] < b[1]


class Scheme2Dispatcher(_SchemeDispatcher):
    """Highest rate per task: speed_a / q_a > speed_b / q_b, compared as speed_a q_b > speed_b q_a."""

    name = "scheme2"

    def better(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        (na, qa), (nb, qb) = a, b
        if qb == 0:
            return False  # nothing beats an idle node already chosen (it is at least as fast)
        if qa == 0:
            return True
        return self.speed[na] * qb > self.speed[nb] * qa


class _Scheme(Policy):
    params = SchemeParams
    kinds = ("probe", "probe_reply")

    def messages(self, exp: Experiment) -> MessageCost:
        assert isinstance(exp.policy, SchemeParams)
        d = sum(exp.policy.d)
        return MessageCost(2.0 * d, f"2 sum(d_j) = {2 * d}", f"{PS_PAPER} §2; {SENDS}", probes=float(d))


class Scheme1(_Scheme):
    name = "scheme1"
    summary = "probe d_j nodes of every class, join the least occupied kept (Mukhopadhyay et al. 2015)"
    dispatcher = Scheme1Dispatcher


class Scheme2(_Scheme):
    name = "scheme2"
    summary = "probe d_j nodes of every class, join the highest rate per task (Mukhopadhyay et al. 2015)"
    dispatcher = Scheme2Dispatcher


POLICIES = (Scheme1(), Scheme2())
