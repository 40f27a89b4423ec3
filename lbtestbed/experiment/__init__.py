"""The experiment layer: what wires a cluster, its load and the analysis together. Each ``lbt`` command
calls one function here with the parsed Experiment and prints what it returns:

- ``simulate``: ``lbt simulate`` (one run, or replications in parallel processes)
- ``predict``: ``lbt predict`` (the theory, and the JLMU fluid trajectory)
- ``cluster_control``: ``lbt cluster up``, ``status`` and ``down``
- ``load``: ``lbt load`` (open loop or locust, and the summary)
- ``run``: ``lbt run``'s checks, then ``runner`` (cluster, open-loop load, measurement, simulation,
  theory, report)
- ``sweep``: ``lbt sweep`` (a grid of runs or simulations and the trade-off plot)

Beside them: ``preflight`` (what a spec asks of this machine; the time scale "auto" picks),
``fault_injector`` (a spec's ``[[faults]]`` on a running cluster, on the load's clock), ``chaos`` (a
seeded storm of overlapping faults and what must hold after it), ``progress`` (progress on stderr) and
``errors`` (BadInput and Failed, which the command line turns into exit codes 2 and 1).
"""
