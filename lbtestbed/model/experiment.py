"""The experiment: what one spec file describes, as every part of the house reads it (docs/design.md,
principle 1).

``lbtestbed.spec`` reads a TOML file (and ``--set`` overrides) into an ``Experiment``; ``model.document``
writes one back as a complete document, which is how a cluster's processes receive it. The policy's own
parameters are its ``PolicyParams`` subclass, declared in its module of ``lbtestbed/policies/``: the model
names no policy. Every key is documented in ``docs/spec.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from lbtestbed.model.distributions import SizeDistribution, SpeedSpec
from lbtestbed.model.reader import TableReader
from lbtestbed.model.schedules import Antagonist, Entry, NodeSpeed, levels
from lbtestbed.model.streams import seed_sequence
from lbtestbed.model.utility import Utility

DISCIPLINES = ("pool", "ps", "fcfs")
# What a spec may ask for (docs/spec.md, "Limits"): checked when it is read, so that a spec that would
# exhaust a process's memory or run for days is one line and exit 2, never a MemoryError after seconds.
#: nodes in all: a process that holds every node (the simulator, a dispatcher) keeps 0.4 to 1.7 KB each
MAX_NODES = 1_000_000
#: expected arrivals over warm-up and measured window: beyond this a simulation alone takes hours
MAX_ARRIVALS = 10**9
#: memory one process may need for what the spec asks (measured costs below, rounded up)
MAX_PROCESS_BYTES = 4 * 2**30
#: bytes per node in the process that holds the most of them (the simulator: node model, policy state)
NODE_BYTES = 2048
#: bytes the simulator keeps per task of the measured window (its sojourn, by batch and by class)
MEASURED_TASK_BYTES = 48
#: bytes a load generator keeps per task it sends (the schedule, and the record of its answer)
SENT_TASK_BYTES = 640
#: timed speed changes (schedule steps, antagonist switches) expected over the run, in all: each is an event
#: of the simulator and an object every process holds (about 150 bytes)
MAX_SPEED_CHANGES = 2_000_000

#: how arrivals are spread over several dispatchers: each to a uniformly random one, or in turn
SPLITS = ("random", "round_robin")
#: dispatchers a spec may ask for: each is a process of its own on the cluster
MAX_DISPATCHERS = 64
#: the largest seed: the random streams take 64 bits
MAX_SEED = 2**64 - 1
#: the longest name of an experiment or a class: it labels every metric and every report
MAX_NAME = 100
#: the most batches a window may have: each is a row of every metric's table and a scrape of every process
MAX_BATCHES = 10_000
#: the longest run in model seconds: at 1e12 a float still resolves a millionth of a model second
MAX_MODEL_SECONDS = 1e12
#: keys every policy accepts: how many dispatchers run it and how the arrivals reach them
COMMON_POLICY_KEYS = ("dispatchers", "split")
#: what each dispatcher of several sees (docs/spec.md, "`view`"): the tasks it routed, or every task
VIEWS = ("local", "full")


@dataclass(frozen=True)
class NodeClass:
    name: str
    count: int
    discipline: str
    speed: SpeedSpec
    utility: Utility | None
    # the speed over time of each node of the class (model.schedules): a factor of its speed
    speed_schedule: tuple[Entry, ...] = ()
    antagonist: Antagonist | None = None
    # Envoy's load_balancing_weight of each node of the class (least_request with weights = "class")
    weight: float | None = None


@dataclass(frozen=True)
class Workload:
    arrival_rate: float  # total tasks per model second
    load: float  # offered load per node: arrival_rate * service.mean / n
    service: SizeDistribution
    beta: float | None = None  # Halfin-Whitt spare capacity: arrival_rate = sum(mu_k) - beta sqrt(n)
    #: the key the spec gave the rate by (load, arrival_rate or beta): a document written back gives the
    #: same, so that the experiment read from it is this one to the last bit
    given: str = "load"


@dataclass(frozen=True)
class PolicyParams:
    """The ``[policy]`` table: what every policy takes, extended by each policy's own parameters.

    Every policy declares a subclass in its module of ``lbtestbed/policies/`` (its ``Params``) with its own
    keys (``KEYS``: its field names, the spec's key names), their reading and checks (``read``, ``check``)
    and the state messages it sends as configured (``message_kinds``). The model and the spec reader see
    only this interface, so that no part outside the policy library knows a policy by its name.
    ``view`` is what each dispatcher of several sees of the tasks (VIEWS): its own, unless a policy that
    can share a picture (one that takes the ``view`` key) is told ``full``.
    """

    name: str = ""
    dispatchers: int = 1  # K dispatchers side by side, each with its own state (docs/spec.md, "dispatchers")
    split: str = "random"  # how the arrivals are spread over them: SPLITS
    view: str = "local"

    #: the policy's own keys beside name and COMMON_POLICY_KEYS, in the order docs/spec.md lists them
    KEYS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def read(cls, r: TableReader, common: Mapping[str, Any], classes: Sequence[NodeClass]) -> PolicyParams:
        """The parameters from the ``[policy]`` table ``r`` (whose keys are already checked against KEYS):
        ``common`` holds name, dispatchers and split as read; ``classes`` the spec's node classes."""
        return cls(**common)

    def message_kinds(self) -> tuple[str, ...]:
        """The kinds of state message the policy sends as configured (none here)."""
        return ()

    def reads_class_weights(self) -> bool:
        """Whether it reads the classes' ``weight`` (a weight given to any other policy is an error)."""
        return False

    def check(self, exp: Experiment, top: TableReader) -> None:
        """Refuse an experiment the policy cannot run (``top.fail``): checks that need more than its own
        table (node disciplines, utilities, speeds)."""

    def table(self) -> dict[str, Any]:
        """The ``[policy]`` table that reads back as these parameters (``model.document``)."""
        out: dict[str, Any] = {"name": self.name, "dispatchers": self.dispatchers, "split": self.split}
        for key in self.KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class RunSpec:
    warmup: float
    duration: float
    time_scale: float = 1.0
    batches: int = 20
    # time_scale = "auto": lbt run (and lbt cluster up) pick it for the machine before anything starts
    # (docs/run.md, "Before it starts"); time_scale then holds 1.0 until they do
    auto_time_scale: bool = False
    # how far the emulation's own delays may move the policy's numbers for the run to be representative of
    # the model (relative; probability points for the wait probability); None: not checked (docs/run.md,
    # "Two answers")
    tolerance: float | None = 0.05


@dataclass(frozen=True)
class NetworkSpec:
    delay: SizeDistribution | None = None  # one-way delay of every state message, model seconds
    forward_tasks: bool = False  # whether task forwarding is delayed too


FAULT_KINDS = ("kill", "pause", "drop", "duplicate", "delay", "restart_dispatcher", "slow", "fail")
#: faults on the node processes (the target is the process serving ``node``) and on state messages
PROCESS_FAULTS = ("kill", "pause")
MESSAGE_FAULTS = ("drop", "duplicate", "delay")
#: gray failures of one node: it answers, but serves at a fraction of its speed, or fails some of its tasks
GRAY_FAULTS = ("slow", "fail")


@dataclass(frozen=True)
class Fault:
    """One injected fault, active over model times [at, until) of the run (``docs/faults.md``)."""

    kind: str
    at: float
    until: float
    node: int = 0  # kill, pause: the node process serving this node (with every node it serves)
    dispatcher: int = 0  # restart_dispatcher
    fraction: float = 1.0  # drop, duplicate: the share of messages hit
    messages: tuple[str, ...] = ()  # drop, duplicate, delay: the kinds hit
    delay: SizeDistribution | None = None  # delay: the extra one-way delay, model seconds
    settle: float = 0.0  # model seconds after ``until`` that the comparison leaves out with the fault
    speed: float = 1.0  # slow: the node's speed during the fault, as a multiple of its own


@dataclass(frozen=True)
class HealthSpec:
    """How dispatchers watch the nodes, in wall seconds (a machine's responsiveness, not the model's)."""

    heartbeat: float = 0.2  # between two health checks of every node process
    timeout: float = 1.0  # a check unanswered this long marks the process down; also the resend age
    # the largest share of the nodes a dispatcher ejects by judgment (timeouts, outliers) at once
    max_ejection: float = 0.5
    # outlier detection (gray failures, dispatcher.outliers): failures in a row that eject a node, the
    # interval over which its service speed is judged, the tasks it needs in an interval, the share of its
    # speed below which it is slow, and the wall seconds of a first ejection
    consecutive_failures: int = 5
    outlier_interval: float = 1.0
    outlier_min_tasks: int = 5
    slow_share: float = 0.5
    ejection_time: float = 5.0
    # supervision by lbt run (experiment.watch): a process that dies outside the spec's faults is started
    # again at once, one that answers nothing for ``restart_after`` wall seconds is killed and started again
    restart: bool = False
    restart_after: float = 5.0


@dataclass(frozen=True)
class Experiment:
    name: str
    seed: int
    classes: tuple[NodeClass, ...]
    workload: Workload
    policy: PolicyParams
    run: RunSpec
    network: NetworkSpec = field(default_factory=NetworkSpec)
    source: str = "<spec>"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    faults: tuple[Fault, ...] = ()
    health: HealthSpec = field(default_factory=HealthSpec)
    #: the ``--set`` overrides applied to the file at ``source``: a cluster's processes read the same
    #: experiment from the two (``load_spec(source, overrides)``)
    overrides: tuple[str, ...] = field(default=(), compare=False)
    #: single nodes' own speed schedules and antagonists (``[[nodes]]``), in place of their class's
    nodes: tuple[NodeSpeed, ...] = ()

    @property
    def n(self) -> int:
        """Total number of nodes."""
        return sum(c.count for c in self.classes)

    @cached_property
    def node_class(self) -> tuple[int, ...]:
        """Class index of every node; nodes are numbered class by class in spec order."""
        return tuple(i for i, c in enumerate(self.classes) for _ in range(c.count))

    @cached_property
    def node_speeds(self) -> tuple[float, ...]:
        """Speed of every node, drawn once per experiment from its seed."""
        return draw_speeds(self.seed, self.classes)

    @property
    def work_rate(self) -> float:
        """Work arriving per model second."""
        return self.workload.arrival_rate * self.workload.service.mean

    def speed_over_time(self, node: int) -> tuple[tuple[Entry, ...], Antagonist | None]:
        """Node ``node``'s speed schedule and antagonist: its own (``[[nodes]]``), key by key, else its
        class's."""
        c = self.classes[self.node_class[node]]
        schedule, antagonist = c.speed_schedule, c.antagonist
        for own in self.nodes:
            if own.node == node:
                schedule = own.schedule if own.schedule is not None else schedule
                antagonist = own.antagonist if own.antagonist is not None else antagonist
        return schedule, antagonist

    def long_run_speed(self, node: int) -> float:
        """Node ``node``'s mean speed in the long run: its speed x its schedule's last level x its
        antagonist's mean factor (docs/spec.md, "Speed over time")."""
        schedule, antagonist = self.speed_over_time(node)
        steps = levels(schedule)
        factor = (steps[-1][1] if steps else 1.0) * (antagonist.mean_factor if antagonist else 1.0)
        return self.node_speeds[node] * factor


def draw_speeds(seed: int, classes: Sequence[NodeClass]) -> tuple[float, ...]:
    """Every node's speed, class by class, from the experiment's speed stream."""
    rng = np.random.default_rng(seed_sequence(seed, "speeds"))
    speeds: list[float] = []
    for c in classes:
        speeds.extend(c.speed.draw(rng, c.count))
    return tuple(speeds)
