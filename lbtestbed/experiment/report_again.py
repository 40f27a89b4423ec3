"""``lbt report DIR``: the report of a run written again from its directory, finished or not (docs/run.md,
"The journal").

The run's directory keeps the experiment as the run resolved it, the trace, the journal of every task's fate
and the counters of every boundary reached (``run_record``); the report is built from them as ``lbt run``
builds it (``run_analysis.analyse``): a run stopped early or cut short is compared on the batches it
measured and marked partial."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lbtestbed.experiment.errors import BadInput
from lbtestbed.experiment.run import RunOutcome

Say = Callable[[str], None]


def report_again(directory: Path, say: Say, simulate: bool = True) -> RunOutcome:
    """Write the report of the run kept in ``directory`` again (BadInput if it holds none)."""
    from lbtestbed.experiment.run_analysis import analyse
    from lbtestbed.experiment.run_record import RunDirectoryError, read_run

    try:
        exp, m, preflight = read_run(directory)
    except RunDirectoryError as e:
        raise BadInput(str(e)) from None
    how = "finished" if m.finished and not m.interrupted else "partial"
    say(f"{directory}: a {how} run of {exp.name}, {len(m.snapshots)} boundaries measured")
    rep, files = analyse(exp, m, directory, say, simulate=simulate, preflight=preflight or None)
    return RunOutcome(rep, files, directory, m.interrupted)
