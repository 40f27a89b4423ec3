"""The JSON Schema of a spec document, made of the reader's own declarations (``model.keys``) and of each
policy's parameter class (its ``KEYS`` and their types), so that it cannot drift from what the reader
accepts: ``lbt spec schema`` prints it, ``docs/spec.schema.json`` holds it for editors (a TOML spec is
validated as its JSON form: taplo, VS Code's Even Better TOML).

The schema says which keys each table takes, which it needs, their types, choices and bounds. What
depends on more than one key's value (the probes of a policy against the nodes there are, a fault's end
within the run, stability, concave utilities, the choices a policy's string takes) is left to the reader,
whose one-line errors say it (``tests/test_spec_schema.py`` lists what only the reader refuses).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Protocol

from lbtestbed.model import keys
from lbtestbed.model.experiment import PolicyParams
from lbtestbed.model.keys import Key, Table

Schema = dict[str, Any]
#: draft-07, which the editors that validate TOML against a JSON Schema read (all the schema uses is in it)
DIALECT = "http://json-schema.org/draft-07/schema#"
#: a speed written as a fraction, "2/3" (model.reading reads it so)
FRACTION = r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?)\s*)?$"


class Policies(Protocol):
    """What the schema needs of the policy library (``model.reading.PolicyLibrary``'s part)."""

    def names(self) -> tuple[str, ...]: ...

    def params(self, name: str) -> type[PolicyParams]: ...


def plain(key: Key) -> Schema:
    """A key of a plain kind: its type, choices and bounds."""
    out: Schema = {"type": key.kind}
    if key.choices:
        out["enum"] = list(key.choices)
    if key.kind == "integer":
        out |= {k: v for k, v in (("minimum", key.minimum), ("maximum", key.maximum)) if v is not None}
    if key.kind == "number":
        if key.positive is True:
            out["exclusiveMinimum"] = 0
        elif key.positive is False:
            out["minimum"] = 0
        if key.maximum is not None:
            out["maximum"] = key.maximum
        if key.below is not None:
            out["exclusiveMaximum"] = key.below
    return out


def table(
    t: Table, names: tuple[str, ...] | None = None, shapes: Mapping[str, Schema] | None = None
) -> Schema:
    """A table (``names``: the keys one variant of it takes, default all): every key it takes, the ones it
    needs, no other."""
    names = t.names if names is None else names
    props = {}
    for name in names:
        key = t[name]
        shape = (shapes or {}).get(name) or (plain(key) if key.kind in keys.PLAIN else SHAPES[key.kind]())
        doc: Schema = {"description": key.doc}
        if key.default is not None and key.kind in (*keys.PLAIN, "time_scale", "tolerance"):
            doc["default"] = key.default
        props[name] = {**shape, **doc}
    out: Schema = {"type": "object", "properties": props, "additionalProperties": False}
    required = [n for n in names if t[n].required]
    if required:
        out["required"] = required
    return out


def size() -> Schema:
    """A work size: a number (deterministic) or {dist, mean} ({dist, mean, scv} for the two that take it)."""
    scv = table(keys.SIZE, keys.SIZE.only("dist", "mean", "scv"))
    scv["properties"]["dist"]["enum"] = list(keys.WITH_SCV)
    plain_mean = table(keys.SIZE, keys.SIZE.only("dist", "mean"))
    others = [d for d in keys.SIZE["dist"].choices if d not in keys.WITH_SCV]
    plain_mean["properties"]["dist"]["enum"] = others
    return {"oneOf": [{"type": "number", "exclusiveMinimum": 0}, scv, plain_mean]}


def speed() -> Schema:
    return {
        "anyOf": [
            {"type": "number", "exclusiveMinimum": 0},
            {"type": "string", "pattern": FRACTION},
            table(keys.SPEED_RANGE),
        ]
    }


def utility() -> Schema:
    xlog = table(keys.UTILITY, keys.UTILITY.only("kind", "r"))
    xlog["properties"]["kind"] = {"const": "xlog"}
    values = {"type": "array", "items": {"type": "number"}, "minItems": 2}
    listed = table(keys.UTILITY, keys.UTILITY.only("kind", "values"), {"values": values})
    listed["properties"]["kind"] = {"const": "table"}
    return {"oneOf": [xlog, listed]}


def schedule() -> Schema:
    step = table(keys.STEP)
    ramp = table(keys.RAMP)
    return {"type": "array", "items": {"oneOf": [step, ramp]}}


def faults() -> Schema:
    """Each kind of fault takes its own keys (``keys.FAULT_KEYS``)."""
    variants = []
    for kind, own in keys.FAULT_KEYS.items():
        v = table(keys.FAULT, (*keys.FAULT_COMMON, *own))
        v["properties"]["kind"] = {"const": kind}
        variants.append(v)
    return {"type": "array", "items": {"oneOf": variants}}


def nodes() -> Schema:
    node = table(keys.NODE)
    node["anyOf"] = [{"required": ["speed_schedule"]}, {"required": ["antagonist"]}]
    return {"type": "array", "items": node}


def workload() -> Schema:
    out = table(keys.WORKLOAD)
    out["oneOf"] = [{"required": [k]} for k in keys.RATES]  # exactly one sets the arrival rate
    return out


SHAPES: dict[str, Any] = {
    "size": size,
    "speed": speed,
    "utility": utility,
    "schedule": schedule,
    "antagonist": lambda: table(keys.ANTAGONIST),
    "classes": lambda: {"type": "array", "minItems": 1, "items": table(keys.CLASS)},
    "faults": faults,
    "nodes": nodes,
    "messages": lambda: {"type": "array", "minItems": 1, "items": {"type": "string"}},
    "time_scale": lambda: {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"const": "auto"}]},
    "tolerance": lambda: {
        "anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"const": "off"}]
    },
    "delay": lambda: {"anyOf": [{"const": 0}, size()]},
}
TABLES = {"workload": workload, "run": lambda: table(keys.RUN), "network": lambda: table(keys.NETWORK)}
TABLES["health"] = lambda: table(keys.HEALTH)


def annotated(params: type[PolicyParams], name: str) -> Schema:
    """A policy's own key from the type of its field in the policy's parameter class (any value where
    the class reads it into another field: its reader checks it)."""
    fields = {f.name for f in dataclasses.fields(params)}
    if name not in fields:
        return {}
    hint = typing.get_type_hints(params)[name]
    options = [a for a in typing.get_args(hint) if a is not type(None)] if _union(hint) else [hint]
    scalar = {str: "string", bool: "boolean", int: "integer", float: "number"}
    out: list[Schema] = []
    for option in options:
        if typing.get_origin(option) is tuple:  # one per class, or one for every class
            item = {"type": scalar.get(typing.get_args(option)[0], "number")}
            out += [item, {"type": "array", "items": item}]
        elif option in scalar:
            out.append({"type": scalar[option]})
    if len(out) == 1:
        return out[0]
    return {"anyOf": out} if out else {}


def _union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def policy(policies: Policies) -> Schema:
    """``[policy]``: the name, the keys every policy takes, and each policy's own keys (``KEYS``)."""
    common = keys.POLICY.only("name", "dispatchers", "split")
    base = table(keys.POLICY, common)
    base["properties"]["name"]["enum"] = list(policies.names())
    branches = []
    for name in policies.names():
        params = policies.params(name)
        own = {k: table(keys.POLICY, ("view",))["properties"]["view"] if k == "view" else annotated(params, k)
               for k in params.KEYS}  # fmt: skip
        for k, s in own.items():
            s.setdefault("description", f"{name}'s {k} (docs/spec.md, Policies)")
        branches.append(
            {
                "if": {"properties": {"name": {"const": name}}, "required": ["name"]},
                "then": {"properties": own, "propertyNames": {"enum": [*common, *params.KEYS]}},
            }
        )
    base.pop("additionalProperties")  # each policy's branch names the keys it takes
    return base | {"allOf": branches}


def document_schema(policies: Policies) -> Schema:
    """The JSON Schema of a spec document (module docstring)."""
    top = table(keys.TOP, shapes={"policy": policy(policies), **{k: f() for k, f in TABLES.items()}})
    return {
        "$schema": DIALECT,
        "title": "lbtestbed experiment spec",
        "description": "An experiment spec of lbtestbed (docs/spec.md), as TOML decodes it. Made by "
        "`lbt spec schema` from the spec reader's own table of keys (lbtestbed/model/keys.py) and each "
        "policy's parameters: the reader checks what no schema can (docs/spec.md, 'The spec's JSON Schema').",
        **top,
    }
