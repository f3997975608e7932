# Entry points: `make bench` (the benchmark suite), `make test` (lint, types, tests), `make package-check`
# (the wheel, installed into a clean venv and run) and `make demo`
# (a scripted agent loop against the example server).
# Each creates .venv on first use and reinstalls only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: bench bench-quick demo test lint typecheck pytest stress package-check clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

# The suite writes each run to benchmarks/results/<time>.json and to latest.json; latest.json is tracked
# (the figures the README and docs/benchmarks.md quote), so these targets put it back after the run: a
# benchmark run leaves the tracked files as they were. To publish a run, copy its <time>.json over it.
KEEP_LATEST := $(VENV)/latest.json.kept

bench: $(STAMP)
	@cp benchmarks/results/latest.json $(KEEP_LATEST)
	@$(BIN)/python -m benchmarks; status=$$?; mv $(KEEP_LATEST) benchmarks/results/latest.json; \
		echo "(benchmarks/results/latest.json keeps the published figures; this run is the newest <time>.json)"; \
		exit $$status

bench-quick: $(STAMP)
	@cp benchmarks/results/latest.json $(KEEP_LATEST)
	@$(BIN)/python -m benchmarks --quick; status=$$?; mv $(KEEP_LATEST) benchmarks/results/latest.json; \
		echo "(benchmarks/results/latest.json keeps the published figures; this run is the newest <time>.json)"; \
		exit $$status

demo: $(STAMP)
	$(BIN)/python -m dispatcher.examples.demo

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check dispatcher tests benchmarks
	$(BIN)/ruff format --check dispatcher tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

# The long form of the chaos suite (tests/chaos): more seeds, batches and examples, and the tests marked
# `stress`. It writes its figures to tests/chaos/results/stress.json (see RELIABILITY.md).
stress: $(STAMP)
	DISPATCHER_STRESS=1 $(BIN)/python -m pytest -q tests/chaos

# Build the wheel and sdist, install the wheel into a clean venv (no source tree on its path) and run a
# batch with it (.ci/smoke.py); then install one integration extra from the wheel and import it.
package-check: $(STAMP)
	rm -rf dist .venv-smoke
	$(BIN)/python -m build --quiet --outdir dist .
	$(PYTHON) -m venv .venv-smoke
	.venv-smoke/bin/python -m pip install --quiet dist/*.whl
	cd /tmp && $(CURDIR)/.venv-smoke/bin/python $(CURDIR)/.ci/smoke.py
	.venv-smoke/bin/dispatcher --version
	.venv-smoke/bin/python -m pip install --quiet "$$(ls dist/*.whl)[langgraph]"
	cd /tmp && $(CURDIR)/.venv-smoke/bin/python -c "from dispatcher.integrations.langgraph import DispatcherToolNode"

clean:
	rm -rf $(VENV) .venv-smoke dist build .mypy_cache .pytest_cache .ruff_cache
