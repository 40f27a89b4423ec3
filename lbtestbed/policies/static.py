"""Policies that use no state information and send no messages: random and round-robin routing."""

from __future__ import annotations

from dataclasses import dataclass

from lbtestbed.model.experiment import Experiment, PolicyParams
from lbtestbed.model.reader import TableReader
from lbtestbed.model.reading import long_run_speeds, over_time_note
from lbtestbed.policies.base import DispatcherSide, Route
from lbtestbed.policies.unit import Policy


@dataclass(frozen=True)
class StaticParams(PolicyParams):
    """No keys of their own; static routing refuses a load its slowest queue cannot carry."""

    def check(self, exp: Experiment, top: TableReader) -> None:
        # static routing gives every node 1/n of the work, whatever the other nodes are
        cls = exp.node_class
        queued = [k for k in range(exp.n) if exp.classes[cls[k]].discipline != "pool"]
        if not queued:
            return
        speeds = long_run_speeds(exp)
        slowest = min(speeds[k] for k in queued)
        if exp.work_rate / exp.n >= slowest:
            raise top.fail(
                "workload",
                f"unstable under {self.name}: each node gets "
                f"{exp.work_rate / exp.n:.4g} work/s but the slowest fcfs/ps node serves {slowest:.4g}/s"
                f"{over_time_note(exp)}",
            )


class RandomDispatcher(DispatcherSide):
    """Uniformly random node (that is up)."""

    name = "random"

    def dispatch(self) -> Route:
        return Route(self.live.pick(self.rng), "random")  # while all are up: int(random() * n), as ever


class RoundRobinDispatcher(DispatcherSide):
    """Nodes in turn, in id order, skipping those that are down; each dispatcher starts at a random node so
    that several do not align."""

    name = "round_robin"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._next = int(self.rng.random() * self.n)

    def dispatch(self) -> Route:
        k = self._next
        down = self.live.down
        while k in down:  # some node is up
            k = k + 1 if k + 1 < self.n else 0
        self._next = k + 1 if k + 1 < self.n else 0
        return Route(k, "round_robin")


class Random(Policy):
    name = "random"
    summary = "a uniformly random node: the baseline that uses no information"
    params = StaticParams
    dispatcher = RandomDispatcher


class RoundRobin(Policy):
    name = "round_robin"
    summary = "the nodes in turn, from a random start per dispatcher"
    params = StaticParams
    dispatcher = RoundRobinDispatcher


POLICIES = (Random(), RoundRobin())
