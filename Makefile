# Developer tasks. `.ci/run` runs `make ci` after installing the project, so CI runs
# exactly what a developer runs. Run `make help` for the list.
PYTHON ?= python

.PHONY: help install lint format typecheck test-fast test docs check ci

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

install:  ## install the project and its test tools into the active environment
	$(PYTHON) -m pip install -e '.[dev]'

lint:  ## ruff lint and the format check (nothing is rewritten)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format:  ## rewrite the code in ruff's format and apply ruff's safe fixes
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .

typecheck:  ## mypy --strict over the package, the tests and the benchmarks
	$(PYTHON) -m mypy --strict src tests bench

test-fast:  ## the fast tier: every test not marked slow (the edit loop)
	$(PYTHON) -m pytest -m "not slow"

test:  ## the full suite, as the README says
	$(PYTHON) -m pytest

docs:  ## build the docs site into site/ (extra docs), failing on any warning
	$(PYTHON) -m mkdocs build --strict

check: lint typecheck test-fast  ## lint, types and the fast tier: before every commit

ci: lint typecheck test  ## what CI runs after installing: lint, types, the full suite
