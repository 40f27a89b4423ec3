"""Solutions kept on disk between processes (``$XDG_CACHE_HOME/lbtestbed/theory``): a chain that takes
seconds to solve is solved once per machine, and again only when its inputs or its solver's source change.

The file's name is a hash of the inputs and of the source of the modules that compute it, so an edited
solver never reads an old answer. A cache that cannot be written only costs the next call the solve.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lbtestbed" / "theory"


def cache_file(kind: str, key: str, solvers: tuple[ModuleType, ...]) -> Path:
    """The file for ``kind`` (a prefix of the name) solved for ``key`` by the modules ``solvers``."""
    text = key.encode() + b"|" + b"".join(Path(str(m.__file__)).read_bytes() for m in solvers)
    return cache_dir() / f"{kind}-{hashlib.sha256(text).hexdigest()[:24]}.json"


def read_or_solve(path: Path, solve: Callable[[], Any]) -> Any:
    """The JSON value kept in ``path``, or ``solve()``'s (JSON-able) value, kept there for next time."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    value = solve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: readers never see half
        tmp.write_text(json.dumps(value))
        tmp.replace(path)
    except OSError:
        pass
    return value
