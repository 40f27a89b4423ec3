"""Load generation (docs/load.md): the open-loop generator, rate schedules, traces and the locustfile.

- ``schedule``: steps and ramps of the arrival rate, an exact non-homogeneous Poisson process
- ``plan``: which tasks a run sends and when (spec, schedule or trace), shared by both generators
- ``openloop``: ``lbt load``'s generator (``drive``, ``run_load``), its report, traces
- ``locustfile``: the same tasks from locust (open or closed loop) and its load shape
- ``locust_run``: ``lbt load --locust``, locust headless in a child process
- ``summary``: the summary's quantities, their units, and ``lbt load --threshold`` on them
"""

#: wall seconds a task may take from its send to its answer before a generator gives it up (``expired``);
#: ``lbt load --deadline`` overrides it (here, not in ``openloop``, so that ``lbt`` starts without numpy)
TASK_DEADLINE = 300.0
