"""``lbt predict``: what theory predicts for an experiment, and with ``--transient`` the JLMU fluid
trajectory from an empty system (docs/theory.md)."""

from __future__ import annotations

from dataclasses import dataclass

from lbtestbed.analysis import theory
from lbtestbed.analysis.results.result import Result
from lbtestbed.experiment.errors import BadInput
from lbtestbed.model.experiment import Experiment

#: the steps of the fluid trajectory, from empty to its horizon
TRANSIENT_STEPS = 24


@dataclass(frozen=True)
class Predicted:
    result: Result  # source "theory"; with a trajectory, also in its extras["transient"]
    transient: list[dict[str, float]] | None  # the fluid trajectory, when asked for


def predict(exp: Experiment, *, transient: bool = False) -> Predicted:
    """The theory's result for ``exp``; with ``transient``, also the fluid trajectory over twice the
    warm-up it needs (at least the spec's warm-up). BadInput when a trajectory is asked of anything but
    pools with utilities."""
    pools = {c.discipline for c in exp.classes} == {"pool"}
    if transient and not (pools and all(c.utility is not None for c in exp.classes)):
        raise BadInput(f"{exp.source}: --transient needs pools with utilities (the JLMU fluid model)")
    result = theory.predict(exp)
    if not transient:
        return Predicted(result, None)
    horizon = max(2 * result.extras["bounds"]["warmup_needed"], exp.run.warmup)
    times = [horizon * k / TRANSIENT_STEPS for k in range(TRANSIENT_STEPS + 1)]
    table = theory.transient_table(exp, times)
    result.extras["transient"] = table
    return Predicted(result, table)
