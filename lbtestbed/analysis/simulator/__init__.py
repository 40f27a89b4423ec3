"""The discrete-event simulator (``engine``) and its mypyc build (``compiled``).

``simulate_once`` is what every command calls: the compiled simulator where it is built and current, unless
``LBT_SIMULATOR=python`` says otherwise, else the pure-Python one (the same result, slower). ``records``: the
same run keeping a record of every task (``lbt simulate --records``); ``twin``: the simulation of a
cluster run with the delays it measured.
"""

from __future__ import annotations

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.engine import Progress, Simulator
from lbtestbed.model.experiment import Experiment

__all__ = ["Progress", "RawRun", "Simulator", "simulate_once"]


def simulate_once(exp: Experiment, replication: int = 0, progress: Progress | None = None) -> RawRun:
    """Run one replication of ``exp``."""
    # imported here: ``python -m lbtestbed.analysis.simulator.compiled`` then runs it once, not twice
    from lbtestbed.analysis.simulator import compiled

    raw = compiled.run_selected(exp, replication, progress)  # None: not to be used, or not available
    if raw is not None:
        return raw
    return Simulator(exp, replication, progress).run()
