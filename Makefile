# Quick start: `make demo` (lab demo) and `make test` (whole suite) on a fresh Debian machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PAIRCTL := $(VENV)/bin/pairctl
PYTEST_ARGS ?=

.PHONY: setup system venv demo check test test-serial test-real-mutants test-long-ctx test-unit lint typecheck fmt bench clean-state

setup: system venv

# Debian packages the lab and builds need (installed only when missing).
SYSTEM_PKGS := openssh-server openssh-client ccache cmake ninja-build g++ git iproute2 procps systemd libgomp1 faketime cron
system:
	@missing=""; for p in $(SYSTEM_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,lint]'
	touch $@

venv: $(VENV)/.installed

# The demo keeps its state in .state/demo (its lab stays up so you can try commands after it:
# `PAIRCTL_HOME=.state/demo .venv/bin/pairctl status --pair lab`); the tests use .state/test.
DEMO_HOME := $(CURDIR)/.state/demo
TEST_HOME := $(CURDIR)/.state/test

demo: setup
	PAIRCTL_HOME=$(DEMO_HOME) $(PY) -m orchestrator.lab.demo

# Each run of a tier keeps its numbers in .state/runs/<tier>/: junit.xml and durations.json (every
# test's wall and CPU seconds, tests/plugins/durations.py); `python -m benchmarks suite` reports them.
RUNS := $(CURDIR)/.state/runs
CHECK_HOME := $(CURDIR)/.state/check

# The fast tier, for every change: ruff, strict mypy, and every unit test but those marked unit_slow.
# No sshd, no builds, no servers (PAIRCTL_TEST_TIER=check makes a lab or source fixture fail the test),
# and no `system` step: a warm venv is all it needs. tests/unit/test_make_check.py proves it fails on
# a lint error, a type error and a broken unit test.
check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	PAIRCTL_TEST_TIER=check PAIRCTL_TEST_HOME=$(CHECK_HOME) PAIRCTL_TEST_RECORD=$(RUNS)/check \
	  $(PY) -m pytest tests/unit -m "not unit_slow" --junitxml=$(RUNS)/check/junit.xml $(PYTEST_ARGS)

# The whole suite on WORKERS pytest-xdist workers (default 2: CI's machine has two cores), each with a
# lab of its own (addresses 127.0.4.x, a home under .state/test/workers/gwK; tests/plugins/workers.py),
# the package store shared; lab test modules and the fault matrix (on lab3's and labfaults' hosts)
# each stay on one worker (--dist loadgroup), handed out longest first. The demo's lab holds the lab
# addresses; stop it (by pid) so the tests can start theirs.
WORKERS ?= 2
test: setup
	-@[ -d $(DEMO_HOME)/lab ] && PAIRCTL_HOME=$(DEMO_HOME) $(PAIRCTL) lab down >/dev/null 2>&1; true
	PAIRCTL_TEST_HOME=$(TEST_HOME) PAIRCTL_TEST_RECORD=$(RUNS)/test \
	  $(PY) -m pytest -n $(WORKERS) --dist loadgroup --junitxml=$(RUNS)/test/junit.xml $(PYTEST_ARGS)

# The same tests one at a time in one process, on the bundled lab addresses (127.0.0.x), as `make
# test` ran them before it took workers: for a debugger, or a machine where a second lab cannot start.
test-serial: setup
	-@[ -d $(DEMO_HOME)/lab ] && PAIRCTL_HOME=$(DEMO_HOME) $(PAIRCTL) lab down >/dev/null 2>&1; true
	PAIRCTL_TEST_HOME=$(TEST_HOME) PAIRCTL_TEST_RECORD=$(RUNS)/test-serial \
	  $(PY) -m pytest --junitxml=$(RUNS)/test-serial/junit.xml $(PYTEST_ARGS)

# Every mutant on the real model too (about 20 minutes more; not part of CI's `make test`).
test-real-mutants: setup
	PAIRCTL_TEST_HOME=$(TEST_HOME) PAIRCTL_TEST_REAL_MUTANTS=1 $(PY) -m pytest tests/mutants -m real_model $(PYTEST_ARGS)

# The 4x-context real-model profile deployed with the whole suite and accepted twice, and a SIGSTOPped
# service of it failed within 3 minutes (tens of minutes; meant for a busy machine).
test-long-ctx: setup
	PAIRCTL_TEST_HOME=$(TEST_HOME) PAIRCTL_TEST_LONG_CTX=1 $(PY) -m pytest tests/e2e/test_real_model_long_ctx.py $(PYTEST_ARGS)

# Every unit test, unit_slow included (the lab source is prepared, no sshd started).
test-unit: setup
	PAIRCTL_TEST_RECORD=$(RUNS)/test-unit $(PY) -m pytest tests/unit --junitxml=$(RUNS)/test-unit/junit.xml $(PYTEST_ARGS)

# Static checks CI runs before the tests (configuration: pyproject.toml's [tool.ruff] and [tool.mypy]).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# The mechanical pass (import order, pyupgrade rewrites, line wrapping); not part of CI.
fmt: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(PY) -m benchmarks

clean-state:
	-PAIRCTL_HOME=$(TEST_HOME) $(PAIRCTL) lab down
	-PAIRCTL_HOME=$(DEMO_HOME) $(PAIRCTL) lab down
	rm -rf .state
