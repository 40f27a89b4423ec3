"""JLMU: join the largest marginal utility (``jlmu_slta.md`` §4).

The task goes to the best-ranked slot that is open: a pool of class i holding j - 1 tasks, for the best
(i, j) in the ranking. Within a class the best open slot belongs to the least loaded pools, so the dispatcher
compares one candidate per class, (i, x_min(i) + 1), and picks a pool of the winning class at x_min
uniformly. Pools report every departure (one message per task).
"""

from __future__ import annotations

import random

from lbtestbed.policies.base import NO_MESSAGES, DispatcherSide, Message, Route
from lbtestbed.policies.ranking import Ranking
from lbtestbed.policies.structures import LevelIndex
from lbtestbed.spec import Experiment


def ranking_of(exp: Experiment) -> Ranking:
    """The slot ranking of an experiment's pool classes."""
    utilities = []
    for c in exp.classes:
        if c.utility is None:
            raise ValueError(f"class {c.name!r} has no utility")
        utilities.append(c.utility)
    return Ranking(utilities, exp.policy.rank_order)


class JLMUDispatcher(DispatcherSide):
    name = "jlmu"

    def __init__(self, exp: Experiment, rng: random.Random, index: int = 0) -> None:
        super().__init__(exp, rng, index)
        self.ranking = ranking_of(exp)
        self.node_class = exp.node_class
        self.classes = [
            LevelIndex([k for k in range(self.n) if exp.node_class[k] == i], rng)
            for i in range(len(exp.classes))
        ]

    def dispatch(self) -> Route:
        key = self.ranking.key
        best, best_key = 0, None
        for i, lv in enumerate(self.classes):
            k = key(i, lv.min_level + 1)
            if best_key is None or k < best_key:
                best, best_key = i, k
        lv = self.classes[best]
        node = lv.pick_uniform(lv.min_level)
        lv.increment(node)
        return Route(node, "jlmu")

    def on_message(self, msg: Message) -> tuple[Message, ...]:
        if msg.kind != "departure":
            return super().on_message(msg)
        self.classes[self.node_class[msg.node]].decrement(msg.node)
        return NO_MESSAGES

    def on_task_failed(self, node: int) -> None:
        self.classes[self.node_class[node]].decrement(node)  # no departure notice will come for it

    def gauges(self) -> dict[str, float]:
        return {
            f"min_occupancy_{self.exp.classes[i].name}": float(lv.min_level)
            for i, lv in enumerate(self.classes)
        }
