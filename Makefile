# Entry points: `make bench` (the benchmark suite), `make test` (lint, types, tests), `make test-quick` (the
# tests that start no process, need no Redis and are not slow: the edit loop), `make package-check`
# (the wheel, installed into a clean venv and run), `make demo` (a scripted agent loop against the example
# server) and `make architecture` (docs/architecture.md, regenerated from the code).
# Each creates .venv on first use and reinstalls only when pyproject.toml or constraints/ changes. The
# versions installed are those of constraints/dev.txt (constraints/adk.txt for .venv-adk); `make lock`
# moves them to the newest that pyproject.toml allows.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: architecture bench bench-quick demo test test-quick lint typecheck pytest stress package-check node-servers adk lock clean

# pytest-xdist workers for the suite. Most tests wait (servers starting, processes, timeouts) rather than
# compute, so six workers beat four on a 2-core machine (the whole suite from a fresh clone, idle: 309 s
# against 432 s; two suites side by side: 404 s each); `worksteal` evens out the files of long tests.
# `make test WORKERS=0` runs it in one process. -rfE lists each failure and error at the end.
WORKERS ?= 6
PYTEST := $(BIN)/python -m pytest -q -rfE -n $(WORKERS) --dist worksteal

$(STAMP): pyproject.toml constraints/dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints/dev.txt -e ".[dev]"
	@touch $(STAMP)

# Each run writes benchmarks/results/<time>.json and latest.json (ignored by git); the published figures
# are benchmarks/reference.json, which no run changes.
bench: $(STAMP)
	$(BIN)/python -m benchmarks

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick

demo: $(STAMP)
	$(BIN)/python -m dispatcher.examples.demo

test: lint typecheck pytest

# The layers, the modules and their import graph, read from the code (scripts/architecture.py).
architecture: $(STAMP)
	$(BIN)/python -m scripts.architecture

lint: $(STAMP)
	$(BIN)/ruff check dispatcher tests benchmarks scripts
	$(BIN)/ruff format --check dispatcher tests benchmarks scripts

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) node-servers
	$(PYTEST)

# The edit loop: the tests not marked subprocess, redis or slow (tests/README.md says what each means).
test-quick: $(STAMP)
	$(PYTEST) -m "not subprocess and not redis and not slow"

# The reference MCP servers from npm that the tests run over stdio (server-everything, -filesystem and
# -memory), pinned in .ci/node and installed into .node/; nothing is fetched once they are there.
node-servers:
	.ci/node-servers

# The official MCP conformance suite's client scenarios against scripts/conformance_client.py (a client on
# Dispatcher.connect), compared with .ci/conformance/expected.toml; the suite and the Node 22 it needs are
# pinned in .ci/conformance and installed into .conformance/ (nothing is fetched once they are there).
.PHONY: conformance
conformance: $(STAMP)
	.ci/conformance-suite
	$(BIN)/python -m scripts.conformance

# The long form of the chaos suite (tests/chaos): more seeds, batches and examples, and the tests marked
# `stress`, tune's real-clock stability sweeps (tests/test_tune.py), the fleet's real-clock race oracle and the
# full example counts of the lifecycle's and the gate's model-based tests (make test runs a fifth to a third of
# them). It writes its figures to tests/chaos/results/stress.json (see RELIABILITY.md).
stress: $(STAMP)
	DISPATCHER_STRESS=1 $(BIN)/python -m pytest -q tests/chaos tests/test_tune.py tests/fleet/test_processes.py \
		tests/test_lifecycle.py tests/test_gate.py

# Build the wheel and sdist, install the wheel into a clean venv (no source tree on its path) and run a
# batch with it (.ci/smoke.py); then add each framework integration's extra from the wheel, one at a time,
# and run a model turn through that framework's runner (.ci/smoke_integrations.py) before adding the next.
# The order puts each extra before any that brings what it needs (langgraph before langchain, which
# depends on it), so a module that imports a package its extra does not declare fails its smoke test.
# pip's cache from the dev install makes these installs quick. The adk extra is `make adk`'s.
SMOKE_EXTRAS := claude-agent-sdk pydantic-ai openai-agents langgraph langchain

package-check: $(STAMP)
	rm -rf dist .venv-smoke
	$(BIN)/python -m build --quiet --outdir dist .
	$(PYTHON) -m venv .venv-smoke
	.venv-smoke/bin/python -m pip install --quiet -c constraints/dev.txt dist/*.whl
	cd /tmp && $(CURDIR)/.venv-smoke/bin/python $(CURDIR)/.ci/smoke.py
	.venv-smoke/bin/dispatcher --version
	set -e; for extra in $(SMOKE_EXTRAS); do \
		.venv-smoke/bin/python -m pip install --quiet -c constraints/dev.txt "$$(ls dist/*.whl)[$$extra]"; \
		(cd /tmp && $(CURDIR)/.venv-smoke/bin/python $(CURDIR)/.ci/smoke_integrations.py $$extra); \
	done

# The Google ADK adapter's tests (and its docs/integrations.md examples), in a venv of their own: google-adk
# would downgrade opentelemetry, tenacity and websockets in .venv (see the `adk` extra in pyproject.toml).
ADK_VENV := .venv-adk

$(ADK_VENV)/.installed: pyproject.toml constraints/adk.txt
	@test -x $(ADK_VENV)/bin/python || $(PYTHON) -m venv $(ADK_VENV)
	$(ADK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ADK_VENV)/bin/python -m pip install --quiet -c constraints/adk.txt -e ".[adk,test]"
	@touch $@

# Move constraints/ to the newest versions pyproject.toml allows, in both venvs; then run make test and
# make adk, and update the "Versions tested" table of docs/integrations.md (a test checks it).
lock: $(STAMP) $(ADK_VENV)/.installed
	$(BIN)/python -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[dev]"
	$(ADK_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[adk,test]"
	{ sed -n '/^#/p' constraints/dev.txt; $(BIN)/python -m pip freeze --exclude-editable; } > constraints/dev.txt.new
	{ sed -n '/^#/p' constraints/adk.txt; $(ADK_VENV)/bin/python -m pip freeze --exclude-editable; } > constraints/adk.txt.new
	mv constraints/dev.txt.new constraints/dev.txt
	mv constraints/adk.txt.new constraints/adk.txt
	@touch $(STAMP) $(ADK_VENV)/.installed

adk: $(ADK_VENV)/.installed
	$(ADK_VENV)/bin/python -m pytest -q tests/test_integrations_google_adk.py tests/test_integrations_docs.py

# redis-server for the fleet tests (tests/fleet), installed when missing where the platform allows.
redis:
	.ci/redis

clean:
	rm -rf $(VENV) $(ADK_VENV) .node .conformance .venv-smoke dist build .mypy_cache .pytest_cache .ruff_cache
