# `make test` and `make demo` work from a clean clone: they create .venv from pyproject.toml first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy lbtestbed

test: lint
	$(BIN)/pytest -q

# Until the cluster exists the demo sets the simulator beside the theory for the same spec.
demo: $(STAMP)
	$(BIN)/lbt simulate examples/slta_two_classes.toml
	@echo
	$(BIN)/lbt predict examples/slta_two_classes.toml

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_simulator.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
