# Two commands do all the set-up: `make run` and `make test`.
# Both create or refresh .venv from pyproject.toml, pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= examples/configs/kaz.yaml
STEPS ?= 20000

.PHONY: run test test-fast lint bench venv clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip -c constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev,ray]"
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/marl-runner sample $(CONFIG) --steps $(STEPS)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/marl-runner bench

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
