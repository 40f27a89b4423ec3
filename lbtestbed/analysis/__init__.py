"""From an experiment to a verdict.

``simulator`` and ``theory`` predict an experiment, ``measurement`` reads what a cluster did; each hands
over a ``results`` object (the same shape from all three), ``comparison`` sets them side by side, and
``report`` writes the verdicts, tables and plots.
"""
