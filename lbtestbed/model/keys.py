"""The keys of a spec, table by table, declared once: what the reader accepts and how it reads each.

``model.reading`` checks every table's keys against the table declared here and reads its plain keys
through their ``Key`` (``Key.read``: the same ``TableReader`` call, so the same one-line errors), and
``model.schema`` makes the spec's JSON Schema (``lbt spec schema``) of the same declarations, so that the
two cannot drift apart. What a declaration cannot say (one key against another, a sum over classes,
stability) stays in the reader's code; ``tests/test_spec_schema.py`` checks, key by key, that the reader
refuses what the schema refuses. Every key is documented in ``docs/spec.md``.

A key's ``kind`` is a plain type (string, integer, number, boolean) or the name of a shape of several
(``SHAPES``: a work size, a speed, a utility, a schedule, ...) that ``model.schema`` describes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lbtestbed.model.distributions import SIZE_DISTRIBUTIONS
from lbtestbed.model.experiment import (
    DISCIPLINES,
    FAULT_KINDS,
    MAX_DISPATCHERS,
    MAX_NODES,
    SPLITS,
    VIEWS,
    HealthSpec,
)
from lbtestbed.model.reader import TableReader

PLAIN = ("string", "integer", "number", "boolean")
#: the kinds made of several values, each described in model.schema
SHAPES = (
    "size",  # a work size or delay: a number (deterministic) or {dist, mean[, scv]}
    "speed",  # a number, a fraction "2/3", or {dist = "uniform", low, high}
    "utility",  # {kind = "xlog", r} or {kind = "table", values}
    "schedule",  # an array of steps {at, factor} and ramps {start, end, [from,] to[, steps]}
    "antagonist",  # {factor, mean_on, mean_off}
    "classes",  # an array of one or more class tables
    "table",  # a table of its own (workload, policy, run, network, health)
    "faults",  # an array of fault tables
    "nodes",  # an array of per-node tables
    "messages",  # a non-empty array of message kinds
    "time_scale",  # a positive number or "auto"
    "tolerance",  # a share in (0, 1] or "off"
    "delay",  # a work size, or 0 for none
    "probes",  # scheme1/2's d: a positive integer, or an array of one per class
)
_UNSET: Any = object()


@dataclass(frozen=True)
class Key:
    """One key of a table: its kind, whether it must be given, its default and the values it takes."""

    name: str
    kind: str
    doc: str
    required: bool = False
    default: Any = None  # what the reader takes when the key is absent (None: no default)
    choices: tuple[str, ...] = ()  # strings: the values allowed
    minimum: int | None = None  # integers: the least allowed
    maximum: float | None = None  # integers and numbers: the largest allowed
    positive: bool | None = True  # numbers: True > 0, False >= 0, None any sign
    below: float | None = None  # numbers: every value must lie below it

    def read(self, r: TableReader, default: Any = _UNSET, maximum: int | None = None) -> Any:
        """The key's value from table ``r`` through the ``TableReader`` call of its kind (``default``,
        ``maximum``: what only the document knows, the run's warm-up, the count of nodes)."""
        d = self.default if default is _UNSET else default
        if self.kind == "string":
            return r.string(self.name, d, self.choices)
        if self.kind == "integer":
            top = self.maximum if maximum is None else maximum
            return r.integer(self.name, d, self.minimum, None if top is None else int(top))
        if self.kind == "number":
            return r.number(self.name, d, self.positive)
        if self.kind == "boolean":
            return r.boolean(self.name, d)
        raise TypeError(f"{self.name}: a {self.kind} is read by its own code (model.reading)")


@dataclass(frozen=True)
class Table:
    """A table of the spec (``path`` as errors name it: ``classes[]``, ``run``) and its keys in the order
    ``docs/spec.md`` lists them."""

    path: str
    keys: tuple[Key, ...]
    doc: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys)

    def __getitem__(self, name: str) -> Key:
        return next(k for k in self.keys if k.name == name)

    def only(self, *names: str) -> tuple[str, ...]:
        """The names given, each checked to be a key of the table (what one variant of it accepts)."""
        for name in names:
            self[name]
        return names


def _num(name: str, doc: str, **kw: Any) -> Key:
    return Key(name, "number", doc, **kw)


TOP = Table(
    "",
    (
        Key("name", "string", "the experiment's name: reports, plots and metrics labels", required=True),
        Key("description", "string", "free text"),
        Key("seed", "integer", "seed of every random stream", default=0, minimum=0),
        Key("classes", "classes", "the node classes ([[classes]])", required=True),
        Key("workload", "table", "arrivals and work sizes", required=True),
        Key("policy", "table", "the load-balancing policy and its parameters", required=True),
        Key("run", "table", "lengths, batches, time scale", required=True),
        Key("network", "table", "delays the simulator adds to messages"),
        Key("faults", "faults", "faults lbt run injects ([[faults]], docs/faults.md)"),
        Key("health", "table", "how dispatchers watch the nodes (wall seconds)"),
        Key("nodes", "nodes", "one node's own speed schedule or antagonist ([[nodes]])"),
    ),
)

CLASS = Table(
    "classes[]",
    (
        Key("name", "string", "the class's name", required=True),
        Key("count", "integer", "nodes of the class", required=True, minimum=1, maximum=MAX_NODES),
        Key("discipline", "string", "pool, ps or fcfs", required=True, choices=DISCIPLINES),
        Key("speed", "speed", 'work per second: a number, a fraction "2/3" or {dist = "uniform", low, high}'),
        Key("utility", "utility", 'pools: u(x), {kind = "xlog", r} or {kind = "table", values}'),
        Key("speed_schedule", "schedule", "the class's speed over time: steps and ramps"),
        Key("antagonist", "antagonist", "an on/off process slowing each node of the class"),
        _num("weight", 'least_request with weights = "class": the nodes\' weight'),
    ),
)

SPEED_RANGE = Table(
    "classes[].speed",
    (
        Key("dist", "string", "speeds drawn per node", required=True, choices=("uniform",)),
        _num("low", "least speed", required=True),
        _num("high", "largest speed (above low)", required=True),
    ),
)

UTILITY = Table(
    "classes[].utility",
    (
        Key(
            "kind",
            "string",
            "xlog: u(x) = x ln(r / x); table: u(0), u(1), ...",
            True,
            choices=("xlog", "table"),
        ),
        _num("r", "xlog's r", required=True),
        Key("values", "array", "table: u(0), u(1), ... (concave, at least two)", required=True),
    ),
)

STEP = Table(
    "classes[].speed_schedule[]",
    (
        _num("at", "model time of the step", required=True, positive=False),
        _num("factor", "the speed's factor from then on", required=True),
    ),
)

RAMP = Table(
    "classes[].speed_schedule[]",
    (
        _num("start", "model time the ramp starts", required=True, positive=False),
        _num("end", "model time it ends (after start)", required=True),
        _num("from", "the factor at start (default: the factor in force)"),
        _num("to", "the factor at end", required=True),
        Key("steps", "integer", "steps of the ramp", default=10, minimum=1),
    ),
)

ANTAGONIST = Table(
    "classes[].antagonist",
    (
        _num("factor", "the speed's factor while it is on", required=True),
        _num("mean_on", "mean model seconds on", required=True),
        _num("mean_off", "mean model seconds off", required=True),
    ),
)

SIZE = Table(
    "workload.service",
    (
        Key("dist", "string", "the distribution", required=True, choices=SIZE_DISTRIBUTIONS),
        _num("mean", "its mean", required=True),
        _num(
            "scv", "squared coefficient of variation (hyperexponential: at least 1; lognormal)", required=True
        ),
    ),
)
#: the distributions that take an scv
WITH_SCV = ("hyperexponential", "lognormal")

WORKLOAD = Table(
    "workload",
    (
        _num("load", "offered load per node (exactly one of load, arrival_rate and beta)"),
        _num("arrival_rate", "total arrivals per model second"),
        _num("beta", "Halfin-Whitt spare capacity: arrival rate = capacity - beta sqrt(n)"),
        Key("service", "size", "work per task (default: exponential, mean 1)"),
    ),
)
#: exactly one of them sets the arrival rate
RATES = ("load", "arrival_rate", "beta")

POLICY = Table(
    "policy",
    (
        Key("name", "string", "the policy (docs/spec.md, Policies)", required=True),
        Key(
            "dispatchers",
            "integer",
            "dispatchers side by side",
            default=1,
            minimum=1,
            maximum=MAX_DISPATCHERS,
        ),
        Key(
            "split",
            "string",
            "how the arrivals are spread over the dispatchers",
            default="random",
            choices=SPLITS,
        ),
        Key(
            "view",
            "string",
            "what each dispatcher sees of the tasks (policies that take it)",
            default="local",
            choices=VIEWS,
        ),
    ),
)

RUN = Table(
    "run",
    (
        _num("warmup", "model seconds discarded first (default: duration / 10)", positive=False),
        _num("duration", "model seconds measured", required=True),
        Key(
            "time_scale",
            "time_scale",
            'wall seconds per model second, or "auto" (lbt run picks it)',
            default=1.0,
        ),
        Key("batches", "integer", "batches of the measured window", default=20, minimum=2),
        Key(
            "tolerance",
            "tolerance",
            'how far the emulation may move the numbers, a share in (0, 1], or "off"',
            default=0.05,
        ),
    ),
)

NETWORK = Table(
    "network",
    (
        Key("delay", "delay", "every state message's delay (a work size; 0: none)"),
        Key("forward_tasks", "boolean", "tasks take the delay on their way to the node too", default=False),
    ),
)

_HEALTH_DOCS = {
    "heartbeat": ("wall seconds between health checks of every node process", {}),
    "timeout": ("wall seconds before an unanswered check marks a process down", {}),
    "max_ejection": ("the largest share of nodes ejected at once", {"positive": False, "maximum": 1.0}),
    "consecutive_failures": ("failures in a row that eject a node", {}),
    "outlier_interval": ("wall seconds over which a node's speed is judged", {}),
    "outlier_min_tasks": ("tasks a node needs in an interval to be judged", {}),
    "slow_share": (
        "the share of its speed below which a node is slow (0: none)",
        {"positive": False, "below": 1.0},
    ),
    "ejection_time": ("wall seconds of a first ejection", {}),
    "restart": ("lbt run starts a process again that died or hung outside the spec's faults", {}),
    "restart_after": ("wall seconds without an answer after which a supervised process is hung", {}),
}


def _health_key(f: str) -> Key:
    default = getattr(HealthSpec(), f)
    doc, bounds = _HEALTH_DOCS[f]
    if isinstance(default, bool):
        return Key(f, "boolean", doc, default=default)
    if isinstance(default, int):
        return Key(f, "integer", doc, default=default, minimum=1)
    return _num(f, doc, default=default, **bounds)


HEALTH = Table(
    "health",
    tuple(_health_key(f) for f in HealthSpec.__dataclass_fields__),
)

FAULT = Table(
    "faults[]",
    (
        Key("kind", "string", "what the fault does (docs/faults.md)", required=True, choices=FAULT_KINDS),
        _num("at", "model time it starts", required=True, positive=False),
        _num("until", "model time it ends (after at, within the run)", required=True),
        _num(
            "settle",
            "model seconds after until also left out of the comparison (default: run.warmup)",
            positive=False,
        ),
        Key(
            "node",
            "integer",
            "the node (kill, pause: its process; slow, fail: the node)",
            required=True,
            minimum=0,
        ),
        Key("dispatcher", "integer", "restart_dispatcher: which", default=0, minimum=0),
        _num(
            "fraction",
            "the share of messages (drop, duplicate) or tasks (fail) hit, in (0, 1]",
            required=True,
            maximum=1.0,
        ),
        _num("speed", "slow: the share of its speed a slow node keeps, in (0, 1)", required=True, below=1.0),
        Key("messages", "messages", "the one-way message kinds hit (default: all the policy sends)"),
        Key("delay", "size", "delay: the messages' delay", required=True),
    ),
)
#: the keys each kind of fault takes besides kind, at, until and settle
FAULT_KEYS = {
    "kill": ("node",),
    "pause": ("node",),
    "drop": ("fraction", "messages"),
    "duplicate": ("fraction", "messages"),
    "delay": ("delay", "messages"),
    "restart_dispatcher": ("dispatcher",),
    "slow": ("node", "speed"),
    "fail": ("node", "fraction"),
}
FAULT_COMMON = ("kind", "at", "until", "settle")

NODE = Table(
    "nodes[]",
    (
        Key("node", "integer", "the node (0 to n - 1)", required=True, minimum=0),
        Key("speed_schedule", "schedule", "its own speed schedule, in place of its class's"),
        Key("antagonist", "antagonist", "its own antagonist, in place of its class's"),
    ),
)

#: every table, for the schema and the tests
TABLES = (
    TOP,
    CLASS,
    SPEED_RANGE,
    UTILITY,
    STEP,
    RAMP,
    ANTAGONIST,
    SIZE,
    WORKLOAD,
    POLICY,
    RUN,
    NETWORK,
    HEALTH,
    FAULT,
    NODE,
)
