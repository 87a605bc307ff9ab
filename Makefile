# The one way to run things. `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOME_DIR ?= $(CURDIR)/.shipyard
PORT ?= 8080

.PHONY: run test coverage lint check bench install install-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: install
	$(BIN)/shipyard serve --host 127.0.0.1 --port $(PORT) --home $(HOME_DIR) --demo

test: install-dev
	$(BIN)/pytest -q -n 3

coverage: install-dev
	$(BIN)/pytest -q -n 3 --cov=shipyard --cov-report=term-missing:skip-covered

lint: install-dev
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

check: lint test

bench: install-dev
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/routing_policies.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
