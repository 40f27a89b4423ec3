"""lbtestbed: load-balancing policies from the literature, simulated, predicted and emulated.

The package's public interface is ``lbtestbed.api``, whose names are importable from here
(``import lbtestbed as lbt; lbt.simulate(lbt.load("examples/jiq.toml"))``; docs/api.md). They are loaded
on first use, so that the processes of a cluster (``python -m lbtestbed.dispatcher``), which import this
package first, do not load the analysis with it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("lbtestbed")  # pyproject.toml's, as installed
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

if TYPE_CHECKING:
    from lbtestbed.api import (
        Experiment,
        Point,
        Result,
        RunReport,
        batch_frame,
        frontier,
        load,
        predict,
        run,
        simulate,
        spec_schema,
        sweep,
        table,
        task_frame,
    )

__all__ = [
    "Experiment",
    "Point",
    "Result",
    "RunReport",
    "__version__",
    "batch_frame",
    "frontier",
    "load",
    "predict",
    "run",
    "simulate",
    "spec_schema",
    "sweep",
    "table",
    "task_frame",
]


def __getattr__(name: str) -> Any:
    """The public interface's names, from ``lbtestbed.api`` when first asked for (PEP 562)."""
    if name in __all__:
        from lbtestbed import api

        return getattr(api, name)
    raise AttributeError(f"module 'lbtestbed' has no attribute {name!r}")
