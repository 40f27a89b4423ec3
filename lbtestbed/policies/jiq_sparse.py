"""Sparsified JIQ: JIQ whose node, left idle, sends its token only with probability p (docs/spec.md,
"`jiq_sparse`"; docs/theory.md, "Sparsified JIQ at the same message rate"), the baseline van der Boor,
Borst and van Leeuwaarden compare JSQ on sparse feedback with ("Hyper-Scalable JSQ with Sparse Feedback",
2019, arXiv 1903.02337, abstract).

Everything is JIQ's (``policies.jiq``: the dispatcher's tokens, their numbers, JIQ-Random or JIQ-SQ(d) with
several dispatchers, the reports) but one rule: when a task leaves a node empty, the node draws from its
own stream and announces itself (sends its token, or starts its JIQ-SQ(d) round) only if the draw falls
below p; otherwise it stays silent until it is left idle again. A silent idle node keeps ``token_to = -1``
in its report, so no dispatcher takes it for a lost token. p = 1 draws nothing and is JIQ. At start every
node's token is held, as in JIQ.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lbtestbed.model.experiment import Experiment, NodeClass
from lbtestbed.model.reader import TableReader
from lbtestbed.model.streams import node_random
from lbtestbed.policies.base import NO_MESSAGES, Message, NodeSide
from lbtestbed.policies.jiq import JIQ, IdleTokenSender, JIQParams
from lbtestbed.policies.unit import SENDS, Curve, MessageCost


@dataclass(frozen=True)
class SparseJIQParams(JIQParams):
    """JIQ's keys, and p: the probability that a node left idle sends its token."""

    name: str = "jiq_sparse"
    p: float = 1.0

    KEYS: ClassVar[tuple[str, ...]] = ("tie_break", "d", "p")

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> SparseJIQParams:
        jiq = super().read(r, common, classes)
        p = r.number("p", default=1.0, positive=True)
        if p > 1.0:
            raise r.fail("p", f"is a probability in (0, 1], got {p!r}")
        assert isinstance(jiq, SparseJIQParams)
        return dataclasses.replace(jiq, p=p)


def tokens_per_task(p: float, load: float) -> float:
    """m = p (1 - load) / (1 - load p): the fluid limit's tokens per task, one dispatcher (docs/theory.md,
    "Sparsified JIQ at the same message rate")."""
    return p * (1.0 - load) / (1.0 - load * p)


class SparseTokenSender(IdleTokenSender):
    """JIQ's node side, announcing an idle node with probability p only (module docstring)."""

    def __init__(self, exp: Experiment, node: int, rng: random.Random, dispatchers: int = 1) -> None:
        super().__init__(exp, node, rng, dispatchers)
        assert isinstance(exp.policy, SparseJIQParams)
        self.p = exp.policy.p

    def on_departure(self, x: int, origin: int) -> tuple[Message, ...]:
        if x == 0 and self.p < 1.0 and self.rng.random() >= self.p:
            return NO_MESSAGES  # silent: token_to stays -1, as after the arrival that made it busy
        return super().on_departure(x, origin)


class SparseJIQ(JIQ):
    name = "jiq_sparse"
    aliases = ("sparsified_jiq",)
    summary = "sparsified JIQ: a node left idle sends its token with probability p (van der Boor et al. 2019)"
    params = SparseJIQParams
    node = SparseTokenSender
    frontier = (Curve("sparsified JIQ", "p", (0.1, 0.25, 0.5, 0.75, 1.0)),)

    def messages(self, exp: Experiment) -> MessageCost:
        params = exp.policy
        assert isinstance(params, SparseJIQParams)
        load = exp.work_rate / sum(exp.node_speeds)
        m = tokens_per_task(params.p, load) if load < 1.0 else params.p
        jiq = super().messages(exp)
        own = jiq.own * m  # JIQ's, per token, for m tokens per task
        if params.dispatchers > 1 or params.d > 1:
            return MessageCost(
                None,
                'tokens per task with several dispatchers: no formula here (docs/theory.md, "Sparsified JIQ '
                'at the same message rate", is for one dispatcher)',
                SENDS,
                own=own,
            )
        return MessageCost(
            m,
            f"p (1 - load) / (1 - load p) = {m:.4g} idle tokens per task (p = {params.p:g}, load {load:.4g})",
            SENDS,
            ("n -> infinity (fluid limit)", "load < 1", "one dispatcher", "exponential work (or p = 1)"),
            own=own,
        )

    def make_node_sides(
        self, exp: Experiment, rng: random.Random, nodes: Sequence[int], dispatchers: int, replication: int
    ) -> list[NodeSide]:
        # every node draws from its own stream, whatever K: the simulator, its twin and the node hosts then
        # draw the same numbers for the same node
        return [SparseTokenSender(exp, k, node_random(exp.seed, k, replication), dispatchers) for k in nodes]


POLICIES = (SparseJIQ(),)
