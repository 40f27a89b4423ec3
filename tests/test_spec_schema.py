"""The JSON Schema of a spec (``lbt spec schema``, docs/spec.schema.json) is made of the reader's own table of
keys (lbtestbed/model/keys.py) and each policy's parameter class, so it cannot drift from the reader:

- it accepts every example, and docs/spec.schema.json is what ``lbt spec schema`` prints;
- it refuses the bad specs of tests/test_spec.py, except those whose rule no schema can say (listed in
  ``READER_ONLY``, each with its reason);
- key by key, a value outside what the table declares (a type, a choice, a bound, a key left out) is
  refused by the schema *and* by the reader, on that very key: a bound written in the table and not in
  the reader (or the other way round) fails here.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from test_spec import NON_POSITIVE, PS_BASE, RULES, SOURCE, UNKNOWN_KEYS, WRONG_TYPES, Case, pools

from lbtestbed.cli import main
from lbtestbed.model import keys
from lbtestbed.model.experiment import HealthSpec
from lbtestbed.model.reader import SpecError
from lbtestbed.spec import parse_spec, spec_schema

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))

#: the bad specs of tests/test_spec.py whose rule depends on more than the values' own types and bounds,
#: by case id, with the reason the schema cannot refuse them (the reader does, in one line)
READER_ONLY = {
    "count-float": "JSON Schema counts 2.0 as an integer; TOML's 2.0 is a float, which the reader refuses",
    "load-inf": "infinity is a number to JSON Schema",
    "load-nan": "NaN is a number to JSON Schema",
    "speed-0-fraction": "a fraction's value (0/3 = 0) is arithmetic, not a pattern",
    "speed-high-low": "high against low",
    "tie-break": "a policy's string choices are in its reader, not in its parameter class",
    "pod-tie-break": "a policy's string choices are in its reader",
    "rank-order": "a policy's string choices are in its reader",
    "pod-d-0": "a policy's bounds are in its reader, not in its parameter class",
    "slta-beta-0": "a policy's bounds are in its reader",
    "weight-unread": "a class key against the policy",
    "weight-missing": "a policy key against the classes",
    "bias-negative": "a policy's bounds are in its reader",
    "decay-zero": "a policy's bounds are in its reader",
    "jlmu-no-utility": "the policy against the classes",
    "slta-no-utility": "the policy against the classes",
    "jlmu-ps-class": "the policy against the classes",
    "slta-fcfs-class": "the policy against the classes",
    "pod-d-gt-n": "probes against the number of nodes",
    "lr-d-gt-n": "probes against the number of nodes",
    "scheme1-d0-gt-count": "probes against a class's count",
    "scheme2-d1-gt-count": "probes against a class's count",
    "scheme1-d-int-gt-count": "probes against a class's count",
    "scheme2-d-length": "one probe count per class",
    "scheme1-d-short": "one probe count per class",
    "scheme2-d-zero": "a policy's bounds are in its reader",
    "ps-at-capacity": "stability: the load against the speeds",
    "ps-above-capacity": "stability",
    "fcfs-rate-above-capacity": "stability",
    "random-slowest": "stability under the policy",
    "round-robin-slowest": "stability under the policy",
    "hyperexponential-scv": "scv against the distribution's own range",
    "non-concave": "concavity: differences of the values",
    "slta-n-beta-lt-2": "beta against the number of nodes",
    "slta-scale-lt-2": "beta_scale against the number of nodes",
    "slta-both": "SLTA reads exactly one of beta and beta_scale",
    "slta-neither": "SLTA reads exactly one of beta and beta_scale",
    "duplicate-names": "names unique across classes",
}
CASES: list[Case] = [*UNKNOWN_KEYS, *WRONG_TYPES, *NON_POSITIVE, *RULES]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = spec_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"  # what editors read
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_follows_the_schema(path: Path, validator: jsonschema.Draft7Validator) -> None:
    errors = [
        f"{e.json_path}: {e.message[:160]}" for e in validator.iter_errors(tomllib.loads(path.read_text()))
    ]
    assert errors == []


def test_the_file_for_editors_is_what_lbt_spec_schema_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == spec_schema()
    assert json.loads((ROOT / "docs" / "spec.schema.json").read_text()) == printed, (
        "docs/spec.schema.json is stale: .venv/bin/lbt spec schema > docs/spec.schema.json"
    )


@pytest.mark.parametrize(("case_id", "data"), [(c[0], c[1]) for c in CASES], ids=[c[0] for c in CASES])
def test_the_schema_refuses_the_bad_specs(
    case_id: str, data: dict[str, Any], validator: jsonschema.Draft7Validator
) -> None:
    with pytest.raises(SpecError):  # the reader's verdict, as tests/test_spec.py has it
        parse_spec(data, SOURCE)
    refused = not validator.is_valid(data)
    if case_id in READER_ONLY:
        assert not refused, f"the schema refuses {case_id} now: take it off READER_ONLY"
    else:
        assert refused, f"the schema accepts {case_id}, which the reader refuses"


# ------------------------------------------------------------------------- key by key, schema and reader

UNIFORM = {"dist": "uniform", "low": 1.0, "high": 2.0}
ON_OFF = {"factor": 0.5, "mean_on": 1.0, "mean_off": 3.0}
#: a document holding every table of keys.TABLES with every key it can give at once, which the reader
#: accepts (health: every key at its default)
FULL: dict[str, Any] = {
    **copy.deepcopy(PS_BASE),
    "description": "every table",
    "seed": 3,
    "network": {"delay": {"dist": "lognormal", "mean": 0.01, "scv": 0.5}, "forward_tasks": False},
    "health": {f: getattr(HealthSpec(), f) for f in HealthSpec.__dataclass_fields__},
    "faults": [
        {"kind": "slow", "node": 0, "at": 1.0, "until": 2.0, "settle": 0.5, "speed": 0.5},
        {"kind": "fail", "node": 1, "at": 1.0, "until": 2.0, "fraction": 0.5},
        {"kind": "restart_dispatcher", "dispatcher": 0, "at": 1.0, "until": 2.0},
    ],
    "nodes": [{"node": 1, "antagonist": dict(ON_OFF)}],
}
FULL["run"] |= {"warmup": 1.0, "batches": 4}
FULL["policy"] |= {"dispatchers": 1, "split": "random", "view": "local"}
FULL["workload"]["service"] = {"dist": "exponential", "mean": 1.0}
FULL["classes"][0] |= {"speed": UNIFORM, "speed_schedule": [{"at": 1.0, "factor": 0.8}]}
FULL["classes"][1]["speed_schedule"] = [{"start": 2.0, "end": 3.0, "from": 0.8, "to": 1.0, "steps": 2}]
FULL["classes"][1]["antagonist"] = dict(ON_OFF)
POOLED = pools(classes=[{"name": "p", "count": 2, "discipline": "pool", "utility": {"kind": "xlog", "r": 3}}])
#: where each table is in a document the reader accepts (some at several places: each variant)
WHERE: dict[str, list[tuple[dict[str, Any], tuple[Any, ...]]]] = {
    "": [(FULL, ())],
    "classes[]": [(FULL, ("classes", 0))],
    "classes[].speed": [(FULL, ("classes", 0, "speed"))],
    "classes[].utility": [(POOLED, ("classes", 0, "utility"))],
    "workload.service": [(FULL, ("network", "delay")), (FULL, ("workload", "service"))],
    "workload": [(FULL, ("workload",))],
    "policy": [(FULL, ("policy",))],
    "run": [(FULL, ("run",))],
    "network": [(FULL, ("network",))],
    "health": [(FULL, ("health",))],
    "faults[]": [(FULL, ("faults", i)) for i in range(3)],
    "nodes[]": [(FULL, ("nodes", 0))],
    "classes[].antagonist": [(FULL, ("classes", 1, "antagonist")), (FULL, ("nodes", 0, "antagonist"))],
}
SCHEDULES = {
    id(keys.STEP): ("classes", 0, "speed_schedule", 0),
    id(keys.RAMP): ("classes", 1, "speed_schedule", 0),
}


def places(table: keys.Table) -> list[tuple[dict[str, Any], tuple[Any, ...]]]:
    if id(table) in SCHEDULES:
        return [(FULL, SCHEDULES[id(table)])]
    assert table.path in WHERE, f"no place in FULL for table {table.path!r}: add one to WHERE"
    return WHERE[table.path]


def error_path(at: tuple[Any, ...], key: str) -> str:
    """The reader's name for ``key`` of the table at ``at``: ``classes[0].speed_schedule[1].end``."""
    out = ""
    for part in at:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return f"{out}.{key}" if out else key


def holder(doc: dict[str, Any], at: tuple[Any, ...]) -> Any:
    for part in at:
        doc = doc[part]
    return doc


def bounds(key: keys.Key) -> list[tuple[str, Any, Any]]:
    """(what, a value the table refuses, the nearest it accepts or None) for each declared rule of ``key``:
    both sides of a bound, so that the table and the reader must agree where it lies."""
    out: list[tuple[str, Any, Any]] = []
    if key.kind == "integer":
        out.append(("type", "3", None))
        if key.minimum is not None:
            out.append(("minimum", key.minimum - 1, key.minimum))
    elif key.kind == "number":
        out.append(("type", "1", None))
        if key.positive is not None:
            out.append(("sign", 0.0 if key.positive else -1e-9, None if key.positive else 0.0))
        if key.maximum is not None:
            out.append(("maximum", key.maximum * (1 + 1e-9), key.maximum))
        if key.below is not None:
            out.append(("below", key.below, key.below * (1 - 1e-9)))
    elif key.kind == "string":
        out.append(("type", 5, None))
        if key.choices:
            out.append(("choices", "none-of-these", None))
    elif key.kind == "boolean":
        out.append(("type", 1, None))
    return out


def cases() -> list[Any]:
    found = []
    for table in keys.TABLES:
        for base, at in places(table):
            for key in table.keys:
                if key.name not in holder(base, at):
                    continue  # not a key of this variant of the table
                if table.path == "policy" and key.name == "name":
                    continue  # its choices come from the library: test_the_schema_refuses_the_bad_specs
                for what, bad, good in bounds(key):
                    case = f"{error_path(at, key.name)}:{what}"
                    found.append(pytest.param(base, at, key.name, bad, good, id=case))
    return found


@pytest.mark.parametrize(("base", "at", "name", "bad", "good"), cases())
def test_the_reader_refuses_what_the_table_refuses(
    base: dict[str, Any], at: tuple[Any, ...], name: str, bad: Any, good: Any,
    validator: jsonschema.Draft7Validator,
) -> None:  # fmt: skip
    assert validator.is_valid(base), "the document without the bad value must be good"
    parse_spec(base, SOURCE)
    data = copy.deepcopy(base)
    holder(data, at)[name] = bad
    assert not validator.is_valid(data), f"the schema accepts {name} = {bad!r}"
    with pytest.raises(SpecError) as refused:
        parse_spec(data, SOURCE)
    assert refused.value.key == error_path(at, name), str(refused.value)
    if good is not None:  # the other side of the bound: both accept it
        holder(data, at)[name] = good
        assert validator.is_valid(data), f"the schema refuses {name} = {good!r}"
        parse_spec(data, SOURCE)


def test_every_required_key_is_required_by_both(validator: jsonschema.Draft7Validator) -> None:
    """A key the table says is needed: left out, both refuse the document, the reader naming the key."""
    checked = 0
    for table in keys.TABLES:
        for base, at in places(table):
            for key in table.keys:
                if not key.required or key.name not in holder(base, at):
                    continue
                data = copy.deepcopy(base)
                del holder(data, at)[key.name]
                assert not validator.is_valid(data), error_path(at, key.name)
                with pytest.raises(SpecError) as refused:
                    parse_spec(data, SOURCE)
                assert refused.value.key == error_path(at, key.name), str(refused.value)
                assert "missing" in refused.value.message, str(refused.value)
                checked += 1
    assert checked >= 20
