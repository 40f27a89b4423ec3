# `make test` and `make demo` work from a clean clone: they create .venv from pyproject.toml first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint demo bench clean prometheus compiled

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# ruff, mypy, and the import layers of pyproject.toml's [tool.importlinter] (lint-imports)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy lbtestbed
	$(BIN)/lint-imports

# Two pytest workers (pytest-xdist), each taking whole files (a module's cluster is started once, in the
# worker that runs the module): most tests wait on a cluster's model clock, so two files at a time halve the
# wall time on two cores, with one of them busy elsewhere too.
test: lint prometheus compiled
	$(BIN)/pytest -q -n 2 --dist loadfile

# The Prometheus server (Debian package) that `lbt cluster up --with-prometheus` and tests/test_prometheus.py
# start; promtool comes with it.
prometheus:
	command -v prometheus >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus)

# The demo: SLTA, then JLMU, on a 20-pool cluster (about a minute each), each compared with the simulator
# and the theory. A verdict of "disagrees" is a result, not a failure; a run that produced no report is.
DEMO := reports/demo
demo: $(STAMP) prometheus compiled
	rm -rf $(DEMO)
	-$(BIN)/lbt run examples/demo_pools.toml --out $(DEMO)/slta
	@echo
	-$(BIN)/lbt run examples/demo_pools.toml --set policy.name=jlmu --out $(DEMO)/jlmu
	@test -f $(DEMO)/slta/report.md && test -f $(DEMO)/jlmu/report.md
	@echo
	@echo "reports: $(DEMO)/slta/report.md and $(DEMO)/jlmu/report.md (results.json and plots beside them)"

# The simulator against SimPy (benchmarks/README.md). A measurement: it exits 1 only when the comparison is
# void (the models disagree); below the 3x target it says so and exits 0 (add --require-target for a gate).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_simulator.py

# The simulator compiled with mypyc into build/compiled-simulator/ (lbtestbed/analysis/simulator/compiled.py):
# every simulation uses it unless LBT_SIMULATOR=python, with the same results to the bit. Built when a C
# compiler is there (about 15 s), and only when a source changed since the last build; without one, the
# simulations say so in one line and run in pure Python. Its main() is called directly: `python -m` of a
# module its package has imported already makes runpy warn.
COMPILED := $(BIN)/python -c 'import sys; from lbtestbed.analysis.simulator.compiled import main; sys.exit(main(sys.argv[1:]))'
compiled: $(STAMP)
	@if command -v cc >/dev/null || command -v gcc >/dev/null; then \
		$(COMPILED) build; \
	else echo "no C compiler: the simulator runs in pure Python"; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis
