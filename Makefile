# The one way to run things. `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOME_DIR ?= $(CURDIR)/.shipyard
PORT ?= 8080

.PHONY: run test test-fast test-images coverage lint docs docs-reference check bench bench-guard install install-dev chromium bubblewrap containers wrk http2-client clean

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
install-dev: $(VENV)/.installed-dev chromium bubblewrap containers http2-client

# The console's browser tests (tests/console/) drive Debian's chromium through Playwright.
# Installed with apt-get where that works (as root); elsewhere those tests skip, saying so.
chromium:
	@command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  (export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq chromium >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1)) || \
	  echo "chromium could not be installed: the console's browser tests will skip"

# With auth:, instances and jobs run under bubblewrap (auth.sandbox; SECURITY.md); the
# sandbox tests need it. Installed as chromium is; a gateway asked to sandbox without it
# refuses to start and says what to install.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  (export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1)) || \
	  echo "bubblewrap could not be installed: the sandbox tests will skip"

# The container backend's tests (tests/containers/) run Podman's Docker-compatible service
# with runc, on images built from a root filesystem made by debootstrap. Installed as
# chromium is; elsewhere those tests skip, saying so.
containers:
	@(command -v podman && command -v runc && command -v debootstrap) >/dev/null 2>&1 || \
	  ! command -v apt-get >/dev/null 2>&1 || \
	  (export DEBIAN_FRONTEND=noninteractive; \
	   apt-get install -y -qq podman runc debootstrap >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && \
	    apt-get install -y -qq podman runc debootstrap >/dev/null 2>&1)) || \
	  echo "podman could not be installed: the container tests will skip"

# AWS's own client of bidirectional streaming (aws-sdk-sagemaker-runtime-http2, over its
# CRT transport) needs Python >= 3.12, the project 3.11: its tests (tests/e2e/
# test_bidi_aws_client.py) run it from this side environment, made with the first
# Python >= 3.12 found; where there is none they skip, saying so.
HTTP2_VENV := .venv-http2
http2-client:
	@test -x $(HTTP2_VENV)/bin/python || { \
	  py=$$(for p in python3.13 python3.12 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python; do \
	    $$p -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1 && \
	    { echo $$p; break; }; done); \
	  if [ -n "$$py" ]; then \
	    $$py -m venv $(HTTP2_VENV) && $(HTTP2_VENV)/bin/pip install --quiet \
	      'aws-sdk-sagemaker-runtime-http2>=0.12' 'smithy-http[awscrt]' || rm -rf $(HTTP2_VENV); \
	  else echo "no Python >= 3.12: the tests of AWS's HTTP/2 client will skip"; fi; }

# The load generator of the peer harness (bench-guard), installed as chromium is.
wrk:
	@command -v wrk >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  (export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq wrk >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq wrk >/dev/null 2>&1))
	@command -v wrk >/dev/null 2>&1 || { echo "bench-guard needs wrk (apt-get install wrk)"; exit 2; }

run: install
	$(BIN)/shipyard serve --host 127.0.0.1 --port $(PORT) --home $(HOME_DIR) --demo

test: install-dev test-images
	$(BIN)/pytest -q -n 3 --dist loadgroup --no-loadscope-reorder --durations=25

# The fast tier: the tests that run in pytest's process alone (no gateway, instance, job
# runner, cluster or fresh interpreter: those are marked `processes`, tests/scheduling.py),
# stores on SQLite only, on two cores. `make test` runs them too, with everything else.
test-fast: $(VENV)/.installed-dev
	$(BIN)/pytest -q -n 2 -m "not processes" -k "not postgresql" \
	  tests/unit tests/storage tests/events tests/transform

# The container tests' base root filesystem, made once and cached (minutes on a slow
# machine: made here rather than under a test's timeout); where it cannot be made, the
# reason is printed and those tests skip.
test-images: install-dev
	@$(BIN)/python -m tests.containers.rootfs

coverage: install-dev test-images
	$(BIN)/pytest -q -n 3 --dist loadgroup --no-loadscope-reorder --cov=shipyard --cov-report=term-missing:skip-covered

lint: install-dev
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml, docs/) into site/: warnings are errors, and every
# link between pages and to a heading is checked. NO_MKDOCS_2_WARNING silences a banner
# about MkDocs 2 that Material prints on every build.
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

check: lint docs test

# The reference pages (docs/reference/: settings, stack file, API coverage, errors, metrics,
# CLI), generated from the code. Run it after changing what they show and commit the pages:
# tests/unit/test_docs_reference.py fails while a committed page differs from the code.
docs-reference: install
	$(BIN)/python -m shipyard.reference docs/reference

bench: install-dev
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/routing_policies.py

# The data path against bench/peer/reference, measured on the peer-benchmark harness:
# fails below 0.9x of it. The harness is an optional checkout, not part of this
# repository: set BENCH_DIR to its folder (by default shared/bench-peers is looked for in
# the folder holding this repository; bench/README.md, "The peer harness", says what it
# holds). Without it the target stops at once with that message (exit 2). Needs a quiet
# machine and a few minutes; not part of CI.
bench-guard: wrk
	bench/peer/guard.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
