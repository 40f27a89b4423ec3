"""Files a user names, read with bounds: never more than a limit of bytes, never nested deeper than a limit
(docs/spec.md, "Limits").

A spec, a cluster file or a trace may be anything: ``/dev/zero`` reads for ever, a TOML array nested 5,000
deep makes the parser recurse until Python gives up. Every reader here stops at its limit and says so in
one line, before anything starts, with the memory it holds bounded by the limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the largest spec file (TOML or JSON): 100,000 [[nodes]] tables fit; Python's TOML parser reads about
#: 3 MB a second, so that a spec this large is read (or refused) in a second or two
MAX_SPEC_BYTES = 4 * 2**20
#: the largest cluster file: the experiment's document (JSON, read fast) and the endpoints
MAX_CLUSTER_BYTES = 16 * 2**20
#: the deepest nesting of tables and arrays a spec or cluster file may have (a spec needs 5)
MAX_DEPTH = 32


class TooLarge(ValueError):
    """A file larger than its limit; the message says the limit."""


def read_limited(path: str | Path, limit: int) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them (TooLarge beyond: the read stops there, so a
    device that never ends costs ``limit`` bytes); OSError as ``open`` and ``read`` raise it."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit / 2**20:g} MiB (the most a file of this kind may hold)")
    return data


def depth(value: Any) -> int:
    """How deeply tables (mappings) and arrays (lists) nest in ``value``: 0 for a scalar; without
    recursion, so that any nesting is measured."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping):
            children = list(v.values())
        elif isinstance(v, list | tuple):
            children = list(v)
        else:
            continue
        deepest = max(deepest, d + 1)
        stack.extend((c, d + 1) for c in children)
    return deepest


def too_deep(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """Why ``value`` nests too deeply for a document of the testbed (one line), or None."""
    d = depth(value)
    if d > limit:
        return f"nested {d} deep (tables and arrays in one another): at most {limit}"
    return None
