"""The experiment model: what an experiment is, read by every other part.

``spec`` parses and validates the TOML file into an ``Experiment``; ``distributions`` holds the work-size
and speed laws, ``utility`` the pools' utility functions, ``workload`` the seeded task stream drawn from
an experiment.
"""
