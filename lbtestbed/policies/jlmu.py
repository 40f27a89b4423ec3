"""JLMU: join the largest marginal utility (Goldsztajn et al. 2021, arXiv 2112.08958, §3.1; docs/theory.md,
"JLMU's dispatching rule").

The task goes to the best-ranked slot that is open: a pool of class i holding j - 1 tasks, for the best
(i, j) in the ranking. Within a class the best open slot belongs to the least loaded pools, so the dispatcher
compares one candidate per class, (i, x_min(i) + 1), and picks a pool of the winning class at x_min
uniformly. Pools report every departure (one message per task), with the counts that make lost, duplicated
and reordered reports harmless (``jsq.py``: the dispatcher's picture is JSQ's, one LevelIndex per class).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lbtestbed.model.experiment import Experiment, NodeClass
from lbtestbed.model.reader import TableReader
from lbtestbed.policies.base import Route, State
from lbtestbed.policies.jsq import CountingDispatcher, CountingParams, DepartureNotifier, notice_cost
from lbtestbed.policies.ranking import Ranking
from lbtestbed.policies.structures import LevelIndex
from lbtestbed.policies.unit import MessageCost, Policy, Quantity

#: the order of the slot ranking's ties (docs/theory.md, "Slots and their ranking"): class, then level, or
#: level, then class
RANK_ORDERS = ("ij", "ji")


@dataclass(frozen=True)
class UtilityParams(CountingParams):
    """What the utility-maximizing policies (JLMU, SLTA) share: pools with utilities, ranked slots."""

    rank_order: str = "ij"

    def check(self, exp: Experiment, top: TableReader) -> None:
        for i, c in enumerate(exp.classes):
            if c.discipline != "pool":
                raise top.fail(
                    f"classes[{i}].discipline", f"{self.name} needs pool nodes, got {c.discipline!r}"
                )
            if c.utility is None:
                raise top.fail(f"classes[{i}].utility", f"{self.name} needs a utility for every pool class")


@dataclass(frozen=True)
class JLMUParams(UtilityParams):
    name: str = "jlmu"

    KEYS = ("rank_order", "view")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> JLMUParams:
        return cls(**common, rank_order=r.string("rank_order", default="ij", choices=RANK_ORDERS))


def ranking_of(exp: Experiment) -> Ranking:
    """The slot ranking of an experiment's pool classes."""
    utilities = []
    for c in exp.classes:
        if c.utility is None:
            raise ValueError(f"class {c.name!r} has no utility")
        utilities.append(c.utility)
    # the ranking's tie order is the policy's own; any other policy's pools are ranked class first
    order = exp.policy.rank_order if isinstance(exp.policy, UtilityParams) else "ij"
    return Ranking(utilities, order)


class JLMUDispatcher(CountingDispatcher):
    name = "jlmu"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.ranking = ranking_of(exp)
        self.node_class = exp.node_class
        self.classes = [
            LevelIndex([k for k in range(self.n) if exp.node_class[k] == i], rng)
            for i in range(len(exp.classes))
        ]

    def _levels(self, k: int) -> LevelIndex:
        return self.classes[self.node_class[k]]

    def dispatch(self) -> Route:
        key = self.ranking.key
        best, best_key = 0, None
        some_down = bool(self.live.down)
        for i, lv in enumerate(self.classes):
            if some_down and not lv.buckets[lv.min_level]:
                continue  # every pool of the class is down
            k = key(i, lv.min_level + 1)
            if best_key is None or k < best_key:
                best, best_key = i, k
        lv = self.classes[best]
        node = lv.pick_uniform(lv.min_level)
        s = self.sent[node] = self.sent[node] + 1
        if s > self.acked[node]:  # else more departures were reported than we count tasks: it stays at 0
            lv.increment(node)
        return Route(node, "jlmu")

    def gauges(self) -> State:
        names = [c.name for c in self.exp.classes]
        return {"jlmu_min_occupancy": {names[i]: float(lv.min_level) for i, lv in enumerate(self.classes)}}


class JLMU(Policy):
    name = "jlmu"
    summary = (
        "join the largest marginal utility, on counts kept by departure notices (Goldsztajn et al. 2021)"
    )
    params = JLMUParams
    dispatcher = JLMUDispatcher
    node = DepartureNotifier
    kinds = ("departure", "arrival")
    message_id: ClassVar[Mapping[str, tuple[int, ...]]] = {
        "departure": (0, 1, 3),
        "arrival": (0, 1, 3),
    }  # (arrived, departed), a full view's event
    exported = (
        Quantity(
            "jlmu_min_occupancy",
            "The fewest tasks a pool of the class holds in this dispatcher's picture (its best open slot)",
            label="class",
        ),
    )

    def messages(self, exp: Experiment) -> MessageCost:
        return notice_cost(exp)


POLICIES = (JLMU(),)
