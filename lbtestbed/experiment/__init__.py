"""The experiment layer: what wires a cluster, its load and the analysis together.

``runner`` is ``lbt run`` (cluster, open-loop load, measurement, simulation, theory, report),
``sweep`` is ``lbt sweep`` (a grid of runs or simulations and the trade-off plot), and
``fault_injector`` applies a spec's ``[[faults]]`` to a running cluster on the load's clock.
"""
