"""Where a result document came from: its schema's version, and the lbtestbed that wrote it.

``results.json`` (``lbt run``), ``lbt simulate --json`` and ``lbt predict --json`` open with

    "schema_version": 1,
    "lbtestbed": {"version": "0.1.0", "commit": "4a5b219...", "dirty": false},

``schema_version`` names the version of the document's JSON Schema (``docs/results.schema.json``,
``docs/result.schema.json``): it grows by one whenever a key is renamed, removed or changes meaning, so
that a reader can refuse what it does not know. ``version`` is the installed package's; ``commit`` the
git commit of the source tree the package runs from, and ``dirty`` whether that tree had uncommitted
changes, both null when not known (an installed copy, a tree without ``.git``, no git).
"""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

#: the version of the schemas of docs/results.schema.json (lbt run) and docs/result.schema.json (a result)
SCHEMA_VERSION = 1
SOURCE = Path(__file__).resolve().parents[3]  # the tree that holds the lbtestbed package


@functools.cache
def version() -> str:
    """The installed package's version (pyproject.toml's); "unknown" in a tree never installed."""
    try:
        return metadata.version("lbtestbed")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def commit() -> tuple[str | None, bool | None]:
    """The git commit of the source tree this package runs from and whether the tree has uncommitted
    changes; (None, None) when that cannot be known."""
    if not (SOURCE / ".git").exists():  # a copy without git, or an installed package
        return None, None

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(SOURCE), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), None if status is None else bool(status.strip())


def stamp() -> dict[str, Any]:
    """The keys a result document opens with (module docstring)."""
    head, dirty = commit()
    return {
        "schema_version": SCHEMA_VERSION,
        "lbtestbed": {"version": version(), "commit": head, "dirty": dirty},
    }


def stamped(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the stamp first."""
    return {**stamp(), **document}
