"""Hypothesis strategies for tests/test_fuzz.py: broken experiment specs and hand-built state messages.

The spec strategies start from real documents (files of ``examples/`` and one document that uses the keys
the examples leave out) and apply one fault each, so that the key at fault is known: a value of a type that
docs/spec.md does not allow, a value out of its documented range, a required key removed, an unknown key
added, or text that is no longer TOML. The types and ranges below are transcribed from docs/spec.md, not read
from lbtestbed/spec.py and lbtestbed/model/reading.py.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = (
    "jiq.toml",
    "slta_two_classes.toml",
    "scheme1_fig3.toml",
    "jsq_hetero_random.toml",
    "sparse_feedback.toml",
)

#: pools with a table utility, a network delay table and every optional run key: what the examples omit
EXTRA_SPEC: dict[str, Any] = {
    "name": "fuzz-extra",
    "description": "keys the examples do not use",
    "seed": 3,
    "classes": [
        {
            "name": "p",
            "count": 3,
            "discipline": "pool",
            "utility": {"kind": "table", "values": [0, 2, 3, 3.5]},
            "speed_schedule": [
                {"at": 2.0, "factor": 0.5},
                {"start": 3.0, "end": 6.0, "from": 0.5, "to": 2.0, "steps": 3},
            ],
        },
        {
            "name": "q",
            "count": 2,
            "discipline": "pool",
            "speed": 1.5,
            "utility": {"kind": "xlog", "r": 4},
            "antagonist": {"factor": 0.5, "mean_on": 2.0, "mean_off": 4.0},
        },
    ],
    "nodes": [
        {
            "node": 4,
            "speed_schedule": [{"at": 1.0, "factor": 2.0}],
            "antagonist": {"factor": 0.25, "mean_on": 1.0, "mean_off": 3.0},
        }
    ],
    "workload": {"arrival_rate": 3.0, "service": {"dist": "lognormal", "mean": 1.0, "scv": 0.5}},
    "policy": {"name": "jlmu", "rank_order": "ji"},
    "run": {"warmup": 1.0, "duration": 10.0, "time_scale": 0.01, "batches": 5},
    "network": {"delay": {"dist": "exponential", "mean": 0.01}, "forward_tasks": True},
}

Path_ = tuple[str | int, ...]  # a key path into a decoded document: ("classes", 0, "count")


def base_documents() -> list[dict[str, Any]]:
    """Valid spec documents: the example files named in EXAMPLES and EXTRA_SPEC."""
    docs = [tomllib.loads((ROOT / "examples" / name).read_text()) for name in EXAMPLES]
    return [*docs, json.loads(json.dumps(EXTRA_SPEC))]


def key_name(path: Path_) -> str:
    """The key as docs/spec.md and the error messages write it: ``classes[0].utility.r``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def pattern(path: Path_) -> str:
    """The key with its indices erased: ``classes[].utility.r``."""
    return re.sub(r"\[\d+\]", "[]", key_name(path))


def get_at(doc: Any, path: Path_) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def set_at(doc: Any, path: Path_, value: Any) -> Any:
    """A deep copy of ``doc`` with ``value`` at ``path``."""
    copy = json.loads(json.dumps(doc))
    get_at(copy, path[:-1])[path[-1]] = value
    return copy


def delete_at(doc: Any, path: Path_) -> Any:
    copy = json.loads(json.dumps(doc))
    del get_at(copy, path[:-1])[path[-1]]
    return copy


def walk(doc: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every (path, value) below ``doc``, tables and arrays included."""
    items: Sequence[tuple[str | int, Any]]
    if isinstance(doc, Mapping):
        items = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    else:
        return
    for key, value in items:
        yield (*prefix, key), value
        yield from walk(value, (*prefix, key))


# ------------------------------------------------------------------------------ what docs/spec.md allows

NUMBER = frozenset({"integer", "float"})
#: TOML types each key takes (docs/spec.md, the "type" columns)
TYPES: dict[str, frozenset[str]] = {
    "name": frozenset({"string"}),
    "description": frozenset({"string"}),
    "seed": frozenset({"integer"}),
    "classes": frozenset({"array"}),
    "classes[]": frozenset({"table"}),
    "classes[].name": frozenset({"string"}),
    "classes[].count": frozenset({"integer"}),
    "classes[].discipline": frozenset({"string"}),
    "classes[].speed": NUMBER | {"string", "table"},
    "classes[].speed.dist": frozenset({"string"}),
    "classes[].speed.low": NUMBER,
    "classes[].speed.high": NUMBER,
    "classes[].utility": frozenset({"table"}),
    "classes[].utility.kind": frozenset({"string"}),
    "classes[].utility.r": NUMBER,
    "classes[].utility.values": frozenset({"array"}),
    "classes[].utility.values[]": NUMBER,
    "workload": frozenset({"table"}),
    "workload.load": NUMBER,
    "workload.arrival_rate": NUMBER,
    "workload.service": NUMBER | {"table"},
    "workload.service.dist": frozenset({"string"}),
    "workload.service.mean": NUMBER,
    "workload.service.scv": NUMBER,
    "policy": frozenset({"table"}),
    "policy.name": frozenset({"string"}),
    "policy.d": frozenset({"integer"}),  # an array too for scheme1/scheme2: see accepted_types
    "policy.d[]": frozenset({"integer"}),
    "policy.replace": frozenset({"boolean"}),
    "policy.tie_break": frozenset({"string"}),
    "policy.beta": NUMBER,
    "policy.beta_scale": NUMBER,
    "policy.rank_order": frozenset({"string"}),
    "policy.updates": frozenset({"string"}),
    "policy.rate": NUMBER,
    "run": frozenset({"table"}),
    "run.warmup": NUMBER,
    "run.duration": NUMBER,
    "run.time_scale": NUMBER,
    "run.batches": frozenset({"integer"}),
    "network": frozenset({"table"}),
    "network.delay": NUMBER | {"table"},
    "network.delay.dist": frozenset({"string"}),
    "network.delay.mean": NUMBER,
    "network.delay.scv": NUMBER,
    "network.forward_tasks": frozenset({"boolean"}),
}
#: speed over time (docs/spec.md, "Speed over time"): the same keys in a class and in a [[nodes]] table
SPEED_OVER_TIME: dict[str, tuple[frozenset[str], str | int | None, bool]] = {
    # key: (types, range, required)
    "speed_schedule": (frozenset({"array"}), None, False),
    "speed_schedule[]": (frozenset({"table"}), None, False),
    "speed_schedule[].at": (NUMBER, "nonnegative", True),
    "speed_schedule[].factor": (NUMBER, "positive", True),
    "speed_schedule[].start": (NUMBER, "nonnegative", True),
    "speed_schedule[].end": (NUMBER, "positive", True),
    "speed_schedule[].from": (NUMBER, "positive", False),
    "speed_schedule[].to": (NUMBER, "positive", True),
    "speed_schedule[].steps": (frozenset({"integer"}), 1, False),
    "antagonist": (frozenset({"table"}), None, False),
    "antagonist.factor": (NUMBER, "positive", True),
    "antagonist.mean_on": (NUMBER, "positive", True),
    "antagonist.mean_off": (NUMBER, "positive", True),
}
TYPES |= {
    "nodes": frozenset({"array"}),
    "nodes[]": frozenset({"table"}),
    "nodes[].node": frozenset({"integer"}),
}
for _owner in ("classes[]", "nodes[]"):
    TYPES |= {f"{_owner}.{k}": types for k, (types, _, _) in SPEED_OVER_TIME.items()}

#: the closed lists of string values (docs/spec.md)
CHOICES: dict[str, tuple[str, ...]] = {
    "classes[].discipline": ("pool", "ps", "fcfs"),
    "classes[].speed.dist": ("uniform",),
    "classes[].utility.kind": ("xlog", "table"),
    "workload.service.dist": ("deterministic", "exponential", "hyperexponential", "lognormal"),
    "network.delay.dist": ("deterministic", "exponential", "hyperexponential", "lognormal"),
    "policy.tie_break": ("random", "fastest", "slowest", "longest_idle", "fastest_idle"),
    "policy.rank_order": ("ij", "ji"),
    "policy.updates": ("asynchronous", "synchronous"),
    "policy.name": (
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
    ),
}

#: numeric ranges: "positive" (> 0, finite), "nonnegative" (>= 0, finite), "finite", or an integer minimum
RANGES: dict[str, str | int] = {
    "seed": 0,
    "classes[].count": 1,
    "classes[].speed": "positive",
    "classes[].speed.low": "positive",
    "classes[].speed.high": "positive",
    "classes[].utility.r": "positive",
    "classes[].utility.values[]": "finite",
    "workload.load": "positive",
    "workload.arrival_rate": "positive",
    "workload.service": "positive",
    "workload.service.mean": "positive",
    "workload.service.scv": "positive",
    "policy.d": 1,
    "policy.d[]": 1,
    "policy.beta": "positive",
    "policy.beta_scale": "positive",
    "policy.rate": "positive",
    "run.warmup": "nonnegative",
    "run.duration": "positive",
    "run.time_scale": "positive",
    "run.batches": 2,
    "network.delay": "nonnegative",
    "network.delay.mean": "positive",
    "network.delay.scv": "positive",
    "nodes[].node": 0,
}
for _owner in ("classes[]", "nodes[]"):
    RANGES |= {f"{_owner}.{k}": rule for k, (_, rule, _) in SPEED_OVER_TIME.items() if rule is not None}

#: keys docs/spec.md marks "required" (and the table keys a table form requires)
REQUIRED = frozenset(
    {
        "name",
        "classes",
        "workload",
        "policy",
        "run",
        "classes[].name",
        "classes[].count",
        "classes[].discipline",
        "classes[].speed.dist",
        "classes[].speed.low",
        "classes[].speed.high",
        "classes[].utility.kind",
        "classes[].utility.r",
        "classes[].utility.values",
        "workload.service.dist",
        "workload.service.mean",
        "workload.service.scv",
        "network.delay.dist",
        "network.delay.mean",
        "network.delay.scv",
        "policy.name",
        "run.duration",
        "nodes[].node",
        *(
            f"{owner}.{k}"
            for owner in ("classes[]", "nodes[]")
            for k, (_, _, req) in SPEED_OVER_TIME.items()
            if req
        ),
    }
)

KNOWN_KEYS = frozenset(re.split(r"[.\[\]]+", " ".join(TYPES))) | {"scv", "values", "r", "kind"}


def accepted_types(doc: Mapping[str, Any], path: Path_) -> frozenset[str]:
    types = TYPES[pattern(path)]
    if pattern(path) == "policy.d" and doc["policy"]["name"] in ("scheme1", "scheme2"):
        return types | {"array"}  # one probe count per class, or one for all
    return types


def toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "table"


# ------------------------------------------------------------------------------------------- TOML text

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(key: str) -> str:
    return key if _BARE.match(key) else toml_string(key)


def toml_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"


def toml_dumps(doc: Mapping[str, Any]) -> str:
    """A spec document as TOML: top-level values first, then [[arrays of tables]] and [tables]."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in doc.items():
        is_table = isinstance(value, dict)
        is_table_array = isinstance(value, list) and value and all(isinstance(x, dict) for x in value)
        if is_table or is_table_array:
            tables.append((key, value))
        else:
            lines.append(f"{toml_key(key)} = {toml_value(value)}")
    for key, value in tables:
        for table in value if isinstance(value, list) else [value]:
            lines.append("")
            lines.append(f"[[{toml_key(key)}]]" if isinstance(value, list) else f"[{toml_key(key)}]")
            lines.extend(f"{toml_key(k)} = {toml_value(x)}" for k, x in table.items())
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- spec mutations


@dataclass(frozen=True)
class Mutation:
    """One fault put into a valid document; ``key`` is where docs/spec.md says the fault is."""

    what: str  # "type", "range", "missing", "unknown"
    key: str
    doc: dict[str, Any]


def values_of_type(kind: str) -> st.SearchStrategy[Any]:
    return {
        "string": st.text(max_size=8),
        "integer": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(allow_nan=True, allow_infinity=True),
        "boolean": st.booleans(),
        "array": st.lists(st.integers(-3, 3) | st.text(max_size=3), max_size=3),
        "table": st.dictionaries(st.sampled_from(["x", "dist", "mean"]), st.integers(0, 3), max_size=2),
    }[kind]


@st.composite
def wrong_type(draw: st.DrawFn, doc: dict[str, Any]) -> Mutation:
    """A key given a value of a TOML type that docs/spec.md does not allow for it."""
    paths = [p for p, _ in walk(doc) if pattern(p) in TYPES]
    path = draw(st.sampled_from(paths))
    allowed = accepted_types(doc, path)
    kind = draw(
        st.sampled_from(sorted({"string", "integer", "float", "boolean", "array", "table"} - allowed))
    )
    return Mutation("type", key_name(path), set_at(doc, path, draw(values_of_type(kind))))


def out_of_range_values(rule: str | int) -> st.SearchStrategy[Any]:
    non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
    if isinstance(rule, int):
        return st.integers(-(2**63), rule - 1)
    if rule == "finite":
        return non_finite
    if rule == "positive":
        return non_finite | st.floats(max_value=0.0) | st.integers(-(2**63), 0)
    # -0.0 is not below zero
    return non_finite | st.floats(max_value=-(2**-1074)) | st.integers(-(2**63), -1)


@st.composite
def out_of_range(draw: st.DrawFn, doc: dict[str, Any]) -> Mutation:
    """A number outside its documented range, or a string outside its closed list of values."""
    paths = [
        p
        for p, v in walk(doc)
        if (pattern(p) in RANGES and toml_type(v) in NUMBER) or (pattern(p) in CHOICES and isinstance(v, str))
    ]
    path = draw(st.sampled_from(paths))
    key = pattern(path)
    if key in CHOICES:
        value = draw(st.text(max_size=12).filter(lambda s: s not in CHOICES[key]))
    else:
        value = draw(out_of_range_values(RANGES[key]))
    return Mutation("range", key_name(path), set_at(doc, path, value))


@st.composite
def missing_key(draw: st.DrawFn, doc: dict[str, Any]) -> Mutation:
    """A required key removed."""
    paths = [p for p, _ in walk(doc) if pattern(p) in REQUIRED]
    path = draw(st.sampled_from(paths))
    return Mutation("missing", key_name(path), delete_at(doc, path))


#: unknown key names: any printable text. Control characters are left out: see
#: test_spec_error_for_a_key_with_a_newline_is_one_line (a known bug).
UNKNOWN_KEY = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=10).filter(
    lambda k: k not in KNOWN_KEYS
)


@st.composite
def unknown_key(draw: st.DrawFn, doc: dict[str, Any]) -> Mutation:
    """A key docs/spec.md does not know, added to one of the document's tables."""
    tables: list[Path_] = [()] + [p for p, v in walk(doc) if isinstance(v, dict)]
    path = draw(st.sampled_from(tables))
    name = draw(UNKNOWN_KEY)
    return Mutation(
        "unknown", key_name((*path, name)), set_at(doc, (*path, name), 1) if path else {**doc, name: 1}
    )


def mutations(docs: Sequence[dict[str, Any]]) -> st.SearchStrategy[Mutation]:
    return st.sampled_from(docs).flatmap(
        lambda doc: st.one_of(wrong_type(doc), out_of_range(doc), missing_key(doc), unknown_key(doc))
    )


@st.composite
def broken_text(draw: st.DrawFn, docs: Sequence[dict[str, Any]]) -> bytes:
    """A valid document's TOML with bytes cut, inserted or replaced: most of it is no longer TOML."""
    data = toml_dumps(draw(st.sampled_from(docs))).encode()
    at = draw(st.integers(0, len(data)))
    how = draw(st.sampled_from(["cut", "insert", "replace", "repeat line"]))
    junk = draw(
        st.binary(min_size=1, max_size=4)
        | st.sampled_from([b"=", b"[", b"]", b'"', b"\n", b"[[", b"{", b"\xff", b"\xc3", b"\x00", b"'''"])
    )
    if how == "cut":
        return data[:at]
    if how == "insert":
        return data[:at] + junk + data[at:]
    if how == "replace":
        return data[:at] + junk + data[at + len(junk) :]
    lines = data.split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    return b"\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])


# --------------------------------------------------------------------------------------- state messages

#: message kinds: every kind of docs/protocol.md, plus kinds no policy has and malformed ones
KINDS = [
    "departure",
    "idle_token",
    "probe",
    "probe_reply",
    "token_arrival",
    "token_departure",
    "token_epoch",
    "epoch",
    "Idle_token",
    "x" * 64,
    "x" * 65,
    "",
    "é",
]

#: JSON values that are almost what a field wants
NEAR_NUMBERS = st.sampled_from([0, -1, 1.0, 1e0, -0.0, 1e308, 2**63, 2**70, True, False, None, "1", [], {}])
SMALL_VALUES = (
    st.integers(-3, 2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.none()
    | st.text(max_size=3)
)


def message_objects(nodes: int, kinds: Sequence[str]) -> st.SearchStrategy[Any]:
    """A message object: most of the time well-formed, of a kind in ``kinds`` (the receiver's) and about a
    node of the cluster; otherwise of any kind, about a node just outside, or with fields missing, mistyped
    or out of range."""
    fields = {
        "kind": st.sampled_from(KINDS) | st.text(max_size=4) | NEAR_NUMBERS,
        "node": st.integers(0, nodes + 1) | NEAR_NUMBERS,
        "dispatcher": st.integers(0, 2) | NEAR_NUMBERS,
        "data": st.lists(SMALL_VALUES, max_size=17) | NEAR_NUMBERS,
    }
    optional = {
        "dispatcher": st.integers(0, 2),
        "data": st.lists(st.integers(0, 3) | st.booleans(), max_size=3),
    }
    # the counts JIQ's idle tokens carry (docs/protocol.md), mostly right, or near them
    counts = st.tuples(st.integers(0, 2**53)).map(list) | optional["data"]
    expected = st.fixed_dictionaries(
        {
            "kind": st.sampled_from(list(kinds) or KINDS[:8]),
            "node": st.integers(0, nodes - 1),
            "data": counts,
        },
        optional={"dispatcher": optional["dispatcher"]},
    )
    near = st.fixed_dictionaries(
        {"kind": st.sampled_from(KINDS), "node": st.integers(0, nodes + 1)}, optional=optional
    )
    anything = st.fixed_dictionaries({}, optional=fields)
    return st.one_of(expected, near, anything, SMALL_VALUES)


def message_batches(nodes: int, kinds: Sequence[str]) -> st.SearchStrategy[Any]:
    """A ``POST .../messages`` body: mostly 1 to 3 messages, sometimes an empty, long or odd batch."""
    messages = message_objects(nodes, kinds)
    usual = st.lists(messages, min_size=1, max_size=3)
    odd = st.lists(messages, min_size=0, max_size=66) | SMALL_VALUES
    return st.one_of(
        st.fixed_dictionaries({"messages": usual}),
        st.fixed_dictionaries({"messages": usual}),
        st.fixed_dictionaries({}, optional={"messages": odd}),
    )


def json_bytes(value: Any) -> bytes:
    """``value`` as Python writes JSON, NaN and Infinity included (the servers read them, and must refuse)."""
    return json.dumps(value, allow_nan=True).encode()


# ------------------------------------------------------------------------------ hostile specs (issue 27)


def nested(depth: int, leaf: Any = 1) -> Any:
    """A value nested ``depth`` deep, arrays and inline tables in turn."""
    value = leaf
    for d in range(depth):
        value = [value] if d % 2 else {"k": value}
    return value


#: values a hostile or unlucky user puts where a spec wants a number, a name or a table
HOSTILE = st.one_of(
    st.sampled_from([1e308, -1e308, 1e-308, 5e-324, 2**63, 2**64, 2**64 - 1, 10**20, -(2**70), 0, 0.0, -0.0]),
    st.sampled_from([float("inf"), float("-inf"), float("nan")]),
    st.integers(1, 60).map(nested),
    st.text(min_size=90, max_size=4000),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
    st.sampled_from(["x" * 101, "a\nb", "tab\there", "\x7f", "\x00", "\u202e", "🙂" * 50]),
    st.lists(st.integers(0, 3), min_size=1000, max_size=3000),
)


@st.composite
def hostile_documents(draw: st.DrawFn, docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A valid document with one to three of its values (or new keys beside them) replaced by HOSTILE
    ones."""
    doc = draw(st.sampled_from(docs))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p, v in walk(doc) if not isinstance(v, dict | list)]
        path = draw(st.sampled_from(paths))
        beside = isinstance(get_at(doc, path[:-1]), dict) and draw(st.booleans())
        if beside:  # a key beside it, named by the fuzzer
            path = (*path[:-1], draw(st.text(min_size=1, max_size=40)))
        doc = set_at(doc, path, draw(HOSTILE))
    return doc


@st.composite
def damaged_bytes(draw: st.DrawFn, docs: Sequence[dict[str, Any]]) -> bytes:
    """A document's bytes damaged several times over (broken_text's damages, one after another), or bytes
    that never were a spec."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=2048))
    data = draw(broken_text(docs))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        # arrays and inline tables thousands deep: a parser that recurses gives up (RecursionError)
        deep = [b"\na = " + b"[" * 3000, b"\nb = " + b"{c=" * 2000, b"[" * 64, b"\x00" * 8]
        junk = draw(st.binary(min_size=1, max_size=16) | st.sampled_from(deep))
        data = data[:at] + junk + data[at + draw(st.integers(0, 8)) :]
    return data
