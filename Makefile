# Entry points: `make bench` (the benchmark suite), `make test` (lint, types, tests) and `make demo`
# (a scripted agent loop against the example server).
# Each creates .venv on first use and reinstalls only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: bench bench-quick demo test lint typecheck pytest stress clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick

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

# redis-server for the fleet tests (tests/fleet), installed when missing where the platform allows.
redis:
	.ci/redis

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
