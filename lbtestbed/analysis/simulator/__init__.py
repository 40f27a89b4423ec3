"""The discrete-event simulator (``engine``), the rates kernel of Markovian specs (``rates``) and their
mypyc build (``compiled``).

``simulate_once`` is what every command calls: the compiled simulator where it is built and current, unless
``LBT_SIMULATOR=python`` says otherwise, else the pure-Python one (the same result, slower); the event
kernel unless ``kernel`` is ``"rates"`` (``lbt simulate --kernel rates``). ``records``: the same run
keeping a record of every task (``lbt simulate --records``); ``twin``: the simulation of a cluster run with
the delays it measured.
"""

from __future__ import annotations

from lbtestbed.analysis.results.raw import RawRun
from lbtestbed.analysis.simulator.engine import Progress, Simulator
from lbtestbed.analysis.simulator.rates import RatesSimulator
from lbtestbed.model.experiment import Experiment

__all__ = ["KERNELS", "Progress", "RawRun", "Simulator", "simulate_once"]

#: the kernels a simulation may run on: the discrete-event kernel (every spec), the rates kernel (Markovian
#: specs only: ``rates.unsupported``)
KERNELS = ("events", "rates")


def simulate_once(
    exp: Experiment, replication: int = 0, progress: Progress | None = None, kernel: str = "events"
) -> RawRun:
    """Run one replication of ``exp`` on ``kernel`` (KERNELS)."""
    # imported here: ``python -m lbtestbed.analysis.simulator.compiled`` then runs it once, not twice
    from lbtestbed.analysis.simulator import compiled

    raw = compiled.run_selected(exp, replication, progress, kernel)  # None: not to be used, or not available
    if raw is not None:
        return raw
    if kernel == "rates":
        return RatesSimulator(exp, replication, progress).run()
    return Simulator(exp, replication, progress).run()
