"""The spec: one TOML file (and ``--set`` overrides) read into an ``Experiment`` (docs/design.md,
principle 1).

The model reads its own tables (``model.reading``) and hands the ``[policy]`` table to the policy
library's catalog, which finds the policy's own parameters. ``load_spec`` reads a file, ``parse_spec`` a
decoded document (a cluster file holds one: ``model.document``); both raise ``SpecError`` with one line
naming the file, the key and what is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lbtestbed.model import reading
from lbtestbed.model.experiment import Experiment
from lbtestbed.model.schema import document_schema
from lbtestbed.policies.catalog import CATALOG


def parse_spec(data: Mapping[str, Any], source: str = "<spec>") -> Experiment:
    """Validate a decoded TOML document and build the experiment."""
    return reading.read_experiment(data, source, CATALOG)


def apply_overrides(data: dict[str, Any], overrides: Iterable[str], source: str) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (``classes[0].count=10``, ``policy.name=jiq``) to a document;
    switching ``policy.name`` drops the old policy's keys that the new one does not take."""
    return reading.apply_overrides(data, overrides, source, CATALOG)


def load_spec(path: str | Path, overrides: Iterable[str] = ()) -> Experiment:
    """Read, override and validate a spec file."""
    source = str(path)
    overrides = tuple(overrides)
    data = apply_overrides(reading.read_document(path), overrides, source)
    return dataclasses.replace(parse_spec(data, source), overrides=overrides)


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a spec document (``lbt spec schema``; ``model.schema``): the reader's own keys
    and every policy's parameters."""
    return document_schema(CATALOG)
