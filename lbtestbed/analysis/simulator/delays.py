"""How long the legs of a task and the state messages take in a simulation: the kernel's delays.

The kernel (``engine.Simulator``) calls its delays at every leg that may take time: a probe and its
replies, a task's way from its dispatcher to its node, its answer's way back, and every state message.
``Delays`` carries everything at once (the model); ``NetworkDelays`` draws the spec's network delay for
each message, probe and reply (and each task and answer with ``network.forward_tasks``); the twin's
``MeasuredDelays`` (``twin.py``) replays what a cluster run measured. What travels waits in the kernel's
event queue (``Simulator.schedule``) and is handed back to the kernel when it arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from lbtestbed.model.distributions import BlockSampler
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.streams import seed_sequence
from lbtestbed.model.workload import Task
from lbtestbed.policies import Message, Probe, Route

if TYPE_CHECKING:
    from lbtestbed.analysis.simulator.engine import Simulator


class Delays:
    """Every leg and message arrives the instant it leaves. A simulator binds its delays to itself
    (``bind``); what travels is handed back to it."""

    sim: Simulator
    #: whether a task leaves the system when it completes (else ``departed`` says when)
    leaves_at_completion = True

    def bind(self, sim: Simulator) -> None:
        self.sim = sim

    def probe(self, task: Task, probe: Probe) -> None:
        """Carry ``probe`` to its nodes and their replies back; route the task once the last is in."""
        sim = self.sim
        d = len(probe.nodes)
        sim.measure.count("probe", d)
        sim.measure.count("probe_reply", d)
        sides, nodes = sim.sides, sim.nodes
        replies = [sides[k].probe_reply(nodes[k].x) for k in probe.nodes]
        sim.route(task, sim.dispatchers[task.origin].resolve(probe, replies))

    def forward(self, task: Task, route: Route, probed: bool) -> None:
        """Carry a routed task to its node (``probed``: it was decided on probe replies)."""
        task.forwarded = self.sim.now
        self.sim.task_at_node(task, route)

    def message(self, m: Message, answer: bool) -> float | None:
        """How long the state message ``m`` travels (None: it arrives at once); ``answer``: it answers a
        message of its receiver's."""
        return None

    def reply(self, task: Task) -> float:
        """The way of ``task``'s answer from its node to the client, part of its sojourn."""
        return 0.0

    def departed(self, task: Task, k: int, t: float, msgs: tuple[Message, ...]) -> None:
        """``task`` left node ``k`` at ``t``, whose node side said ``msgs``: the messages and its answer
        go to the dispatchers."""
        sim = self.sim
        if msgs:
            sim.to_dispatcher(msgs)
        if not sim.ignores_done:
            sim.dispatchers[task.origin].on_task_done(k, t - task.forwarded)


class _Pending:
    """A task waiting for its probe replies."""

    __slots__ = ("missing", "probe", "replies", "task")

    def __init__(self, task: Task, probe: Probe) -> None:
        self.task, self.probe = task, probe
        self.replies = [0] * len(probe.nodes)
        self.missing = len(probe.nodes)


class NetworkDelays(Delays):
    """The spec's network delay (``[network]``): each state message, probe and reply is delayed by a draw of
    its own; with ``forward_tasks`` each task and each answer too."""

    def __init__(self, exp: Experiment, replication: int) -> None:
        assert exp.network.delay is not None
        rng = np.random.default_rng(seed_sequence(exp.seed, "network", replication))
        self.delay: Callable[[], float] = BlockSampler(exp.network.delay, rng)
        self.forward_tasks = exp.network.forward_tasks

    def probe(self, task: Task, probe: Probe) -> None:
        pending = _Pending(task, probe)
        sim = self.sim
        for i in range(len(probe.nodes)):
            sim.measure.count("probe")
            sim.schedule(sim.now + self.delay(), self._probe_at_node, pending, i)

    def _probe_at_node(self, pending: object, i: object) -> None:
        assert isinstance(pending, _Pending) and isinstance(i, int)
        sim = self.sim
        k = pending.probe.nodes[i]
        (reply,) = sim.sides[k].on_message(Message("probe", k), sim.nodes[k].x)
        sim.measure.count("probe_reply")
        sim.schedule(sim.now + self.delay(), self._reply_at_dispatcher, pending, (i, reply.data[0]))

    def _reply_at_dispatcher(self, pending: object, reply: object) -> None:
        assert isinstance(pending, _Pending) and isinstance(reply, tuple)
        i, x = reply
        pending.replies[i] = x
        pending.missing -= 1
        if pending.missing == 0:
            task = pending.task
            self.sim.route(task, self.sim.dispatchers[task.origin].resolve(pending.probe, pending.replies))

    def forward(self, task: Task, route: Route, probed: bool) -> None:
        sim = self.sim
        task.forwarded = sim.now
        if self.forward_tasks:
            sim.schedule(sim.now + self.delay(), sim.task_at_node, task, route)
        else:
            sim.task_at_node(task, route)

    def message(self, m: Message, answer: bool) -> float | None:
        return self.delay()

    def departed(self, task: Task, k: int, t: float, msgs: tuple[Message, ...]) -> None:
        sim = self.sim
        if msgs:
            sim.to_dispatcher(msgs)
        if self.forward_tasks:
            back = t + self.delay()  # the answer's way back to the dispatcher
            sim.schedule(back, self._answered, task, (k, back - task.forwarded))
        else:
            sim.dispatchers[task.origin].on_task_done(k, t - task.forwarded)

    def _answered(self, task: object, done: object) -> None:
        assert isinstance(task, Task) and isinstance(done, tuple)
        k, latency = done
        self.sim.dispatchers[task.origin].on_task_done(k, latency)
