# Two commands do all the set-up: `make run` and `make test`.
# Both create or refresh .venv from pyproject.toml, pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= examples/configs/kaz.yaml
STEPS ?= 20000

.PHONY: run test test-all lint docs bench venv clean

# pip's output goes to $(INSTALL_LOG) and is shown only when an install fails, so a
# first `make run` prints the run, not setuptools' editable-install banner.
INSTALL_LOG := $(VENV)/install.log
PIP := $(BIN)/pip install --disable-pip-version-check -c constraints.txt

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing into $(VENV) (log: $(INSTALL_LOG)) ..."
	@( $(PIP) --upgrade pip && $(PIP) torch==2.13.0 && $(PIP) -e ".[dev,ray]" ) \
		> $(INSTALL_LOG) 2>&1 || { cat $(INSTALL_LOG); exit 1; }
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/marl-runner sample $(CONFIG) --steps $(STEPS)

# The default suite, on two pytest-xdist workers (under 3 minutes on 2 cores); `test-all`
# runs everything, the slow tests too (soaks, Ray cluster start-ups, long runs), one at a
# time. CI runs both. Bytecode is cached even where the shell says not to
# (PYTHONDONTWRITEBYTECODE): without it, every pytest worker compiles and assert-rewrites
# each test module again, and every command a test starts compiles the package again.
TEST_ENV := PYTHONDONTWRITEBYTECODE=
test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slow" -n 2

test-all: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

# The API reference, from the docstrings, into build/api (git-ignored); fails on a pdoc warning.
docs: $(STAMP)
	$(BIN)/python scripts/build_api_docs.py build/api

bench: $(STAMP)
	$(BIN)/marl-runner bench

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
