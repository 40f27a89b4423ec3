"""The experiment spec: one TOML file drives predict, simulate, cluster and run (docs/design.md, principle 1).

``load_spec`` reads and validates a file. Every problem raises ``SpecError`` whose text is one line naming
the file, the key and what is wrong; nothing runs on a spec that did not validate. Every key is documented
in ``docs/spec.md``.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lbtestbed.model.distributions import SIZE_DISTRIBUTIONS, SizeDistribution, SpeedSpec
from lbtestbed.model.schedules import Antagonist, Entry, NodeSpeed, Ramp, Step, levels
from lbtestbed.model.utility import TableUtility, Utility, XLogUtility, first_concavity_violation

DISCIPLINES = ("pool", "ps", "fcfs")
POLICIES = (
    "random",
    "round_robin",
    "jsq",
    "power_of_d",
    "least_request",
    "jiq",
    "jlmu",
    "slta",
    "scheme1",
    "scheme2",
    "peak_ewma",
    "prequal",
)
TIE_BREAKS = ("random", "fastest", "slowest", "longest_idle", "fastest_idle")
UTILITY_POLICIES = ("jlmu", "slta")
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
#: keys every policy accepts: how many dispatchers run it and how the arrivals reach them
COMMON_POLICY_KEYS = ("dispatchers", "split")

# Policy keys each policy accepts beside ``name`` and COMMON_POLICY_KEYS; a key given to a policy that
# ignores it is an error, because a user who writes it expects it to act.
POLICY_KEYS: dict[str, tuple[str, ...]] = {
    "random": (),
    "round_robin": (),
    "jsq": ("tie_break", "view"),
    "power_of_d": ("d", "replace", "tie_break"),
    "least_request": ("d", "replace", "active_request_bias", "weights"),
    "peak_ewma": ("decay_time", "default_rtt"),
    "jiq": ("tie_break", "d"),
    "jlmu": ("rank_order", "view"),
    "slta": ("beta", "beta_scale", "rank_order", "view"),
    "scheme1": ("d",),
    "scheme2": ("d",),
    "prequal": (
        "r_probe",
        "r_remove",
        "pool_size",
        "max_age",
        "delta",
        "b_reuse",
        "q_rif",
        "rif_history",
        "latency_window",
    ),
}


#: message kinds each policy may send (``message_kinds`` gives those of one configuration), for the
#: protocol's accepted kinds and label sets
MESSAGE_KINDS: dict[str, tuple[str, ...]] = {
    "random": (),
    "round_robin": (),
    "least_request": (),
    "peak_ewma": (),
    "jsq": ("departure", "arrival"),
    "jlmu": ("departure", "arrival"),
    "power_of_d": ("probe", "probe_reply"),
    "scheme1": ("probe", "probe_reply"),
    "scheme2": ("probe", "probe_reply"),
    "jiq": ("idle_token", "token_probe", "token_count"),
    "slta": ("token_departure", "token_arrival", "token_epoch", "epoch"),
    "prequal": ("prequal_probe", "prequal_reply"),
}

#: what each dispatcher of several sees (docs/spec.md, "`view`"): the tasks it routed, or every task
VIEWS = ("local", "full")
#: least_request's node weights (docs/spec.md, "least_request"): all equal, each node's speed, each class's
WEIGHTS = ("equal", "speed", "class")


def message_kinds(policy: PolicySpec) -> tuple[str, ...]:
    """The kinds of state message ``policy`` sends as configured (a subset of MESSAGE_KINDS[name])."""
    kinds = MESSAGE_KINDS[policy.name]
    if policy.name in ("jsq", "jlmu"):
        full = policy.view == "full" and policy.dispatchers > 1
        return kinds if full else ("departure",)  # arrival notices only tell the other dispatchers
    if policy.name == "jiq":
        return kinds if policy.d != 1 else ("idle_token",)  # JIQ-SQ(d) probes the dispatchers first
    return kinds


class SpecError(ValueError):
    """A bad spec: ``str(err)`` is ``"<file>: <key>: <what is wrong>"``."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        text = f"{source}: {key}: {message}" if key else f"{source}: {message}"
        # one line whatever the file holds: a quoted TOML key may contain a newline
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))


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


@dataclass(frozen=True)
class PrequalParams:
    """Prequal's parameters, named as Wydrowski et al. 2024 (arXiv 2312.10172) name them (docs/spec.md,
    "`prequal`"): probes per query, probes removed per query, the pool's size m, its age limit (model
    seconds), delta and the reuse budget of Eq. 1 (None: derived), the RIF quantile and over how many recent
    replies it is taken, and how many recent latencies a node keeps for its estimate."""

    r_probe: float = 3.0
    r_remove: float = 1.0
    pool_size: int = 16
    max_age: float = 1.0
    delta: float = 1.0
    b_reuse: float | None = None
    q_rif: float = 2**-0.25
    rif_history: int = 16
    latency_window: int = 16


@dataclass(frozen=True)
class PolicySpec:
    name: str
    d: int | tuple[int, ...] | None = None
    replace: bool = False
    tie_break: str = "random"
    beta: float | None = None
    rank_order: str = "ij"
    dispatchers: int = 1  # K dispatchers side by side, each with its own state (docs/spec.md, "dispatchers")
    split: str = "random"  # how the arrivals are spread over them: SPLITS
    view: str = "local"  # jsq, jlmu, slta with several dispatchers: what each one's picture counts (VIEWS)
    # least_request as Envoy's LEAST_REQUEST: the nodes' weights (WEIGHTS) and the exponent of the active
    # requests in weight / (active + 1)^active_request_bias when the weights differ
    weights: str = "equal"
    active_request_bias: float = 1.0
    # peak_ewma as Finagle's PeakEwma (model seconds): the estimate's time constant, and tower's (Linkerd's)
    # starting estimate of a node never observed (None: Finagle's, 0 with a penalty while it has requests)
    decay_time: float = 10.0
    default_rtt: float | None = None
    prequal: PrequalParams | None = None  # prequal's parameters (None for the other policies)


@dataclass(frozen=True)
class RunSpec:
    warmup: float
    duration: float
    time_scale: float = 1.0
    batches: int = 20
    # time_scale = "auto": lbt run (and lbt cluster up) pick it for the machine before anything starts
    # (docs/run.md, "Before it starts"); time_scale then holds 1.0 until they do
    auto_time_scale: bool = False


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


@dataclass(frozen=True)
class Experiment:
    name: str
    seed: int
    classes: tuple[NodeClass, ...]
    workload: Workload
    policy: PolicySpec
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

    @cached_property
    def node_weights(self) -> tuple[float, ...]:
        """least_request's weight of every node (Envoy's load_balancing_weight, ``policy.weights``): its
        speed, its class's weight, or 1."""
        if self.policy.weights == "speed":
            return self.node_speeds
        if self.policy.weights == "class":
            return tuple(float(self.classes[c].weight or 0.0) for c in self.node_class)
        return (1.0,) * self.n

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


_STREAMS = {
    "speeds": 1,
    "arrivals": 2,
    "sizes": 3,
    "policy": 4,
    "network": 5,
    "nodes": 6,
    "split": 7,  # which dispatcher each arrival reaches (policy.split = "random")
    "dispatchers": 8,  # the simulator's dispatchers 1..K-1 (dispatcher 0 draws from "policy")
    "node_side": 9,  # node k's own draws (which dispatcher hears of it): one stream per node, see below
    "faults": 10,  # which tasks a failing node fails (fail faults): the simulator's, and each node host's
    "antagonists": 11,  # node k's antagonist: one stream per node (model.schedules.antagonist_random)
}


def draw_speeds(seed: int, classes: Sequence[NodeClass]) -> tuple[float, ...]:
    """Every node's speed, class by class, from the experiment's speed stream."""
    rng = np.random.default_rng(seed_sequence(seed, "speeds"))
    speeds: list[float] = []
    for c in classes:
        speeds.extend(c.speed.draw(rng, c.count))
    return tuple(speeds)


def seed_sequence(seed: int, stream: str, replication: int = 0) -> np.random.SeedSequence:
    """An independent random stream of an experiment: one per purpose and replication."""
    return np.random.SeedSequence([seed, replication, _STREAMS[stream]])


def seeded_random(seed: int, stream: str, replication: int = 0) -> random.Random:
    """A Python generator on one of an experiment's streams (policies draw scalars: faster than numpy)."""
    return random.Random(int(seed_sequence(seed, stream, replication).generate_state(1)[0]))


def node_random(seed: int, node: int, replication: int = 0) -> random.Random:
    """Node ``node``'s own stream for its policy half's draws. One per node, so that the simulator, the
    twin and a node process (which may host many nodes, in whatever order their events come) draw the
    same numbers for the same node events."""
    state = np.random.SeedSequence([seed, replication, _STREAMS["node_side"], node]).generate_state(1)
    return random.Random(int(state[0]))


# --------------------------------------------------------------------------------------------- parsing


class _Reader:
    """Typed access to a TOML table that reports the full key path of every problem."""

    def __init__(self, source: str, table: Mapping[str, Any], prefix: str) -> None:
        self.source, self.table, self.prefix = source, table, prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, message: str) -> SpecError:
        return SpecError(self.source, self.key(name), message)

    def check_keys(self, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for k in self.table:
            if k not in allowed:
                hint = f"; expected one of {', '.join(allowed)}" if allowed else ""
                raise self.fail(k, f"unknown key{hint}")

    def has(self, name: str) -> bool:
        return name in self.table

    def get(self, name: str, default: Any = None) -> Any:
        return self.table.get(name, default)

    def require(self, name: str) -> Any:
        if name not in self.table:
            raise SpecError(self.source, self.key(name), "missing")
        return self.table[name]

    def string(self, name: str, default: str | None = None, choices: Sequence[str] = ()) -> str:
        v = self.require(name) if default is None else self.get(name, default)
        if not isinstance(v, str):
            raise self.fail(name, f"must be a string, got {_show(v)}")
        if choices and v not in choices:
            raise self.fail(name, f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    def integer(
        self, name: str, default: int | None = None, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        v = self.require(name) if default is None else self.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(name, f"must be an integer, got {_show(v)}")
        if minimum is not None and v < minimum:
            raise self.fail(name, f"must be at least {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.fail(name, f"must be at most {maximum:,}, got {_show(v)}")
        return v

    def number(self, name: str, default: float | None = None, positive: bool = True) -> float:
        v = self.require(name) if default is None else self.get(name, default)
        return self.as_number(name, v, positive)

    def as_number(self, name: str, v: Any, positive: bool | None = True) -> float:
        """A finite number; positive=True: > 0, False: >= 0, None: any sign."""
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(name, f"must be a number, got {_show(v)}")
        if not math.isfinite(v):
            raise self.fail(name, f"must be finite, got {v}")
        if positive is None:
            return float(v)
        if positive and v <= 0:
            raise self.fail(name, f"must be positive, got {v}")
        if not positive and v < 0:
            raise self.fail(name, f"must not be negative, got {v}")
        return float(v)

    def boolean(self, name: str, default: bool) -> bool:
        v = self.get(name, default)
        if not isinstance(v, bool):
            raise self.fail(name, f"must be true or false, got {_show(v)}")
        return v

    def sub(self, name: str) -> _Reader:
        v = self.require(name)
        if not isinstance(v, Mapping):
            raise self.fail(name, f"must be a table, got {_show(v)}")
        return _Reader(self.source, v, self.key(name))


def _show(v: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{kind.get(type(v), type(v).__name__)} {v!r}" if not isinstance(v, dict | list) else kind[type(v)]


_FRACTION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?)\s*)?$")


def _parse_speed(r: _Reader) -> SpeedSpec:
    if not r.has("speed"):
        return SpeedSpec(value=Fraction(1))
    v = r.get("speed")
    if isinstance(v, Mapping):
        s = _Reader(r.source, v, r.key("speed"))
        s.check_keys(("dist", "low", "high"))
        s.string("dist", choices=("uniform",))
        low, high = s.number("low"), s.number("high")
        if high <= low:
            raise s.fail("high", f"must exceed low ({low:g}), got {high:g}")
        return SpeedSpec(low=low, high=high)
    if isinstance(v, str):
        m = _FRACTION.match(v)
        if not m:
            raise r.fail("speed", f'must be a number, a fraction like "2/3" or a table, got {v!r}')
        if m.group(2) is not None and Fraction(m.group(2)) == 0:
            raise r.fail("speed", f"the denominator of {v!r} is zero")
        value = Fraction(m.group(1)) / Fraction(m.group(2) or 1)
    else:
        # str() keeps the decimal the user wrote: 0.2 becomes exactly 1/5, so speed ratios tie exactly
        value = Fraction(str(r.as_number("speed", v)))
    if value <= 0:
        raise r.fail("speed", f"must be positive, got {v!r}")
    return SpeedSpec(value=value)


def _parse_utility(r: _Reader) -> Utility | None:
    if not r.has("utility"):
        return None
    u = r.sub("utility")
    kind = u.string("kind", choices=("xlog", "table"))
    if kind == "xlog":
        u.check_keys(("kind", "r"))
        return XLogUtility(u.number("r"))
    u.check_keys(("kind", "values"))
    values = u.require("values")
    if not isinstance(values, list) or len(values) < 2:
        raise u.fail("values", "must be an array of at least two numbers u(0), u(1), ...")
    nums = [u.as_number(f"values[{i}]", x, positive=None) for i, x in enumerate(values)]
    bad = first_concavity_violation(nums)
    if bad is not None:
        raise u.fail(
            "values", f"utility must be concave: u({bad + 1}) - u({bad}) exceeds u({bad}) - u({bad - 1})"
        )
    return TableUtility(nums)


def _parse_size(r: _Reader, name: str) -> SizeDistribution:
    v = r.get(name)
    if isinstance(v, int | float) and not isinstance(v, bool):
        return SizeDistribution.of("deterministic", r.as_number(name, v))
    t = r.sub(name)
    dist = t.string("dist", choices=SIZE_DISTRIBUTIONS)
    needs_scv = dist in ("hyperexponential", "lognormal")
    t.check_keys(("dist", "mean", "scv") if needs_scv else ("dist", "mean"))
    mean = t.number("mean")
    scv = t.number("scv") if needs_scv else None
    if dist == "hyperexponential" and scv is not None and scv < 1:
        raise t.fail("scv", f"a hyperexponential has scv >= 1, got {scv:g} (use lognormal below 1)")
    return SizeDistribution.of(dist, mean, scv)


def _parse_class(r: _Reader) -> NodeClass:
    r.check_keys(
        ("name", "count", "discipline", "speed", "utility", "speed_schedule", "antagonist", "weight")
    )
    return NodeClass(
        name=r.string("name"),
        count=r.integer("count", minimum=1, maximum=MAX_NODES),
        discipline=r.string("discipline", choices=DISCIPLINES),
        speed=_parse_speed(r),
        utility=_parse_utility(r),
        speed_schedule=_parse_schedule(r) or (),
        antagonist=_parse_antagonist(r),
        weight=r.number("weight") if r.has("weight") else None,
    )


def _parse_schedule(r: _Reader) -> tuple[Entry, ...] | None:
    """``speed_schedule``: steps {at, factor} and ramps {start, end, to, from, steps}, in time order."""
    if not r.has("speed_schedule"):
        return None
    raw = r.get("speed_schedule")
    if not isinstance(raw, list):
        raise r.fail("speed_schedule", "must be an array of steps {at, factor} and ramps {start, end, to}")
    entries: list[Entry] = []
    for j, v in enumerate(raw):
        if not isinstance(v, Mapping):
            raise r.fail(
                f"speed_schedule[{j}]", "must be a table: a step {at, factor} or a ramp {start, end, to}"
            )
        e = _Reader(r.source, v, r.key(f"speed_schedule[{j}]"))
        entry: Entry
        if e.has("at"):
            e.check_keys(("at", "factor"))
            entry = Step(e.number("at", positive=False), e.number("factor"))
        elif any(e.has(k) for k in ("start", "end", "from", "to", "steps")):
            e.check_keys(("start", "end", "from", "to", "steps"))
            start, end = e.number("start", positive=False), e.number("end")
            if end <= start:
                raise e.fail("end", f"must come after start ({start:g}), got {end:g}")
            frm = e.number("from") if e.has("from") else None
            entry = Ramp(start, end, e.number("to"), frm, e.integer("steps", default=10, minimum=1))
        else:
            raise e.fail("at", "missing: a step has at and factor, a ramp start, end and to")
        if entries and entry.begins < entries[-1].ends:
            key = "at" if isinstance(entry, Step) else "start"
            raise e.fail(
                key,
                f"must not come before the previous entry ends ({entries[-1].ends:g}), got {entry.begins:g}",
            )
        entries.append(entry)
    return tuple(entries)


def _parse_antagonist(r: _Reader) -> Antagonist | None:
    """``antagonist = {factor, mean_on, mean_off}``: an on/off process slowing each node it acts on."""
    if not r.has("antagonist"):
        return None
    a = r.sub("antagonist")
    a.check_keys(("factor", "mean_on", "mean_off"))
    return Antagonist(a.number("factor"), a.number("mean_on"), a.number("mean_off"))


def _parse_nodes(top: _Reader, n: int) -> tuple[NodeSpeed, ...]:
    """``[[nodes]]``: a node's own speed schedule and antagonist, each in place of its class's."""
    if not top.has("nodes"):
        return ()
    raw = top.get("nodes")
    if not isinstance(raw, list):
        raise top.fail("nodes", "must be an array of [[nodes]] tables")
    out: list[NodeSpeed] = []
    for i, v in enumerate(raw):
        if not isinstance(v, Mapping):
            raise top.fail(f"nodes[{i}]", "must be a table")
        r = _Reader(top.source, v, f"nodes[{i}]")
        r.check_keys(("node", "speed_schedule", "antagonist"))
        node = r.integer("node", minimum=0, maximum=n - 1)
        if any(o.node == node for o in out):
            raise r.fail("node", f"node {node} has another [[nodes]] table")
        if not r.has("speed_schedule") and not r.has("antagonist"):
            raise r.fail("speed_schedule", "missing: give speed_schedule, antagonist or both")
        out.append(NodeSpeed(node, _parse_schedule(r), _parse_antagonist(r)))
    return tuple(out)


def _check_speeds_over_time(top: _Reader, exp: Experiment) -> None:
    """Schedules within the run; antagonists' expected switches (and schedules' steps) within the limit."""
    end = exp.run.warmup + exp.run.duration
    horizon = exp.run.warmup + 2 * exp.run.duration
    owners: list[tuple[str, tuple[Entry, ...], Antagonist | None, int]] = [
        (f"classes[{i}]", c.speed_schedule, c.antagonist, c.count) for i, c in enumerate(exp.classes)
    ]
    owners += [(f"nodes[{i}]", o.schedule or (), o.antagonist, 1) for i, o in enumerate(exp.nodes)]
    changes = 0.0
    for where, schedule, antagonist, count in owners:
        for j, e in enumerate(schedule):
            if e.ends > end:
                key = f"{where}.speed_schedule[{j}].{'at' if isinstance(e, Step) else 'end'}"
                raise top.fail(key, f"must lie within the run (warmup + duration = {end:g}), got {e.ends:g}")
            changes += count * (1 if isinstance(e, Step) else e.steps + 1)
        if antagonist is not None:
            changes += count * (1 + 2 * horizon / (antagonist.mean_on + antagonist.mean_off))
            if changes > MAX_SPEED_CHANGES:
                raise top.fail(
                    f"{where}.antagonist",
                    f"about {changes:.3g} speed changes in all over warmup + 2 x duration = {horizon:g} "
                    f"model s (the run and its longest drain): at most {MAX_SPEED_CHANGES:.0e}; "
                    "lengthen mean_on and mean_off",
                )
        if changes > MAX_SPEED_CHANGES:
            raise top.fail(
                f"{where}.speed_schedule",
                f"{changes:.3g} speed changes in all: at most {MAX_SPEED_CHANGES:.0e}; use fewer ramp steps",
            )


def _parse_policy(r: _Reader, classes: Sequence[NodeClass], n: int) -> PolicySpec:
    name = r.string("name", choices=POLICIES)
    r.check_keys(("name", *COMMON_POLICY_KEYS, *POLICY_KEYS[name]))
    dispatchers = r.integer("dispatchers", default=1, minimum=1, maximum=MAX_DISPATCHERS)
    split = r.string("split", default="random", choices=SPLITS)
    view = r.string("view", default="local", choices=VIEWS)
    d: int | tuple[int, ...] | None = None
    if name == "jiq":
        d = r.integer("d", default=1, minimum=1)
        if d > dispatchers:
            raise r.fail(
                "d",
                f"JIQ-SQ(d): an idle node probes {d} distinct dispatchers but the spec runs {dispatchers} "
                "(policy.dispatchers)",
            )
        replace = False
    elif name in ("power_of_d", "least_request"):
        d = r.integer("d", default=2, minimum=1)
        replace = r.boolean("replace", False)
        if d > n and not replace:
            raise r.fail("d", f"samples {d} distinct nodes but the spec has only {n}")
    elif name in ("scheme1", "scheme2"):
        raw = r.get("d", [2] * len(classes))
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = [raw] * len(classes)
        if not isinstance(raw, list) or len(raw) != len(classes):
            raise r.fail("d", f"must be an array with one probe count per class ({len(classes)} classes)")
        for i, (dj, c) in enumerate(zip(raw, classes, strict=True)):
            if isinstance(dj, bool) or not isinstance(dj, int) or dj < 1:
                raise r.fail(f"d[{i}]", f"must be a positive integer, got {_show(dj)}")
            if dj > c.count:
                raise r.fail(
                    f"d[{i}]", f"samples {dj} distinct nodes but class {c.name!r} has only {c.count}"
                )
        d = tuple(raw)
        replace = False
    else:
        replace = False
    tie_break = r.string("tie_break", default="random", choices=TIE_BREAKS)
    if name == "power_of_d" and tie_break not in ("random", "fastest", "slowest"):
        raise r.fail("tie_break", "power_of_d breaks ties among sampled nodes by random, fastest or slowest")
    beta = None
    if name == "slta":
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
    rank_order = r.string("rank_order", default="ij", choices=("ij", "ji"))
    weights = r.string("weights", default="equal", choices=WEIGHTS)
    for i, c in enumerate(classes):
        if c.weight is None and weights == "class":
            raise r.fail(
                "weights", f'"class" takes each class\'s weight, and classes[{i}] ({c.name!r}) has none'
            )
        if c.weight is not None and weights != "class":
            raise SpecError(
                r.source,
                f"classes[{i}].weight",
                'only least_request with weights = "class" reads a class weight '
                "(Envoy's load_balancing_weight)",
            )
    decay_time = r.number("decay_time", 10.0)
    default_rtt = r.number("default_rtt") if r.has("default_rtt") else None
    prequal = _parse_prequal(r, n) if name == "prequal" else None
    return PolicySpec(
        name=name,
        d=d,
        replace=replace,
        tie_break=tie_break,
        beta=beta,
        rank_order=rank_order,
        dispatchers=dispatchers,
        split=split,
        view=view,
        weights=weights,
        active_request_bias=r.number("active_request_bias", 1.0, positive=False),
        decay_time=decay_time,
        default_rtt=default_rtt,
        prequal=prequal,
    )


def _parse_prequal(r: _Reader, n: int) -> PrequalParams:
    """Prequal's keys (docs/spec.md, "`prequal`"), each with the paper's default."""
    dflt = PrequalParams()
    r_probe = r.number("r_probe", default=dflt.r_probe)
    if r_probe > n:
        raise r.fail("r_probe", f"probes {r_probe:g} distinct nodes per query but the spec has only {n}")
    q_rif = r.number("q_rif", default=dflt.q_rif, positive=False)
    if q_rif > 1:
        raise r.fail("q_rif", f"is a quantile: from 0 to 1, got {q_rif:g}")
    b_reuse = r.number("b_reuse") if r.has("b_reuse") else None
    if b_reuse is not None and b_reuse < 1:
        raise r.fail("b_reuse", f"a probe serves at least one query: must be at least 1, got {b_reuse:g}")
    return PrequalParams(
        r_probe=r_probe,
        r_remove=r.number("r_remove", default=dflt.r_remove, positive=False),
        pool_size=r.integer("pool_size", default=dflt.pool_size, minimum=1, maximum=MAX_NODES),
        max_age=r.number("max_age", default=dflt.max_age),
        delta=r.number("delta", default=dflt.delta, positive=False),
        b_reuse=b_reuse,
        q_rif=q_rif,
        rif_history=r.integer("rif_history", default=dflt.rif_history, minimum=1, maximum=100_000),
        latency_window=r.integer("latency_window", default=dflt.latency_window, minimum=1, maximum=100_000),
    )


def parse_spec(data: Mapping[str, Any], source: str = "<spec>") -> Experiment:
    """Validate a decoded TOML document and build the experiment."""
    top = _Reader(source, data, "")
    top.check_keys(
        (
            "name",
            "description",
            "seed",
            "classes",
            "workload",
            "policy",
            "run",
            "network",
            "faults",
            "health",
            "nodes",
        )
    )
    name = top.string("name")
    if top.has("description"):
        top.string("description")
    seed = top.integer("seed", default=0, minimum=0)

    raw_classes = top.require("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        raise top.fail("classes", "must be an array of one or more [[classes]] tables")
    classes: list[NodeClass] = []
    for i, c in enumerate(raw_classes):
        if not isinstance(c, Mapping):
            raise top.fail(f"classes[{i}]", "must be a table")
        classes.append(_parse_class(_Reader(source, c, f"classes[{i}]")))
    names = [c.name for c in classes]
    for i, nm in enumerate(names):
        if nm in names[:i]:
            raise top.fail(f"classes[{i}].name", f"duplicate class name {nm!r}")
    n = sum(c.count for c in classes)
    if n > MAX_NODES:
        raise top.fail("classes", f"{n:,} nodes in all: at most {MAX_NODES:,} (docs/spec.md, Limits)")

    w = top.sub("workload")
    w.check_keys(("load", "arrival_rate", "beta", "service"))
    service = _parse_size(w, "service") if w.has("service") else SizeDistribution.of("exponential", 1.0)
    if sum(w.has(k) for k in ("load", "arrival_rate", "beta")) != 1:
        raise w.fail(
            "load",
            "give exactly one of load (per node), arrival_rate (total per second) and beta (the Halfin-Whitt "
            "spare capacity)",
        )
    beta = None
    if w.has("load"):
        load = w.number("load")
        rate = load * n / service.mean
    elif w.has("arrival_rate"):
        rate = w.number("arrival_rate")
        load = rate * service.mean / n
    else:
        beta = w.number("beta")
        rate = _halfin_whitt_rate(w, seed, classes, service, beta)
        load = rate * service.mean / n
    workload = Workload(arrival_rate=rate, load=load, service=service, beta=beta)

    p = top.sub("policy")
    policy = _parse_policy(p, classes, n)
    if policy.name in UTILITY_POLICIES:
        for i, c in enumerate(classes):
            if c.discipline != "pool":
                raise top.fail(
                    f"classes[{i}].discipline", f"{policy.name} needs pool nodes, got {c.discipline!r}"
                )
            if c.utility is None:
                raise top.fail(f"classes[{i}].utility", f"{policy.name} needs a utility for every pool class")

    for i, c in enumerate(classes):
        if c.utility is not None and c.discipline != "pool":
            raise top.fail(f"classes[{i}].utility", f"utilities belong to pool classes, not {c.discipline!r}")

    rr = top.sub("run")
    rr.check_keys(("warmup", "duration", "time_scale", "batches"))
    duration = rr.number("duration")
    auto = rr.get("time_scale") == "auto"
    if isinstance(rr.get("time_scale"), str) and not auto:
        raise rr.fail("time_scale", f'must be a positive number or "auto", got {_show(rr.get("time_scale"))}')
    run = RunSpec(
        warmup=rr.number("warmup", default=duration / 10, positive=False),
        duration=duration,
        time_scale=1.0 if auto else rr.number("time_scale", default=1.0),
        batches=rr.integer("batches", default=20, minimum=2),
        auto_time_scale=auto,
    )
    _check_size(rr, n, rate, run)

    network = NetworkSpec()
    if top.has("network"):
        nw = top.sub("network")
        nw.check_keys(("delay", "forward_tasks"))
        delay = None
        if nw.has("delay"):
            v = nw.get("delay")
            zero = isinstance(v, int | float) and not isinstance(v, bool) and v == 0
            delay = None if zero else _parse_size(nw, "delay")
        network = NetworkSpec(delay=delay, forward_tasks=nw.boolean("forward_tasks", False))

    health = HealthSpec()
    if top.has("health"):
        h = top.sub("health")
        h.check_keys(
            (
                "heartbeat",
                "timeout",
                "max_ejection",
                "consecutive_failures",
                "outlier_interval",
                "outlier_min_tasks",
                "slow_share",
                "ejection_time",
            )
        )
        max_ejection = h.number("max_ejection", 0.5, positive=False)
        if max_ejection > 1:
            raise h.fail("max_ejection", f"must lie in [0, 1], got {max_ejection:g}")
        slow_share = h.number("slow_share", 0.5, positive=False)
        if slow_share >= 1:
            raise h.fail(
                "slow_share", f"must lie in [0, 1) (0: no ejection for slowness), got {slow_share:g}"
            )
        health = HealthSpec(
            h.number("heartbeat", 0.2),
            h.number("timeout", 1.0),
            max_ejection,
            h.integer("consecutive_failures", default=5, minimum=1),
            h.number("outlier_interval", 1.0),
            h.integer("outlier_min_tasks", default=5, minimum=1),
            slow_share,
            h.number("ejection_time", 5.0),
        )
    faults = _parse_faults(top, policy, n, run)

    exp = Experiment(name, seed, tuple(classes), workload, policy, run, network, source, data, faults, health)
    exp = dataclasses.replace(exp, nodes=_parse_nodes(top, n))
    _check_speeds_over_time(top, exp)
    _check_stability(exp, top)
    return exp


def _halfin_whitt_rate(
    w: _Reader, seed: int, classes: Sequence[NodeClass], service: SizeDistribution, beta: float
) -> float:
    """lambda = sum_k mu_k - beta sqrt(n) for the drawn speeds, mu_k = s_k / mean work (docs/theory.md,
    "The heterogeneous-JSQ model")."""
    if any(c.discipline == "pool" for c in classes):
        raise w.fail("beta", "beta sets the spare capacity of fcfs or ps nodes; pools have no capacity")
    speeds = draw_speeds(seed, classes)
    capacity = sum(speeds) / service.mean
    rate = capacity - beta * math.sqrt(len(speeds))
    if rate <= 0:
        raise w.fail(
            "beta",
            f"beta = {beta:g} leaves no arrivals: beta sqrt(n) = {beta * math.sqrt(len(speeds)):.4g} is at "
            f"least the {capacity:.4g} tasks per second the drawn speeds serve",
        )
    return rate


def _check_size(rr: _Reader, n: int, rate: float, run: RunSpec) -> None:
    """Refuse a run longer or a simulation larger than any process can take (docs/spec.md, Limits)."""
    arrivals = rate * (run.warmup + run.duration)
    if arrivals > MAX_ARRIVALS:
        longest = MAX_ARRIVALS / rate
        raise rr.fail(
            "duration" if run.duration >= run.warmup else "warmup",
            f"warmup + duration = {run.warmup + run.duration:g} model s brings {arrivals:.3g} tasks at "
            f"{rate:g} per model s: at most {MAX_ARRIVALS:.0e} ({longest:.4g} model s)",
        )
    need = n * NODE_BYTES + rate * run.duration * MEASURED_TASK_BYTES
    if need > MAX_PROCESS_BYTES:
        raise rr.fail(
            "duration",
            f"the simulation would hold {need / 2**30:.3g} GiB ({n:,} nodes, {rate * run.duration:.3g} "
            f"measured tasks): at most {MAX_PROCESS_BYTES / 2**30:g} GiB per process",
        )


def sent_tasks_problem(exp: Experiment, model_seconds: float, what: str = "the load") -> str | None:
    """Why a load generator cannot hold ``model_seconds`` of the spec's arrivals (the schedule and a record
    of each answer), or None; for ``lbt load`` and ``lbt run`` before anything starts."""
    tasks = exp.workload.arrival_rate * model_seconds
    need = tasks * SENT_TASK_BYTES
    if need <= MAX_PROCESS_BYTES:
        return None
    most = MAX_PROCESS_BYTES / SENT_TASK_BYTES / exp.workload.arrival_rate
    return (
        f"{exp.source}: {what} of {model_seconds:g} model s sends {tasks:.3g} tasks, which the generator "
        f"would hold in {need / 2**30:.3g} GiB: at most {MAX_PROCESS_BYTES / 2**30:g} GiB per process "
        f"({most:.4g} model s at this rate)"
    )


def _parse_faults(top: _Reader, spec: PolicySpec, n: int, run: RunSpec) -> tuple[Fault, ...]:
    if not top.has("faults"):
        return ()
    raw = top.get("faults")
    if not isinstance(raw, list):
        raise top.fail("faults", "must be an array of [[faults]] tables")
    policy = spec.name
    one_way = tuple(k for k in message_kinds(spec) if k not in ("probe", "probe_reply"))
    end = run.warmup + run.duration
    faults: list[Fault] = []
    for i, v in enumerate(raw):
        if not isinstance(v, Mapping):
            raise top.fail(f"faults[{i}]", "must be a table")
        f = _Reader(top.source, v, f"faults[{i}]")
        kind = f.string("kind", choices=FAULT_KINDS)
        keys = {
            "kill": ("node",),
            "pause": ("node",),
            "drop": ("fraction", "messages"),
            "duplicate": ("fraction", "messages"),
            "delay": ("delay", "messages"),
            "restart_dispatcher": ("dispatcher",),
            "slow": ("node", "speed"),
            "fail": ("node", "fraction"),
        }[kind]
        f.check_keys(("kind", "at", "until", "settle", *keys))
        at, until = f.number("at", positive=False), f.number("until")
        # a restarted node starts empty, and the warm-up is what the spec allows to reach equilibrium
        # from empty; a fault that builds a backlog (a long pause) may need more
        settle = f.number("settle", run.warmup, positive=False)
        if until <= at:
            raise f.fail("until", f"must come after at ({at:g}), got {until:g}")
        if until > end:
            raise f.fail("until", f"must lie within the run (warmup + duration = {end:g}), got {until:g}")
        fault = Fault(kind, at, until)
        if kind in PROCESS_FAULTS:
            fault = Fault(kind, at, until, node=f.integer("node", minimum=0, maximum=n - 1))
        elif kind == "restart_dispatcher":
            fault = Fault(kind, at, until, dispatcher=f.integer("dispatcher", default=0, minimum=0))
        elif kind in GRAY_FAULTS:
            node = f.integer("node", minimum=0, maximum=n - 1)
            for j, other in enumerate(faults):
                if other.kind == kind and other.node == node and at < other.until and other.at < until:
                    raise f.fail("at", f"overlaps faults[{j}], another {kind} fault of node {node}")
            if kind == "slow":
                speed = f.number("speed")
                if speed >= 1:
                    raise f.fail(
                        "speed", f"a slow node serves at a fraction of its speed: in (0, 1), got {speed:g}"
                    )
                fault = Fault(kind, at, until, node=node, speed=speed)
            else:
                fraction = f.number("fraction")
                if fraction > 1:
                    raise f.fail("fraction", f"must lie in (0, 1], got {fraction:g}")
                fault = Fault(kind, at, until, node=node, fraction=fraction)
        else:
            if not one_way:
                raise f.fail("kind", f"{policy} sends no state messages to {kind}")
            kinds = f.get("messages", list(one_way))
            if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
                raise f.fail("messages", "must be a non-empty array of message kinds")
            for j, k in enumerate(kinds):
                if k not in one_way:
                    raise f.fail(
                        f"messages[{j}]",
                        f"{policy} sends no {k!r} messages that a fault can hit (one-way kinds: "
                        f"{', '.join(one_way)}; probes are answered on the same connection)",
                    )
            fraction = 1.0
            if kind != "delay":
                fraction = f.number("fraction")
                if fraction > 1:
                    raise f.fail("fraction", f"must lie in (0, 1], got {fraction:g}")
            delay = _parse_size(f, "delay") if kind == "delay" else None
            fault = Fault(kind, at, until, fraction=fraction, messages=tuple(kinds), delay=delay)
        faults.append(dataclasses.replace(fault, settle=settle))
    return tuple(faults)


def _check_stability(exp: Experiment, top: _Reader) -> None:
    """Refuse loads that no policy (or the chosen static policy) can carry on ps/fcfs nodes."""
    cls = exp.node_class
    queued = [k for k in range(exp.n) if exp.classes[cls[k]].discipline != "pool"]
    if not queued:
        return
    varies = exp.nodes or any(c.speed_schedule or c.antagonist for c in exp.classes)
    # with schedules and antagonists: the speeds they leave in the long run (docs/spec.md, Speed over time)
    speeds = [exp.long_run_speed(k) for k in range(exp.n)] if varies else exp.node_speeds
    capacity = sum(speeds)
    over_time = " in the long run (schedules' last levels, antagonists' mean factors)" if varies else ""
    # with a pool (infinite capacity) somewhere, some policy can always keep the system stable
    if len(queued) == exp.n and exp.work_rate >= capacity:
        raise top.fail(
            "workload",
            f"unstable: work arrives at {exp.work_rate:.4g}/s but the nodes serve at most "
            f"{capacity:.4g}/s{over_time} (load must stay below the mean speed {capacity / exp.n:.4g})",
        )
    if exp.policy.name in ("random", "round_robin"):
        # static routing gives every node 1/n of the work, whatever the other nodes are
        slowest = min(speeds[k] for k in queued)
        if exp.work_rate / exp.n >= slowest:
            raise top.fail(
                "workload",
                f"unstable under {exp.policy.name}: each node gets "
                f"{exp.work_rate / exp.n:.4g} work/s but the slowest fcfs/ps node serves {slowest:.4g}/s"
                f"{over_time}",
            )


# ------------------------------------------------------------------------------------------- overrides


def apply_overrides(data: dict[str, Any], overrides: Iterable[str], source: str) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (``classes[0].count=10``, ``policy.name=jiq``) to a document."""
    for item in overrides:
        if "=" not in item:
            raise SpecError(source, item, "an override reads key.path=value")
        path, _, text = item.partition("=")
        if not [p for p in re.split(r"\.|\[(\d+)\]", path.strip()) if p]:
            raise SpecError(source, item, "an override needs a key path before '='")
        try:
            value: Any = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text  # bare words are strings: policy.name=jiq
        parts = [p for p in re.split(r"\.|\[(\d+)\]", path.strip()) if p]
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            key: Any = int(part) if part.isdigit() else part
            if isinstance(node, list):
                if not isinstance(key, int) or key >= len(node):
                    raise SpecError(source, path, f"no list element {part}")
            elif isinstance(node, dict):
                if not last and key not in node:
                    node[key] = {}
            else:
                raise SpecError(source, path, f"{'.'.join(parts[:i])} is not a table")
            if last:
                node[key] = value
            else:
                node = node[key]
        if parts == ["policy", "name"] and isinstance(value, str) and value in POLICY_KEYS:
            # switching policy drops the old one's parameters that the new one does not take, so that
            # a sweep over policies needs no per-policy file; the new policy's own defaults apply
            table = data["policy"]
            keep = ("name", *COMMON_POLICY_KEYS, *POLICY_KEYS[value])
            for k in [k for k in table if k not in keep]:
                del table[k]
    return data


def load_spec(path: str | Path, overrides: Iterable[str] = ()) -> Experiment:
    """Read, override and validate a spec file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(source, "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(source, "", f"not UTF-8 text: {e.reason} at byte {e.start}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, "", f"not valid TOML: {e}") from None
    overrides = tuple(overrides)
    exp = parse_spec(apply_overrides(data, overrides, source), source)
    return dataclasses.replace(exp, overrides=overrides)
