# django-pgqueue: `make demo` and `make test` set everything up on a fresh machine.
#
# The virtual environment lives in .venv and is built with the newest Python >= 3.12
# found (python3.13, python3.12, pyenv's versions, python3); set PYTHON=... to choose.
# The database is DATABASE_URL, else postgres://postgres@127.0.0.1:5432/pgqueue.

SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MANAGE := $(BIN)/python testproject/manage.py
PYTEST := $(BIN)/pytest

.PHONY: install demo test test-fast lint format migrate clean createdb bench-admin screenshots

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
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'; \
	touch $(STAMP)

createdb: install
	@$(BIN)/python testproject/createdb.py

migrate: createdb
	@$(MANAGE) migrate --verbosity 0

demo: migrate
	@$(MANAGE) run_demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Everything CI runs: lint, migrations in sync, the whole test suite (slow tests included).
test: lint
	@$(MANAGE) makemigrations --check --dry-run --verbosity 0 || \
		(echo "error: models and migrations differ: run makemigrations" >&2; exit 1)
	$(PYTEST)

# The quick loop while developing: no slow tests.
test-fast: install
	$(PYTEST) -m "not slow"

# The admin's pages on 1,000,000 jobs (its own database, dropped afterwards);
# BENCH_ARGS=--smoke for a quick run, --json-out FILE to keep the figures.
bench-admin: install
	$(BIN)/python benchmarks/admin_pages.py $(BENCH_ARGS)

# Refresh docs/images/admin-*.png from the admin's browser test (needs chromium).
screenshots: install
	PGQUEUE_SCREENSHOTS=1 $(PYTEST) tests/admin/test_browser.py

clean:
	rm -rf $(VENV) build dist *.egg-info
