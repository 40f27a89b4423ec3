"""The discrete-event simulator (``engine``) and its opt-in mypyc build (``compiled``).

``simulate_once`` is what every command calls: the pure-Python engine, or the compiled copy when
``LBT_SIMULATOR=compiled`` asks for it and the build is current (the same result, faster). ``records``:
the same run keeping a record of every task (``lbt simulate --records``).
"""

from __future__ import annotations

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator import compiled
from lbtestbed.analysis.simulator.engine import Progress, Simulator
from lbtestbed.model.experiment import Experiment

__all__ = ["Progress", "RawRun", "Simulator", "simulate_once"]


def simulate_once(exp: Experiment, replication: int = 0, progress: Progress | None = None) -> RawRun:
    """Run one replication of ``exp``."""
    raw = compiled.run_selected(exp, replication, progress)  # None: not asked for, or not available
    if raw is not None:
        return raw
    return Simulator(exp, replication, progress).run()
