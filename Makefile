# haltwise developer tasks. `make test` is what CI runs (via .ci/run).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
#: the demo's own install: haltwise and what it needs to run, none of the test tools
CORE_STAMP := $(VENV)/.installed-core
# Directories ruff checks (those that exist: git does not keep empty ones).
LINT_DIRS := $(wildcard src tests examples bench)
# A hung test is interrupted (SIGINT: pytest prints where it hung) after TEST_TIMEOUT seconds,
# and every test running longer than TEST_TRACEBACK_AFTER seconds dumps its thread stacks.
TEST_TIMEOUT ?= 2400
TEST_TRACEBACK_AFTER ?= 300
PYTEST_ARGS ?=

.PHONY: install test lint typecheck demo bench clean distclean

install: $(STAMP)

$(VENV):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@ $(CORE_STAMP)

# `make demo` installs haltwise alone (its runtime dependencies): no linters, type checker,
# browser driver or agent frameworks, which only `make test` needs.
$(CORE_STAMP): pyproject.toml | $(VENV)
	$(BIN)/python -m pip install -e .
	touch $@

test: install
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-chromium.sh
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)
	$(BIN)/mypy
	HALTWISE_PG_BIN="$$(bash scripts/ensure-postgres.sh)" HALTWISE_REQUIRE_POSTGRES=1 \
	timeout --signal=INT --kill-after=30 $(TEST_TIMEOUT) \
	$(BIN)/pytest -q -m "not slow" -o faulthandler_timeout=$(TEST_TRACEBACK_AFTER) $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)

typecheck: install
	$(BIN)/mypy

demo: $(CORE_STAMP)
	$(BIN)/python examples/demo.py

# The benchmarks run in their own venv: the peers they compare haltwise with (DBOS Transact,
# LangGraph's SQLite checkpointer) and matplotlib are never dependencies of the project. The
# postgres extra is for the fleet benchmark (PostgreSQL beside SQLite), the framework extras for
# the adapters' benchmark.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_PACKAGES := dbos langgraph langgraph-checkpoint-sqlite matplotlib

$(BENCH_VENV):
	$(PYTHON) -m venv $(BENCH_VENV)

$(BENCH_STAMP): pyproject.toml Makefile | $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[postgres,openai-agents,pydantic-ai,langchain,mcp]' $(BENCH_PACKAGES)
	touch $@

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/run_all.py

# Build and test leftovers; the venv stays (see distclean).
clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache .hypothesis .haltwise demo-out
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
