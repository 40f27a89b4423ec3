"""Reading a spec's TOML tables: typed access that names the full key path of every problem.

Every problem raises ``SpecError``, whose text is one line naming the file, the key and what is wrong; the
model's own tables (``model.reading``) and every policy's parameters (``lbtestbed/policies/``, each policy's
``Params.read``) are read through ``TableReader``, so that all of them fail alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class SpecError(ValueError):
    """A bad spec: ``str(err)`` is ``"<file>: <key>: <what is wrong>"``."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        text = f"{source}: {key}: {message}" if key else f"{source}: {message}"
        # one line whatever the file holds: a quoted TOML key may contain a newline
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))


class TableReader:
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
            raise self.fail(name, f"must be a string, got {show(v)}")
        if choices and v not in choices:
            raise self.fail(name, f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    def integer(
        self, name: str, default: int | None = None, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        v = self.require(name) if default is None else self.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(name, f"must be an integer, got {show(v)}")
        if minimum is not None and v < minimum:
            raise self.fail(name, f"must be at least {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.fail(name, f"must be at most {maximum:,}, got {show(v)}")
        return v

    def number(self, name: str, default: float | None = None, positive: bool | None = True) -> float:
        v = self.require(name) if default is None else self.get(name, default)
        return self.as_number(name, v, positive)

    def as_number(self, name: str, v: Any, positive: bool | None = True) -> float:
        """A finite number; positive=True: > 0, False: >= 0, None: any sign."""
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(name, f"must be a number, got {show(v)}")
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
            raise self.fail(name, f"must be true or false, got {show(v)}")
        return v

    def sub(self, name: str) -> TableReader:
        v = self.require(name)
        if not isinstance(v, Mapping):
            raise self.fail(name, f"must be a table, got {show(v)}")
        return TableReader(self.source, v, self.key(name))


def show(v: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{kind.get(type(v), type(v).__name__)} {v!r}" if not isinstance(v, dict | list) else kind[type(v)]
