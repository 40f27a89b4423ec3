"""The JSON Schemas of docs/ for the result documents, ready to validate (``results.schema.json`` refers to
``result.schema.json`` by its file name), and the key paths of a document (what must not change between
two runs of one spec)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

DOCS = Path(__file__).resolve().parents[1] / "docs"


@cache
def _registry() -> Registry:
    result = json.loads((DOCS / "result.schema.json").read_text())
    return Registry().with_resource("result.schema.json", Resource.from_contents(result))


@cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    """The validator of ``docs/<name>`` (``result.schema.json`` or ``results.schema.json``)."""
    schema = json.loads((DOCS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def problems(name: str, document: Any) -> list[str]:
    """Where ``document`` breaks ``docs/<name>``, one line each (none: it follows it)."""
    return [f"{e.json_path}: {e.message[:200]}" for e in validator(name).iter_errors(document)]


def key_paths(x: Any, at: str = "") -> set[str]:
    """Every key of every object in ``x``, as a path (``.results.cluster.metrics.mean_sojourn.value``);
    the items of a list share the path ``[]``."""
    out = set()
    if isinstance(x, dict):
        for k, v in x.items():
            out.add(f"{at}.{k}")
            out |= key_paths(v, f"{at}.{k}")
    elif isinstance(x, list):
        for v in x:
            out |= key_paths(v, f"{at}[]")
    return out
