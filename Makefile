# Entry points: `make bench` (the benchmark suite), `make test` (lint, types, tests) and `make demo`
# (a scripted agent loop against the example server).
# Each creates .venv on first use and reinstalls only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: bench bench-quick demo test lint typecheck pytest clean

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

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
